"""The invariant auditor: a clean run of every outcome passes; each invariant,
broken on purpose, is reported by name with the saga it concerns, recorded in
an AuditRun, and makes ``manage.py audit_sagas`` exit non-zero.

Money back to a confirmed purchase is a refund row of its own (the saga stays
CONFIRMED: docs/refunds.md); the compensation's refund is only owed for a
charge that landed on a purchase being undone (tests/late_charge.py). Both
are outcomes of the story."""

import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from freezegun import freeze_time

from ledger.models import LedgerEntry
from outbox.models import InboxEntry, OutboxMessage
from payments.fake_gateway.inprocess import InProcessFakeGateway
from payments.fake_gateway.models import FakeCharge, FakeRefund
from payments.interface import GatewayRefund, GatewayUnavailable
from payments.registry import override_gateway
from purchases.models import (
    AuditRun,
    Event,
    EventCancellation,
    GatewayAnswer,
    PurchaseSaga,
    Refund,
    Reservation,
    ReservationSeat,
    Seat,
    SweepHeartbeat,
)
from purchases.ops.audit import (
    CANCELLATION_EMAIL,
    CONFIRMATION_EMAIL,
    INVARIANTS,
    audit_run,
)
from purchases.ops.audit.emails import REFUND_EMAIL
from purchases.ops.runbook import Action, action_run
from purchases.saga.states import SagaState
from purchases.services import (
    SYSTEM,
    By,
    event_cancel,
    organizer_refund,
    purchase_refund,
    refund_chase,
    refund_execute,
    saga_charge,
    saga_compensate,
    saga_transition,
)

from .conftest import drain_outbox, start_purchase
from .factories import EventFactory
from .gateways import FaultyGateway
from .late_charge import charged_while_undone

T0 = "2026-12-02 12:00:00"
BACKOFF = [60, 120, 240, 480, 960, 1920]
LATER = timedelta(hours=2)  # past the default threshold (300 s + the hold)


@dataclass
class Story:
    event: object
    clock: object
    visa: PurchaseSaga
    declined: PurchaseSaga
    reconciled: PurchaseSaga
    refunded: PurchaseSaga
    expired_unknown: PurchaseSaga
    undone: PurchaseSaga
    partly: PurchaseSaga


def _bare_refund(saga, *, amount: int) -> Refund:
    """A pending operator refund row written straight to the table, nothing
    else (no seats, no obligations): the state a check must name."""
    return Refund.objects.create(
        saga_id=saga.pk,
        event_id=saga.event_id,
        amount=amount,
        currency="EUR",
        source="operator",
        public_reason="-",
        created_at=timezone.now(),
        updated_at=timezone.now(),
    )


def _fresh(saga):
    return PurchaseSaga.objects.get(pk=saga.pk)


@pytest.fixture
def story(alice, bob, gateway, settings):
    """One saga of every outcome, every message delivered, inside frozen time."""
    settings.PURCHASE_HOLD_SECONDS = 300
    settings.RECONCILE_BACKOFF_SECONDS = BACKOFF
    event = EventFactory(seats=[f"A{n}" for n in range(1, 11)])
    with freeze_time(T0) as clock:
        visa = saga_charge(saga_id=start_purchase(alice, event, seats=["A1"]).pk)
        declined = saga_charge(
            saga_id=start_purchase(
                bob, event, seats=["A2"], payment_method="pm_card_chargeDeclined"
            ).pk
        )
        reconciled = start_purchase(
            alice, event, seats=["A3"], payment_method="pm_card_timeout_charged"
        )
        assert saga_charge(saga_id=reconciled.pk).state == "UNKNOWN"
        # Refunded in full by customer service: a refund row (asked of the
        # processor by its message, delivered below), the seats back on sale.
        refunded = saga_charge(saga_id=start_purchase(bob, event, seats=["A4", "A5"]).pk)
        purchase_refund(saga_id=refunded.pk, reason="customer asked", by=By.operator("carol"))
        # A part given back by the organizer: the processor's charge stays
        # "succeeded" (only its refunds say what it kept).
        partly = saga_charge(saga_id=start_purchase(alice, event, seats=["A10"]).pk)
        organizer_refund(
            organizer=event.organizer, saga_id=partly.pk, user=alice, reason="late", amount=1000
        )
        # Charged while it was being undone: the compensation refunds it.
        undone = charged_while_undone(alice, event, seats=["A9"])
        saga_compensate(saga_id=undone.pk)
        # The gateway never answers: reconciled until the hold runs out, then
        # cancelled at the gateway (a definitive answer) and compensated.
        expired_unknown = start_purchase(
            bob, event, seats=["A6"], payment_method="pm_card_unreachable"
        )
        assert saga_charge(saga_id=expired_unknown.pk).state == "UNKNOWN"
        for _ in range(8):
            clock.tick(60)
            drain_outbox()
        told = Story(
            event,
            clock,
            _fresh(visa),
            _fresh(declined),
            _fresh(reconciled),
            _fresh(refunded),
            _fresh(expired_unknown),
            _fresh(undone),
            _fresh(partly),
        )
        assert [
            s.state
            for s in (
                told.visa,
                told.declined,
                told.reconciled,
                told.refunded,
                told.expired_unknown,
                told.undone,
                told.partly,
            )
        ] == [
            "CONFIRMED",
            "COMPENSATED",
            "CONFIRMED",
            "CONFIRMED",
            "COMPENSATED",
            "COMPENSATED",
            "CONFIRMED",
        ]
        assert [(r.saga_id, r.amount, r.status) for r in Refund.objects.order_by("amount")] == [
            (partly.pk, 1000, "succeeded"),
            (refunded.pk, 5000, "succeeded"),
        ]
        yield told


