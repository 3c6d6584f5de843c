"""The HTTP adapter against a real HTTP server (pytest-django's live server
running the fake gateway), and the in-process fake's matching semantics."""

from __future__ import annotations

import socket
import threading
import time
import uuid
import weakref
from collections.abc import Iterator

import httpx
import pytest
from django.db import transaction
from gunicorn.config import Keepalive as GunicornKeepalive

from payments import gateway as gateway_module
from payments.codec import interpret_charge
from payments.fake_gateway.inprocess import InProcessFakeGateway
from payments.fake_gateway.models import FakeCharge, FakeIdempotentAnswer, FakeIntent
from payments.gateway import HttpPaymentGateway
from payments.guards import NetworkCallInTransaction
from payments.interface import (
    CancelOutcome,
    ChargeOutcome,
    ChargeRequest,
    GatewayUnavailable,
    IntentStatus,
    RefundOutcome,
)
from payments.registry import get_gateway, override_gateway

FAKE_DELAY = 0.8
SHORT_TIMEOUT = 0.3
# Generous, so a loaded machine does not turn a normal answer into a timeout.
NORMAL_TIMEOUT = 5.0


def new_intent_id() -> str:
    return f"pi_{uuid.uuid4().hex}"


def request_for(intent_id: str, payment_method: str = "pm_card_visa") -> ChargeRequest:
    return ChargeRequest(
        intent_id=intent_id, amount=4200, currency="EUR", payment_method=payment_method
    )


# --- the HTTP adapter on a live server ----------------------------------------------


@pytest.fixture
def server_url(live_server, settings) -> str:
    # The live server runs in this process, so it serves whatever URLconf the
    # settings name when a request arrives.
    settings.ROOT_URLCONF = "tests.fake_gateway_urls"
    settings.FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS = FAKE_DELAY
    settings.FAKE_GATEWAY_LATENCY_MS = 0
    return live_server.url


@pytest.fixture
def gw(server_url) -> Iterator[HttpPaymentGateway]:
    gateway = HttpPaymentGateway(base_url=f"{server_url}/fake-gateway/v1", timeout=NORMAL_TIMEOUT)
    yield gateway
    gateway.close()


@pytest.fixture
def impatient_gw(server_url) -> Iterator[HttpPaymentGateway]:
    gateway = HttpPaymentGateway(base_url=f"{server_url}/fake-gateway/v1", timeout=SHORT_TIMEOUT)
    yield gateway
    gateway.close()


def test_visa_succeeds(gw):
    intent_id = new_intent_id()

    result = gw.charge(request_for(intent_id))

    assert result.outcome == ChargeOutcome.SUCCEEDED
    assert result.charge_id.startswith("ch_")
    assert result.latency_ms > 0
    lookup = gw.retrieve(intent_id)
    assert lookup.status == IntentStatus.SUCCEEDED
    assert lookup.raw["amount"] == 4200
    [listed] = gw.list_charges(intent_id)
    assert (listed.id, listed.amount, listed.status) == (result.charge_id, 4200, "succeeded")


def test_declined(gw):
    intent_id = new_intent_id()

    result = gw.charge(request_for(intent_id, "pm_card_chargeDeclined"))

    assert (result.outcome, result.charge_id, result.detail) == (
        ChargeOutcome.DECLINED,
        None,
        "declined",
    )
    assert gw.retrieve(intent_id).status == IntentStatus.DECLINED


def test_invalid_payment_method_is_a_definitive_refusal(gw):
    result = gw.charge(request_for(new_intent_id(), "pm_card_amex"))

    assert (result.outcome, result.detail) == (ChargeOutcome.DECLINED, "invalid_payment_method")


def test_timeout_charged(gw, impatient_gw):
    intent_id = new_intent_id()

    # when: the charge lands but its answer is lost
    first = impatient_gw.charge(request_for(intent_id, "pm_card_timeout_charged"))

    # then
    assert (first.outcome, first.detail) == (ChargeOutcome.UNKNOWN, "timeout")
    assert SHORT_TIMEOUT * 1000 <= first.latency_ms < FAKE_DELAY * 1000
    assert gw.retrieve(intent_id).status == IntentStatus.SUCCEEDED
    second = gw.charge(request_for(intent_id, "pm_card_timeout_charged"))
    assert second.outcome == ChargeOutcome.SUCCEEDED
    charges = gw.list_charges(intent_id)
    assert [c.id for c in charges] == [second.charge_id]


