"""UNKNOWN outcomes are reconciled, never compensated blind; the hold expiry
is an obligation whose consumer decides from the saga's state; compensation
runs in reverse order and is idempotent; a confirmed purchase's refund is a
row of its own, asked of the processor after its commit (docs/refunds.md)."""

import logging
from datetime import timedelta

import pytest
from django.core import mail
from django.db.models import F, Sum
from django.utils import timezone
from freezegun import freeze_time

from ledger.models import LedgerEntry
from outbox.delivery import message_deliver
from outbox.models import OutboxMessage
from outbox.relay import relay_tick
from payments.fake_gateway.models import FakeCharge, FakeIntent
from purchases.models import GatewayAnswer, PurchaseSaga, Refund, Seat
from purchases.refunds.errors import RefundExceedsPaid
from purchases.saga.states import SagaState
from purchases.services import (
    By,
    purchase_refund,
    saga_charge,
    saga_compensate,
    saga_expire_hold,
    saga_reconcile,
    saga_transition,
)

from .conftest import drain_outbox, start_purchase
from .late_charge import charged_while_undone

T0 = "2026-12-02 12:00:00"
BACKOFF = [60, 120, 240, 480, 960, 1920]


def _state(saga):
    return PurchaseSaga.objects.get(pk=saga.pk).state


def _seat(event, ref="A1"):
    return Seat.objects.get(event=event, ref=ref).status


def _charges(saga):
    return FakeCharge.objects.filter(intent_id=saga.intent_id).count()


def _gateway_net(saga):
    captured = (
        FakeCharge.objects.filter(intent_id=saga.intent_id, status="succeeded").aggregate(
            n=Sum("amount")
        )["n"]
        or 0
    )
    return captured


def _ledger_net(saga):
    return LedgerEntry.objects.filter(intent_id=saga.intent_id).aggregate(n=Sum("amount"))["n"] or 0


@pytest.fixture
def long_hold(settings):
    # Reconciliation runs for an hour in total; keep the hold out of its way.
    settings.PURCHASE_HOLD_SECONDS = 4 * 3600
    settings.RECONCILE_BACKOFF_SECONDS = BACKOFF


# --- reconciliation -------------------------------------------------------


@pytest.mark.django_db
def test_timeout_but_charged_is_reconciled_to_confirmed_with_one_charge(
    alice, event, gateway, long_hold
):
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
        assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"
        assert _charges(saga) == 1  # it did land, we just did not hear

        clock.tick(59)
        assert drain_outbox() == []  # not before the first offset
        clock.tick(1)
        drain_outbox()

    assert _state(saga) == "CONFIRMED"
    assert _charges(saga) == 1
    assert [c[0] for c in gateway.calls] == ["charge", "retrieve"]  # looked up, not re-sent
    assert _seat(event) == "sold"
    assert _ledger_net(saga) == _gateway_net(saga) == 2500
    probe = GatewayAnswer.objects.get(saga=saga, asked="retrieve")
    assert (probe.answer, probe.attempt) == ("succeeded", 1)


@pytest.mark.django_db
def test_timeout_not_charged_is_charged_again_with_the_same_key(alice, event, gateway, long_hold):
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_timeout_not_charged")
        assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"
        assert _charges(saga) == 0
        clock.tick(60)
        drain_outbox()

    assert _state(saga) == "CONFIRMED"
    assert _charges(saga) == 1
    assert [c[0] for c in gateway.calls] == ["charge", "retrieve", "charge"]
    assert PurchaseSaga.objects.get(pk=saga.pk).attempts == 2
    assert _ledger_net(saga) == _gateway_net(saga)


@pytest.mark.django_db
def test_backoff_probes_at_the_configured_offsets_then_escalates(
    alice, event, faulty_gateway, long_hold, caplog
):
    faulty_gateway.down("retrieve")
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_unreachable")
        saga_charge(saga_id=saga.pk)
        started = timezone.now()
        elapsed = 0
        for n, offset in enumerate(BACKOFF, start=1):
            clock.tick(offset - 1)
            assert drain_outbox() == [], f"probe {n} fired early"
            clock.tick(1)
            elapsed += offset
            delivered = drain_outbox()
            assert [m.topic for m in delivered].count("purchase.reconcile") == 1
            probe = GatewayAnswer.objects.filter(saga=saga, asked="retrieve").latest("id")
            assert probe.attempt == n
            assert probe.at == started + timedelta(seconds=elapsed)

    stored = PurchaseSaga.objects.get(pk=saga.pk)
    assert stored.state == "UNKNOWN_EXPIRED"
    assert GatewayAnswer.objects.filter(saga=saga, asked="retrieve").count() == 6
    assert (
        OutboxMessage.objects.filter(topic="purchase.needs_operator", saga_id=saga.pk).count() == 1
    )
    alerts = [
        r
        for r in caplog.records
        if r.levelno == logging.ERROR and getattr(r, "saga_id", None) == str(saga.pk)
    ]
    assert alerts, "an ERROR log line naming the saga"
    assert _seat(event) == "held"  # nothing released on an assumption