def _invariants(report) -> set[str]:
    return {v.invariant for v in report.violations}


def _sagas(report, invariant) -> set:
    return {v.saga_id for v in report.violations if v.invariant == invariant}


def _only(report, invariant, saga=None):
    """The report names exactly this invariant (and this saga); the run is recorded."""
    assert _invariants(report) == {invariant}, report.violations
    if saga is not None:
        assert str(saga.pk) in _sagas(report, invariant)
    assert report.run_id is not None
    run = AuditRun.objects.get(pk=report.run_id)
    assert run.violations == len(report.violations) > 0
    assert {v["invariant"] for v in run.report} == {invariant}
    assert run.finished_at is not None and run.finished_at >= run.started_at


def _command_fails(invariant, saga=None) -> str:
    out = StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("audit_sagas", stdout=out)
    assert failed.value.returncode == 1
    text = out.getvalue()
    table = dict(line.split() for line in text.splitlines()[: len(INVARIANTS)])
    assert table.pop(invariant) != "ok"
    assert set(table.values()) == {"ok"}
    if saga is not None:
        assert str(saga.pk) in text
    assert AuditRun.objects.latest("started_at", "id").violations > 0
    return text


# --- a clean run ----------------------------------------------------------------


@pytest.mark.django_db
def test_a_clean_run_over_every_outcome_finds_nothing(story, gateway):
    report = audit_run()

    assert report.violations == []
    assert report.sagas_checked == 7 and report.sagas_skipped == 0
    assert set(report.counts) == set(INVARIANTS) and not any(report.counts.values())
    # One look-up per intent, through the gateway's API, and one of the
    # refunds of each intent that holds (or held) a charge.
    asked = [c[1] for c in gateway.calls if c[0] == "list_charges"]
    assert sorted(asked) == sorted(s.intent_id for s in PurchaseSaga.objects.all())
    refunds_asked = [c[1] for c in gateway.calls if c[0] == "list_refunds"]
    charged = (story.visa, story.reconciled, story.refunded, story.undone, story.partly)
    assert sorted(refunds_asked) == sorted(s.intent_id for s in charged)
    assert report.run_id is not None
    run = AuditRun.objects.get(pk=report.run_id)
    assert (run.sagas_checked, run.violations, run.report) == (7, 0, [])
    beat = SweepHeartbeat.objects.get(name="audit_sagas")
    assert beat.last_succeeded_at is not None and beat.rows_seen == 7

    # Nothing is silently stuck a day later either: everything settled.
    assert audit_run(now=timezone.now() + timedelta(days=1)).violations == []


@pytest.mark.django_db
def test_the_command_prints_the_table_and_exits_0_when_clean(story):
    out = StringIO()

    call_command("audit_sagas", stdout=out)  # no CommandError: exit status 0

    lines = out.getvalue().splitlines()
    assert [line.split() for line in lines[: len(INVARIANTS)]] == [
        [name, "ok"] for name in INVARIANTS
    ]
    assert "7 saga(s) checked" in lines[-1] and "0 violation(s)" in lines[-1]
    assert AuditRun.objects.count() == 1


@pytest.mark.django_db
def test_the_command_prints_json_on_request(story):
    Seat.objects.filter(event=story.event, ref="A8").update(status="sold")
    out = StringIO()

    with pytest.raises(CommandError):
        call_command("audit_sagas", "--json", stdout=out)

    report = json.loads(out.getvalue())
    assert report["sagas_checked"] == 7
    assert report["counts"]["seat_sold_once"] == 1
    assert report["violations"] == [
        {
            "invariant": "seat_sold_once",
            "saga_id": None,
            "intent_id": None,
            "detail": f"seat A8 of event {story.event.pk} is sold to no reservation",
        }
    ]
    assert report["run_id"] == AuditRun.objects.get().pk


