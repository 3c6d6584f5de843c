"""The HTTP adapter of the payment gateway port (docs/api.md, "Fake gateway").

:class:`HttpPaymentGateway` speaks the processor's HTTP API (served by
``payments.fake_gateway`` outside production) and reads every answer with
``payments.codec``. A timeout or a lost connection is UNKNOWN, like any answer
that leaves the charge in doubt, and the caller reconciles with
:meth:`~HttpPaymentGateway.retrieve`. No method raises for a network failure
except :meth:`list_charges` and :meth:`list_refunds`, which auditors use and
which raise :class:`~payments.interface.GatewayUnavailable`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from django.conf import settings

from .codec import (
    interpret_cancel,
    interpret_charge,
    interpret_charges,
    interpret_refund,
    interpret_refund_answer,
    interpret_refunds,
    interpret_retrieve,
)
from .guards import assert_no_transaction
from .interface import (
    CancelOutcome,
    CancelResult,
    ChargeOutcome,
    ChargeRequest,
    ChargeResult,
    GatewayCharge,
    GatewayRefund,
    GatewayUnavailable,
    IntentLookup,
    IntentStatus,
    RefundAnswer,
    RefundOutcome,
    RefundRequest,
    RefundResult,
    RefundState,
)

logger = logging.getLogger(__name__)


# An idle pooled connection is dropped after this long, before the server
# closes it: gunicorn (the fake gateway's server, and the default of many)
# closes idle keep-alive connections after 2 s, and a request sent on a
# connection at the instant the server closes it gets no answer, which is an
# UNKNOWN charge to reconcile (seen by make bench with httpx's 5 s default).
KEEPALIVE_EXPIRY_SECONDS = 1.0


# A connection that broke once the request was on its way (the server
# closed it, or it was reset): no answer, and no way to know whether the
# request was taken. Every request here may be sent twice (a charge, a
# refund and a refund's creation carry their idempotency key, whose first
# answer the processor replays; a read is a read; cancelling a cancelled
# intent answers it cancelled), so such a request is sent once more at once,
# on a new connection, within what is left of the timeout: one broken
# keep-alive connection is not an UNKNOWN charge to reconcile (docs/design.md,
# "The gateway step"). A refused connection (nothing listens) and a timeout
# are not sent again.
BROKEN_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
# The least time left worth a second send.
RESEND_MIN_SECONDS = 0.05


@dataclass(frozen=True)
class _Reply:
    status_code: int | None  # None: no answer at all
    body: Any  # parsed JSON; None if absent or unreadable
    failure: str  # "timeout" | "connection_error" | "" when an answer came
    latency_ms: float
    # The transport's own words for a failure ("RemoteProtocolError: Server
    # disconnected ..."), the last send's; "" when an answer came.
    error: str = ""
    sends: int = 1


class HttpPaymentGateway:
    """:class:`~payments.interface.PaymentGateway` over HTTP.

    ``base_url`` and ``timeout`` default to ``settings.PAYMENT_GATEWAY_URL`` and
    ``settings.PAYMENT_GATEWAY_TIMEOUT_SECONDS``, read at each call. The
    ``httpx.Client`` (a connection pool) is created lazily and once per
    process: a client inherited across ``fork`` (Celery's prefork pool) would
    share its sockets with the parent, so a child makes its own.
    """

    # One client, made under a lock, and no state of a call kept on the
    # gateway: a charge burst asks it from several threads at once.
    concurrent_calls = True

    def __init__(self, *, base_url: str | None = None, timeout: float | None = None) -> None:
        self._base_url = base_url
        self._timeout = timeout
        self._client: httpx.Client | None = None
        self._client_pid: int | None = None
        self._client_lock = threading.Lock()

    def prepare(self) -> None:
        """Build this process's client now (its TLS context is tens of
        milliseconds of CPU): a Celery pool process calls this when it starts
        (``registry.prepare_in_pool_process``), so that its first charge does
        not pay for it."""
        self._http()

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
        if reply.status_code is None:  # no answer: failure says why
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
        if reply.status_code is None:  # no answer: failure says why
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
        if reply.status_code is None:  # no answer: failure says why
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
        if reply.status_code is None:  # no answer: failure says why
            result = RefundResult(
                RefundOutcome.UNKNOWN, detail=reply.failure, latency_ms=reply.latency_ms
            )
        else:
            result = interpret_refund(reply.status_code, reply.body, latency_ms=reply.latency_ms)
        self._log("refund", intent_id, result.outcome, result.detail, reply)
        return result

    def list_charges(self, intent_id: str) -> list[GatewayCharge]:
        return interpret_charges(*self._list("charges", intent_id))

    def create_refund(self, request: RefundRequest) -> RefundAnswer:
        assert_no_transaction("create_refund")
        reply = self._send(
            "POST",
            f"payment_intents/{_segment(request.intent_ref)}/refunds",
            json={"amount": request.amount, "refund_id": request.refund_id},
            # Every retry of this refund, from any process, is the same request.
            headers={"Idempotency-Key": request.idempotency_key},
        )
        return self._refund_answer("create_refund", request, reply)

    def retrieve_refund(self, request: RefundRequest) -> RefundAnswer:
        """By our refund id: the fake names its refunds by it (``processor_ref``
        is not needed to find one)."""
        assert_no_transaction("retrieve_refund")
        reply = self._send("GET", f"refunds/{_segment(request.refund_id)}")
        return self._refund_answer("retrieve_refund", request, reply)

    def list_refunds(self, intent_ref: str) -> list[GatewayRefund]:
        return interpret_refunds(*self._list("refunds", intent_ref))

    def _list(self, what: str, intent_ref: str) -> tuple[int, Any]:
        """``GET <what>?payment_intent=``: the intent's charges or refunds,
        status and body; ``GatewayUnavailable`` when no answer came."""
        assert_no_transaction(f"list_{what}")
        reply = self._send("GET", what, params={"payment_intent": intent_ref})
        if reply.status_code is None:  # no answer: failure says why
            raise GatewayUnavailable(f"list {what}: {reply.failure}")
        return reply.status_code, reply.body

    def _refund_answer(self, operation: str, request: RefundRequest, reply: _Reply) -> RefundAnswer:
        if reply.status_code is None:  # no answer: failure says why
            result = RefundAnswer(
                RefundState.UNKNOWN, detail=reply.failure, latency_ms=reply.latency_ms
            )
        else:
            result = interpret_refund_answer(
                reply.status_code, reply.body, latency_ms=reply.latency_ms
            )
        self._log(
            operation, request.intent_id, result.state, result.detail, reply, request.refund_id
        )
        return result

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
                        limits=httpx.Limits(
                            max_connections=50,
                            max_keepalive_connections=10,
                            keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
                        ),
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

        sends = 0
        while True:
            sends += 1
            left = self.timeout - elapsed() / 1000
            try:
                response = self._http().request(
                    method,
                    f"{self.base_url}/{path}",
                    json=json,
                    params=params,
                    headers=headers,
                    timeout=httpx.Timeout(max(left, RESEND_MIN_SECONDS)),
                )
            # TimeoutException is a TransportError: catch it first.
            except httpx.TimeoutException as exc:
                return _Reply(None, None, "timeout", elapsed(), _said(exc), sends)
            except httpx.TransportError as exc:
                resend = isinstance(exc, BROKEN_CONNECTION) and sends == 1
                if resend and self.timeout - elapsed() / 1000 >= RESEND_MIN_SECONDS:
                    continue
                return _Reply(None, None, "connection_error", elapsed(), _said(exc), sends)
            break
        try:
            body = response.json()
        except ValueError:  # includes JSON and Unicode decoding errors
            body = None
        return _Reply(response.status_code, body, "", elapsed(), "", sends)

    @staticmethod
    def _log(
        operation: str,
        intent_id: str,
        outcome: str,
        detail: str,
        reply: _Reply,
        refund_id: str = "",
    ) -> None:
        refund = {"refund_id": refund_id} if refund_id else {}
        logger.info(
            "gateway %s",
            operation,
            extra={
                **refund,
                "intent_id": intent_id,
                "gateway_operation": operation,
                "outcome": str(outcome),
                "detail": detail,
                "http_status": reply.status_code,
                "latency_ms": round(reply.latency_ms, 1),
                **({"error": reply.error} if reply.error else {}),
                **({"sends": reply.sends} if reply.sends > 1 else {}),
            },
        )


def _said(exc: BaseException) -> str:
    """A transport error in a few words, for the log line."""
    return f"{type(exc).__name__}: {exc}"[:200]


def _segment(value: str) -> str:
    return quote(value, safe="")
