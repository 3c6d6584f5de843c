"""Operators' runbook actions: guarded transitions through the same services.

Each action names the operator and a reason (both land in the saga's
history), is offered only where the transition table allows it, and has a
dry run (:func:`action_plan`) that says what it will do before it does it.
The admin is a thin caller of these functions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from ledger.models import EntryKind
from ledger.money import format_money
from ledger.services import ledger_has_charge, ledger_record
from payments.gateway import GatewayUnavailable
from payments.interface import CancelOutcome, IntentStatus, PaymentGateway

from . import lock_objects, services
from .errors import DomainError, IllegalTransition
from .models import Actor, PurchaseSaga, ReconciliationProbe, Reservation, ReservationStatus
from .selectors import saga_seat_refs
from .states import TERMINAL, TRANSITIONS, SagaState
from .sweeps import saga_resume

S = SagaState


class Action(enum.StrEnum):
    RECONCILE_NOW = "reconcile_now"
    RESUME_NOW = "resume_now"
    CONFIRM_MANUAL = "confirm_after_manual_check"
    COMPENSATE_MANUAL = "compensate_after_manual_check"
    REFUND = "refund"


LABELS = {
    Action.RECONCILE_NOW: "Reconcile now (look the intent up at the gateway)",
    Action.RESUME_NOW: "Resume now (drive from the current state)",
    Action.CONFIRM_MANUAL: "Confirm after manual check",
    Action.COMPENSATE_MANUAL: "Compensate after manual check",
    Action.REFUND: "Refund (customer service)",
}

_NON_TERMINAL = frozenset(s for s in S if s not in TERMINAL)

# Where each action may start: derived from, and checked against, the
# transition table (see test_runbook).
SOURCES: dict[Action, frozenset[SagaState]] = {
    Action.RECONCILE_NOW: _NON_TERMINAL,
    Action.RESUME_NOW: _NON_TERMINAL - {S.UNKNOWN_EXPIRED},
    Action.CONFIRM_MANUAL: frozenset({S.UNKNOWN_EXPIRED, S.COMPENSATION_PENDING}),
    Action.COMPENSATE_MANUAL: frozenset({S.UNKNOWN_EXPIRED, S.COMPENSATION_PENDING}),
    Action.REFUND: frozenset({S.CONFIRMED}),
}
# The move each manual action makes, for the table check.
TARGETS = {
    (Action.CONFIRM_MANUAL, S.UNKNOWN_EXPIRED): S.CONFIRMED,
    (Action.CONFIRM_MANUAL, S.COMPENSATION_PENDING): S.COMPENSATED,
    (Action.COMPENSATE_MANUAL, S.UNKNOWN_EXPIRED): S.COMPENSATING,
    (Action.COMPENSATE_MANUAL, S.COMPENSATION_PENDING): S.COMPENSATING,
    (Action.REFUND, S.CONFIRMED): S.COMPENSATING,
}
assert all(target in TRANSITIONS[source] for (_, source), target in TARGETS.items())


class ActionRefused(DomainError):
    code = "action_refused"


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


@dataclass(frozen=True)
class GatewayView:
    """The gateway's records of an intent, as a manual action weighs them."""

    reachable: bool
    captured: int = 0
    # The succeeded charge, when the gateway holds exactly the saga's amount.
    charge_id: str | None = None
    text: str = ""


def gateway_view(saga: PurchaseSaga, *, gateway: PaymentGateway | None = None) -> GatewayView:
    """Ask the gateway for the intent's charges. Network I/O: call it outside
    any transaction (the adapters assert it)."""
    gateway = services._gateway(gateway)
    try:
        charges = gateway.list_charges(saga.intent_id)
    except GatewayUnavailable as exc:
        return GatewayView(reachable=False, text=f"the gateway cannot be reached ({exc})")
    captured = sum(c.amount for c in charges if c.status == "succeeded")
    succeeded = [c for c in charges if c.status == "succeeded"]
    listed = "; ".join(f"{c.id} {format_money(c.amount, saga.currency)} {c.status}"
                       for c in charges) or "no charge"
    return GatewayView(
        reachable=True,
        captured=captured,
        charge_id=succeeded[0].id if len(succeeded) == 1 and captured == saga.amount else None,
        text=f"{listed}; captured {format_money(captured, saga.currency)}",
    )


