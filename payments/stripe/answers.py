"""How Stripe's answers read as the gateway port's (docs/stripe.md, "How Stripe's answers map").

Pure functions over the ``stripe`` library's objects and errors: what a
PaymentIntent's status means to the saga, and which errors leave a call in
doubt. The adapter (``payments.stripe.adapter``) makes the calls.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import stripe

from ..interface import (
    ChargeOutcome,
    ChargeResult,
    GatewayCharge,
    GatewayRefund,
    IntentLookup,
    IntentStatus,
    RefundAnswer,
    RefundState,
)

# Statuses in which Stripe still accepts a cancel and no money has moved: an
# extra PaymentIntent of one of our intents in one of these is cancelled.
CANCELLABLE = frozenset({"requires_payment_method", "requires_confirmation", "requires_action"})

# Which of several PaymentIntents of one intent is the one that matters: the
# lowest rank (money moved or moving first), then the oldest. Unlisted: last.
_RANK = {
    "succeeded": 0,
    "processing": 1,
    "requires_capture": 1,
    "requires_action": 2,
    "requires_confirmation": 3,
    "requires_payment_method": 4,
    "canceled": 5,
}


def error_code(err: stripe.StripeError) -> str:
    """The error's ``code`` (or, for a card error, its ``decline_code``), or ""."""
    detail = err.error
    if detail is not None:
        return (
            getattr(detail, "decline_code", None) or getattr(detail, "code", None) or err.code or ""
        )
    return err.code or ""


def failure_detail(err: stripe.StripeError) -> str:
    """A short reason for an error that leaves the call in doubt: "timeout",
    "connection_error", "http_500", "rate_limited", "idempotency_key_in_use"…"""
    if isinstance(err, stripe.APIConnectionError):
        return "timeout" if _caused_by_timeout(err) else "connection_error"
    if isinstance(err, stripe.RateLimitError):
        return "rate_limited"
    code = error_code(err)
    if code == "idempotency_key_in_use":
        return code
    if isinstance(err, stripe.IdempotencyError):
        return "idempotency_error"
    if isinstance(err, stripe.AuthenticationError):
        return "authentication_error"
    if isinstance(err, stripe.PermissionError):
        return "permission_error"
    if err.http_status is not None:
        return f"http_{err.http_status}"
    return code or type(err).__name__


def _caused_by_timeout(err: BaseException) -> bool:
    # The library wraps its HTTP client's exception (``raise … from``).
    cause = err.__cause__
    while cause is not None:
        if isinstance(cause, httpx.TimeoutException | TimeoutError):
            return True
        cause = cause.__cause__
    return False


def is_refusal(err: stripe.StripeError) -> bool:
    """A definitive "no" about the request itself: Stripe did nothing (a
    card error, or a 400/404 that is not about rate or idempotency)."""
    if isinstance(err, stripe.CardError):
        return True
    return (
        isinstance(err, stripe.InvalidRequestError)
        and not isinstance(err, stripe.IdempotencyError)
        and error_code(err) not in ("rate_limit", "idempotency_key_in_use")
    )


def is_not_found(err: stripe.StripeError) -> bool:
    return isinstance(err, stripe.InvalidRequestError) and err.http_status == 404


# Errors of a create that say the buyer's payment method cannot pay (Stripe's
# error codes): the create is DECLINED. Any other refusal is a request of
# ours that Stripe does not take (a bug, a setting): UNKNOWN, for an operator.
_PAYMENT_METHOD_CODES = frozenset(
    {
        "payment_intent_incompatible_payment_method",
        "payment_method_not_available",
        "payment_method_provider_decline",
        "payment_method_unactivated",
        "payment_method_unexpected_state",
    }
)


def refuses_payment_method(err: stripe.StripeError) -> bool:
    """A create's error that names the payment method: a card error, Stripe's
    ``resource_missing`` (or another error) on ``payment_method``, or
    localstripe's bare 404 (the payment method is the only object a create
    names)."""
    if isinstance(err, stripe.CardError):
        return True
    if not is_refusal(err):
        return False
    param = getattr(err, "param", None) or getattr(err.error, "param", None)
    if param == "payment_method" or error_code(err) in _PAYMENT_METHOD_CODES:
        return True
    return err.http_status == 404 and not param


