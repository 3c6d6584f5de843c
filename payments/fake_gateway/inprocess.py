"""An in-process :class:`~payments.interface.PaymentGateway` for unit tests.

It calls the fake processor's services directly (no HTTP, no sleeping) and
reads their answers with the same ``interpret_*`` functions as the HTTP
adapter, so a test sees what the saga would see over the wire. Where the HTTP
client would have timed out (an answer that "times out"), it returns the
UNKNOWN result a timeout produces, while the fake's tables end up exactly as
after the HTTP call: ``pm_card_timeout_charged`` leaves a charge and a stored
answer behind its first UNKNOWN, ``pm_card_timeout_not_charged`` leaves nothing,
``pm_card_refundTimeout`` leaves the refund made behind its UNKNOWN.
"""

from __future__ import annotations

import time

from payments.codec import (
    interpret_cancel,
    interpret_charge,
    interpret_charges,
    interpret_refund,
    interpret_refund_answer,
    interpret_refunds,
    interpret_retrieve,
)
from payments.guards import assert_no_transaction
from payments.interface import (
    CancelResult,
    ChargeOutcome,
    ChargeRequest,
    ChargeResult,
    GatewayCharge,
    GatewayRefund,
    IntentLookup,
    RefundAnswer,
    RefundRequest,
    RefundResult,
    RefundState,
)

from . import services


class InProcessFakeGateway:
    def __init__(self) -> None:
        # (method, intent_id) for every call, in order: lets a test assert
        # what the code under test asked the gateway.
        self.calls: list[tuple[str, str]] = []

    def _begin(self, method: str, intent_id: str) -> float:
        """No transaction may be open (as for a real processor's call); the
        call is recorded. The time it starts, for its latency."""
        assert_no_transaction(method)
        self.calls.append((method, intent_id))
        return time.perf_counter()

    def charge(self, request: ChargeRequest) -> ChargeResult:
        started = self._begin("charge", request.intent_id)
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
        started = self._begin("retrieve", intent_id)
        answer = services.intent_retrieve(intent_id=intent_id)
        return interpret_retrieve(answer.status_code, answer.body, latency_ms=_since(started))

    def cancel(self, intent_id: str) -> CancelResult:
        started = self._begin("cancel", intent_id)
        answer = services.intent_cancel(intent_id=intent_id)
        return interpret_cancel(answer.status_code, answer.body, latency_ms=_since(started))

    def refund(self, intent_id: str, *, idempotency_key: str) -> RefundResult:
        started = self._begin("refund", intent_id)
        answer = services.intent_refund(intent_id=intent_id, idempotency_key=idempotency_key)
        return interpret_refund(answer.status_code, answer.body, latency_ms=_since(started))

    def list_charges(self, intent_id: str) -> list[GatewayCharge]:
        assert_no_transaction("list_charges")
        self.calls.append(("list_charges", intent_id))
        answer = services.charge_list(intent_id=intent_id)
        return interpret_charges(answer.status_code, answer.body)

    def create_refund(self, request: RefundRequest) -> RefundAnswer:
        started = self._begin("create_refund", request.intent_id)
        answer = services.refund_create(
            intent_id=request.intent_ref,
            idempotency_key=request.idempotency_key,
            amount=request.amount,
            refund_id=request.refund_id,
        )
        latency_ms = _since(started)
        if answer.times_out:
            return RefundAnswer(RefundState.UNKNOWN, detail="timeout", latency_ms=latency_ms)
        return interpret_refund_answer(answer.status_code, answer.body, latency_ms=latency_ms)

    def retrieve_refund(self, request: RefundRequest) -> RefundAnswer:
        started = self._begin("retrieve_refund", request.intent_id)
        answer = services.refund_retrieve(refund_id=request.refund_id)
        return interpret_refund_answer(answer.status_code, answer.body, latency_ms=_since(started))

    def list_refunds(self, intent_ref: str) -> list[GatewayRefund]:
        assert_no_transaction("list_refunds")
        self.calls.append(("list_refunds", intent_ref))
        answer = services.refund_list(intent_id=intent_ref)
        return interpret_refunds(answer.status_code, answer.body)


def _since(started: float) -> float:
    return (time.perf_counter() - started) * 1000