def _disagreement(saga: PurchaseSaga, view: GatewayView) -> str:
    """Why the gateway's records contradict the operator's verdict ("" if
    they agree), for a manual confirmation from the saga's state."""
    if not view.reachable:
        return ""
    if saga.state == S.UNKNOWN_EXPIRED and view.charge_id is None:
        # "I saw the charge": the gateway must hold exactly this purchase's money.
        return f"the gateway disagrees: {view.text}, not {format_money(saga.amount, saga.currency)}"
    if saga.state == S.COMPENSATION_PENDING and view.captured != 0:
        # "I saw the refund": the gateway must hold none of it any more.
        return f"the gateway disagrees: {view.text}"
    return ""


def actions_for(state: str) -> list[Action]:
    return [a for a in Action if SagaState(state) in SOURCES[a]]


def action_plan(
    *,
    saga: PurchaseSaga,
    action: Action,
    gateway: PaymentGateway | None = None,
    ask_gateway: bool = True,
) -> Plan:
    """The dry run: what the action would do to this saga. Writes nothing.

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
        view = gateway_view(saga, gateway=gateway)
        plan.gateway_answer = view.text
        if action == Action.CONFIRM_MANUAL:
            if disagreement := _disagreement(saga, view):
                plan.allowed = False
                plan.why = disagreement
                return plan
            plan.override_needed = not view.reachable
        elif state == S.UNKNOWN_EXPIRED and view.captured:
            plan.allowed = False
            plan.why = f"the gateway says charged: confirm instead ({view.text})"
            return plan
    seats = saga_seat_refs(saga)
    charged = ledger_has_charge(intent_id=saga.intent_id)
    was_confirmed = Reservation.objects.filter(
        pk=saga.reservation_id, status=ReservationStatus.CONFIRMED
    ).exists()
    if plan.override_needed:
        plan.why = (f"{plan.gateway_answer}: only with the override (the ledger entry and "
                    "the history say so; the auditor reports it until the gateway agrees)")
        plan.ledger = (f"{'charge +' if state == S.UNKNOWN_EXPIRED else 'refund -'}"
                       f"{format_money(saga.amount, saga.currency)}, marked as an override")
        plan.seats_freed = seats if state == S.COMPENSATION_PENDING else []
        plan.emails = (["confirmation"] if state == S.UNKNOWN_EXPIRED
                       else ["correction" if was_confirmed else "failure"])
    elif action == Action.RECONCILE_NOW and state in (S.CHARGING, S.UNKNOWN, S.UNKNOWN_EXPIRED):
        plan.gateway_calls = ["retrieve"]
        plan.why = "look the intent up; act only on a definitive answer"
        if state != S.UNKNOWN_EXPIRED:
            plan.why += " (charged: confirm; declined: compensate; no charge: charge again)"
    elif action in (Action.RECONCILE_NOW, Action.RESUME_NOW):
        # From any other state, reconcile-now is a resume: say what that does.
        plan.why = services_why(state)
        if state == S.PENDING:
            plan.gateway_calls = ["charge"]
            plan.emails = ["confirmation or failure, by the outcome"]
        elif state in (S.CHARGING, S.UNKNOWN):
            plan.gateway_calls = ["retrieve"]
        else:  # a compensation to run or finish
            plan.refund = charged
            plan.gateway_calls = ["refund"] if charged else []
            plan.ledger = f"refund -{format_money(saga.amount, saga.currency)}" if charged else ""
            plan.seats_freed = seats
            plan.emails = ["correction" if was_confirmed else "failure"]
    elif action == Action.CONFIRM_MANUAL and state == S.UNKNOWN_EXPIRED:
        plan.why = "the operator and the gateway saw the charge"
        plan.ledger = (f"charge +{format_money(saga.amount, saga.currency)} with the "
                       "operator's note")
        plan.emails = ["confirmation"]
    elif action == Action.CONFIRM_MANUAL:
        plan.why = "the operator and the gateway saw the refund"
        plan.ledger = (f"refund -{format_money(saga.amount, saga.currency)} with the "
                       "operator's note")
        plan.seats_freed = seats
        plan.emails = ["correction" if was_confirmed else "failure"]
    elif action == Action.COMPENSATE_MANUAL and state == S.UNKNOWN_EXPIRED:
        plan.why = "the operator saw no charge: cancel the intent first, then compensate"
        plan.gateway_calls = ["cancel"]
        plan.seats_freed = seats
        plan.emails = ["failure"]
    else:  # compensate COMPENSATION_PENDING, or refund CONFIRMED
        plan.refund = charged
        plan.gateway_calls = ["refund"] if charged else []
        plan.ledger = f"refund -{format_money(saga.amount, saga.currency)}" if charged else ""
        plan.seats_freed = seats
        plan.emails = ["correction" if was_confirmed else "failure"]
        plan.why = "refund, free the seats, announce, email"
    return plan


def services_why(state: SagaState) -> str:
    from .sweeps import _WHY

    return _WHY.get(state, "")


def action_run(
    *,
    saga_id,
    action: Action,
    operator: str,
    reason: str,
    override: bool = False,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
) -> PurchaseSaga:
    """Run a runbook action for ``operator``. Raises ActionRefused if the
    saga is not in a state the action may start from, or if the gateway
    contradicts a manual confirmation.

    ``override`` lets a manual confirmation proceed while the gateway cannot
    be asked (never when it answers and disagrees); the ledger entry and the
    history are marked, and the auditor reports it until the gateway agrees.
    """
    if not reason or not reason.strip():
        raise ActionRefused("a reason is required")
    if not operator:
        raise ActionRefused("the operator must be named")
    saga = PurchaseSaga.objects.get(pk=saga_id)
    if SagaState(saga.state) not in SOURCES[action]:
        raise ActionRefused(f"{LABELS[action]} is not allowed from {saga.state}")
    note = f"{reason.strip()} (by {operator})"
    # The reason is on the record before anything moves, whatever follows.
    with transaction.atomic(durable=True):
        locked = lock_objects.saga_for_update(saga_id=saga_id)
        services._note(locked, reason=f"{LABELS[action]}: {reason.strip()}",
                       now=now or timezone.now(), actor=Actor.OPERATOR, actor_name=operator)
    if action == Action.RECONCILE_NOW:
        return _reconcile_now(saga, operator=operator, note=note, gateway=gateway, now=now)
    if action == Action.RESUME_NOW:
        return saga_resume(saga_id=saga_id, actor=Actor.OPERATOR, actor_name=operator,
                           gateway=gateway, now=now)
    if action == Action.REFUND:
        return services.purchase_refund(saga_id=saga_id, reason=note, actor=Actor.OPERATOR,
                                        actor_name=operator, gateway=gateway, now=now)
    if action == Action.CONFIRM_MANUAL:
        return _confirm_manual(saga_id, operator=operator, note=note, override=override,
                               gateway=gateway, now=now)
    return _compensate_manual(saga_id, operator=operator, note=note, gateway=gateway, now=now)


def _reconcile_now(saga, *, operator, note, gateway, now):
    state = SagaState(saga.state)
    if state in (S.CHARGING, S.UNKNOWN):
        # Keeps its place in the backoff schedule, as the resumer does.
        probes = ReconciliationProbe.objects.filter(saga=saga, asked="retrieve").count()
        return services.saga_reconcile(saga_id=saga.pk, attempt=probes + 1, gateway=gateway,
                                       now=now,
                                       actor=Actor.OPERATOR, actor_name=operator)
    if state != S.UNKNOWN_EXPIRED:
        return saga_resume(saga_id=saga.pk, actor=Actor.OPERATOR, actor_name=operator,
                           gateway=gateway, now=now)
    # Escalated: a fresh look-up. Only "charged" settles it automatically;
    # anything else is the operator's decision (confirm / compensate).
    lookup = services._gateway(gateway).retrieve(saga.intent_id)
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga.pk)
        services._probe(saga, asked="retrieve", answer=lookup.status.value,
                        detail=lookup.detail, latency_ms=lookup.latency_ms, now=now)
        if saga.state != S.UNKNOWN_EXPIRED:
            return saga
        if lookup.status == IntentStatus.SUCCEEDED:
            services._confirm(saga, charge_id=lookup.charge_id or "",
                              reason=f"reconciled by operator: {note}",
                              now=now, actor=Actor.OPERATOR, actor_name=operator)
        else:
            services._note(saga, reason=f"operator look-up: {lookup.status.value}", now=now,
                           actor=Actor.OPERATOR, actor_name=operator)
    return saga


def _confirm_manual(saga_id, *, operator, note, override, gateway, now):
    """The operator saw the charge (UNKNOWN_EXPIRED) or the refund
    (COMPENSATION_PENDING) at the processor. The gateway is asked first and
    must agree; money is never written on the operator's word alone, except
    with the override while the gateway cannot be asked."""
    view = gateway_view(PurchaseSaga.objects.get(pk=saga_id), gateway=gateway)
    at = now or timezone.now()
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        if saga.state not in (S.UNKNOWN_EXPIRED, S.COMPENSATION_PENDING):
            raise IllegalTransition(saga.state, S.CONFIRMED)
        if disagreement := _disagreement(saga, view):
            raise ActionRefused(disagreement)
        marked = ""
        if not view.reachable:
            if not override:
                raise ActionRefused(f"{view.text}: confirm only with the override")
            marked = " [override: the gateway could not be asked]"
        if saga.state == S.UNKNOWN_EXPIRED:
            services._confirm(
                saga, charge_id=view.charge_id or "manual-override",
                reason=f"confirmed after manual check: {note}{marked}", now=at,
                actor=Actor.OPERATOR, actor_name=operator,
                note=f"manual confirmation: {note}{marked}", override=bool(marked),
            )
            return saga
        if not ledger_has_charge(intent_id=saga.intent_id):
            raise ActionRefused("no charge in the ledger: nothing to confirm as refunded")
        ledger_record(
            intent_id=saga.intent_id, kind=EntryKind.REFUND, amount=-saga.amount,
            currency=saga.currency, saga_id=saga.pk, event_id=saga.event_id, now=at,
            gateway_reference="manual-override" if marked else "manual",
            note=f"refund confirmed after manual check: {note}{marked}", override=bool(marked),
        )
        services._finish_compensation(
            saga, now=at, actor=Actor.OPERATOR, actor_name=operator, refunded=True,
            reason=f"refund confirmed after manual check: {note}{marked}",
        )
    return saga


def _compensate_manual(saga_id, *, operator, note, gateway, now):
    saga = PurchaseSaga.objects.get(pk=saga_id)
    if saga.state == S.UNKNOWN_EXPIRED:
        # Never release a seat on an assumption, even an operator's: make
        # sure no charge can land first.
        answer = services._gateway(gateway).cancel(saga.intent_id)
        with transaction.atomic(durable=True):
            services._probe(lock_objects.saga_for_update(saga_id=saga_id), asked="cancel",
                            answer=answer.outcome.value, detail=answer.detail,
                            latency_ms=answer.latency_ms, now=now or timezone.now())
        if answer.outcome == CancelOutcome.ALREADY_CHARGED:
            raise ActionRefused("the gateway says the intent was charged: confirm instead")
        if answer.outcome != CancelOutcome.CANCELED:
            raise ActionRefused(f"the gateway did not confirm the cancel ({answer.detail})")
    return services.saga_compensate(
        saga_id=saga_id, gateway=gateway, now=now, actor=Actor.OPERATOR, actor_name=operator,
        reason=f"compensated after manual check: {note}", operator_override=True,
    )