def refusal_detail(err: stripe.StripeError) -> str:
    if isinstance(err, stripe.CardError):
        return error_code(err) or "card_declined"
    if err.http_status == 404:
        # Stripe: 400 resource_missing naming the payment method; localstripe: 404.
        return error_code(err) or "resource_missing"
    return error_code(err) or "invalid_request"


def charge_of(pi: stripe.PaymentIntent) -> stripe.Charge | None:
    """The PaymentIntent's latest charge, when the answer carries it (asked
    with ``expand=["latest_charge"]``; localstripe always nests it)."""
    charge = getattr(pi, "latest_charge", None)
    return charge if isinstance(charge, stripe.Charge) else None


def charge_id_of(pi: stripe.PaymentIntent) -> str | None:
    charge = getattr(pi, "latest_charge", None)
    if isinstance(charge, str):
        return charge
    return charge.id if charge is not None else None


def refunded_in_full(pi: stripe.PaymentIntent) -> bool:
    charge = charge_of(pi)
    return bool(charge is not None and getattr(charge, "refunded", False))


def payment_error_code(pi: stripe.PaymentIntent) -> str:
    """The code of the PaymentIntent's last failed charge or authentication, or ""."""
    error = getattr(pi, "last_payment_error", None)
    if not error:
        return ""
    return getattr(error, "decline_code", None) or getattr(error, "code", None) or "declined"


def evidence(pi: stripe.PaymentIntent) -> dict[str, Any]:
    """What the saga stores as the answer's evidence: small, no secrets."""
    return {"id": pi.id, "status": pi.status, "amount": pi.amount, "currency": pi.currency}


def lookup_of(pi: stripe.PaymentIntent, *, latency_ms: float) -> IntentLookup:
    """A retrieved PaymentIntent as the port's look-up answer."""
    status = pi.status
    found: dict[str, Any] = {
        "latency_ms": latency_ms,
        "raw": evidence(pi),
        "processor_ref": pi.id,
    }
    if status == "succeeded":
        refunded = refunded_in_full(pi)
        return IntentLookup(
            IntentStatus.REFUNDED if refunded else IntentStatus.SUCCEEDED,
            charge_id=charge_id_of(pi),
            **found,
        )
    if status == "requires_action":
        return IntentLookup(
            IntentStatus.REQUIRES_ACTION, action_secret=pi.client_secret or "", **found
        )
    if status == "requires_payment_method" and payment_error_code(pi):
        return IntentLookup(IntentStatus.DECLINED, detail=payment_error_code(pi), **found)
    if status in ("requires_payment_method", "requires_confirmation"):
        # No charge landed: the saga may confirm again.
        return IntentLookup(IntentStatus.REQUIRES_PAYMENT, detail=status, **found)
    if status == "canceled":
        return IntentLookup(IntentStatus.CANCELED, **found)
    # processing, requires_capture: money is moving; ask again later.
    return IntentLookup(IntentStatus.UNKNOWN, detail="processing", **found)


def charge_result_of(pi: stripe.PaymentIntent, *, latency_ms: float) -> ChargeResult:
    """A PaymentIntent as it stands after a confirm, as the port's charge answer."""
    status = pi.status
    if status == "succeeded":
        return ChargeResult(
            ChargeOutcome.SUCCEEDED, charge_id=charge_id_of(pi), latency_ms=latency_ms
        )
    if status == "requires_action":
        return ChargeResult(
            ChargeOutcome.REQUIRES_ACTION,
            detail="requires_action",
            action_secret=pi.client_secret or "",
            latency_ms=latency_ms,
        )
    if status == "requires_payment_method":
        detail = payment_error_code(pi) or "declined"
        return ChargeResult(ChargeOutcome.DECLINED, detail=detail, latency_ms=latency_ms)
    if status == "canceled":
        # Nothing was or can be charged on it.
        return ChargeResult(ChargeOutcome.DECLINED, detail="canceled", latency_ms=latency_ms)
    detail = "processing" if status in ("processing", "requires_capture") else status
    return ChargeResult(ChargeOutcome.UNKNOWN, detail=detail, latency_ms=latency_ms)


