"""What a buyer reads in a purchase's history (docs/api.md, "Purchases").

Each move of the saga is told by one sentence written for the buyer, chosen
by the move itself (from, to) and, at the end of a compensation, by the
ledger (was the payment refunded?). The stored ``reason`` is never shown: it
carries operators' notes and names and internal diagnostics, which stay in
the admin. Notes (rows with from == to: refusals, operators' notes, probes
without a move) are not moves and are left out (see ``selectors.purchase_get``).

Money given back to a confirmed purchase is no move either: the saga stays
CONFIRMED, and each refund is a row of its own that the purchase's
``refunds`` lists with the sentence written for its buyer
(docs/refunds.md, "The rows"). So the only refund told here is a
compensation's: the refund of a charge that landed on a purchase that did
not confirm.

A step told again and again (a refund or a payment retried: the saga going
round COMPENSATING <-> COMPENSATION_PENDING or CHARGING <-> UNKNOWN) is told
once, with how many times it happened and when it last did (``collapse``);
the admin keeps every row.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import NamedTuple

from django.db.models import F

from ledger.models import EntryKind, LedgerEntry

from .models import PurchaseSaga
from .saga.states import SagaState

S = SagaState


class ByRefund(NamedTuple):
    """A move told one way when the payment was refunded, another when
    nothing was charged (the ledger says which)."""

    refunded: str
    not_charged: str


_BOOKED = "Payment received; your seats are booked"
_DECLINED = "Your payment was declined"
_EXPIRED = "The hold on your seats ran out before the payment went through"
_AUTHENTICATE = "Your bank asks you to confirm the payment"
_CANCELLING = "We are cancelling the purchase and releasing your seats"
_CANCELLED = ByRefund(
    refunded="Your payment was refunded and the purchase cancelled",
    not_charged="Purchase cancelled; nothing was charged",
)

# Every move TRANSITIONS allows, plus the creation (None -> PENDING); a test
# walks the table. No sentence names who made the move.
SENTENCES: dict[tuple[SagaState | None, SagaState], str | ByRefund] = {
    (None, S.PENDING): "Purchase received; your seats are held while we take the payment",
    (S.PENDING, S.CHARGING): "We are taking the payment",
    (S.PENDING, S.EXPIRED): _EXPIRED,
    (S.CHARGING, S.CONFIRMED): _BOOKED,
    (S.CHARGING, S.PAYMENT_FAILED): _DECLINED,
    (S.CHARGING, S.UNKNOWN): "We are confirming the payment with the bank",
    (S.CHARGING, S.EXPIRED): _EXPIRED,
    (S.CHARGING, S.REQUIRES_ACTION): _AUTHENTICATE,
    (S.UNKNOWN, S.REQUIRES_ACTION): _AUTHENTICATE,
    (S.REQUIRES_ACTION, S.CONFIRMED): _BOOKED,
    (S.REQUIRES_ACTION, S.PAYMENT_FAILED): (
        "Your bank did not confirm the payment; nothing was charged"
    ),
    (S.REQUIRES_ACTION, S.EXPIRED): (
        "The hold on your seats ran out before the payment was confirmed; nothing was charged"
    ),
    (S.UNKNOWN, S.CHARGING): "We are trying the payment again",
    (S.UNKNOWN, S.CONFIRMED): _BOOKED,
    (S.UNKNOWN, S.PAYMENT_FAILED): _DECLINED,
    (S.UNKNOWN, S.UNKNOWN_EXPIRED): (
        "Confirming the payment is taking longer than usual; our team is checking it with the bank"
    ),
    (S.UNKNOWN, S.EXPIRED): _EXPIRED,
    (S.UNKNOWN_EXPIRED, S.CONFIRMED): _BOOKED,
    (S.UNKNOWN_EXPIRED, S.EXPIRED): _EXPIRED,
    (S.UNKNOWN_EXPIRED, S.COMPENSATING): (
        "The payment did not go through; we are cancelling the purchase and releasing your seats"
    ),
    (S.PAYMENT_FAILED, S.COMPENSATING): _CANCELLING,
    (S.EXPIRED, S.COMPENSATING): _CANCELLING,
    (S.COMPENSATING, S.COMPENSATED): _CANCELLED,
    (S.COMPENSATING, S.COMPENSATION_PENDING): (
        "The refund is taking longer than usual; we will keep trying"
    ),
    (S.COMPENSATION_PENDING, S.COMPENSATING): "We are trying the refund again",
    (S.COMPENSATION_PENDING, S.COMPENSATED): _CANCELLED,
}

# A row the table does not know (a state added later, hand-written data): the
# buyer still reads a sentence, never the stored reason.
FALLBACK = "Your purchase was updated"


def buyer_sentence(from_state: str | None, to_state: str, *, refunded: bool) -> str:
    """The buyer's sentence for the move ``from_state`` -> ``to_state``."""
    try:
        key = (None if from_state is None else S(from_state), S(to_state))
    except ValueError:
        return FALLBACK
    sentence = SENTENCES.get(key, FALLBACK)
    if isinstance(sentence, ByRefund):
        return sentence.refunded if refunded else sentence.not_charged
    return sentence


@dataclass(frozen=True)
class BuyerMove:
    from_state: str | None
    to_state: str
    at: datetime  # the latest time, for a step told ``times`` times
    reason: str
    times: int = 1


def collapse(moves: Iterable[BuyerMove]) -> list[BuyerMove]:
    """Each step (from, to, sentence) once, where it last happened, with how
    many times it happened and its latest time.

    Any repeat, not only a consecutive one: a retry is a cycle of two steps
    that alternate (the refund is taking longer, we are trying it again), so
    no step ever follows itself. A step can only come back by a cycle, and
    every step of a cycle collapses alike. Each is placed where it last
    happened, so the times still read in order and the last step is where
    the purchase stands now (its ``to`` is the status).
    """
    told: dict[tuple[str | None, str, str], BuyerMove] = {}
    for move in moves:
        key = (move.from_state, move.to_state, move.reason)
        before = told.pop(key, None)  # popped: re-inserted last, where it last happened
        told[key] = move if before is None else replace(move, times=before.times + move.times)
    return list(told.values())


def buyer_history(saga: PurchaseSaga) -> list[BuyerMove]:
    """The saga's moves, oldest first, each told for the buyer, repeated
    steps told once (``collapse``).

    ``selectors.purchase_get`` prefetches the moves (``moves``) and the
    ledger's refund (``has_refund``); without them this asks the database.
    """
    moves = getattr(saga, "moves", None)
    if moves is None:
        moves = saga.history.exclude(from_state=F("to_state")).order_by("at", "id")
    refunded = getattr(saga, "has_refund", None)
    told = []
    for move in moves:
        if refunded is None and move.to_state == S.COMPENSATED:
            refunded = LedgerEntry.objects.filter(
                intent_id=saga.intent_id, kind=EntryKind.REFUND
            ).exists()
        told.append(
            BuyerMove(
                move.from_state,
                move.to_state,
                move.at,
                buyer_sentence(move.from_state, move.to_state, refunded=bool(refunded)),
            )
        )
    return collapse(told)
