"""Runbook actions as services: offered only where the table allows them,
named and reasoned, and never releasing a seat that may have been paid.

The refund (customer service) opens a refund row of a confirmed purchase,
which stays CONFIRMED (docs/refunds.md); a refund the compensation owes (a
charge that landed on a purchase being undone: tests/late_charge.py) is the
one a manual confirmation or compensation settles."""

import pytest

from ledger.models import LedgerEntry
from payments.fake_gateway.models import FakeIntent
from purchases import services
from purchases.models import PurchaseSaga, Refund, Seat
from purchases.ops.runbook import SOURCES, TARGETS, Action, ActionRefused, action_plan, action_run
from purchases.saga.states import TRANSITIONS, SagaState
from purchases.services import saga_charge, saga_compensate, saga_transition

from .conftest import drain_outbox, start_purchase
from .late_charge import charged_while_undone


def _unknown_expired(user, event, **kwargs):
    saga = start_purchase(user, event, **kwargs)
    for to in (SagaState.CHARGING, SagaState.UNKNOWN, SagaState.UNKNOWN_EXPIRED):
        saga = saga_transition(saga_id=saga.pk, to=to, reason="test")
    return saga


class _Unreachable:
    """The gateway's charge list cannot be had (the processor is down)."""

    def __init__(self, gateway):
        self.gateway = gateway

    def __call__(self, intent_id):
        from payments.interface import GatewayUnavailable

        self.gateway.calls.append(("list_charges", intent_id))
        raise GatewayUnavailable("list charges: connection_error")


def _charged_but_unknown_expired(user, event, seats=("A1",)):
    saga = start_purchase(user, event, seats=seats, payment_method="pm_card_timeout_charged")
    assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"  # charged; the answer was lost
    return saga_transition(saga_id=saga.pk, to=SagaState.UNKNOWN_EXPIRED, reason="test")


def _refund_pending(user, event, gateway):
    saga = charged_while_undone(user, event)
    gateway.down("refund")
    assert saga_compensate(saga_id=saga.pk).state == "COMPENSATION_PENDING"
    gateway.up("refund")
    return saga


def test_manual_actions_only_make_moves_the_table_allows():
    for (action, source), target in TARGETS.items():
        assert source in SOURCES[action]
        assert target in TRANSITIONS[source], (action, source, target)
    assert SOURCES[Action.REFUND] == {SagaState.CONFIRMED}
    assert SagaState.COMPENSATED not in set().union(*SOURCES.values())


@pytest.mark.django_db
def test_confirm_after_manual_check_writes_a_ledger_note(alice, event, gateway):
    saga = _charged_but_unknown_expired(alice, event)

    result = action_run(
        saga_id=saga.pk,
        action=Action.CONFIRM_MANUAL,
        operator="carol",
        reason="charge ch_123 seen in the processor dashboard",
    )

    assert result.state == "CONFIRMED"
    entry = LedgerEntry.objects.get(intent_id=saga.intent_id)
    assert entry.kind == "charge" and "ch_123" in entry.note and "carol" in entry.note
    last = PurchaseSaga.objects.get(pk=saga.pk).history.latest("id")
    assert (last.to_state, last.actor, last.actor_name) == ("CONFIRMED", "operator", "carol")
    assert Seat.objects.get(event=event, ref="A1").status == "sold"


@pytest.mark.django_db
def test_compensate_after_manual_check_cancels_the_intent_first(alice, event, gateway):
    saga = _unknown_expired(alice, event)

    result = action_run(
        saga_id=saga.pk,
        action=Action.COMPENSATE_MANUAL,
        operator="carol",
        reason="no charge at the processor",
    )

    assert result.state == "COMPENSATED"
    assert gateway.calls[0] == ("cancel", saga.intent_id)
    assert FakeIntent.objects.get(pk=saga.intent_id).status == "canceled"
    assert Seat.objects.get(event=event, ref="A1").status == "available"


