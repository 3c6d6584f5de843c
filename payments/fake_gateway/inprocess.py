"""An in-process :class:`~payments.interface.PaymentGateway` for unit tests.

It calls the fake processor's services directly (no HTTP, no sleeping) and
reads their answers with the same ``interpret_*`` functions as the HTTP
adapter, so a test sees what the saga would see over the wire. Where the HTTP
client would have timed out (an answer that "times out"), it returns the
UNKNOWN result a timeout produces, while the fake's tables end up exactly as
after the HTTP call: ``pm_card_timeout_charged`` leaves a charge and a stored
answer behind its first UNKNOWN, ``pm_card_timeout_not_charged`` leaves nothing.
"""

from __future__ import annotations

import time

from payments.codec import (
    interpret_cancel,
    interpret_charge,
    interpret_charges,
    interpret_refund,
    interpret_retrieve,
)
from payments.guards import assert_no_transaction
from payments.interface import (
    CancelResult,
    ChargeOutcome,
    ChargeRequest,
    ChargeResult,
    GatewayCharge,
    IntentLookup,
    RefundResult,
)

from . import services


class InProcessFakeGateway:
    def __init__(self) -> None:
        # (method, intent_id) for every call, in order: lets a test assert
        # what the code under test asked the gateway.
        self.calls: list[tuple[str, str]] = []

    def charge(self, request: ChargeRequest) -> ChargeResult:
        assert_no_transaction("charge")
        self.calls.append(("charge", request.intent_id))
        started = time.perf_counter()
        answer = services.intent_charge(
            intent_id=request.intent_id,
            idempotency_key=request.intent_id,
            amount=request.amount,
            currency=request.currency,
            payment_method=request.payment_method,
        )
        latency_ms = _since(started)
        if answer.times_out:
            return ChargeResult(ChargeOutcome.UNKNOWN, detail="timeout", latency_ms=latency_ms)
        return interpret_charge(answer.status_code, answer.body, latency_ms=latency_ms)

    def retrieve(self, intent_id: str) -> IntentLookup:
        assert_no_transaction("retrieve")
        self.calls.append(("retrieve", intent_id))
        started = time.perf_counter()
        answer = services.intent_retrieve(intent_id=intent_id)
        return interpret_retrieve(answer.status_code, answer.body, latency_ms=_since(started))

    def cancel(self, intent_id: str) -> CancelResult:
        assert_no_transaction("cancel")
        self.calls.append(("cancel", intent_id))
        started = time.perf_counter()
        answer = services.intent_cancel(intent_id=intent_id)
        return interpret_cancel(answer.status_code, answer.body, latency_ms=_since(started))

    def refund(self, intent_id: str, *, idempotency_key: str) -> RefundResult:
        assert_no_transaction("refund")
        self.calls.append(("refund", intent_id))
        started = time.perf_counter()
        answer = services.intent_refund(intent_id=intent_id, idempotency_key=idempotency_key)
        return interpret_refund(answer.status_code, answer.body, latency_ms=_since(started))

    def list_charges(self, intent_id: str) -> list[GatewayCharge]:
        assert_no_transaction("list_charges")
        self.calls.append(("list_charges", intent_id))
        answer = services.charge_list(intent_id=intent_id)
        return interpret_charges(answer.status_code, answer.body)


def _since(started: float) -> float:
    return (time.perf_counter() - started) * 1000