@pytest.mark.django_db
def test_an_unknown_saga_is_never_compensated_blind(alice, event, gateway, long_hold):
    saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
    saga_charge(saga_id=saga.pk)

    result = saga_compensate(saga_id=saga.pk)

    assert result.state == "UNKNOWN"
    assert _seat(event) == "held"
    assert not [c for c in gateway.calls if c[0] == "refund"]


# --- the hold expires -------------------------------------------------------


@pytest.mark.django_db
def test_red_expiry_of_a_paid_unknown_saga_confirms_instead_of_freeing_the_seat(
    alice, event, faulty_gateway, settings
):
    # given: the gateway charged, but every look-up is lost, and the hold runs out
    settings.PURCHASE_HOLD_SECONDS = 30
    faulty_gateway.down("retrieve")
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
        saga_charge(saga_id=saga.pk)
        assert _state(saga) == "UNKNOWN"

        # when: the expiry fires
        clock.tick(30)
        delivered = drain_outbox()

    # then: the gateway's definitive answer (already charged) wins
    assert "purchase.hold_expired" in [m.topic for m in delivered]
    assert _state(saga) == "CONFIRMED"
    assert _seat(event) == "sold"
    assert _charges(saga) == 1
    assert _ledger_net(saga) == _gateway_net(saga) == 2500
    assert ("cancel", saga.intent_id) in faulty_gateway.calls


@pytest.mark.django_db
def test_unreachable_stays_unknown_until_the_hold_then_cancels_and_compensates(
    alice, event, gateway, settings
):
    settings.PURCHASE_HOLD_SECONDS = 900
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_unreachable")
        saga_charge(saga_id=saga.pk)
        for _ in range(14):  # reconcile probes and retries within the hold
            clock.tick(60)
            drain_outbox()
            if timezone.now() < saga.reservation.hold_expires_at:
                assert _state(saga) in ("UNKNOWN", "CHARGING"), "compensated while unknown"
                assert _seat(event) == "held"
        clock.tick(120)
        drain_outbox()

    assert _state(saga) == "COMPENSATED"
    assert FakeIntent.objects.get(pk=saga.intent_id).status == "canceled"
    assert _seat(event) == "available"
    assert _charges(saga) == 0 and _ledger_net(saga) == 0
    assert len(mail.outbox) == 1 and "did not go through" in mail.outbox[0].subject


@pytest.mark.django_db
def test_expiry_with_the_gateway_unreachable_waits_and_asks_again(
    alice, event, faulty_gateway, settings
):
    settings.PURCHASE_HOLD_SECONDS = 30
    settings.RECONCILE_BACKOFF_SECONDS = BACKOFF
    faulty_gateway.down("charge")
    faulty_gateway.down("retrieve")
    faulty_gateway.down("cancel", times=2)
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)
        saga_charge(saga_id=saga.pk)
        clock.tick(30)
        drain_outbox()  # cancel lost: stays
        assert _state(saga) == "UNKNOWN" and _seat(event) == "held"
        clock.tick(30)  # the first reconcile probe (lost) ...
        drain_outbox()
        clock.tick(30)  # ... and the second expiry check at +60 (lost)
        drain_outbox()
        assert _state(saga) == "UNKNOWN" and _seat(event) == "held"
        clock.tick(120)
        drain_outbox()

    assert _state(saga) == "COMPENSATED"
    assert [c[0] for c in faulty_gateway.calls].count("cancel") == 3
    assert _seat(event) == "available"