@pytest.mark.django_db
def test_compensate_after_manual_check_refuses_when_the_gateway_charged(alice, event, gateway):
    saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
    saga_charge(saga_id=saga.pk)  # UNKNOWN, but charged
    saga_transition(saga_id=saga.pk, to=SagaState.UNKNOWN_EXPIRED, reason="test")

    with pytest.raises(ActionRefused, match="charged"):
        action_run(
            saga_id=saga.pk,
            action=Action.COMPENSATE_MANUAL,
            operator="carol",
            reason="operator thought it was not charged",
        )

    assert PurchaseSaga.objects.get(pk=saga.pk).state == "UNKNOWN_EXPIRED"
    assert Seat.objects.get(event=event, ref="A1").status == "held"


@pytest.mark.django_db
def test_confirm_after_manual_check_of_a_pending_refund(alice, event, faulty_gateway):
    saga = _refund_pending(alice, event, faulty_gateway)
    # The refund did land at the processor (an answer lost on the way back).
    faulty_gateway.refund(saga.intent_id, idempotency_key=f"refund:{saga.intent_id}")

    result = action_run(
        saga_id=saga.pk,
        action=Action.CONFIRM_MANUAL,
        operator="carol",
        reason="refund visible at the processor",
    )

    assert result.state == "COMPENSATED"
    assert list(
        LedgerEntry.objects.filter(intent_id=saga.intent_id).values_list("kind", "amount")
    ) == [("charge", 2500), ("refund", -2500)]
    assert Seat.objects.get(event=event, ref="A1").status == "available"


@pytest.mark.django_db
def test_an_action_needs_a_reason_and_an_allowed_state(alice, event, gateway):
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)

    with pytest.raises(ActionRefused, match="reason"):
        action_run(saga_id=saga.pk, action=Action.REFUND, operator="carol", reason="  ")
    with pytest.raises(ActionRefused, match="not allowed"):
        action_run(saga_id=saga.pk, action=Action.CONFIRM_MANUAL, operator="carol", reason="r")
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "CONFIRMED"


@pytest.mark.django_db
def test_the_dry_run_of_a_refund_says_what_will_happen_and_writes_nothing(alice, event, gateway):
    saga = saga_charge(saga_id=start_purchase(alice, event, seats=["A1", "A2"]).pk)
    version = saga.version

    plan = action_plan(saga=saga, action=Action.REFUND)

    assert plan.allowed and plan.refund
    assert "open a refund of 50.00 EUR" in plan.why and "stays CONFIRMED" in plan.why
    assert plan.seats_freed == ["A1", "A2"]
    assert plan.emails == ["refund"]
    assert plan.gateway_calls == ["create_refund"]
    assert plan.ledger == "refund -50.00 EUR once the processor confirms it"
    assert PurchaseSaga.objects.get(pk=saga.pk).version == version
    assert not Refund.objects.exists()
    assert [c for c in gateway.calls if "refund" in c[0]] == []


@pytest.mark.django_db
def test_the_refund_opens_a_refund_row_and_the_purchase_stays_confirmed(alice, event, gateway):
    saga = saga_charge(saga_id=start_purchase(alice, event, seats=["A1", "A2"]).pk)

    result = action_run(
        saga_id=saga.pk, action=Action.REFUND, operator="carol", reason="the buyer cannot come"
    )

    assert result.state == "CONFIRMED"
    refund = Refund.objects.get(saga_id=saga.pk)
    assert (refund.amount, refund.status, refund.source) == (5000, "pending", "operator")
    assert sorted(refund.seats) == ["A1", "A2"] and refund.released
    assert "carol" in refund.reason
    assert set(Seat.objects.filter(event=event).values_list("status", flat=True)) == {"available"}
    last = PurchaseSaga.objects.get(pk=saga.pk).history.latest("id")
    assert (last.to_state, last.actor, last.actor_name) == ("CONFIRMED", "operator", "carol")
    assert "refund of 50.00 EUR requested" in last.reason

    drain_outbox()  # the row's message asks the processor

    assert Refund.objects.get(pk=refund.pk).status == "succeeded"
    assert list(
        LedgerEntry.objects.filter(intent_id=saga.intent_id).values_list("kind", "amount")
    ) == [("charge", 5000), ("refund", -5000)]
    # Nothing is left to refund: the dry run and the action both say so.
    plan = action_plan(saga=result, action=Action.REFUND)
    assert not plan.allowed and "nothing left to refund" in plan.why
    with pytest.raises(ActionRefused, match="Refund"):
        action_run(saga_id=saga.pk, action=Action.REFUND, operator="carol", reason="again")
    assert Refund.objects.filter(saga_id=saga.pk).count() == 1