# --- seat_sold_once --------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "breakage", ["reservation_cancelled", "seat_released", "link_ended", "orphan_sold"]
)
def test_seat_sold_once(story, breakage):
    saga = story.visa
    if breakage == "reservation_cancelled":
        Reservation.objects.filter(pk=saga.reservation_id).update(status="CANCELLED")
    elif breakage == "seat_released":
        Seat.objects.filter(event=story.event, ref="A1").update(status="available")
    elif breakage == "link_ended":
        # A confirmed purchase's seat put back on sale by no refund: its
        # refund (an amount, no seat named) gave back money, not A10.
        saga = story.partly
        ReservationSeat.objects.filter(reservation_id=saga.reservation_id).update(
            released_at=timezone.now()
        )
        Seat.objects.filter(event=story.event, ref="A10").update(status="available")
    else:  # a seat sold to nobody
        Seat.objects.filter(event=story.event, ref="A8").update(status="sold")
        saga = None

    report = audit_run()

    _only(report, "seat_sold_once", saga)
    _command_fails("seat_sold_once", saga)


# --- one_charge_per_intent ----------------------------------------------------------


@pytest.mark.django_db
def test_one_charge_per_intent(story):
    # A second charge at "the processor" (refunded, so the net still agrees).
    FakeCharge.objects.create(
        intent_id=story.visa.intent_id, amount=2500, currency="EUR", status="refunded"
    )
    FakeRefund.objects.create(
        refund_id="whole:second",
        intent_id=story.visa.intent_id,
        amount=2500,
        currency="EUR",
        status="succeeded",
    )

    report = audit_run()

    _only(report, "one_charge_per_intent", story.visa)
    _command_fails("one_charge_per_intent", story.visa)


# --- ledger_equals_gateway ----------------------------------------------------------


@pytest.mark.django_db
def test_ledger_equals_gateway_when_the_gateway_captured_another_amount(story):
    FakeCharge.objects.filter(intent_id=story.reconciled.intent_id).update(amount=2000)

    report = audit_run()

    _only(report, "ledger_equals_gateway", story.reconciled)
    assert "ledger net 2500 != gateway net captured 2000" in report.violations[0].detail
    _command_fails("ledger_equals_gateway", story.reconciled)


@pytest.mark.django_db
def test_ledger_equals_gateway_for_ledger_entries_no_saga_owns(story, gateway):
    LedgerEntry.objects.create(
        intent_id="pi_BOGUS",
        kind="charge",
        amount=2500,
        currency="EUR",
        saga_id=story.visa.pk,
        event_id=story.event.pk,
        created_at=timezone.now(),
    )

    report = audit_run()

    _only(report, "ledger_equals_gateway")
    assert [v.intent_id for v in report.violations] == ["pi_BOGUS"]
    assert ("list_charges", "pi_BOGUS") in gateway.calls
    _command_fails("ledger_equals_gateway")


# --- confirmed_has_one_charge_entry ----------------------------------------------------


@pytest.mark.django_db
def test_a_confirmed_saga_without_its_charge_entry(story):
    LedgerEntry.objects.filter(intent_id=story.visa.intent_id, kind="charge").delete()

    report = audit_run()

    named = [v for v in report.violations if v.invariant == "confirmed_has_one_charge_entry"]
    assert [(v.saga_id, v.detail) for v in named] == [
        (str(story.visa.pk), "CONFIRMED with 0 charge and 0 other ledger entries")
    ]
    # The gateway holds the money the ledger lost, and the seller's report says so.
    assert _invariants(report) == {
        "confirmed_has_one_charge_entry",
        "ledger_equals_gateway",
        "report_equals_ledger",
    }


@pytest.mark.django_db
def test_a_compensated_saga_whose_ledger_does_not_net_zero(story):
    # The refund never happened at the gateway and its ledger entry is void:
    # ledger and gateway agree (2500), but a compensated purchase kept money.
    FakeRefund.objects.filter(intent_id=story.undone.intent_id).delete()
    FakeCharge.objects.filter(intent_id=story.undone.intent_id).update(status="succeeded")
    LedgerEntry.objects.filter(intent_id=story.undone.intent_id, kind="refund").update(amount=0)

    report = audit_run()

    _only(report, "confirmed_has_one_charge_entry", story.undone)
    assert "nets 2500" in report.violations[0].detail
    _command_fails("confirmed_has_one_charge_entry", story.undone)