def test_timeout_not_charged(gw, impatient_gw):
    intent_id = new_intent_id()

    first = impatient_gw.charge(request_for(intent_id, "pm_card_timeout_not_charged"))

    assert (first.outcome, first.detail) == (ChargeOutcome.UNKNOWN, "timeout")
    assert gw.retrieve(intent_id).status == IntentStatus.NOT_FOUND
    retry = gw.charge(request_for(intent_id, "pm_card_timeout_not_charged"))
    assert retry.outcome == ChargeOutcome.SUCCEEDED
    assert len(gw.list_charges(intent_id)) == 1


def test_unreachable(gw, impatient_gw):
    intent_id = new_intent_id()

    result = impatient_gw.charge(request_for(intent_id, "pm_card_unreachable"))

    assert (result.outcome, result.detail) == (ChargeOutcome.UNKNOWN, "timeout")
    assert gw.retrieve(intent_id).status == IntentStatus.REQUIRES_PAYMENT
    assert gw.cancel(intent_id).outcome == CancelOutcome.CANCELED
    assert gw.retrieve(intent_id).status == IntentStatus.CANCELED
    assert gw.list_charges(intent_id) == []


def test_cancel_then_charge_is_declined(gw):
    intent_id = new_intent_id()

    assert gw.cancel(intent_id).outcome == CancelOutcome.CANCELED
    result = gw.charge(request_for(intent_id))

    assert (result.outcome, result.detail) == (ChargeOutcome.DECLINED, "intent_canceled")


def test_cancel_after_charge_and_refund(gw):
    intent_id = new_intent_id()
    gw.charge(request_for(intent_id))

    assert gw.cancel(intent_id).outcome == CancelOutcome.ALREADY_CHARGED
    assert gw.refund(intent_id, idempotency_key=f"{intent_id}:refund").outcome == (
        RefundOutcome.REFUNDED
    )
    assert gw.refund(intent_id, idempotency_key=f"{intent_id}:refund").outcome == (
        RefundOutcome.REFUNDED
    )
    assert [c.status for c in gw.list_charges(intent_id)] == ["refunded"]
    assert gw.retrieve(intent_id).status == IntentStatus.REFUNDED


def test_refund_of_nothing(gw):
    intent_id = new_intent_id()

    result = gw.refund(intent_id, idempotency_key=intent_id)

    assert (result.outcome, result.detail) == (RefundOutcome.NOT_CHARGED, "not_charged")


def test_already_charged_under_another_key_is_unknown(gw, server_url):
    intent_id = new_intent_id()
    httpx.post(
        f"{server_url}/fake-gateway/v1/payment_intents/{intent_id}/charge",
        json={"amount": 4200, "currency": "EUR", "payment_method": "pm_card_visa"},
        headers={"Idempotency-Key": "someone-elses-key"},
    )

    result = gw.charge(request_for(intent_id))

    assert (result.outcome, result.detail) == (ChargeOutcome.UNKNOWN, "already_charged")


def test_5xx_is_unknown(server_url):
    broken = HttpPaymentGateway(base_url=f"{server_url}/broken/v1", timeout=NORMAL_TIMEOUT)
    intent_id = new_intent_id()

    result = broken.charge(request_for(intent_id))

    assert (result.outcome, result.detail) == (ChargeOutcome.UNKNOWN, "http_503")
    assert broken.retrieve(intent_id).status == IntentStatus.UNKNOWN
    assert broken.cancel(intent_id).outcome == CancelOutcome.UNKNOWN
    assert broken.refund(intent_id, idempotency_key=intent_id).outcome == RefundOutcome.UNKNOWN
    with pytest.raises(GatewayUnavailable):
        broken.list_charges(intent_id)


def test_unparseable_body_is_unknown(server_url):
    garbage = HttpPaymentGateway(base_url=f"{server_url}/garbage/v1", timeout=NORMAL_TIMEOUT)
    intent_id = new_intent_id()

    result = garbage.charge(request_for(intent_id))

    assert (result.outcome, result.detail) == (ChargeOutcome.UNKNOWN, "bad_response")
    assert garbage.retrieve(intent_id).status == IntentStatus.UNKNOWN
    with pytest.raises(GatewayUnavailable):
        garbage.list_charges(intent_id)


def test_wrong_url_is_unknown_not_not_found(server_url):
    # A misconfigured base URL must never read as "no such intent".
    lost = HttpPaymentGateway(
        base_url=f"{server_url}/fake-gateway/v1/nowhere", timeout=NORMAL_TIMEOUT
    )

    assert lost.retrieve(new_intent_id()).status == IntentStatus.UNKNOWN


