"""Running a runbook action for a named operator, through the saga's public
services only."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from ledger.models import EntryKind
from ledger.services import ledger_has_charge, ledger_record
from payments.interface import CancelOutcome, IntentStatus, PaymentGateway

from ... import lock_objects, services
from ...errors import IllegalTransition
from ...models import PurchaseSaga
from ...saga.states import SagaState
from .actions import LABELS, SOURCES, Action, ActionRefused
from .gateway_view import disagreement, gateway_view

S = SagaState


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
    by = services.By.operator(operator)
    note = f"{reason.strip()} (by {operator})"
    # The reason is on the record before anything moves, whatever follows.
    with transaction.atomic(durable=True):
        locked = lock_objects.saga_for_update(saga_id=saga_id)
        services.note_decision(
            locked, reason=f"{LABELS[action]}: {reason.strip()}", at=services.clock(now), by=by
        )
    kwargs = {"saga_id": saga_id, "by": by, "gateway": gateway, "now": now}
    if action == Action.RECONCILE_NOW and saga.state == S.UNKNOWN_EXPIRED:
        return _look_up_escalated(note=note, **kwargs)
    if action in (Action.RECONCILE_NOW, Action.RESUME_NOW):
        return services.saga_drive(**kwargs)
    if action == Action.REFUND:
        return services.purchase_refund(reason=note, **kwargs)
    if action == Action.CONFIRM_MANUAL:
        return _confirm_manual(note=note, override=override, **kwargs)
    return _compensate_manual(note=note, **kwargs)


def _look_up_escalated(*, saga_id, note, by, gateway, now) -> PurchaseSaga:
    """A fresh look-up of an escalated saga. Only "charged" settles it by
    itself; anything else is the operator's decision (confirm / compensate)."""
    gateway = services.gateway_or_default(gateway)

    def decide(saga, at):
        return services.Ask("retrieve", saga.version)

    def record(saga, ask, lookup, at):
        if saga.state != S.UNKNOWN_EXPIRED:
            return None
        if lookup.status == IntentStatus.SUCCEEDED:
            services.confirm(
                saga,
                charge_id=lookup.charge_id or "",
                reason=f"reconciled by operator: {note}",
                at=at,
                by=by,
            )
        else:
            services.note_decision(
                saga, reason=f"operator look-up: {lookup.status.value}", at=at, by=by
            )
        return None

    return services.gateway_step(
        saga_id=saga_id,
        decide=decide,
        record=record,
        now=now,
        call=lambda saga, ask: gateway.retrieve(saga.intent_id),
    )


def _confirm_manual(*, saga_id, note, override, by, gateway, now) -> PurchaseSaga:
    """The operator saw the charge (UNKNOWN_EXPIRED) or the refund
    (COMPENSATION_PENDING) at the processor. The gateway is asked first and
    must agree; money is never written on the operator's word alone, except
    with the override while the gateway cannot be asked."""
    view = gateway_view(PurchaseSaga.objects.get(pk=saga_id), gateway=gateway)
    at = services.clock(now)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        if saga.state not in (S.UNKNOWN_EXPIRED, S.COMPENSATION_PENDING):
            raise IllegalTransition(saga.state, S.CONFIRMED)
        if contradiction := disagreement(saga, view):
            raise ActionRefused(contradiction)
        marked = ""
        if not view.reachable:
            if not override:
                raise ActionRefused(f"{view.text}: confirm only with the override")
            marked = " [override: the gateway could not be asked]"
        if saga.state == S.UNKNOWN_EXPIRED:
            services.confirm(
                saga,
                charge_id=view.charge_id or "manual-override",
                reason=f"confirmed after manual check: {note}{marked}",
                at=at,
                by=by,
                note=f"manual confirmation: {note}{marked}",
                override=bool(marked),
            )
            return saga
        if not ledger_has_charge(intent_id=saga.intent_id):
            raise ActionRefused("no charge in the ledger: nothing to confirm as refunded")
        ledger_record(
            intent_id=saga.intent_id,
            kind=EntryKind.REFUND,
            amount=-saga.amount,
            currency=saga.currency,
            saga_id=saga.pk,
            event_id=saga.event_id,
            now=at,
            gateway_reference="manual-override" if marked else "manual",
            note=f"refund confirmed after manual check: {note}{marked}",
            override=bool(marked),
        )
        services.finish_compensation(
            saga,
            at=at,
            by=by,
            refunded=True,
            reason=f"refund confirmed after manual check: {note}{marked}",
        )
    return saga


def _compensate_manual(*, saga_id, note, by, gateway, now) -> PurchaseSaga:
    """The operator saw no charge (UNKNOWN_EXPIRED: the intent is cancelled
    first, so that none can land later) or retries the refund now
    (COMPENSATION_PENDING)."""
    gateway = services.gateway_or_default(gateway)

    def compensate():
        return services.saga_compensate(
            saga_id=saga_id,
            gateway=gateway,
            now=now,
            by=by,
            reason=f"compensated after manual check: {note}",
            may_start_from=frozenset({S.UNKNOWN_EXPIRED}),
        )

    def decide(saga, at):
        # Never release a seat on an assumption, even an operator's.
        return (
            services.Ask("cancel", saga.version) if saga.state == S.UNKNOWN_EXPIRED else compensate
        )

    def record(saga, ask, answer, at):
        # The answer is kept as evidence whatever it says; a refusal is
        # raised after that commit.
        if answer.outcome == CancelOutcome.ALREADY_CHARGED:
            return _refuse("the gateway says the intent was charged: confirm instead")
        if answer.outcome != CancelOutcome.CANCELED:
            return _refuse(f"the gateway did not confirm the cancel ({answer.detail})")
        return compensate

    return services.gateway_step(
        saga_id=saga_id,
        decide=decide,
        record=record,
        now=now,
        call=lambda saga, ask: gateway.cancel(saga.intent_id),
    )


def _refuse(why: str):
    def refuse():
        raise ActionRefused(why)

    return refuse