# --- refunds of a confirmed purchase ----------------------------------------------------


def _refund_of(saga) -> Refund:
    return Refund.objects.get(saga_id=saga.pk)


def _its_entry(refund):
    return LedgerEntry.objects.filter(refund_id=refund.pk)


@pytest.mark.django_db
@pytest.mark.parametrize("breakage", ["entry_names_another_refund", "entry_of_another_amount"])
def test_a_refund_entry_that_is_not_its_refunds(story, breakage):
    refund = _refund_of(story.refunded)
    if breakage == "entry_names_another_refund":
        _its_entry(refund).update(refund_id=uuid.uuid4())
        why = ["not a succeeded one", f"succeeded refund {refund.pk} has 0 ledger entries"]
    else:
        # The row says 4000 went back, its entry 5000 (as the processor).
        Refund.objects.filter(pk=refund.pk).update(amount=4000)
        why = [f"refund {refund.pk} of 4000 has an entry of 5000"]

    report = audit_run()

    _only(report, "refund_entry_mismatch", story.refunded)
    details = " | ".join(v.detail for v in report.violations)
    assert all(w in details for w in why), details
    _command_fails("refund_entry_mismatch", story.refunded)


@pytest.mark.django_db
def test_a_refund_entry_that_names_no_refund_row(story):
    # A refund entry of 0 on a confirmed purchase (the net and the gateway
    # still agree): no refund row of it gave that money back.
    LedgerEntry.objects.create(
        intent_id=story.visa.intent_id,
        kind="refund",
        amount=0,
        currency="EUR",
        saga_id=story.visa.pk,
        event_id=story.event.pk,
        created_at=timezone.now(),
    )

    report = audit_run()

    _only(report, "refund_entry_mismatch", story.visa)
    assert "names no refund row" in report.violations[0].detail


@pytest.mark.django_db
def test_a_refund_row_of_a_purchase_never_confirmed(story):
    _bare_refund(story.declined, amount=100)

    report = audit_run()

    _only(report, "refund_entry_mismatch", story.declined)
    assert "never confirmed" in report.violations[0].detail


@pytest.mark.django_db
def test_refunds_that_owe_more_than_was_paid(story):
    # A second refund of 1 (pending, just opened) beside the 5000 given back.
    _bare_refund(story.refunded, amount=1)

    report = audit_run()

    _only(report, "refund_exceeds_charge", story.refunded)
    assert "add up to 5001, more than the 5000 paid" in report.violations[0].detail
    _command_fails("refund_exceeds_charge", story.refunded)


@pytest.mark.django_db
def test_a_ledger_that_nets_below_zero(story):
    # The charge was 1000 at the processor and in the ledger (which agree),
    # and 5000 went back: the rows, the entries and the processor agree too.
    LedgerEntry.objects.filter(intent_id=story.refunded.intent_id, kind="charge").update(
        amount=1000
    )
    FakeCharge.objects.filter(intent_id=story.refunded.intent_id).update(amount=1000)

    report = audit_run()

    _only(report, "refund_exceeds_charge", story.refunded)
    assert "nets -4000" in report.violations[0].detail


class _RefundsTwice(InProcessFakeGateway):
    """The processor lists one of our refunds twice (made twice, under
    two of its own ids)."""

    def list_refunds(self, intent_ref):
        refunds = super().list_refunds(intent_ref)
        return refunds + [
            GatewayRefund(id="re_again", refund_id=r.refund_id, amount=r.amount, status="failed")
            for r in refunds
        ]


@pytest.mark.django_db
def test_a_refund_made_twice_at_the_processor(story):
    report = audit_run(gateway=_RefundsTwice())

    refund = _refund_of(story.refunded)
    assert _invariants(report) == {"refund_twice_at_processor"}, report.violations
    assert _sagas(report, "refund_twice_at_processor") == {
        str(s.pk) for s in (story.refunded, story.partly, story.undone)
    }
    assert any(f"2 refunds under our refund id {refund.pk}" in v.detail for v in report.violations)


@pytest.mark.django_db
def test_the_processors_refunds_add_up_to_the_ledgers(story):
    # The processor gave back 4000 where the ledger (and the row) say 5000.
    FakeRefund.objects.filter(refund_id=str(_refund_of(story.refunded).pk)).update(amount=4000)

    report = audit_run()

    _only(report, "ledger_equals_gateway", story.refunded)
    assert report.violations[0].detail == (
        "the ledger's refunds add up to 5000, the processor's succeeded refunds to 4000 "
        "(saga CONFIRMED)"
    )


