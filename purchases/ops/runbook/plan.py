"""The dry run of a runbook action: what it would do to a saga, and what the
gateway says about it. Writes nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.money import format_money
from ledger.models import EntryKind, LedgerEntry
from payments.interface import PaymentGateway

from ... import services
from ...models import PurchaseSaga, Reservation, ReservationStatus
from ...refunds.opening import refundable, seat_links
from ...saga.states import SagaState
from ...selectors import saga_seat_refs
from .actions import SOURCES, Action
from .gateway_view import disagreement, gateway_view

S = SagaState


@dataclass
class Plan:
    saga_id: str
    state: str
    action: Action
    allowed: bool
    why: str = ""
    refund: bool = False
    seats_freed: list[str] = field(default_factory=list)
    emails: list[str] = field(default_factory=list)
    ledger: str = ""
    gateway_calls: list[str] = field(default_factory=list)
    # What the gateway says about the intent (manual actions only): the
    # operator reads it beside their own view before confirming anything.
    gateway_answer: str = ""
    # The gateway could not be asked: only an explicit override may proceed.
    override_needed: bool = False


def action_plan(
    *,
    saga: PurchaseSaga,
    action: Action,
    gateway: PaymentGateway | None = None,
    ask_gateway: bool = True,
) -> Plan:
    """The dry run: what the action would do to this saga.

    For the manual actions it asks the gateway (outside any transaction) and
    shows its answer; a confirmation the gateway contradicts is refused here
    already, and one it cannot be asked about needs the override.
    ``ask_gateway=False`` gives the transition table's verdict alone (the
    action asks the gateway itself when it runs).
    """
    state = SagaState(saga.state)
    plan = Plan(str(saga.pk), state, action, allowed=state in SOURCES[action])
    if not plan.allowed:
        plan.why = f"not allowed from {state}"
        return plan
    if ask_gateway and action in (Action.CONFIRM_MANUAL, Action.COMPENSATE_MANUAL):
        _weigh_the_gateway(plan, saga, gateway)
        if not plan.allowed:
            return plan
    if action == Action.REFUND:
        _describe_refund(plan, saga)
        return plan
    _describe(plan, saga)
    return plan


def _describe_refund(plan: Plan, saga: PurchaseSaga) -> None:
    """The refund of a confirmed purchase (docs/refunds.md): a refund row of
    all that is left, its seats back on sale in its commit; the purchase
    stays CONFIRMED. The processor is asked after the commit, by the row's
    own message, once; an answer that is not definitive is looked up, never
    re-sent."""
    left = refundable(saga)
    if left == 0:
        plan.allowed = False
        plan.why = (
            f"nothing left to refund: {format_money(saga.amount, saga.currency)} "
            "refunded or being refunded already"
        )
        return
    money = format_money(left, saga.currency)
    plan.why = (
        f"open a refund of {money} (all that is left), its seats back on sale now; the "
        "purchase stays CONFIRMED; the processor is asked after the commit, once, and "
        "looked up until it settles"
    )
    plan.refund = True
    plan.gateway_calls = ["create_refund"]
    plan.ledger = f"refund -{money} once the processor confirms it"
    plan.seats_freed = [link.ref for link in seat_links(saga) if not link.released]
    plan.emails = ["refund"]


def _weigh_the_gateway(plan: Plan, saga: PurchaseSaga, gateway) -> None:
    view = gateway_view(saga, gateway=gateway)
    plan.gateway_answer = view.text
    if plan.action == Action.CONFIRM_MANUAL:
        if contradiction := disagreement(saga, view):
            plan.allowed, plan.why = False, contradiction
        plan.override_needed = not view.reachable
    elif plan.state == S.UNKNOWN_EXPIRED and view.captured:
        plan.allowed = False
        plan.why = f"the gateway says charged: confirm instead ({view.text})"


# The states whose charge outcome "reconcile now" looks up at the gateway.
_LOOKED_UP = frozenset({S.CHARGING, S.REQUIRES_ACTION, S.UNKNOWN, S.UNKNOWN_EXPIRED})


def _describe(plan: Plan, saga: PurchaseSaga) -> None:
    """Fill in what the action does: why, gateway calls, ledger, seats, emails."""
    state, action = SagaState(plan.state), plan.action
    seats = saga_seat_refs(saga)
    charged = LedgerEntry.objects.filter(intent_id=saga.intent_id, kind=EntryKind.CHARGE).exists()
    was_confirmed = Reservation.objects.filter(
        pk=saga.reservation_id, event_id=saga.event_id, status=ReservationStatus.CONFIRMED
    ).exists()
    money = format_money(saga.amount, saga.currency)
    undone = ["correction" if was_confirmed else "failure"]

    def compensation(why: str) -> None:
        plan.why = why
        plan.refund = charged
        plan.gateway_calls = ["refund"] if charged else []
        plan.ledger = f"refund -{money}" if charged else ""
        plan.seats_freed, plan.emails = seats, undone

    if plan.override_needed:
        plan.why = (
            f"{plan.gateway_answer}: only with the override (the ledger entry and "
            "the history say so; the auditor reports it until the gateway agrees)"
        )
        if state == S.UNKNOWN_EXPIRED:
            plan.ledger, plan.emails = f"charge +{money}, marked as an override", ["confirmation"]
        else:
            plan.ledger = f"refund -{money}, marked as an override"
            plan.seats_freed, plan.emails = seats, undone
    elif action == Action.RECONCILE_NOW and state in _LOOKED_UP:
        plan.gateway_calls = ["retrieve"]
        plan.why = "look the intent up; act only on a definitive answer"
        if state != S.UNKNOWN_EXPIRED:
            plan.why += " (charged: confirm; declined: compensate; no charge: charge again)"
    elif action in (Action.RECONCILE_NOW, Action.RESUME_NOW):
        # From any other state, reconcile-now is a resume: say what that does.
        if state == S.PENDING:
            plan.why = services.DRIVES[state].why
            plan.gateway_calls = ["charge"]
            plan.emails = ["confirmation or failure, by the outcome"]
        elif state in _LOOKED_UP - {S.UNKNOWN_EXPIRED}:
            plan.why, plan.gateway_calls = services.DRIVES[state].why, ["retrieve"]
        else:  # a compensation to run or finish
            compensation(services.DRIVES[state].why)
    elif action == Action.CONFIRM_MANUAL and state == S.UNKNOWN_EXPIRED:
        plan.why = "the operator and the gateway saw the charge"
        plan.ledger = f"charge +{money} with the operator's note"
        plan.emails = ["confirmation"]
    elif action == Action.CONFIRM_MANUAL:
        plan.why = "the operator and the gateway saw the refund"
        plan.ledger = f"refund -{money} with the operator's note"
        plan.seats_freed, plan.emails = seats, undone
    elif action == Action.COMPENSATE_MANUAL and state == S.UNKNOWN_EXPIRED:
        plan.why = "the operator saw no charge: cancel the intent first, then compensate"
        plan.gateway_calls = ["cancel"]
        plan.seats_freed, plan.emails = seats, ["failure"]
    else:  # compensate COMPENSATION_PENDING
        compensation("refund, free the seats, announce, email")
