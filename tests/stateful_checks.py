"""The saga's invariants (docs/design.md, "Invariants and where they are
enforced"), checked from the tables.

Used by the stateful test after every step and once more after its final
drain. Each check reads the whole (small) world of one example in a few
queries and raises AssertionError naming the saga and the broken property.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from django.core import mail
from django.db.models import Sum

from ledger.models import LedgerEntry
from outbox.models import OutboxMessage
from payments.fake_gateway.models import FakeCharge
from purchases.models import (
    GatewayAnswer,
    PurchaseSaga,
    ReservationSeat,
    ReservationStatus,
    SagaHistory,
    Seat,
    SeatStatus,
)
from purchases.saga.states import SagaState

S = SagaState

# States in which the gateway may hold a charge the ledger has not recorded
# yet: the charge's answer is not in (or was lost), or it is escalated.
CHARGE_IN_DOUBT = (S.CHARGING, S.UNKNOWN, S.UNKNOWN_EXPIRED)

# States in which the gateway may have refunded what the ledger has not
# recorded yet (the refund's answer was lost; the next attempt replays it).
REFUND_IN_DOUBT = (S.COMPENSATING, S.COMPENSATION_PENDING)

# A sold seat belongs to a CONFIRMED saga, or to one whose refund is under way.
SOLD_STATES = (S.CONFIRMED, S.COMPENSATING, S.COMPENSATION_PENDING)

# Gateway answers that prove no charge can land (or landed) on an intent: the
# only evidence on which a saga that tried to charge may release its seats.
# A look-up that reads "canceled" is one too (the auditor's DEFINITIVE_ANSWERS
# agree): a canceled intent takes no charge, and the saga acts on it when the
# cancel was ours and its answer was lost (purchases/saga/reconcile.py).
NO_CHARGE_EVIDENCE = {
    ("charge", "declined"),
    ("retrieve", "declined"),
    ("retrieve", "canceled"),
    ("cancel", "canceled"),
}

_SUBJECT = re.compile(
    r"^(?:(?P<confirmed>Your tickets): reservation (?P<r1>\S+)"
    r"|(?P<failed>Your purchase did not go through): reservation (?P<r2>\S+)"
    r"|(?P<corrected>Correction): reservation (?P<r3>\S+) was refunded)$"
)


@dataclass
class Emails:
    confirmed: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    corrected: Counter = field(default_factory=Counter)


def emails_by_reservation() -> Emails:
    out = Emails()
    for message in mail.outbox:
        match = _SUBJECT.match(str(message.subject))
        assert match, f"unexpected email subject {message.subject!r}"
        ref = match["r1"] or match["r2"] or match["r3"]
        kind = "confirmed" if match["confirmed"] else "failed" if match["failed"] else "corrected"
        getattr(out, kind)[ref] += 1
    return out


def _sum(qs) -> int:
    return qs.aggregate(n=Sum("amount"))["n"] or 0


def check_seats(*, event_id: int) -> None:
    """A seat is held by at most one live reservation; its status agrees with
    that link; a sold seat belongs to a CONFIRMED saga."""
    live = list(
        ReservationSeat.objects.filter(event_id=event_id, released_at__isnull=True).values_list(
            "seat_id", "reservation_id", "reservation__status", "reservation__saga__state"
        )
    )
    per_seat = Counter(seat_id for seat_id, *_ in live)
    doubled = [seat_id for seat_id, n in per_seat.items() if n > 1]
    assert not doubled, f"seats with more than one live reservation: {doubled}"
    link = {seat_id: rest for seat_id, *rest in live}
    for seat_id, ref, status in Seat.objects.filter(event_id=event_id).values_list(
        "id", "ref", "status"
    ):
        held_by = link.get(seat_id)
        if status == SeatStatus.AVAILABLE:
            assert held_by is None, f"seat {ref} is available but still linked to {held_by}"
            continue
        assert held_by is not None, f"seat {ref} is {status} without a live reservation"
        _reservation, reservation_status, saga_state = held_by
        if status == SeatStatus.SOLD:
            # Sold to a confirmed purchase, or one being refunded: its seats
            # stay sold until the money is back (then all goes in one commit).
            assert saga_state in SOLD_STATES, f"seat {ref} sold to a {saga_state} saga"
            assert reservation_status == ReservationStatus.CONFIRMED, (
                f"seat {ref} sold to a {reservation_status} reservation"
            )
        else:
            assert saga_state not in (S.CONFIRMED, S.COMPENSATED), (
                f"seat {ref} still held by a {saga_state} saga"
            )


def check_money(*, saga_ids) -> None:
    """Per intent: at most one charge at the gateway; ledger and gateway agree
    on every settled saga; released seats were never (or are no longer) paid."""
    sagas = list(
        PurchaseSaga.objects.filter(pk__in=saga_ids).values(
            "pk", "state", "intent_id", "amount", "reservation_id"
        )
    )
    intents = [s["intent_id"] for s in sagas]
    charges = defaultdict(list)
    for intent_id, status, amount in FakeCharge.objects.filter(intent_id__in=intents).values_list(
        "intent_id", "status", "amount"
    ):
        charges[intent_id].append((status, amount))
    ledger = defaultdict(list)
    for intent_id, kind, amount in LedgerEntry.objects.filter(intent_id__in=intents).values_list(
        "intent_id", "kind", "amount"
    ):
        ledger[intent_id].append((kind, amount))
    live = set(
        ReservationSeat.objects.filter(
            reservation_id__in=[s["reservation_id"] for s in sagas], released_at__isnull=True
        ).values_list("reservation_id", flat=True)
    )
    for saga in sagas:
        sid, state, intent = saga["pk"], saga["state"], saga["intent_id"]
        made = charges[intent]
        assert len(made) <= 1, f"saga {sid} ({state}): {len(made)} charges at the gateway"
        captured = sum(amount for status, amount in made if status == "succeeded")
        entries = ledger[intent]
        kinds = Counter(kind for kind, _ in entries)
        net = sum(amount for _, amount in entries)
        assert all(n == 1 for n in kinds.values()), f"saga {sid}: ledger kinds {kinds}"
        refund_in_doubt = (
            state in REFUND_IN_DOUBT
            and kinds == Counter({"charge": 1})
            and [status for status, _ in made] == ["refunded"]
        )
        if entries and not refund_in_doubt:
            assert net == captured, (
                f"saga {sid} ({state}): ledger net {net} != gateway captured {captured}"
            )
        else:
            assert captured == 0 or state in CHARGE_IN_DOUBT, (
                f"saga {sid} ({state}): the gateway captured {captured}, the ledger has nothing"
            )
        if state == S.CONFIRMED:
            assert kinds == Counter({"charge": 1}), f"CONFIRMED saga {sid}: ledger {entries}"
            assert net == saga["amount"], f"CONFIRMED saga {sid}: ledger net {net}"
        if state == S.COMPENSATED:
            assert net == 0, f"COMPENSATED saga {sid}: ledger nets {net}"
        if saga["reservation_id"] not in live:
            assert captured == 0, (
                f"saga {sid} ({state}) released its seats but the gateway holds a charge "
                f"of {captured}"
            )


def check_compensation_evidence(*, saga_ids) -> None:
    """A saga that tried to charge releases nothing before the gateway said,
    definitively, that no charge landed (or can land) on its intent."""
    moves = SagaHistory.objects.filter(
        saga_id__in=saga_ids,
        to_state=S.COMPENSATING,
        from_state__in=[S.PAYMENT_FAILED, S.EXPIRED, S.UNKNOWN_EXPIRED],
    ).values_list("saga_id", "at", "id")
    for saga_id, at, history_id in moves:
        evidence = [
            (asked, answer)
            for asked, answer in GatewayAnswer.objects.filter(
                saga_id=saga_id, at__lte=at
            ).values_list("asked", "answer")
            if (asked, answer) in NO_CHARGE_EVIDENCE
        ]
        assert evidence, (
            f"saga {saga_id} compensated (history #{history_id}) without a definitive "
            "gateway answer before it"
        )


def check_emails(*, saga_ids) -> Emails:
    """At most one confirmation and one failure-or-correction per saga, each
    of the kind its history calls for."""
    emails = emails_by_reservation()
    sagas = {
        row["reservation__ref"]: row
        for row in PurchaseSaga.objects.filter(pk__in=saga_ids).values(
            "pk", "state", "reservation__ref"
        )
    }
    ever_confirmed = set(
        SagaHistory.objects.filter(saga_id__in=saga_ids, to_state=S.CONFIRMED).values_list(
            "saga_id", flat=True
        )
    )
    for ref in set(emails.confirmed) | set(emails.failed) | set(emails.corrected):
        assert ref in sagas, f"an email about reservation {ref}, which no saga owns"
        saga = sagas[ref]
        sid, state = saga["pk"], saga["state"]
        confirmed, failed, corrected = (
            emails.confirmed[ref],
            emails.failed[ref],
            emails.corrected[ref],
        )
        assert confirmed <= 1, f"saga {sid}: {confirmed} confirmation emails"
        assert failed + corrected <= 1, f"saga {sid}: {failed} failure + {corrected} correction"
        if confirmed:
            assert sid in ever_confirmed, f"saga {sid} ({state}) never confirmed, got tickets"
        if failed:
            assert state == S.COMPENSATED, f"saga {sid} ({state}) got a failure email"
            assert sid not in ever_confirmed, (
                f"saga {sid} was confirmed: a failure email instead of a correction"
            )
        if corrected:
            assert state == S.COMPENSATED, f"saga {sid} ({state}) got a correction"
            assert sid in ever_confirmed, f"saga {sid} never confirmed, got a correction"
    return emails


def check_all(*, event_id: int, saga_ids) -> None:
    check_seats(event_id=event_id)
    check_money(saga_ids=saga_ids)
    check_compensation_evidence(saga_ids=saga_ids)
    check_emails(saga_ids=saga_ids)


def check_settled(*, event_id: int, saga_ids) -> None:
    """After the outages end and time runs out: every saga reached an end an
    operator can see, with exactly the emails that end calls for."""
    check_all(event_id=event_id, saga_ids=saga_ids)
    emails = emails_by_reservation()
    ever_confirmed = set(
        SagaHistory.objects.filter(saga_id__in=saga_ids, to_state=S.CONFIRMED).values_list(
            "saga_id", flat=True
        )
    )
    for saga in PurchaseSaga.objects.filter(pk__in=saga_ids).select_related("reservation"):
        sid, state, ref = saga.pk, saga.state, saga.reservation.ref
        got = (emails.confirmed[ref], emails.failed[ref], emails.corrected[ref])
        if state == S.CONFIRMED:
            assert got == (1, 0, 0), f"CONFIRMED saga {sid}: emails (conf, fail, corr) {got}"
        elif state == S.COMPENSATED:
            want = (1, 0, 1) if saga.pk in ever_confirmed else (0, 1, 0)
            assert got == want, f"COMPENSATED saga {sid}: emails {got}, expected {want}"
        elif state == S.UNKNOWN_EXPIRED:
            assert OutboxMessage.objects.filter(
                saga_id=sid, topic="purchase.needs_operator"
            ).exists(), f"UNKNOWN_EXPIRED saga {sid} without an operator alert"
            assert got == (0, 0, 0), f"UNKNOWN_EXPIRED saga {sid}: emails {got}"
        else:
            history = list(saga.history.order_by("at", "id").values_list("to_state", "reason"))
            raise AssertionError(f"saga {sid} stuck in {state}; history {history}")
    stuck = OutboxMessage.objects.filter(
        saga_id__in=saga_ids,
        completed_at__isnull=True,
        cancelled_at__isnull=True,
        fired_at__isnull=False,
    ).values_list("topic", "payload")
    assert not list(stuck), f"outbox rows handed over but never completed: {list(stuck)}"