@pytest.mark.django_db
def test_an_expiry_check_delivered_again_after_a_crash_arms_its_successor_once(
    alice, event, faulty_gateway, settings
):
    # Found by the stateful test: the worker that ran the expiry check died
    # before the inbox entry; the redelivery asked the gateway again and then
    # failed on the already-armed next check (a unique key) forever.
    from outbox.models import InboxEntry

    settings.PURCHASE_HOLD_SECONDS = 30
    settings.RECONCILE_BACKOFF_SECONDS = BACKOFF
    faulty_gateway.down("charge")
    faulty_gateway.down("retrieve")
    faulty_gateway.down("cancel")
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)
        saga_charge(saga_id=saga.pk)
        clock.tick(30)
        (check,) = [m for m in drain_outbox() if m.key == f"hold:{saga.pk}"]
        InboxEntry.objects.filter(message=check).delete()
        OutboxMessage.objects.filter(pk=check.pk).update(completed_at=None)

        assert message_deliver(message_id=check.pk) == "delivered"

    retries = OutboxMessage.objects.filter(key__startswith=f"hold:{saga.pk}:retry:")
    assert list(retries.values_list("key", flat=True)) == [f"hold:{saga.pk}:retry:1"]
    assert _state(saga) == "UNKNOWN" and _seat(event) == "held"


@pytest.mark.django_db
def test_a_charge_that_meets_an_intent_canceled_by_a_crashed_expiry_unwinds(alice, event, gateway):
    # Found by the stateful test (1,000 examples): the expiry's cancel reached
    # the processor and its worker died before recording the answer; the
    # charge task then runs. The processor refuses the charge, so nothing can
    # land: the saga unwinds and the seat goes back on sale, with no charge.
    from payments.fake_gateway import services as fake

    saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
    fake.intent_cancel(intent_id=saga.intent_id)

    saga = saga_charge(saga_id=saga.pk)

    assert saga.state == "COMPENSATED"
    assert FakeCharge.objects.filter(intent_id=saga.intent_id).count() == 0
    assert LedgerEntry.objects.filter(intent_id=saga.intent_id).count() == 0
    assert _seat(event) == "available"


# --- Seed 000's four properties ---------------------------------------------


@pytest.mark.django_db
def test_property_1_duplicate_submission_one_payment_request_one_timer_one_saga(
    alice_api, event, gateway, django_capture_on_commit_callbacks, monkeypatch
):
    from purchases.saga import start

    # The broker boundary, replaced by running the task body in-process.
    monkeypatch.setattr(start, "publish_charge", lambda saga_id: saga_charge(saga_id=saga_id))
    body = {"event": event.pk, "seats": ["A1"], "payment_method": "pm_card_visa"}
    with django_capture_on_commit_callbacks(execute=True):
        first = alice_api.post("/api/purchases/", body, format="json", HTTP_IDEMPOTENCY_KEY="dup")
        second = alice_api.post("/api/purchases/", body, format="json", HTTP_IDEMPOTENCY_KEY="dup")

    assert first.status_code == second.status_code == 202
    assert first.json() == second.json()
    assert PurchaseSaga.objects.count() == 1
    assert OutboxMessage.objects.filter(topic="purchase.hold_expired").count() == 1
    assert [c[0] for c in gateway.calls] == ["charge"]


@pytest.mark.django_db
def test_property_2_a_timer_cancelled_in_the_confirming_commit_is_never_delivered(
    alice, event, gateway, settings
):
    settings.PURCHASE_HOLD_SECONDS = 60
    with freeze_time(T0) as clock:
        saga = saga_charge(saga_id=start_purchase(alice, event).pk)
        timers = list(OutboxMessage.objects.filter(topic="purchase.hold_expired"))
        assert len(timers) == 1 and timers[0].cancelled_at is not None

        clock.tick(3600)
        handed: list[int] = []
        # a bounded delivery pass that must find nothing
        for _ in range(3):
            relay_tick(dispatch=handed.append)

    assert not [
        m for m in handed if OutboxMessage.objects.get(pk=m).topic == "purchase.hold_expired"
    ]
    assert OutboxMessage.objects.get(pk=timers[0].pk).fired_at is None
    assert _state(saga) == "CONFIRMED"


