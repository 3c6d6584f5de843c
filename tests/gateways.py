"""Fault injection around the in-process fake gateway.

The fake itself stays real (its tables, its idempotency); this wrapper only
decides, per method, that the network failed (the answer never arrived) or
runs a hook at the moment of the call, so that a test can observe the world
exactly when the gateway is asked. A lost call never reaches the fake:
nothing is made (``pm_card_timeout_charged`` and ``pm_card_refundTimeout``
are the answers lost after the fake acted). ``list_refunds`` raises
``GatewayUnavailable`` when lost, as the adapters do.
"""

from __future__ import annotations

from collections.abc import Callable

from payments.fake_gateway.inprocess import InProcessFakeGateway
from payments.guards import assert_no_transaction
from payments.interface import (
    CancelOutcome,
    CancelResult,
    ChargeOutcome,
    ChargeResult,
    GatewayUnavailable,
    IntentLookup,
    IntentStatus,
    RefundAnswer,
    RefundOutcome,
    RefundResult,
    RefundState,
)

_LOST = {
    "charge": ChargeResult(ChargeOutcome.UNKNOWN, detail="timeout"),
    "retrieve": IntentLookup(IntentStatus.UNKNOWN, detail="timeout"),
    "cancel": CancelResult(CancelOutcome.UNKNOWN, detail="timeout"),
    "refund": RefundResult(RefundOutcome.UNKNOWN, detail="timeout"),
    "create_refund": RefundAnswer(RefundState.UNKNOWN, detail="timeout"),
    "retrieve_refund": RefundAnswer(RefundState.UNKNOWN, detail="timeout"),
}


class FaultyGateway(InProcessFakeGateway):
    def __init__(self) -> None:
        super().__init__()
        # method -> number of upcoming calls whose answer is lost (-1: all)
        self.outages: dict[str, int] = {}
        # method -> hook(intent_id) run before the call reaches the fake
        self.before: dict[str, Callable[[str], None]] = {}

    def down(self, method: str, times: int = -1) -> None:
        self.outages[method] = times

    def up(self, method: str) -> None:
        self.outages.pop(method, None)

    def _lost(self, method: str, intent_id: str) -> bool:
        assert_no_transaction(method)
        if hook := self.before.get(method):
            hook(intent_id)
        left = self.outages.get(method, 0)
        if left == 0:
            return False
        if left > 0:
            self.outages[method] = left - 1
        self.calls.append((method, intent_id))
        return True

    def charge(self, request):
        if self._lost("charge", request.intent_id):
            return _LOST["charge"]
        return super().charge(request)

    def retrieve(self, intent_id):
        if self._lost("retrieve", intent_id):
            return _LOST["retrieve"]
        return super().retrieve(intent_id)

    def cancel(self, intent_id):
        if self._lost("cancel", intent_id):
            return _LOST["cancel"]
        return super().cancel(intent_id)

    def refund(self, intent_id, *, idempotency_key):
        if self._lost("refund", intent_id):
            return _LOST["refund"]
        return super().refund(intent_id, idempotency_key=idempotency_key)

    def create_refund(self, request):
        if self._lost("create_refund", request.intent_id):
            return _LOST["create_refund"]
        return super().create_refund(request)

    def retrieve_refund(self, request):
        if self._lost("retrieve_refund", request.intent_id):
            return _LOST["retrieve_refund"]
        return super().retrieve_refund(request)

    def list_refunds(self, intent_ref):
        if self._lost("list_refunds", intent_ref):
            raise GatewayUnavailable("list refunds: timeout")
        return super().list_refunds(intent_ref)
