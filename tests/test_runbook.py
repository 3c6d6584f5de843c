"""Runbook actions as services: offered only where the table allows them,
named and reasoned, and never releasing a seat that may have been paid."""

import pytest

from ledger.models import LedgerEntry
from payments.fake_gateway.models import FakeIntent
from purchases.models import PurchaseSaga, Seat
from purchases.runbook import SOURCES, TARGETS, Action, ActionRefused, action_plan, action_run
from purchases.services import purchase_refund, saga_charge, saga_transition
from purchases.states import TRANSITIONS, SagaState

from .conftest import start_purchase


def _unknown_expired(user, event, **kwargs):
    saga = start_purchase(user, event, **kwargs)
    for to in ("CHARGING", "UNKNOWN", "UNKNOWN_EXPIRED"):
        saga_transition(saga_id=saga.pk, to=to, reason="test")
    return saga


def test_manual_actions_only_make_moves_the_table_allows():
    for (action, source), target in TARGETS.items():
        assert source in SOURCES[action]
        assert target in TRANSITIONS[source], (action, source, target)
    assert SOURCES[Action.REFUND] == {SagaState.CONFIRMED}
    assert SagaState.COMPENSATED not in set().union(*SOURCES.values())


@pytest.mark.django_db
def test_confirm_after_manual_check_writes_a_ledger_note(alice, event, gateway):
    saga = _unknown_expired(alice, event)

    result = action_run(saga_id=saga.pk, action=Action.CONFIRM_MANUAL, operator="carol",
                        reason="charge ch_123 seen in the processor dashboard")

    assert result.state == "CONFIRMED"
    entry = LedgerEntry.objects.get(intent_id=saga.intent_id)
    assert entry.kind == "charge" and "ch_123" in entry.note and "carol" in entry.note
    last = PurchaseSaga.objects.get(pk=saga.pk).history.latest("id")
    assert (last.to_state, last.actor, last.actor_name) == ("CONFIRMED", "operator", "carol")
    assert Seat.objects.get(event=event, ref="A1").status == "sold"


@pytest.mark.django_db
def test_compensate_after_manual_check_cancels_the_intent_first(alice, event, gateway):
    saga = _unknown_expired(alice, event)

    result = action_run(saga_id=saga.pk, action=Action.COMPENSATE_MANUAL, operator="carol",
                        reason="no charge at the processor")

    assert result.state == "COMPENSATED"
    assert gateway.calls[0] == ("cancel", saga.intent_id)
    assert FakeIntent.objects.get(pk=saga.intent_id).status == "canceled"
    assert Seat.objects.get(event=event, ref="A1").status == "available"


@pytest.mark.django_db
def test_compensate_after_manual_check_refuses_when_the_gateway_charged(alice, event, gateway):
    saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
    saga_charge(saga_id=saga.pk)  # UNKNOWN, but charged
    saga_transition(saga_id=saga.pk, to="UNKNOWN_EXPIRED", reason="test")

    with pytest.raises(ActionRefused, match="charged"):
        action_run(saga_id=saga.pk, action=Action.COMPENSATE_MANUAL, operator="carol",
                   reason="operator thought it was not charged")

    assert PurchaseSaga.objects.get(pk=saga.pk).state == "UNKNOWN_EXPIRED"
    assert Seat.objects.get(event=event, ref="A1").status == "held"


@pytest.mark.django_db
def test_confirm_after_manual_check_of_a_pending_refund(alice, event, faulty_gateway):
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    faulty_gateway.down("refund")
    assert purchase_refund(saga_id=saga.pk, reason="r").state == "COMPENSATION_PENDING"

    result = action_run(saga_id=saga.pk, action=Action.CONFIRM_MANUAL, operator="carol",
                        reason="refund visible at the processor")

    assert result.state == "COMPENSATED"
    assert list(LedgerEntry.objects.filter(intent_id=saga.intent_id)
                .values_list("kind", "amount")) == [("charge", 2500), ("refund", -2500)]
    assert Seat.objects.get(event=event, ref="A1").status == "available"


@pytest.mark.django_db
def test_an_action_needs_a_reason_and_an_allowed_state(alice, event, gateway):
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)

    with pytest.raises(ActionRefused, match="reason"):
        action_run(saga_id=saga.pk, action=Action.REFUND, operator="carol", reason="  ")
    with pytest.raises(ActionRefused, match="not allowed"):
        action_run(saga_id=saga.pk, action=Action.CONFIRM_MANUAL, operator="carol",
                   reason="r")
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "CONFIRMED"


@pytest.mark.django_db
def test_the_dry_run_of_a_refund_says_what_will_happen_and_writes_nothing(alice, event, gateway):
    saga = saga_charge(saga_id=start_purchase(alice, event, seats=["A1", "A2"]).pk)
    version = saga.version

    plan = action_plan(saga=saga, action=Action.REFUND)

    assert plan.allowed and plan.refund
    assert plan.seats_freed == ["A1", "A2"]
    assert plan.emails == ["correction"]
    assert plan.gateway_calls == ["refund"]
    assert PurchaseSaga.objects.get(pk=saga.pk).version == version
    assert [c for c in gateway.calls if c[0] == "refund"] == []