@pytest.mark.django_db
def test_a_partial_refund_is_netted_from_the_processors_refunds(story):
    # The processor's charge of a partly refunded purchase stays "succeeded":
    # only its refunds say it kept 1500 (and the ledger agrees).
    assert FakeCharge.objects.get(intent_id=story.partly.intent_id).status == "succeeded"
    assert audit_run().violations == []

    FakeRefund.objects.filter(intent_id=story.partly.intent_id).update(status="failed")
    report = audit_run()

    _only(report, "ledger_equals_gateway", story.partly)


@pytest.mark.django_db
def test_a_refund_in_flight_is_not_judged_against_the_processor_until_its_deadline(story, settings):
    # Done at the processor, our row still pending (its answer lost, the
    # look-up to come): the ledger lags the processor, for now.
    refund = _refund_of(story.refunded)
    Refund.objects.filter(pk=refund.pk).update(status="pending", settled_at=None)
    _its_entry(refund).delete()
    settled = OutboxMessage.objects.filter(topic="refund.settled", saga_id=story.refunded.pk)
    InboxEntry.objects.filter(message__in=settled).delete()
    settled.delete()
    assert audit_run().violations == []

    story.clock.tick(timedelta(seconds=settings.REFUND_CHASE_SECONDS) + LATER)
    report = audit_run()

    assert _invariants(report) == {"ledger_equals_gateway", "no_silent_stuck"}


@pytest.mark.django_db
def test_a_refund_pending_past_its_deadline_needs_the_chasers_alert(story, settings):
    # Pending (asked, never settled), and the chaser's timer never delivered.
    refund = Refund.objects.create(
        saga_id=story.visa.pk,
        event_id=story.event.pk,
        amount=1000,
        currency="EUR",
        source="operator",
        public_reason="-",
        asked=True,
        created_at=timezone.now(),
        updated_at=timezone.now(),
    )
    story.clock.tick(timedelta(seconds=settings.REFUND_CHASE_SECONDS) - timedelta(minutes=1))
    assert audit_run().violations == []  # before its deadline: on its way
    story.clock.tick(LATER)

    report = audit_run()

    _only(report, "no_silent_stuck", story.visa)
    assert f"refund {refund.pk} of 1000 pending" in report.violations[0].detail
    assert refund_chase(refund_id=refund.pk, event_id=story.event.pk)
    assert audit_run().violations == []  # the alert names it


class _SettlesMeanwhile(InProcessFakeGateway):
    """While the auditor asks the processor about an intent, the refund of
    its purchase settles (its look-up, on another worker)."""

    def __init__(self, refund):
        super().__init__()
        self.settling = refund

    def list_charges(self, intent_id):
        if self.settling is not None and intent_id == self.settling.saga.intent_id:
            refund, self.settling = self.settling, None
            refund_execute(refund_id=refund.pk, event_id=refund.event_id, gateway=self)
        return super().list_charges(intent_id)


@pytest.mark.django_db
def test_a_refund_that_settles_while_the_auditor_reads_is_left_to_the_next_run(story, settings):
    # Pending past its deadline (its request never reached the processor;
    # the chaser alerted): judged, not in flight.
    faulty = FaultyGateway()
    faulty.down("create_refund", times=1)
    with override_gateway(faulty):
        organizer_refund(
            organizer=story.event.organizer,
            saga_id=story.visa.pk,
            user=story.visa.buyer,
            reason="late",
            amount=1000,
        )
        drain_outbox(now=timezone.now())
    refund = Refund.objects.get(saga_id=story.visa.pk)
    assert (refund.status, refund.asked) == ("pending", True)
    story.clock.tick(timedelta(seconds=settings.REFUND_CHASE_SECONDS) + LATER)
    assert refund_chase(refund_id=refund.pk, event_id=story.event.pk)

    report = audit_run(gateway=_SettlesMeanwhile(refund))

    assert Refund.objects.get(pk=refund.pk).status == "succeeded"
    # Read pending with no entry, then the processor's refund: a mix the
    # auditor does not judge.
    assert report.violations == []
    assert report.sagas_skipped == 1
    assert audit_run().violations == []  # the next run, settled