# --- money is written on the gateway's word, not the operator's alone -----------------


@pytest.mark.django_db
def test_confirm_after_manual_check_refuses_when_the_gateway_has_no_charge(alice, event, gateway):
    saga = _unknown_expired(alice, event)  # nothing ever reached the gateway

    with pytest.raises(ActionRefused, match="gateway disagrees.*no charge"):
        action_run(
            saga_id=saga.pk,
            action=Action.CONFIRM_MANUAL,
            operator="carol",
            reason="I am sure I saw it",
        )

    assert PurchaseSaga.objects.get(pk=saga.pk).state == "UNKNOWN_EXPIRED"
    assert not LedgerEntry.objects.filter(intent_id=saga.intent_id).exists()
    assert Seat.objects.get(event=event, ref="A1").status == "held"
    assert ("list_charges", saga.intent_id) in gateway.calls


@pytest.mark.django_db
def test_confirm_after_manual_check_records_the_gateways_charge(alice, event, gateway):
    from payments.fake_gateway.models import FakeCharge

    saga = _charged_but_unknown_expired(alice, event)

    action_run(
        saga_id=saga.pk,
        action=Action.CONFIRM_MANUAL,
        operator="carol",
        reason="seen in the dashboard",
    )

    entry = LedgerEntry.objects.get(intent_id=saga.intent_id)
    assert entry.gateway_reference == FakeCharge.objects.get(intent_id=saga.intent_id).id
    assert not entry.override


@pytest.mark.django_db
def test_confirming_a_refund_is_refused_while_the_gateway_still_holds_the_money(
    alice, event, faulty_gateway
):
    saga = _refund_pending(alice, event, faulty_gateway)  # the refund never landed

    with pytest.raises(ActionRefused, match="gateway disagrees.*captured"):
        action_run(
            saga_id=saga.pk,
            action=Action.CONFIRM_MANUAL,
            operator="carol",
            reason="the customer says they got it",
        )

    assert PurchaseSaga.objects.get(pk=saga.pk).state == "COMPENSATION_PENDING"
    assert list(
        LedgerEntry.objects.filter(intent_id=saga.intent_id).values_list("kind", flat=True)
    ) == ["charge"]
    assert Seat.objects.get(event=event, ref="A1").status == "held"  # not released


@pytest.mark.django_db
def test_the_dry_run_shows_the_gateways_answer(alice, bob, event, gateway):
    disagreeing = _unknown_expired(alice, event, seats=["A1"])
    agreeing = _charged_but_unknown_expired(bob, event, seats=["A2"])

    refused = action_plan(saga=disagreeing, action=Action.CONFIRM_MANUAL)
    allowed = action_plan(saga=agreeing, action=Action.CONFIRM_MANUAL)

    assert not refused.allowed
    assert "no charge" in refused.gateway_answer and "disagrees" in refused.why
    assert allowed.allowed and not allowed.override_needed
    assert "succeeded" in allowed.gateway_answer and "25.00 EUR" in allowed.gateway_answer


