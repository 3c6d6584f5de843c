"""Time in the saga: a charge never starts after its hold ran out, every
history row carries the moment of its own commit, and a charge found by a
look-up (rather than answered by the charge call) is recorded with its
reference, as a charge answered directly is."""

from datetime import UTC, datetime, timedelta

import pytest
from freezegun import freeze_time

from ledger.models import LedgerEntry
from payments.fake_gateway.models import FakeCharge, FakeIntent
from purchases.models import PurchaseSaga, SagaHistory, Seat
from purchases.ops.runbook import Action, action_run
from purchases.ops.sweeps import sweep_resume
from purchases.saga.states import SagaState
from purchases.services import saga_charge, saga_expire_hold, saga_reconcile, saga_transition

from .conftest import drain_outbox, start_purchase

T0 = "2026-12-02 12:00:00"
START = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
HOLD = 900


@pytest.fixture(autouse=True)
def _defaults(settings):
    settings.PURCHASE_HOLD_SECONDS = HOLD
    settings.RECONCILE_BACKOFF_SECONDS = [60, 120, 240, 480, 960, 1920]
    settings.RESUME_AFTER_SECONDS = 300


def _fresh(saga):
    return PurchaseSaga.objects.get(pk=saga.pk)


def _charge_calls(gateway, saga) -> int:
    return sum(
        1 for method, intent in gateway.calls if method == "charge" and intent == saga.intent_id
    )


# --- a charge never starts after the hold ran out ------------------------------------


@pytest.mark.django_db
def test_a_late_charge_task_after_the_hold_goes_through_the_expiry_path(alice, event, gateway):
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)
        clock.tick(HOLD + 1)  # relay and workers were down past the hold
        saga_charge(saga_id=saga.pk)
        drain_outbox()

    assert _charge_calls(gateway, saga) == 0, "charged a hold that had run out"
    assert FakeIntent.objects.get(pk=saga.intent_id).status == "canceled"
    assert _fresh(saga).state == "COMPENSATED"
    assert list(
        SagaHistory.objects.filter(saga=saga)
        .exclude(from_state=None)
        .values_list("from_state", "to_state")
    )[:1] == [("PENDING", "EXPIRED")]
    assert Seat.objects.get(event=event, ref="A1").status == "available"


@pytest.mark.django_db
def test_the_resumer_never_charges_a_hold_that_has_run_out(alice, event, gateway):
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)  # the charge task was lost
        clock.tick(HOLD + 301)  # and the relay was down: the hold timer did not fire
        sweep_resume()

    assert _charge_calls(gateway, saga) == 0
    assert FakeIntent.objects.get(pk=saga.intent_id).status == "canceled"
    assert _fresh(saga).state == "COMPENSATED"


@pytest.mark.django_db
def test_a_retry_after_not_found_is_not_a_first_charge_past_the_hold(
    alice, event, gateway, settings
):
    settings.PURCHASE_HOLD_SECONDS = 30
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_timeout_not_charged")
        assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"  # nothing landed
        clock.tick(61)  # the probe is due; the hold ran out meanwhile (its timer late)
        saga_reconcile(saga_id=saga.pk, attempt=1)

    assert _charge_calls(gateway, saga) == 1, "charged again after the hold had run out"
    assert FakeCharge.objects.filter(intent_id=saga.intent_id).count() == 0
    assert _fresh(saga).state == "COMPENSATED"


@pytest.mark.django_db
def test_a_charge_inside_the_hold_still_charges(alice, event, gateway):
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)
        clock.tick(HOLD - 1)
        assert saga_charge(saga_id=saga.pk).state == "CONFIRMED"


# --- every history row at its own commit's moment -------------------------------------


@pytest.mark.django_db
def test_a_retried_charge_is_stamped_when_its_answer_came_not_when_the_retry_began(
    alice, event, faulty_gateway, settings
):
    settings.PURCHASE_HOLD_SECONDS = 4 * 3600
    with freeze_time(T0) as clock:
        # Every charge call takes 2 s on the wire and its answer is lost.
        faulty_gateway.before["charge"] = lambda intent_id: clock.tick(2)
        saga = start_purchase(alice, event, payment_method="pm_card_unreachable")
        saga_charge(saga_id=saga.pk)  # CHARGING at 0 s, UNKNOWN at 2 s
        clock.tick(60)  # the first probe at 62 s: requires_payment, charge again
        saga_reconcile(saga_id=saga.pk, attempt=1)

    moves = list(
        SagaHistory.objects.filter(saga=saga)
        .exclude(from_state=None)
        .values_list("from_state", "to_state", "at")
    )
    seconds = [(a, b, (at - START).total_seconds()) for a, b, at in moves]
    assert seconds == [
        ("PENDING", "CHARGING", 0.0),
        ("CHARGING", "UNKNOWN", 2.0),
        ("UNKNOWN", "CHARGING", 62.0),
        ("CHARGING", "UNKNOWN", 64.0),
    ]


# --- a charge found by a look-up keeps its reference -----------------------------------


def _charge_reference(saga) -> str:
    return LedgerEntry.objects.get(intent_id=saga.intent_id, kind="charge").gateway_reference


def _gateway_charge_id(saga) -> str:
    return FakeCharge.objects.get(intent_id=saga.intent_id).id


@pytest.mark.django_db
def test_a_saga_confirmed_by_reconciliation_records_the_charge_reference(
    alice, event, gateway, settings
):
    settings.PURCHASE_HOLD_SECONDS = 4 * 3600
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
        assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"
        clock.tick(60)
        drain_outbox()

    assert _fresh(saga).state == "CONFIRMED"
    assert _charge_reference(saga) == _gateway_charge_id(saga) != ""


@pytest.mark.django_db
def test_a_saga_confirmed_by_the_hold_expiry_records_the_charge_reference(alice, event, gateway):
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
        assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"
        clock.tick(HOLD)
        saga_expire_hold(saga_id=saga.pk)  # cancel: 409 already_charged

    assert _fresh(saga).state == "CONFIRMED"
    assert _charge_reference(saga) == _gateway_charge_id(saga) != ""


@pytest.mark.django_db
def test_an_operators_reconcile_of_an_escalated_saga_records_the_charge_reference(
    alice, event, gateway, settings
):
    settings.PURCHASE_HOLD_SECONDS = 4 * 3600
    saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
    saga_charge(saga_id=saga.pk)
    saga_transition(
        saga_id=saga.pk,
        to=SagaState.UNKNOWN_EXPIRED,
        reason="schedule exhausted",
        now=datetime.now(UTC) + timedelta(seconds=1),
    )

    action_run(
        saga_id=saga.pk,
        action=Action.RECONCILE_NOW,
        operator="carol",
        reason="the bank says it went through",
    )

    assert _fresh(saga).state == "CONFIRMED"
    assert _charge_reference(saga) == _gateway_charge_id(saga) != ""
