"""Running a runbook action for a named operator: the runbook's checks here
(a reason, a name, a state the action may start from, the gateway's records
against the operator's word), the saga's steps through ``purchases.services``
(docs/design.md, "Operators' steps"). The refund opens a refund row of a
confirmed purchase, which stays CONFIRMED (docs/refunds.md)."""

from __future__ import annotations

from datetime import datetime

from payments.interface import PaymentGateway

from ... import services
from ...models import PurchaseSaga
from ...refunds.errors import RefundError
from ...saga.states import SagaState
from ...services import ActionRefused
from .actions import LABELS, SOURCES, Action
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
    services.saga_note(
        saga_id=saga_id, reason=f"{LABELS[action]}: {reason.strip()}", by=by, now=now
    )
    kwargs = {"saga_id": saga_id, "by": by, "gateway": gateway, "now": now}
    if action == Action.RECONCILE_NOW and saga.state == S.UNKNOWN_EXPIRED:
        return services.saga_look_up_escalated(note=note, **kwargs)
    if action in (Action.RECONCILE_NOW, Action.RESUME_NOW):
        return services.saga_drive(**kwargs)
    if action == Action.REFUND:
        return _refund(note=note, **kwargs)
    if action == Action.CONFIRM_MANUAL:
        return _confirm_manual(note=note, override=override, **kwargs)
    return services.saga_compensate_manual(note=note, **kwargs)


def _refund(*, saga_id, note, by, gateway, now) -> PurchaseSaga:
    """A refund row of all that is left of a confirmed purchase, its seats
    back on sale; the purchase stays CONFIRMED (docs/refunds.md). One the
    purchase cannot have (nothing left to give back) is refused."""
    try:
        return services.purchase_refund(
            saga_id=saga_id, reason=note, by=by, gateway=gateway, now=now
        )
    except RefundError as exc:
        raise ActionRefused(f"{LABELS[Action.REFUND]}: {exc}") from exc


def _confirm_manual(*, saga_id, note, override, by, gateway, now) -> PurchaseSaga:
    """The operator saw the charge (UNKNOWN_EXPIRED) or the refund
    (COMPENSATION_PENDING) at the processor. The gateway is asked first and
    must agree: money is never written on the operator's word alone, except
    with the override while the gateway cannot be asked."""
    view = gateway_view(PurchaseSaga.objects.get(pk=saga_id), gateway=gateway)

    def objection(saga: PurchaseSaga) -> str:
        # Weighed against the saga as the step's lock finds it: what the
        # gateway must show depends on the state the verdict settles.
        if contradiction := disagreement(saga, view):
            return contradiction
        if not view.reachable and not override:
            return f"{view.text}: confirm only with the override"
        return ""

    return services.saga_confirm_manual(
        saga_id=saga_id,
        note=note,
        by=by,
        charge_id=view.charge_id,
        objection=objection,
        override=not view.reachable,
        now=now,
    )