@pytest.mark.django_db
def test_property_3_a_declined_purchase_is_unwound_by_its_timer_alone(
    alice, event, gateway, settings
):
    settings.PURCHASE_HOLD_SECONDS = 60
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_chargeDeclined")
        # The worker recorded the decline and died before compensating: no
        # request and no worker of this purchase is alive any more.
        saga_transition(saga_id=saga.pk, to=SagaState.CHARGING, reason="charge started")
        saga_transition(saga_id=saga.pk, to=SagaState.PAYMENT_FAILED, reason="charge declined")
        clock.tick(60)
        drain_outbox()

    assert _state(saga) == "COMPENSATED"
    assert _seat(event) == "available"
    assert len(mail.outbox) == 1


@pytest.mark.django_db
def test_property_4_a_confirmed_purchase_whose_cancel_was_skipped_refuses_its_expiry(
    alice, event, gateway, settings
):
    settings.PURCHASE_HOLD_SECONDS = 60
    with freeze_time(T0) as clock:
        saga = saga_charge(saga_id=start_purchase(alice, event).pk)
        # The cancel is deliberately skipped: the timer is still armed.
        OutboxMessage.objects.filter(key=f"hold:{saga.pk}").update(
            cancelled_at=None, due_at=F("available_at")
        )
        clock.tick(60)
        delivered = drain_outbox()

    assert "purchase.hold_expired" in [m.topic for m in delivered]
    stored = PurchaseSaga.objects.get(pk=saga.pk)
    assert stored.state == "CONFIRMED" and stored.version == saga.version
    assert stored.history.filter(reason="expiry refused: confirmed").count() == 1
    assert _seat(event) == "sold"
    assert ("cancel", saga.intent_id) not in gateway.calls
    assert not [c for c in gateway.calls if c[0] == "refund"]


# --- compensation -----------------------------------------------------------


@pytest.mark.django_db
def test_refund_of_a_confirmed_purchase_is_a_refund_row_asked_after_its_commit(
    alice, event, faulty_gateway
):
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    drain_outbox()
    mail.outbox.clear()
    seen: dict = {}

    def at_refund(intent_id):
        refund = Refund.objects.get(saga_id=saga.pk)
        seen.update(
            seat=_seat(event),
            refund=(refund.status, refund.asked),
            ledger=_ledger_net(saga),
            emails=len(mail.outbox),
        )

    faulty_gateway.before["create_refund"] = at_refund

    result = purchase_refund(saga_id=saga.pk, reason="customer asked", by=By.operator("carol"))
    after_commit = {
        "seat": _seat(event),
        "asked": [c for c in faulty_gateway.calls if "refund" in c[0]],
    }
    drain_outbox()

    # The row and its seats back on sale in one commit; nothing asked yet.
    assert result.state == "CONFIRMED"
    assert after_commit == {"seat": "available", "asked": []}
    # Asked after that commit (the row committed, marked asked), the money
    # still in the ledger and no email until the processor says it is done.
    assert seen == {"seat": "available", "refund": ("pending", True), "ledger": 2500, "emails": 0}
    refund = Refund.objects.get(saga_id=saga.pk)
    assert (refund.status, refund.amount, refund.source) == ("succeeded", 2500, "operator")
    assert len(mail.outbox) == 1 and mail.outbox[0].subject.startswith("Refund of 25.00 EUR")
    assert _state(saga) == "CONFIRMED"
    assert _ledger_net(saga) == 0
    assert _gateway_net(saga) == 0
    assert list(
        LedgerEntry.objects.filter(intent_id=saga.intent_id).values_list(
            "kind", "amount", "refund_id"
        )
    ) == [("charge", 2500, None), ("refund", -2500, refund.pk)]
    note = PurchaseSaga.objects.get(pk=saga.pk).history.latest("id")
    assert (note.to_state, note.actor, note.actor_name) == ("CONFIRMED", "operator", "carol")


@pytest.mark.django_db
def test_a_compensation_that_owes_a_refund_runs_in_reverse_order(alice, event, faulty_gateway):
    saga = charged_while_undone(alice, event)
    mail.outbox.clear()
    seen = {}

    def at_refund(intent_id):
        seen["seat"] = _seat(event)
        seen["cancelled_events"] = OutboxMessage.objects.filter(topic="purchase.cancelled").count()
        seen["emails"] = len(mail.outbox)

    faulty_gateway.before["refund"] = at_refund

    result = saga_compensate(saga_id=saga.pk, by=By.operator("carol"))
    after_commit = {
        "seat": _seat(event),
        "cancelled_events": OutboxMessage.objects.filter(topic="purchase.cancelled").count(),
        "emails": len(mail.outbox),
    }
    drain_outbox()

    # refund first (seats still held, no event, no email) ...
    assert seen == {"seat": "held", "cancelled_events": 0, "emails": 0}
    # ... then seats and event in one commit, the email only after it
    assert after_commit == {"seat": "available", "cancelled_events": 1, "emails": 0}
    assert len(mail.outbox) == 1
    assert result.state == "COMPENSATED"
    assert _ledger_net(saga) == 0
    assert _gateway_net(saga) == 0
    assert list(
        LedgerEntry.objects.filter(intent_id=saga.intent_id).values_list("kind", "amount")
    ) == [("charge", 2500), ("refund", -2500)]
    last = PurchaseSaga.objects.get(pk=saga.pk).history.get(to_state="COMPENSATING")
    assert (last.actor, last.actor_name) == ("operator", "carol")


