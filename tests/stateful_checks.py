"""The saga's invariants (docs/design.md, "Invariants and where they are
enforced"), checked from the tables.

Used by the stateful test after every step and once more after its final
drain. Each check reads the whole (small) world of one example in a few
queries and raises AssertionError naming the saga and the broken property.

Money back to a confirmed purchase is a refund row of its own (the saga stays
CONFIRMED: docs/refunds.md): its seats go back on sale with the row, its
ledger entry (naming it) comes with its success, its email after that; the
processor holds at most one refund per refund id of ours, and may be ahead of
the ledger only by the refunds still pending on our side.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from django.core import mail
from django.db.models import Sum

from ledger.models import LedgerEntry
from outbox.models import OutboxMessage
from payments.fake_gateway.models import FakeCharge, FakeRefund
from purchases.models import (
    GatewayAnswer,
    PurchaseSaga,
    Refund,
    RefundStatus,
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

# A sold seat belongs to a CONFIRMED saga: a compensation starts only from a
# purchase that never confirmed (its seats held, never sold).
SOLD_STATES = (S.CONFIRMED,)

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
    r"|(?P<corrected>Correction): reservation (?P<r3>\S+) was refunded"
    r"|(?P<refunded>Refund of .+): reservation (?P<r4>\S+))$"
)
# A refund's email names it (templates/emails/refund_succeeded.txt).
_REFUND_REFERENCE = re.compile(r"Reference (?P<refund>[0-9a-f-]{36})\.")


@dataclass
class Emails:
    confirmed: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    corrected: Counter = field(default_factory=Counter)
    # refund id -> its emails
    refunded: Counter = field(default_factory=Counter)


def emails_by_reservation() -> Emails:
    out = Emails()
    for message in mail.outbox:
        match = _SUBJECT.match(str(message.subject))
        assert match, f"unexpected email subject {message.subject!r}"
        if match["refunded"]:
            reference = _REFUND_REFERENCE.search(str(message.body))
            assert reference, f"a refund email without its reference: {message.body!r}"
            out.refunded[reference["refund"]] += 1
            continue
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
    _check_seats_given_back(event_id=event_id)
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


def _check_seats_given_back(*, event_id: int) -> None:
    """A released link of a confirmed purchase is a refund's: one that names
    the seat and released it, in the same commit."""
    released = list(
        ReservationSeat.objects.filter(
            event_id=event_id,
            released_at__isnull=False,
            reservation__saga__state=S.CONFIRMED,
        ).values_list("reservation__saga__id", "seat__ref")
    )
    given: set = set()
    for saga_id, seats in Refund.objects.filter(event_id=event_id, released=True).values_list(
        "saga_id", "released_seats"
    ):
        given.update((saga_id, ref) for ref in seats)
    for saga_id, ref in released:
        assert (saga_id, ref) in given, (
            f"CONFIRMED saga {saga_id}: seat {ref} released by no refund of it"
        )
    for saga_id, seats in Refund.objects.filter(event_id=event_id, released=True).values_list(
        "saga_id", "released_seats"
    ):
        for ref in seats:
            assert (saga_id, ref) in set(released), (
                f"saga {saga_id}: a refund released {ref}, whose link is still live"
            )


@dataclass
class _Refunds:
    """One saga's refund rows and the processor's refunds of its intent."""

    rows: list = field(default_factory=list)  # (id, amount, status)
    at_processor: dict = field(default_factory=dict)  # our refund id -> (amount, status)


def _refunds_of(sagas: list) -> dict:
    out: dict = defaultdict(_Refunds)
    by_intent = {s["intent_id"]: s["pk"] for s in sagas}
    for saga_id, pk, amount, status in Refund.objects.filter(
        saga_id__in=list(by_intent.values())
    ).values_list("saga_id", "id", "amount", "status"):
        out[saga_id].rows.append((str(pk), amount, status))
    for intent_id, refund_id, amount, status in FakeRefund.objects.filter(
        intent_id__in=list(by_intent)
    ).values_list("intent_id", "refund_id", "amount", "status"):
        made = out[by_intent[intent_id]].at_processor
        assert refund_id not in made, f"intent {intent_id}: two refunds under {refund_id}"
        made[refund_id] = (amount, status)
    return out


def check_money(*, saga_ids) -> None:
    """Per intent: at most one charge at the gateway; ledger and gateway agree
    on every settled saga (the processor ahead only by refunds still pending
    on our side); released seats were never (or are no longer) paid; a
    confirmed purchase's refunds are its ledger's refund entries."""
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
    for intent_id, kind, amount, refund_id in LedgerEntry.objects.filter(
        intent_id__in=intents
    ).values_list("intent_id", "kind", "amount", "refund_id"):
        ledger[intent_id].append((kind, amount, str(refund_id) if refund_id else None))
    live = set(
        ReservationSeat.objects.filter(
            reservation_id__in=[s["reservation_id"] for s in sagas], released_at__isnull=True
        ).values_list("reservation_id", flat=True)
    )
    refunds = _refunds_of(sagas)
    for saga in sagas:
        _check_saga_money(
            saga,
            made=charges[saga["intent_id"]],
            entries=ledger[saga["intent_id"]],
            refunds=refunds[saga["pk"]],
            released=saga["reservation_id"] not in live,
        )


def _check_saga_money(saga, *, made, entries, refunds: _Refunds, released: bool) -> None:
    sid, state = saga["pk"], saga["state"]
    assert len(made) <= 1, f"saga {sid} ({state}): {len(made)} charges at the gateway"
    # What the processor keeps: its capture (refunded since or not) less
    # its succeeded refunds (a charge partly refunded stays "succeeded").
    captured = sum(amount for status, amount in made if status in ("succeeded", "refunded"))
    captured -= sum(a for a, status in refunds.at_processor.values() if status == "succeeded")
    kinds = Counter((kind, refund_id) for kind, _, refund_id in entries)
    net = sum(amount for _, amount, _ in entries)
    assert all(n == 1 for n in kinds.values()), f"saga {sid}: ledger entries {kinds}"
    ours = {pk: (amount, status) for pk, amount, status in refunds.rows}
    # Done at the processor, still pending here (its answer lost, or the
    # look-up to come): the ledger may lag by exactly those.
    lagging = sum(
        a
        for refund_id, (a, status) in refunds.at_processor.items()
        if status == "succeeded" and ours.get(refund_id, (0, ""))[1] == RefundStatus.PENDING
    )
    compensation_in_doubt = (
        state in REFUND_IN_DOUBT
        and Counter(kind for kind, _ in kinds) == Counter({"charge": 1})
        and [status for status, _ in made] == ["refunded"]
    )
    if entries and not compensation_in_doubt:
        assert net - lagging == captured, (
            f"saga {sid} ({state}): ledger net {net} (less {lagging} refunded at the "
            f"processor, pending here) != gateway net {captured}"
        )
    else:
        assert captured == 0 or state in CHARGE_IN_DOUBT, (
            f"saga {sid} ({state}): the gateway captured {captured}, the ledger has nothing"
        )
    _check_refund_rows(saga, entries=entries, refunds=refunds, net=net)
    if state == S.COMPENSATED:
        assert net == 0, f"COMPENSATED saga {sid}: ledger nets {net}"
    if released and state != S.CONFIRMED:
        # (A confirmed purchase's seats go back with a refund row, before its
        # money: the refund rows answer for it.)
        assert captured == 0, (
            f"saga {sid} ({state}) released its seats but the gateway holds a charge of {captured}"
        )


def _check_refund_rows(saga, *, entries, refunds: _Refunds, net: int) -> None:
    sid, state, intent = saga["pk"], saga["state"], saga["intent_id"]
    ours = {pk: (amount, status) for pk, amount, status in refunds.rows}
    unknown = set(refunds.at_processor) - set(ours) - {f"refund:{intent}"}
    assert not unknown, f"saga {sid}: refunds at the processor not ours: {unknown}"
    if state != S.CONFIRMED:
        assert not ours, f"saga {sid} ({state}, never confirmed) has refund rows"
        return
    charges = [amount for kind, amount, _ in entries if kind == "charge"]
    assert charges == [saga["amount"]], f"CONFIRMED saga {sid}: charge entries {charges}"
    by_refund = {refund_id: -amount for kind, amount, refund_id in entries if kind == "refund"}
    assert None not in by_refund, f"CONFIRMED saga {sid}: a refund entry naming no refund"
    succeeded = {pk: a for pk, (a, status) in ours.items() if status == RefundStatus.SUCCEEDED}
    assert by_refund == succeeded, (
        f"CONFIRMED saga {sid}: refund entries {by_refund} != succeeded refunds {succeeded}"
    )
    owed = sum(a for a, status in ours.values() if status != RefundStatus.FAILED)
    assert owed <= saga["amount"], f"saga {sid}: refunds of {owed} > {saga['amount']} paid"
    assert net == saga["amount"] - sum(succeeded.values()) >= 0, f"saga {sid}: ledger net {net}"
    for pk, (amount, status) in ours.items():
        done = refunds.at_processor.get(pk)
        if status == RefundStatus.SUCCEEDED:
            assert done == (amount, "succeeded"), f"refund {pk} succeeded; the processor: {done}"
        if status == RefundStatus.FAILED:
            assert done is None or done[1] == "failed", f"refund {pk} failed; processor: {done}"


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
    _check_refund_emails(emails, saga_ids=saga_ids)
    return emails


def _check_refund_emails(emails: Emails, *, saga_ids) -> None:
    """One email per refund, and only once the processor said it is done."""
    status = {
        str(pk): s
        for pk, s in Refund.objects.filter(saga_id__in=saga_ids).values_list("id", "status")
    }
    for refund_id, n in emails.refunded.items():
        assert refund_id in status, f"a refund email for {refund_id}, which is no refund"
        assert n == 1, f"refund {refund_id}: {n} emails"
        assert status[refund_id] == RefundStatus.SUCCEEDED, (
            f"refund {refund_id} is {status[refund_id]}, and its buyer was told it is done"
        )


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
            _check_refunds_settled(saga, emails)
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
    assert not Refund.objects.filter(saga_id__in=saga_ids, status=RefundStatus.PENDING).exists(), (
        "a refund still pending once the outages ended and time ran out"
    )
    stuck = OutboxMessage.objects.filter(
        saga_id__in=saga_ids,
        completed_at__isnull=True,
        cancelled_at__isnull=True,
        fired_at__isnull=False,
    ).values_list("topic", "payload")
    assert not list(stuck), f"outbox rows handed over but never completed: {list(stuck)}"


def _check_refunds_settled(saga: PurchaseSaga, emails: Emails) -> None:
    """Every refund of a settled confirmed purchase ended: succeeded with one
    email, or failed (the processor refused) with one alert naming it."""
    for refund_id, status in Refund.objects.filter(saga_id=saga.pk).values_list("id", "status"):
        if status == RefundStatus.SUCCEEDED:
            assert emails.refunded[str(refund_id)] == 1, f"refund {refund_id}: no email"
        elif status == RefundStatus.FAILED:
            alerts = OutboxMessage.objects.filter(
                saga_id=saga.pk,
                topic="purchase.needs_operator",
                key=f"needs_operator:{saga.pk}:refund-failed:{refund_id}",
            )
            assert alerts.count() == 1, f"failed refund {refund_id}: {alerts.count()} alerts"