def the_one_that_matters(intents: list[stripe.PaymentIntent]) -> stripe.PaymentIntent:
    """Of several PaymentIntents of one intent (a create whose answer was
    lost, then made again), the one to keep: money first, then the oldest.
    The id breaks a tie (``created`` is in seconds) so that every look-up
    keeps the same one."""
    return min(intents, key=lambda pi: (_RANK.get(pi.status, 9), pi.created, pi.id))


def gateway_charge_of(pi: stripe.PaymentIntent) -> GatewayCharge | None:
    """The PaymentIntent's charge that holds money, if any (a PaymentIntent
    holds at most one succeeded charge: its latest)."""
    charge = charge_of(pi)
    if charge is None or charge.status != "succeeded":
        return None
    return GatewayCharge(
        id=charge.id,
        amount=charge.amount,
        status="refunded" if getattr(charge, "refunded", False) else "succeeded",
        created=datetime.fromtimestamp(charge.created, tz=UTC).isoformat(),
    )


def search_query(intent_id: str) -> str:
    """Stripe's search query for the PaymentIntents of one of our intents."""
    quoted = intent_id.replace("\\", "\\\\").replace("'", "\\'")
    return f"metadata['intent_id']:'{quoted}'"


# --- refunds of a part (or the whole) of a charge -------------------------------------

# A Refund's status (Stripe's), as the port's.
_REFUND_STATES = {
    "succeeded": RefundState.SUCCEEDED,
    "pending": RefundState.PENDING,
    "requires_action": RefundState.PENDING,  # the customer must act: not settled yet
    "failed": RefundState.FAILED,
    "canceled": RefundState.FAILED,
}


def refund_answer_of(refund: stripe.Refund, *, latency_ms: float) -> RefundAnswer:
    """A Refund as Stripe holds it, as the port's answer (``failure_reason``
    is the detail of a failed one)."""
    state = _REFUND_STATES.get(refund.status or "")
    if state is None:
        # A status this code does not know: not proof of anything.
        return RefundAnswer(
            RefundState.UNKNOWN,
            processor_ref=refund.id,
            detail=f"refund_{refund.status}",
            latency_ms=latency_ms,
        )
    detail = ""
    if state == RefundState.FAILED:
        detail = getattr(refund, "failure_reason", None) or refund.status or "failed"
    elif refund.status == "requires_action":
        detail = "requires_action"
    return RefundAnswer(state, processor_ref=refund.id, detail=detail, latency_ms=latency_ms)


def refund_refusal_detail(err: stripe.StripeError) -> str:
    """Why Stripe refused a refund (:func:`is_refusal`): its code, else what
    the error names. Stripe gives an amount over what is left to refund no
    code, only ``param: amount`` ("Refund amount … is greater than
    unrefunded amount on charge …"): ``amount_too_large``."""
    code = error_code(err)
    if code:
        return code
    param = getattr(err, "param", None) or getattr(err.error, "param", None)
    if param == "amount":
        return "amount_too_large"
    if err.http_status == 404:
        return "resource_missing"
    return "invalid_request"


def refund_error_answer(err: stripe.StripeError, *, latency_ms: float) -> RefundAnswer:
    """A refund's create that raised: FAILED when Stripe refused it (nothing
    was refunded, asking again changes nothing), else UNKNOWN (no answer,
    429, 5xx, a key in use: it may have been made)."""
    if is_refusal(err):
        return RefundAnswer(
            RefundState.FAILED, detail=refund_refusal_detail(err), latency_ms=latency_ms
        )
    return RefundAnswer(RefundState.UNKNOWN, detail=failure_detail(err), latency_ms=latency_ms)


def our_refund_id(refund: stripe.Refund) -> str:
    """The refund id of ours a Refund carries in its metadata ("" if none:
    made elsewhere, e.g. in Stripe's dashboard)."""
    metadata = refund.to_dict().get("metadata") or {}
    return str(metadata.get("refund_id") or "")


def gateway_refund_of(refund: stripe.Refund) -> GatewayRefund:
    """A Refund for the auditor: its status as the port's three."""
    state = _REFUND_STATES.get(refund.status or "")
    # A status this code does not know is shown as Stripe says it.
    status = state.value if state is not None else str(refund.status)
    return GatewayRefund(
        id=refund.id, refund_id=our_refund_id(refund), amount=refund.amount, status=status
    )
