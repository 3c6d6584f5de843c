"""The HTTP adapter for the payment gateway port, and the process-wide gateway.

:class:`HttpPaymentGateway` speaks the processor's HTTP API (``shared/API.md``,
served by ``payments.fake_gateway`` outside production) and turns every answer
into the port's dataclasses. Its one rule: a charge is reported SUCCEEDED or
DECLINED only on a definitive answer; anything that leaves the charge in doubt
(timeout, lost connection, 5xx, an unreadable body, a conflicting key) is
UNKNOWN, and the caller reconciles with :meth:`~HttpPaymentGateway.retrieve`.
No method raises for a network failure except :meth:`list_charges`, which
auditors use and which raises :class:`GatewayUnavailable`.

The ``interpret_*`` functions read one (status code, body) answer; the
in-process fake uses them too, so both adapters agree by construction.

:func:`get_gateway` is how the rest of the code base obtains a gateway; tests
swap it with :func:`override_gateway` (or :func:`set_gateway`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from django.conf import settings

from .guards import assert_no_transaction
from .interface import (
    CancelOutcome,
    CancelResult,
    ChargeOutcome,
    ChargeRequest,
    ChargeResult,
    GatewayCharge,
    IntentLookup,
    IntentStatus,
    PaymentGateway,
    RefundOutcome,
    RefundResult,
)

logger = logging.getLogger(__name__)


class GatewayUnavailable(RuntimeError):
    """The gateway gave no usable answer (timeout, lost connection, 5xx, bad
    body). Raised only by :meth:`HttpPaymentGateway.list_charges`."""


# --- reading answers ------------------------------------------------------------


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
        return IntentLookup(IntentStatus(body["status"]), latency_ms=latency_ms, raw=body,
                            charge_id=_charge_id(body))
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
            CancelOutcome.ALREADY_CHARGED, detail="already_charged", latency_ms=latency_ms,
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


# --- HTTP -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Reply:
    status_code: int | None  # None: no answer at all
    body: Any  # parsed JSON; None if absent or unreadable
    failure: str  # "timeout" | "connection_error" | "" when an answer came
    latency_ms: float


class HttpPaymentGateway:
    """:class:`~payments.interface.PaymentGateway` over HTTP.

    ``base_url`` and ``timeout`` default to ``settings.PAYMENT_GATEWAY_URL`` and
    ``settings.PAYMENT_GATEWAY_TIMEOUT_SECONDS``, read at each call. The
    ``httpx.Client`` (a connection pool) is created lazily and once per
    process: a client inherited across ``fork`` (Celery's prefork pool) would
    share its sockets with the parent, so a child makes its own.
    """

    def __init__(self, *, base_url: str | None = None, timeout: float | None = None) -> None:
        self._base_url = base_url
        self._timeout = timeout
        self._client: httpx.Client | None = None
        self._client_pid: int | None = None
        self._client_lock = threading.Lock()

    # The port ------------------------------------------------------------------

    def charge(self, request: ChargeRequest) -> ChargeResult:
        assert_no_transaction("charge")
        reply = self._send(
            "POST",
            f"payment_intents/{_segment(request.intent_id)}/charge",
            json={
                "amount": request.amount,
                "currency": request.currency,
                "payment_method": request.payment_method,
            },
            # The saga's intent id is the key: every retry of this charge,
            # from any process, is the same request to the processor.
            headers={"Idempotency-Key": request.intent_id},
        )
        if reply.failure:
            result = ChargeResult(
                ChargeOutcome.UNKNOWN, detail=reply.failure, latency_ms=reply.latency_ms
            )
        else:
            result = interpret_charge(reply.status_code, reply.body, latency_ms=reply.latency_ms)
        self._log("charge", request.intent_id, result.outcome, result.detail, reply)
        return result

    def retrieve(self, intent_id: str) -> IntentLookup:
        assert_no_transaction("retrieve")
        reply = self._send("GET", f"payment_intents/{_segment(intent_id)}")
        if reply.failure:
            result = IntentLookup(
                IntentStatus.UNKNOWN, detail=reply.failure, latency_ms=reply.latency_ms
            )
        else:
            result = interpret_retrieve(reply.status_code, reply.body, latency_ms=reply.latency_ms)
        self._log("retrieve", intent_id, result.status, result.detail, reply)
        return result

    def cancel(self, intent_id: str) -> CancelResult:
        assert_no_transaction("cancel")
        reply = self._send("POST", f"payment_intents/{_segment(intent_id)}/cancel")
        if reply.failure:
            result = CancelResult(
                CancelOutcome.UNKNOWN, detail=reply.failure, latency_ms=reply.latency_ms
            )
        else:
            result = interpret_cancel(reply.status_code, reply.body, latency_ms=reply.latency_ms)
        self._log("cancel", intent_id, result.outcome, result.detail, reply)
        return result

    def refund(self, intent_id: str, *, idempotency_key: str) -> RefundResult:
        assert_no_transaction("refund")
        reply = self._send(
            "POST",
            f"payment_intents/{_segment(intent_id)}/refund",
            headers={"Idempotency-Key": idempotency_key},
        )
        if reply.failure:
            result = RefundResult(
                RefundOutcome.UNKNOWN, detail=reply.failure, latency_ms=reply.latency_ms
            )
        else:
            result = interpret_refund(reply.status_code, reply.body, latency_ms=reply.latency_ms)
        self._log("refund", intent_id, result.outcome, result.detail, reply)
        return result

    def list_charges(self, intent_id: str) -> list[GatewayCharge]:
        assert_no_transaction("list_charges")
        reply = self._send("GET", "charges", params={"payment_intent": intent_id})
        if reply.failure:
            raise GatewayUnavailable(f"list charges: {reply.failure}")
        return interpret_charges(reply.status_code, reply.body)

    # Plumbing ------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return (self._base_url or settings.PAYMENT_GATEWAY_URL).rstrip("/")

    @property
    def timeout(self) -> float:
        if self._timeout is not None:
            return self._timeout
        return settings.PAYMENT_GATEWAY_TIMEOUT_SECONDS

    def _http(self) -> httpx.Client:
        pid = os.getpid()
        if self._client is None or self._client_pid != pid:
            with self._client_lock:
                if self._client is None or self._client_pid != pid:
                    # The parent's client (if any) is deliberately not closed
                    # here: its sockets belong to the parent.
                    self._client = httpx.Client(
                        headers={"Accept": "application/json"},
                        follow_redirects=False,
                        limits=httpx.Limits(max_connections=50, max_keepalive_connections=10),
                    )
                    self._client_pid = pid
        return self._client

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None and self._client_pid == os.getpid():
                self._client.close()
            self._client = None
            self._client_pid = None

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: dict | None = None,
        params: dict | None = None,
        headers: dict | None = None,
    ) -> _Reply:
        started = time.perf_counter()

        def elapsed() -> float:
            return (time.perf_counter() - started) * 1000

        try:
            response = self._http().request(
                method,
                f"{self.base_url}/{path}",
                json=json,
                params=params,
                headers=headers,
                timeout=httpx.Timeout(self.timeout),
            )
        # TimeoutException is a TransportError: catch it first.
        except httpx.TimeoutException:
            return _Reply(None, None, "timeout", elapsed())
        except httpx.TransportError:
            return _Reply(None, None, "connection_error", elapsed())
        try:
            body = response.json()
        except ValueError:  # includes JSON and Unicode decoding errors
            body = None
        return _Reply(response.status_code, body, "", elapsed())

    @staticmethod
    def _log(operation: str, intent_id: str, outcome: str, detail: str, reply: _Reply) -> None:
        logger.info(
            "gateway %s",
            operation,
            extra={
                "intent_id": intent_id,
                "gateway_operation": operation,
                "outcome": str(outcome),
                "detail": detail,
                "http_status": reply.status_code,
                "latency_ms": round(reply.latency_ms, 1),
            },
        )


def _segment(value: str) -> str:
    return quote(value, safe="")


# --- the process-wide gateway ---------------------------------------------------

_default_gateway: HttpPaymentGateway | None = None
_override: PaymentGateway | None = None
_default_lock = threading.Lock()


def get_gateway() -> PaymentGateway:
    """The gateway the code base should use: an override if a test set one,
    else one :class:`HttpPaymentGateway` per process, built from settings."""
    global _default_gateway
    if _override is not None:
        return _override
    if _default_gateway is None:
        with _default_lock:
            if _default_gateway is None:
                _default_gateway = HttpPaymentGateway()
    return _default_gateway


def set_gateway(gateway: PaymentGateway | None) -> None:
    """Make :func:`get_gateway` return ``gateway``; None restores the default."""
    global _override
    _override = gateway


@contextlib.contextmanager
def override_gateway(gateway: PaymentGateway) -> Iterator[PaymentGateway]:
    previous = _override
    set_gateway(gateway)
    try:
        yield gateway
    finally:
        set_gateway(previous)