@pytest.mark.django_db
def test_a_cancelled_event_nets_zero_once_its_run_is_done(story):
    # Written as done while two confirmed purchases still hold their money.
    EventCancellation.objects.create(
        event=story.event,
        reason="storm",
        status="done",
        rate=20,
        tick_due=timezone.now(),
        created_at=timezone.now(),
        updated_at=timezone.now(),
        finished_at=timezone.now(),
    )

    report = audit_run()

    assert _invariants(report) == {"cancelled_event_not_refunded"}
    # The refunded purchase nets zero; the partly refunded one does not.
    assert _sagas(report, "cancelled_event_not_refunded") == {
        str(s.pk) for s in (story.visa, story.reconciled, story.partly)
    }
    assert any("still nets 1500" in v.detail for v in report.violations)
    _command_fails("cancelled_event_not_refunded", story.visa)


@pytest.mark.django_db
def test_a_cancelled_events_run_leaves_a_clean_audit(story, alice):
    event_cancel(
        organizer=story.event.organizer, event_id=story.event.pk, reason="storm", user=alice
    )
    for _ in range(10):
        story.clock.tick(1)
        drain_outbox()
    assert EventCancellation.objects.get(event=story.event).status == "done"
    assert {s.state for s in PurchaseSaga.objects.all()} == {"CONFIRMED", "COMPENSATED"}

    assert audit_run().violations == []


# --- emails_exactly_once ---------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("which", ["confirmation", "cancellation", "refund"])
def test_an_email_never_sent_is_a_violation_once_it_is_overdue(story, which):
    saga, consumer = {
        "confirmation": (story.visa, CONFIRMATION_EMAIL),
        "cancellation": (story.declined, CANCELLATION_EMAIL),
        "refund": (story.refunded, REFUND_EMAIL),
    }[which]
    InboxEntry.objects.filter(message__saga_id=saga.pk, consumer=consumer).delete()

    assert audit_run().violations == []  # still young: it may be on its way
    story.clock.tick(LATER)
    report = audit_run()

    _only(report, "emails_exactly_once", saga)
    assert "not processed" in report.violations[0].detail
    _command_fails("emails_exactly_once", saga)


@pytest.mark.django_db
def test_two_confirmation_messages_for_one_saga(story):
    first = OutboxMessage.objects.get(topic="purchase.confirmed", saga_id=story.visa.pk)
    second = OutboxMessage.objects.create(
        topic="purchase.confirmed",
        payload=first.payload,
        saga_id=story.visa.pk,
        event_id=story.event.pk,
        created_at=timezone.now(),
        available_at=timezone.now(),
        completed_at=timezone.now(),
    )
    InboxEntry.objects.create(
        consumer=CONFIRMATION_EMAIL, message=second, processed_at=timezone.now()
    )

    report = audit_run()

    _only(report, "emails_exactly_once", story.visa)
    assert report.violations[0].detail == "2 purchase.confirmed messages"
    _command_fails("emails_exactly_once", story.visa)


# --- no_silent_stuck -------------------------------------------------------------------


@pytest.mark.django_db
def test_a_saga_left_in_payment_failed_with_no_timer_is_silently_stuck(story, alice):
    # The worker recorded the decline and died before compensating; the hold
    # timer does not count (on an old saga it is long overdue).
    saga = start_purchase(alice, story.event, seats=["A7"])
    saga_transition(saga_id=saga.pk, to=SagaState.CHARGING, reason="charge started")
    saga_transition(saga_id=saga.pk, to=SagaState.PAYMENT_FAILED, reason="charge declined")
    story.clock.tick(60)
    assert audit_run().violations == []  # young: it may still be moving

    story.clock.tick(LATER)
    report = audit_run()

    _only(report, "no_silent_stuck", saga)
    assert "PAYMENT_FAILED" in report.violations[0].detail
    _command_fails("no_silent_stuck", saga)


@pytest.mark.django_db
def test_a_saga_inside_its_events_longer_hold_is_not_stuck(story, alice, settings):
    # given: an event that holds seats for two hours, past PURCHASE_HOLD_SECONDS
    # (300 s here) and RESUME_AFTER_SECONDS; a purchase left PENDING an hour
    Event.objects.filter(pk=story.event.pk).update(hold_seconds=7200)
    saga = start_purchase(alice, story.event, seats=["A7"])
    story.clock.tick(3600)

    # then: inside its hold, nothing to say; past it and the resumer's delay, stuck
    assert [v for v in audit_run().violations if v.saga_id == str(saga.pk)] == []
    story.clock.tick(3600 + settings.RESUME_AFTER_SECONDS + 60)
    assert "no_silent_stuck" in {
        v.invariant for v in audit_run().violations if v.saga_id == str(saga.pk)
    }


