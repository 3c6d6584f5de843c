"""Reading the processor's answers: one (status code, JSON body) at a time,
into the port's dataclasses (``payments.interface``).

Its one rule: a charge is SUCCEEDED or DECLINED only on a definitive answer;
anything that leaves the charge in doubt (5xx, an unreadable body, a
conflicting key) is UNKNOWN, and the caller reconciles with a look-up. The
HTTP adapter and the in-process fake both read through these functions, so
they agree by construction.
"""

from __future__ import annotations

from typing import Any

from .interface import (
    CancelOutcome,
    CancelResult,
    ChargeOutcome,
    ChargeResult,
    GatewayCharge,
    GatewayRefund,
    GatewayUnavailable,
    IntentLookup,
    IntentStatus,
    RefundAnswer,
    RefundOutcome,
    RefundResult,
    RefundState,
)


def _code(body: Any) -> str:
    return body.get("code", "") if isinstance(body, dict) else ""


def _charge_id(body: dict) -> str | None:
    charge_id = body.get("latest_charge")
    return charge_id if isinstance(charge_id, str) and charge_id else None


def _doubt(status_code: int, body: Any) -> str:
    """The detail of an answer that settles nothing."""
    if status_code >= 500:
        return f"http_{status_code}"
    if status_code == 200 or body is None:
        # A success we cannot read, or an error page that is not ours.
        return "bad_response"
    return _code(body) or f"http_{status_code}"


def interpret_charge(status_code: int, body: Any, *, latency_ms: float = 0.0) -> ChargeResult:
    """``body`` is the parsed JSON, or None if it could not be parsed."""
    if status_code == 200 and isinstance(body, dict):
        status, charge_id = body.get("status"), body.get("charge_id")
        if status == "succeeded" and isinstance(charge_id, str) and charge_id:
            return ChargeResult(ChargeOutcome.SUCCEEDED, charge_id=charge_id, latency_ms=latency_ms)
        if status == "declined":
            return ChargeResult(ChargeOutcome.DECLINED, detail="declined", latency_ms=latency_ms)
    if status_code == 409 and _code(body) == "intent_canceled":
        # Cancelled intents can never be charged: as final as a decline.
        return ChargeResult(ChargeOutcome.DECLINED, detail="intent_canceled", latency_ms=latency_ms)
    if status_code == 400 and _code(body):
        # The processor refused the request before charging anything.
        return ChargeResult(ChargeOutcome.DECLINED, detail=_code(body), latency_ms=latency_ms)
    # Includes 409 already_charged: the intent holds a charge made under
    # another key; only a look-up can say what to make of it.
    return ChargeResult(
        ChargeOutcome.UNKNOWN, detail=_doubt(status_code, body), latency_ms=latency_ms
    )


_KNOWN_STATUSES = frozenset(IntentStatus) - {IntentStatus.NOT_FOUND, IntentStatus.UNKNOWN}


def interpret_retrieve(status_code: int, body: Any, *, latency_ms: float = 0.0) -> IntentLookup:
    if status_code == 200 and isinstance(body, dict) and body.get("status") in _KNOWN_STATUSES:
        return IntentLookup(
            IntentStatus(body["status"]),
            latency_ms=latency_ms,
            raw=body,
            charge_id=_charge_id(body),
        )
    if status_code == 404 and _code(body) == "not_found":
        return IntentLookup(
            IntentStatus.NOT_FOUND, detail="not_found", latency_ms=latency_ms, raw=body
        )
    return IntentLookup(
        IntentStatus.UNKNOWN,
        detail=_doubt(status_code, body),
        latency_ms=latency_ms,
        raw=body if isinstance(body, dict) else {},
    )