@pytest.mark.parametrize(
    ("status_code", "body", "outcome", "detail"),
    [
        (200, {"status": "succeeded", "charge_id": "ch_1"}, ChargeOutcome.SUCCEEDED, ""),
        (200, {"status": "succeeded"}, ChargeOutcome.UNKNOWN, "bad_response"),
        (200, {"status": "pending"}, ChargeOutcome.UNKNOWN, "bad_response"),
        (200, None, ChargeOutcome.UNKNOWN, "bad_response"),
        (400, {"code": "invalid_amount"}, ChargeOutcome.DECLINED, "invalid_amount"),
        (400, None, ChargeOutcome.UNKNOWN, "bad_response"),
        (409, {"code": "intent_canceled"}, ChargeOutcome.DECLINED, "intent_canceled"),
        (409, {"code": "already_charged"}, ChargeOutcome.UNKNOWN, "already_charged"),
        (429, {"code": "rate_limited"}, ChargeOutcome.UNKNOWN, "rate_limited"),
        (502, None, ChargeOutcome.UNKNOWN, "http_502"),
    ],
)
def test_interpret_charge(status_code, body, outcome, detail):
    result = interpret_charge(status_code, body)

    assert (result.outcome, result.detail) == (outcome, detail)


# --- no server at all -----------------------------------------------------------------


def test_connection_refused_is_unknown():
    # Port 9 (discard) has no listener here: the connection is refused.
    nowhere = HttpPaymentGateway(base_url="http://127.0.0.1:9/fake-gateway/v1", timeout=2.0)
    intent_id = new_intent_id()

    result = nowhere.charge(request_for(intent_id))

    assert (result.outcome, result.detail) == (ChargeOutcome.UNKNOWN, "connection_error")
    assert nowhere.retrieve(intent_id).detail == "connection_error"
    assert nowhere.cancel(intent_id).outcome == CancelOutcome.UNKNOWN
    assert nowhere.refund(intent_id, idempotency_key=intent_id).outcome == RefundOutcome.UNKNOWN
    with pytest.raises(GatewayUnavailable):
        nowhere.list_charges(intent_id)


def test_settings_are_read_at_call_time(settings):
    gateway = HttpPaymentGateway()
    settings.PAYMENT_GATEWAY_URL = "http://127.0.0.1:9/elsewhere/"
    settings.PAYMENT_GATEWAY_TIMEOUT_SECONDS = 1.5

    assert (gateway.base_url, gateway.timeout) == ("http://127.0.0.1:9/elsewhere", 1.5)


def test_a_forked_process_gets_its_own_client(monkeypatch):
    gateway = HttpPaymentGateway(base_url="http://127.0.0.1:9")
    parent_client = gateway._http()
    assert gateway._http() is parent_client

    monkeypatch.setattr(gateway_module.os, "getpid", lambda: -1)

    assert gateway._http() is not parent_client
    parent_client.close()
    gateway.close()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "make_gateway",
    [
        lambda: HttpPaymentGateway(base_url="http://127.0.0.1:9"),
        InProcessFakeGateway,
    ],
)
def test_no_gateway_call_inside_a_transaction(make_gateway):
    gateway = make_gateway()

    with transaction.atomic(), pytest.raises(NetworkCallInTransaction):
        gateway.charge(request_for(new_intent_id()))
    with transaction.atomic(), pytest.raises(NetworkCallInTransaction):
        gateway.retrieve(new_intent_id())


def test_get_gateway_is_process_wide_and_overridable():
    default = get_gateway()
    assert isinstance(default, HttpPaymentGateway)
    assert get_gateway() is default

    fake = InProcessFakeGateway()
    with override_gateway(fake):
        assert get_gateway() is fake

    assert get_gateway() is default


# --- the in-process fake --------------------------------------------------------------


@pytest.fixture
def inprocess(settings) -> InProcessFakeGateway:
    # Long: any sleeping would show.
    settings.FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS = 5
    return InProcessFakeGateway()


@pytest.mark.django_db
def test_inprocess_visa_and_declined(inprocess):
    paid, declined = new_intent_id(), new_intent_id()

    assert inprocess.charge(request_for(paid)).outcome == ChargeOutcome.SUCCEEDED
    assert inprocess.charge(request_for(declined, "pm_card_chargeDeclined")).outcome == (
        ChargeOutcome.DECLINED
    )
    assert inprocess.retrieve(declined).status == IntentStatus.DECLINED
    assert inprocess.calls == [("charge", paid), ("charge", declined), ("retrieve", declined)]


