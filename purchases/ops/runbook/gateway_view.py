"""What the gateway's records say about an intent, as a manual action weighs
them against the operator's verdict: money is never written on an operator's
word alone (docs/operations.md, "Runbook")."""

from __future__ import annotations

from dataclasses import dataclass

from common.money import format_money
from payments.interface import GatewayUnavailable, PaymentGateway
from payments.registry import get_gateway

from ...models import PurchaseSaga
from ...saga.states import SagaState

S = SagaState


@dataclass(frozen=True)
class GatewayView:
    reachable: bool
    captured: int = 0
    # The succeeded charge, when the gateway holds exactly the saga's amount.
    charge_id: str | None = None
    text: str = ""


def gateway_view(saga: PurchaseSaga, *, gateway: PaymentGateway | None = None) -> GatewayView:
    """Ask the gateway for the intent's charges. Network I/O: call it outside
    any transaction (the adapters assert it)."""
    gateway = gateway if gateway is not None else get_gateway()
    try:
        charges = gateway.list_charges(saga.gateway_ref)
    except GatewayUnavailable as exc:
        return GatewayView(reachable=False, text=f"the gateway cannot be reached ({exc})")
    captured = sum(c.amount for c in charges if c.status == "succeeded")
    succeeded = [c for c in charges if c.status == "succeeded"]
    listed = (
        "; ".join(f"{c.id} {format_money(c.amount, saga.currency)} {c.status}" for c in charges)
        or "no charge"
    )
    return GatewayView(
        reachable=True,
        captured=captured,
        charge_id=succeeded[0].id if len(succeeded) == 1 and captured == saga.amount else None,
        text=f"{listed}; captured {format_money(captured, saga.currency)}",
    )


def disagreement(saga: PurchaseSaga, view: GatewayView) -> str:
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