def interpret_cancel(status_code: int, body: Any, *, latency_ms: float = 0.0) -> CancelResult:
    if status_code == 200 and isinstance(body, dict) and body.get("status") == "canceled":
        return CancelResult(CancelOutcome.CANCELED, latency_ms=latency_ms)
    if status_code == 409 and _code(body) == "already_charged":
        return CancelResult(
            CancelOutcome.ALREADY_CHARGED,
            detail="already_charged",
            latency_ms=latency_ms,
            charge_id=_charge_id(body),
        )
    return CancelResult(
        CancelOutcome.UNKNOWN, detail=_doubt(status_code, body), latency_ms=latency_ms
    )


def interpret_refund(status_code: int, body: Any, *, latency_ms: float = 0.0) -> RefundResult:
    if status_code == 200 and isinstance(body, dict) and body.get("status") == "refunded":
        return RefundResult(RefundOutcome.REFUNDED, latency_ms=latency_ms)
    if status_code == 409 and _code(body) == "not_charged":
        return RefundResult(RefundOutcome.NOT_CHARGED, detail="not_charged", latency_ms=latency_ms)
    return RefundResult(
        RefundOutcome.UNKNOWN, detail=_doubt(status_code, body), latency_ms=latency_ms
    )


def interpret_charges(status_code: int, body: Any) -> list[GatewayCharge]:
    """Raises :class:`GatewayUnavailable` unless the answer is a readable list."""
    if status_code != 200 or not isinstance(body, list):
        raise GatewayUnavailable(f"list charges: {_doubt(status_code, body)}")
    try:
        return [
            GatewayCharge(id=c["id"], amount=c["amount"], status=c["status"], created=c["created"])
            for c in body
        ]
    except (KeyError, TypeError) as exc:
        raise GatewayUnavailable("list charges: bad_response") from exc


# What a refund's ``status`` reads as (the fake's, which are Stripe's).
_REFUND_STATES = {
    "succeeded": RefundState.SUCCEEDED,
    "pending": RefundState.PENDING,
    "failed": RefundState.FAILED,
}
# Refusals of a refund: nothing was refunded, and asking again changes nothing.
_REFUND_REFUSALS = frozenset({"not_charged", "amount_too_large"})


def interpret_refund_answer(
    status_code: int, body: Any, *, latency_ms: float = 0.0
) -> RefundAnswer:
    """A refund's create or look-up answer (``POST …/refunds``, ``GET
    refunds/<refund_id>``). FAILED only on a definitive refusal; a 409
    ``refund_id_in_use`` (a refund exists under the id, made with another
    key) is UNKNOWN like any doubt: a look-up by the id finds it."""
    if status_code == 200 and isinstance(body, dict):
        state, ref = _REFUND_STATES.get(str(body.get("status"))), body.get("id")
        if state is not None and isinstance(ref, str) and ref:
            detail = ""
            if state == RefundState.FAILED:
                detail = str(body.get("failure_reason") or "failed")
            return RefundAnswer(state, processor_ref=ref, detail=detail, latency_ms=latency_ms)
    code = _code(body)
    if (status_code == 409 and code in _REFUND_REFUSALS) or (status_code == 400 and code):
        # 400: the processor refused the request before refunding anything.
        return RefundAnswer(RefundState.FAILED, detail=code, latency_ms=latency_ms)
    if status_code == 404 and code == "not_found":
        return RefundAnswer(RefundState.NOT_FOUND, detail="not_found", latency_ms=latency_ms)
    return RefundAnswer(
        RefundState.UNKNOWN, detail=_doubt(status_code, body), latency_ms=latency_ms
    )


def interpret_refunds(status_code: int, body: Any) -> list[GatewayRefund]:
    """Raises :class:`GatewayUnavailable` unless the answer is a readable list."""
    if status_code != 200 or not isinstance(body, list):
        raise GatewayUnavailable(f"list refunds: {_doubt(status_code, body)}")
    try:
        return [
            GatewayRefund(
                id=r["id"], refund_id=r["refund_id"], amount=r["amount"], status=r["status"]
            )
            for r in body
        ]
    except (KeyError, TypeError) as exc:
        raise GatewayUnavailable("list refunds: bad_response") from exc