@pytest.mark.django_db
def test_a_saga_waiting_on_its_reconcile_timer_is_not_stuck_until_the_timer_is_overdue(
    story, alice
):
    saga = start_purchase(alice, story.event, seats=["A7"], payment_method="pm_card_unreachable")
    assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"  # probe armed at +60 s
    story.clock.tick(30)

    assert audit_run(stuck_after_seconds=10).violations == []  # on schedule

    story.clock.tick(120)  # the probe was due 90 s ago and nobody delivered it
    report = audit_run(stuck_after_seconds=10)
    _only(report, "no_silent_stuck", saga)


@pytest.mark.django_db
def test_an_escalated_saga_is_not_silent_while_an_alert_names_it(story, alice, settings):
    settings.PURCHASE_HOLD_SECONDS = 4 * 3600
    saga = start_purchase(alice, story.event, seats=["A7"], payment_method="pm_card_unreachable")
    saga_charge(saga_id=saga.pk)
    for offset in BACKOFF:
        story.clock.tick(offset)
        drain_outbox()
    assert _fresh(saga).state == "UNKNOWN_EXPIRED"
    story.clock.tick(3600)

    assert audit_run(stuck_after_seconds=600).violations == []

    alert = OutboxMessage.objects.get(topic="purchase.needs_operator", saga_id=saga.pk)
    InboxEntry.objects.filter(message=alert).delete()
    alert.delete()
    report = audit_run(stuck_after_seconds=600)
    _only(report, "no_silent_stuck", saga)
    assert "no alert names it" in report.violations[0].detail


# --- unknown_never_compensated_blind --------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("actor", ["system", "operator"])
def test_an_unknown_saga_compensated_without_a_definitive_answer(story, alice, actor):
    saga = start_purchase(alice, story.event, seats=["A7"], payment_method="pm_card_unreachable")
    assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"
    # Released on an assumption: no look-up, no cancel at the gateway.
    by = By.operator("carol") if actor == "operator" else By(actor)
    saga_transition(saga_id=saga.pk, to=SagaState.EXPIRED, reason="assumed", by=by)
    saga_compensate(saga_id=saga.pk, by=by)
    drain_outbox()
    assert _fresh(saga).state == "COMPENSATED"

    report = audit_run()

    if actor == "operator":  # a named operator's decision (the runbook) is not blind
        assert report.violations == []
        return
    _only(report, "unknown_never_compensated_blind", saga)
    _command_fails("unknown_never_compensated_blind", saga)


@pytest.mark.django_db
def test_a_refund_after_an_operator_settled_the_unknown_is_not_blind(story, alice):
    saga = start_purchase(
        alice, story.event, seats=["A7"], payment_method="pm_card_timeout_charged"
    )
    assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"
    saga_transition(saga_id=saga.pk, to=SagaState.UNKNOWN_EXPIRED, reason="probes exhausted")
    # No look-up ever answered; the operator saw the charge and confirmed it.
    action_run(
        saga_id=saga.pk,
        action=Action.CONFIRM_MANUAL,
        operator="carol",
        reason="charge seen in the processor's dashboard",
    )
    # Refunded later: a refund row (the saga stays CONFIRMED), its first
    # request lost on the way (it never reached the processor).
    faulty = FaultyGateway()
    faulty.down("create_refund", times=1)
    with override_gateway(faulty):
        purchase_refund(saga_id=saga.pk, reason="customer asked", by=SYSTEM)
        drain_outbox()
        story.clock.tick(60)  # the look-up finds none: asked again, same key
        drain_outbox()
    assert _fresh(saga).state == "CONFIRMED"
    assert Refund.objects.get(saga_id=saga.pk).status == "succeeded"
    assert [m for m, _ in faulty.calls if "refund" in m] == [
        "create_refund",
        "retrieve_refund",
        "create_refund",
    ]

    assert audit_run().violations == []


@pytest.mark.django_db
def test_the_hold_expiry_cancel_is_the_definitive_answer_that_allows_compensation(story):
    # Without the stored evidence of the cancel, the compensation looks blind.
    probes = GatewayAnswer.objects.filter(saga=story.expired_unknown)
    assert probes.filter(asked="cancel", answer="canceled").exists()
    probes.exclude(asked="charge").delete()

    report = audit_run()

    _only(report, "unknown_never_compensated_blind", story.expired_unknown)


# --- the gateway cannot answer --------------------------------------------------------


class _GatewayDownFor(InProcessFakeGateway):
    def __init__(self, intent_id=None):
        super().__init__()
        self.down_for = intent_id  # None: every intent
        self.lost = 0

    def list_charges(self, intent_id):
        if self.down_for in (None, intent_id):
            self.lost += 1
            raise GatewayUnavailable("list charges: timeout")
        return super().list_charges(intent_id)