@pytest.mark.django_db
def test_an_override_confirms_when_the_gateway_cannot_be_reached_and_the_auditor_follows_it(
    alice, event, gateway, monkeypatch
):
    from purchases.ops.audit import audit_run

    saga = _charged_but_unknown_expired(alice, event)
    monkeypatch.setattr(gateway, "list_charges", _Unreachable(gateway))

    plan = action_plan(saga=saga, action=Action.CONFIRM_MANUAL)
    assert plan.allowed and plan.override_needed and "cannot be reached" in plan.gateway_answer
    with pytest.raises(ActionRefused, match="cannot be reached.*override"):
        action_run(
            saga_id=saga.pk,
            action=Action.CONFIRM_MANUAL,
            operator="carol",
            reason="processor dashboard shows ch_9",
        )
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "UNKNOWN_EXPIRED"

    action_run(
        saga_id=saga.pk,
        action=Action.CONFIRM_MANUAL,
        operator="carol",
        reason="processor dashboard shows ch_9",
        override=True,
    )

    saga = PurchaseSaga.objects.get(pk=saga.pk)
    assert saga.state == "CONFIRMED"
    entry = LedgerEntry.objects.get(intent_id=saga.intent_id)
    assert entry.override and "override" in entry.note.lower()
    assert "override" in saga.history.latest("id").reason.lower()
    # While the gateway cannot confirm it, the auditor keeps naming it.
    report = audit_run(gateway=gateway)
    assert report.violations == []
    assert [u.intent_id for u in report.unverified] == [saga.intent_id]
    assert "override" in report.unverified[0].detail
    # Once the gateway answers and agrees, it is settled.
    monkeypatch.undo()
    assert audit_run(gateway=gateway).violations == []


@pytest.mark.django_db
def test_the_auditor_reports_an_override_the_gateway_contradicts(
    alice, event, gateway, monkeypatch
):
    from purchases.ops.audit import audit_run

    saga = _unknown_expired(alice, event)  # nothing was charged
    monkeypatch.setattr(gateway, "list_charges", _Unreachable(gateway))
    action_run(
        saga_id=saga.pk,
        action=Action.CONFIRM_MANUAL,
        operator="carol",
        reason="wrong guess",
        override=True,
    )
    monkeypatch.undo()

    report = audit_run(gateway=gateway)

    assert [(v.invariant, v.saga_id) for v in report.violations] == [
        ("override_agrees_with_gateway", str(saga.pk))
    ]


# --- the steps behind the actions are the saga's (docs/design.md, "Operators' steps") ---


@pytest.mark.django_db
def test_the_saga_confirms_no_charge_the_gateway_did_not_show_whoever_calls_it(
    alice, event, gateway
):
    saga = _unknown_expired(alice, event)

    # when: called as the runbook would, but with nothing held against it
    with pytest.raises(ActionRefused, match="no charge"):
        services.saga_confirm_manual(
            saga_id=saga.pk,
            note="I am sure",
            by=services.By.operator("carol"),
            charge_id=None,
            objection=lambda saga: "",
        )

    # then
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "UNKNOWN_EXPIRED"
    assert not LedgerEntry.objects.filter(intent_id=saga.intent_id).exists()


@pytest.mark.django_db
def test_the_runbooks_objection_is_weighed_against_the_locked_saga(alice, event, gateway):
    saga = _charged_but_unknown_expired(alice, event)
    seen = []

    def objection(locked):
        seen.append((locked.state, locked.version))
        return "the operator's manager says no"

    with pytest.raises(ActionRefused, match="manager says no"):
        services.saga_confirm_manual(
            saga_id=saga.pk,
            note="seen",
            by=services.By.operator("carol"),
            charge_id="ch_1",
            objection=objection,
        )

    fresh = PurchaseSaga.objects.get(pk=saga.pk)
    assert seen == [("UNKNOWN_EXPIRED", fresh.version)]
    assert fresh.state == "UNKNOWN_EXPIRED"
    assert not LedgerEntry.objects.filter(intent_id=saga.intent_id).exists()