@pytest.mark.django_db
def test_inprocess_timeout_charged(inprocess):
    intent_id = new_intent_id()
    started = time.perf_counter()

    first = inprocess.charge(request_for(intent_id, "pm_card_timeout_charged"))

    assert time.perf_counter() - started < 1
    assert (first.outcome, first.detail) == (ChargeOutcome.UNKNOWN, "timeout")
    charge_row = FakeCharge.objects.get(intent_id=intent_id)
    assert FakeIdempotentAnswer.objects.filter(idempotency_key=intent_id).exists()
    assert inprocess.retrieve(intent_id).status == IntentStatus.SUCCEEDED
    second = inprocess.charge(request_for(intent_id, "pm_card_timeout_charged"))
    assert (second.outcome, second.charge_id) == (ChargeOutcome.SUCCEEDED, charge_row.id)
    assert [c.id for c in inprocess.list_charges(intent_id)] == [charge_row.id]


@pytest.mark.django_db
def test_inprocess_timeout_not_charged(inprocess):
    intent_id = new_intent_id()
    started = time.perf_counter()

    first = inprocess.charge(request_for(intent_id, "pm_card_timeout_not_charged"))

    assert time.perf_counter() - started < 1
    assert (first.outcome, first.detail) == (ChargeOutcome.UNKNOWN, "timeout")
    assert not FakeIntent.objects.filter(pk=intent_id).exists()
    assert inprocess.retrieve(intent_id).status == IntentStatus.NOT_FOUND
    assert (
        inprocess.charge(request_for(intent_id, "pm_card_timeout_not_charged")).outcome
        == ChargeOutcome.SUCCEEDED
    )
    assert FakeCharge.objects.filter(intent_id=intent_id).count() == 1


@pytest.mark.django_db
def test_inprocess_unreachable_then_cancel(inprocess):
    intent_id = new_intent_id()

    for _ in range(2):
        result = inprocess.charge(request_for(intent_id, "pm_card_unreachable"))
        assert (result.outcome, result.detail) == (ChargeOutcome.UNKNOWN, "timeout")

    assert inprocess.retrieve(intent_id).status == IntentStatus.REQUIRES_PAYMENT
    assert inprocess.cancel(intent_id).outcome == CancelOutcome.CANCELED
    assert inprocess.retrieve(intent_id).status == IntentStatus.CANCELED
    assert not FakeCharge.objects.filter(intent_id=intent_id).exists()


@pytest.mark.django_db
def test_inprocess_cancel_refund(inprocess):
    canceled, paid = new_intent_id(), new_intent_id()

    assert inprocess.cancel(canceled).outcome == CancelOutcome.CANCELED
    assert inprocess.charge(request_for(canceled)).detail == "intent_canceled"
    inprocess.charge(request_for(paid))
    assert inprocess.cancel(paid).outcome == CancelOutcome.ALREADY_CHARGED
    assert inprocess.refund(paid, idempotency_key=paid).outcome == RefundOutcome.REFUNDED
    assert inprocess.refund(canceled, idempotency_key=canceled).outcome == (
        RefundOutcome.NOT_CHARGED
    )
    assert [c.status for c in inprocess.list_charges(paid)] == ["refunded"]


def test_idle_connections_are_dropped_before_gunicorn_closes_them():
    """A charge sent on a pooled connection at the instant the server closes
    it gets no answer: an UNKNOWN to reconcile (make bench saw it with httpx's
    5 s default). The pool lets go of an idle connection before gunicorn's
    keep-alive (the fake gateway's server) closes it."""
    client = HttpPaymentGateway(base_url="http://127.0.0.1:9")._http()
    transport = client._transport
    assert isinstance(transport, httpx.HTTPTransport)
    pool = transport._pool

    assert pool._keepalive_expiry < GunicornKeepalive.default


def test_a_pool_process_builds_the_gateway_client_when_it_starts(monkeypatch):
    # What each Celery pool process runs as it starts (payments/apps.py):
    # the client (and its TLS context) is built there, not in the first charge.
    from celery import signals

    from payments.registry import prepare_in_pool_process

    connected = [
        r() if isinstance(r, weakref.ReferenceType) else r
        for _, r in signals.worker_process_init.receivers
    ]
    assert prepare_in_pool_process in connected

    built: list[HttpPaymentGateway] = []
    real = HttpPaymentGateway._http

    def counted(self):
        built.append(self)
        return real(self)

    monkeypatch.setattr(HttpPaymentGateway, "_http", counted)
    http = HttpPaymentGateway(base_url="http://127.0.0.1:9/v1")
    with override_gateway(http):
        prepare_in_pool_process()

    assert built == [http]
    assert http._client is not None
    client = http._client
    http.prepare()  # once per process: the same client again
    assert http._client is client
    http.close()