@pytest.mark.django_db
def test_an_intent_the_gateway_cannot_answer_about_is_reported_not_fatal(story):
    gateway = _GatewayDownFor(story.visa.intent_id)

    report = audit_run(gateway=gateway)

    assert report.violations == [] and not report.complete
    assert [(u.saga_id, u.intent_id) for u in report.unverified] == [
        (str(story.visa.pk), story.visa.intent_id)
    ]
    assert report.sagas_checked == 7
    assert report.intents_checked == 7
    assert len([c for c in gateway.calls if c[0] == "list_charges"]) == 6  # + the one lost
    assert "list charges: timeout" in report.unverified[0].detail
    assert report.run_id is not None
    run = AuditRun.objects.get(pk=report.run_id)
    assert (run.violations, run.unverified) == (0, 1)


@pytest.mark.django_db
def test_a_gateway_that_stays_down_is_not_asked_about_every_intent(story, monkeypatch):
    monkeypatch.setattr("purchases.ops.audit.context.GATEWAY_FAILURES_BEFORE_GIVING_UP", 2)
    gateway = _GatewayDownFor()

    report = audit_run(gateway=gateway)

    assert gateway.lost == report.intents_checked == 2
    assert len(report.unverified) == 7
    assert report.violations == []
    assert sum("not asked" in u.detail for u in report.unverified) == 5


# --- cost --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_pending_sagas_are_not_asked_and_chunks_cover_every_saga(story, alice, gateway):
    pending = start_purchase(alice, story.event, seats=["A7"])
    gateway.calls.clear()

    report = audit_run(chunk_size=2)

    assert report.violations == []
    assert report.sagas_checked == 8
    asked = [c[1] for c in gateway.calls if c[0] == "list_charges"]
    assert len(asked) == len(set(asked)) == 7 and pending.intent_id not in asked


class _CountingGateway(InProcessFakeGateway):
    """The in-process fake's own queries stand for HTTP calls to the processor:
    counted apart from the auditor's."""

    def __init__(self):
        super().__init__()
        self.queries = 0

    def list_charges(self, intent_id):
        before = len(connection.queries)
        try:
            return super().list_charges(intent_id)
        finally:
            self.queries += len(connection.queries) - before

    def list_refunds(self, intent_ref):
        before = len(connection.queries)
        try:
            return super().list_refunds(intent_ref)
        finally:
            self.queries += len(connection.queries) - before


def _audit_queries() -> int:
    audit_run()  # warm: the heartbeat row exists from now on
    gateway = _CountingGateway()
    with CaptureQueriesContext(connection) as ctx:
        audit_run(gateway=gateway)
    return len(ctx.captured_queries) - gateway.queries


@pytest.mark.django_db
def test_the_number_of_queries_does_not_grow_with_the_number_of_sagas(alice, gateway):
    event = EventFactory(seats=[f"A{n}" for n in range(1, 9)])
    with freeze_time(T0):
        for ref in ("A1", "A2"):
            saga_charge(saga_id=start_purchase(alice, event, seats=[ref]).pk)
        drain_outbox()
        few = _audit_queries()
        for ref in ("A3", "A4", "A5", "A6", "A7", "A8"):
            saga_charge(saga_id=start_purchase(alice, event, seats=[ref]).pk)
        drain_outbox()
        many = _audit_queries()

    assert few == many


# --- an audit that cannot reach the gateway is incomplete, not a violation ------------


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db
def test_an_audit_that_cannot_reach_the_gateway_is_incomplete_not_a_violation(story, client):
    from payments.gateway import HttpPaymentGateway

    url = f"http://127.0.0.1:{_closed_port()}/fake-gateway/v1"
    out = StringIO()
    with override_gateway(HttpPaymentGateway(base_url=url, timeout=0.5)):
        with pytest.raises(CommandError) as failed:
            call_command("audit_sagas", stdout=out)

    text = out.getvalue()
    assert failed.value.returncode == 2, "could not check is not a violation (exit 1)"
    assert "0 violation(s)" in text and "incomplete" in text and url in text
    run = AuditRun.objects.get()
    assert run.violations == 0 and run.report == []
    assert run.unverified == 7 and run.gateway_url == url
    metrics = client.get("/metrics").content.decode()
    assert "boxoffice_audit_violations 0.0" in metrics
    assert "boxoffice_audit_unverified_intents 7.0" in metrics


@pytest.mark.django_db
def test_before_any_audit_the_metrics_do_not_claim_zero_violations(client):
    samples = [
        line
        for line in client.get("/metrics").content.decode().splitlines()
        if line.startswith("boxoffice_audit_")
    ]

    assert samples == []