@pytest.mark.django_db
def test_a_refund_not_confirmed_waits_in_compensation_pending_and_retries(
    alice, event, faulty_gateway, settings
):
    settings.RECONCILE_BACKOFF_SECONDS = BACKOFF
    with freeze_time(T0) as clock:
        saga = charged_while_undone(alice, event)
        faulty_gateway.down("refund", times=1)

        assert saga_compensate(saga_id=saga.pk).state == "COMPENSATION_PENDING"
        assert _seat(event) == "held"  # nothing released before the money is back
        clock.tick(60)
        drain_outbox()

    assert _state(saga) == "COMPENSATED"
    assert _ledger_net(saga) == _gateway_net(saga) == 0
    assert LedgerEntry.objects.filter(intent_id=saga.intent_id, kind="refund").count() == 1


# --- every handler delivered twice ---------------------------------------------


@pytest.mark.django_db
def test_every_handler_delivered_twice_ends_the_same(alice, bob, event, faulty_gateway, long_hold):
    with freeze_time(T0) as clock:
        # charge twice
        confirmed = start_purchase(alice, event, seats=["A1"])
        saga_charge(saga_id=confirmed.pk)
        saga_charge(saga_id=confirmed.pk)
        # reconcile twice (same probe delivered twice)
        unknown = start_purchase(bob, event, seats=["A2"], payment_method="pm_card_timeout_charged")
        saga_charge(saga_id=unknown.pk)
        saga_reconcile(saga_id=unknown.pk, attempt=1)
        saga_reconcile(saga_id=unknown.pk, attempt=1)
        # expiry twice on a declined one and compensation twice
        declined = start_purchase(
            alice, event, seats=["A3"], payment_method="pm_card_chargeDeclined"
        )
        saga_charge(saga_id=declined.pk)
        saga_expire_hold(saga_id=declined.pk)
        saga_expire_hold(saga_id=declined.pk)
        saga_compensate(saga_id=declined.pk)
        # refund twice: one refund row (nothing is left for a second), and a
        # compensation asked of the confirmed purchase does nothing
        assert _state(unknown) == "CONFIRMED"
        purchase_refund(saga_id=unknown.pk, reason="r")
        with pytest.raises(RefundExceedsPaid):
            purchase_refund(saga_id=unknown.pk, reason="r")
        saga_compensate(saga_id=unknown.pk)
        # every outbox message delivered twice
        clock.tick(10)
        drain_outbox()
        for message in OutboxMessage.objects.all():
            OutboxMessage.objects.filter(pk=message.pk).update(completed_at=None)
            message_deliver(message_id=message.pk)

    assert _state(confirmed) == "CONFIRMED"
    assert _state(unknown) == "CONFIRMED"
    assert _state(declined) == "COMPENSATED"
    assert Refund.objects.get(saga_id=unknown.pk).status == "succeeded"
    for saga in (confirmed, unknown, declined):
        for kind in ("charge", "refund"):
            assert LedgerEntry.objects.filter(intent_id=saga.intent_id, kind=kind).count() <= 1
        assert _ledger_net(saga) == _gateway_net(saga)
        assert _charges(saga) <= 1
    assert _ledger_net(unknown) == 0
    assert [c for c in faulty_gateway.calls if c[0] == "create_refund"] == [
        ("create_refund", unknown.intent_id)
    ]
    subjects = sorted(m.subject.split(":")[0] for m in mail.outbox)
    assert subjects == sorted(
        [
            "Your tickets",
            "Your tickets",
            "Refund of 25.00 EUR",
            "Your purchase did not go through",
        ]
    )