# --- a connection that breaks after the request went out -----------------------------------


class _AnswerLosingProxy:
    """A TCP stand-in in front of the live fake: it forwards each request (so
    the fake acts on it) and, for the first ``lose`` requests, closes the
    caller's connection instead of passing the answer on, as a keep-alive
    connection closed under a request, or a reset, looks to the caller."""

    def __init__(self, upstream: str, *, lose: int) -> None:
        self.upstream, self.lose, self.requests = upstream, lose, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            while True:
                request = self._read(conn)
                if request is None:
                    return
                self.requests += 1
                method, path, headers, body = request
                answer = httpx.request(method, self.upstream + path, headers=headers, content=body)
                if self.requests <= self.lose:
                    return  # the fake acted; its answer goes nowhere
                conn.sendall(
                    f"HTTP/1.1 {answer.status_code} X\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(answer.content)}\r\n\r\n".encode()
                    + answer.content
                )

    @staticmethod
    def _read(conn: socket.socket):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = dict(line.split(": ", 1) for line in lines[1:])
        size = int(headers.get("content-length", headers.get("Content-Length", "0")))
        while len(body) < size:
            body += conn.recv(65536)
        kept = {
            k: v for k, v in headers.items() if k.lower() in ("content-type", "idempotency-key")
        }
        return method, path, kept, body

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def losing_proxy(server_url):
    proxies = []

    def make(*, lose: int) -> _AnswerLosingProxy:
        proxies.append(_AnswerLosingProxy(server_url, lose=lose))
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.close()


def test_a_charge_whose_answer_a_broken_connection_lost_is_sent_again_and_charged_once(
    gw, losing_proxy, caplog
):
    # given: the connection breaks after the fake charged, on the first send
    proxy = losing_proxy(lose=1)
    through = HttpPaymentGateway(base_url=f"{proxy.url}/fake-gateway/v1", timeout=NORMAL_TIMEOUT)
    intent_id = new_intent_id()

    with caplog.at_level("INFO", logger="payments.gateway"):
        result = through.charge(request_for(intent_id))
    through.close()

    # then: sent once more under the same key, the fake's first answer came
    # back, and the card was charged once
    assert result.outcome == ChargeOutcome.SUCCEEDED
    assert proxy.requests == 2
    assert [c.id for c in gw.list_charges(intent_id)] == [result.charge_id]
    [line] = [r for r in caplog.records if r.msg == "gateway %s"]
    assert line.sends == 2


def test_a_connection_broken_twice_is_unknown_with_the_transports_words_and_not_sent_a_third_time(
    gw, losing_proxy, caplog
):
    proxy = losing_proxy(lose=10)
    through = HttpPaymentGateway(base_url=f"{proxy.url}/fake-gateway/v1", timeout=NORMAL_TIMEOUT)
    intent_id = new_intent_id()

    with caplog.at_level("INFO", logger="payments.gateway"):
        result = through.charge(request_for(intent_id))
        refund = through.refund(intent_id, idempotency_key=f"{intent_id}-r")
    through.close()

    assert (result.outcome, result.detail) == (ChargeOutcome.UNKNOWN, "connection_error")
    assert refund.outcome == RefundOutcome.UNKNOWN
    assert proxy.requests == 4  # two sends each
    # the charge landed once whatever the answers' fate; the refund too
    assert gw.retrieve(intent_id).status == IntentStatus.REFUNDED
    charge_line = next(r for r in caplog.records if getattr(r, "gateway_operation", "") == "charge")
    assert charge_line.sends == 2
    assert charge_line.error.startswith("RemoteProtocolError: ")


def test_a_timeout_and_a_refused_connection_are_sent_once(impatient_gw, caplog):
    nowhere = HttpPaymentGateway(base_url="http://127.0.0.1:9/fake-gateway/v1", timeout=2.0)
    with caplog.at_level("INFO", logger="payments.gateway"):
        late = impatient_gw.charge(request_for(new_intent_id(), "pm_card_timeout_not_charged"))
        refused = nowhere.charge(request_for(new_intent_id()))

    assert (late.detail, refused.detail) == ("timeout", "connection_error")
    lines = [r for r in caplog.records if getattr(r, "gateway_operation", "") == "charge"]
    assert [getattr(r, "sends", 1) for r in lines] == [1, 1]
    assert lines[1].error.startswith("ConnectError: ")
