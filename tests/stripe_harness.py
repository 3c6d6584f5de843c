"""Stripe for the tests: localstripe (a real, stateful Stripe emulator, run
as its own process), a fault proxy between our adapter and it, a stub
server for the answers localstripe cannot give, and helpers that read and
drive localstripe directly (docs/stripe.md, "Testing against localstripe").

- ``localstripe_url`` (session): ``LOCALSTRIPE_URL`` when
  ``scripts/with-services.sh`` started one (make test), else a localstripe
  of this session's own on a free port, so that one file runs alone too.
- :class:`FaultProxy`: a threaded HTTP proxy on 127.0.0.1. Per rule (method,
  path pattern, which matching call): ``drop`` forwards the request, waits
  for localstripe's answer, then closes the connection without answering
  (the request *reached* Stripe); ``delay`` forwards it and answers only
  after ``delay_seconds`` (past the adapter's timeout); ``error500`` answers
  500 without forwarding. It also serves Stripe's PaymentIntent search by
  ``metadata['…']``, which localstripe lacks, by listing and filtering.
- :class:`StubStripe`: answers each request with the next of a script of
  Stripe-shaped answers (409 ``idempotency_key_in_use``, 429, pending
  refunds…), recording what it was asked.
- :class:`Localstripe`: PaymentMethods (the 3-D Secure card), the buyer's
  authentication (``_authenticate``), and listings to assert on.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from payments.stripe.adapter import StripePaymentGateway

# localstripe takes any secret key of the right shape.
LOCALSTRIPE_KEY = "sk_test_boxoffice"
# The adapter's timeout behind the proxy: short, so that a delay costs little.
ADAPTER_TIMEOUT = 1.0
# How long a ``delay`` rule holds its answer: well past ADAPTER_TIMEOUT.
DELAY_SECONDS = 3.0
# localstripe's start: a Python process importing aiohttp.
START_DEADLINE_SECONDS = 30.0

# Test cards (docs/stripe.md, "Test cards").
CARD_VISA = "pm_card_visa"  # charges
CARD_DECLINED_AT_CHARGE = "pm_card_chargeCustomerFail"
CARD_3DS = "4000002500003155"  # a card number: needs 3-D Secure


# --- localstripe, the process -----------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v1/balance", auth=(LOCALSTRIPE_KEY, ""), timeout=1).is_success
    except httpx.TransportError:
        return False


@pytest.fixture(scope="session")
def localstripe_url() -> Iterator[str]:
    """The URL of a running localstripe: make test's, or this session's own."""
    given = os.environ.get("LOCALSTRIPE_URL")
    if given:
        yield given.rstrip("/")
        return
    executable = Path(sys.executable).with_name("localstripe")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [str(executable), "--from-scratch", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + START_DEADLINE_SECONDS
            while not _answers(url):
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read()[-2000:].decode(errors="replace")
                    raise RuntimeError(f"localstripe ({executable}) did not start:\n{tail}")
                time.sleep(0.1)  # polling an external process, with a deadline
            yield url
        finally:
            process.terminate()
            process.wait(timeout=10)


# --- localstripe, the API -----------------------------------------------------------


class Localstripe:
    """localstripe's API, spoken directly (not through the adapter)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {LOCALSTRIPE_KEY}"}, timeout=10
        )

    def _post(self, path: str, data: dict[str, str]) -> dict[str, Any]:
        answer = self.http.post(path, data=data)
        answer.raise_for_status()
        return answer.json()

    def _get(self, path: str, **params: str) -> dict[str, Any]:
        answer = self.http.get(path, params=params)
        answer.raise_for_status()
        return answer.json()

    def card(self, number: str) -> str:
        """A PaymentMethod of a card number (what Stripe.js makes in a browser)."""
        made = self._post(
            "/v1/payment_methods",
            {
                "type": "card",
                "card[number]": number,
                "card[exp_month]": "12",
                "card[exp_year]": "2034",
                "card[cvc]": "123",
            },
        )
        return made["id"]

    def authenticate(self, pi_id: str, client_secret: str, *, success: bool) -> dict[str, Any]:
        """The buyer completes (or fails) 3-D Secure, as localstripe's
        Stripe.js stand-in does."""
        return self._post(
            f"/v1/payment_intents/{pi_id}/_authenticate",
            {"client_secret": client_secret, "success": "true" if success else "false"},
        )

    def payment_intent(self, pi_id: str) -> dict[str, Any]:
        return self._get(f"/v1/payment_intents/{pi_id}")

    def payment_intents_of(self, intent_id: str) -> list[dict[str, Any]]:
        """Every PaymentIntent whose ``metadata.intent_id`` is ours."""
        return [
            pi
            for pi in list_all(self._get, "/v1/payment_intents")
            if (pi.get("metadata") or {}).get("intent_id") == intent_id
        ]

    def refunds_of(self, pi_id: str) -> list[dict[str, Any]]:
        return self._get("/v1/refunds", payment_intent=pi_id, limit="100")["data"]

    def close(self) -> None:
        self.http.close()


def list_all(get, path: str) -> list[dict[str, Any]]:
    """Every object of a Stripe list endpoint, page after page."""
    found: list[dict[str, Any]] = []
    params = {"limit": "100"}
    while True:
        page = get(path, **params)
        found.extend(page["data"])
        if not page["has_more"] or not page["data"]:
            return found
        params["starting_after"] = page["data"][-1]["id"]


@pytest.fixture(scope="session")
def localstripe(localstripe_url: str) -> Iterator[Localstripe]:
    api = Localstripe(localstripe_url)
    yield api
    api.close()


# --- the fault proxy --------------------------------------------------------------

FAULTS = ("drop", "delay", "error500")
SEARCH_PATH = "/v1/payment_intents/search"
_FORWARDED = ("authorization", "content-type", "idempotency-key", "stripe-version")
_METADATA_QUERY = re.compile(r"metadata\['(?P<key>[^']+)'\]:'(?P<value>(?:[^'\\]|\\.)*)'")


@dataclass
class Rule:
    method: str
    path: re.Pattern[str]
    action: str
    # Which matching call (1-based) gets the fault; None: every one.
    call: int | None
    seen: int = 0

    def applies(self, method: str, path: str) -> bool:
        if method != self.method or not self.path.fullmatch(path):
            return False
        self.seen += 1
        return self.call is None or self.seen == self.call


@dataclass
class Exchange:
    method: str
    path: str
    fault: str  # "" when the answer went through
    status: int | None = None


@dataclass
class _Answer:
    status: int
    content_type: str
    body: bytes


@dataclass
class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``upstream``, in threads of the
    test process: see the module's docstring."""

    upstream: str
    delay_seconds: float = DELAY_SECONDS
    rules: list[Rule] = field(default_factory=list)
    exchanges: list[Exchange] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._release = threading.Event()
        target = urlsplit(self.upstream)
        self._host, self._port = target.hostname or "127.0.0.1", target.port or 80
        self._server = _server_for(self)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def fault(self, method: str, path: str, action: str, *, call: int | None = 1) -> Rule:
        """From now on, the ``call``-th request matching ``method`` and the
        ``path`` pattern (the whole path, no query) meets ``action``."""
        assert action in FAULTS, action
        rule = Rule(method, re.compile(path), action, call)
        with self._lock:
            self.rules.append(rule)
        return rule

    def faults_met(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.fault]

    def close(self) -> None:
        self._release.set()  # answers held by ``delay`` go (to nobody) now
        self._server.shutdown()
        self._server.server_close()

    # What the handler asks -----------------------------------------------------

    def _action_for(self, method: str, path: str) -> str:
        with self._lock:
            for rule in self.rules:
                if rule.applies(method, path):
                    return rule.action
        return ""

    def _forward(self, method: str, target: str, headers: dict[str, str], body: bytes) -> _Answer:
        connection = HTTPConnection(self._host, self._port, timeout=30)
        try:
            connection.request(method, target, body=body or None, headers=headers)
            response = connection.getresponse()
            return _Answer(
                response.status,
                response.getheader("Content-Type") or "application/json",
                response.read(),
            )
        finally:
            connection.close()

    def _search(self, query: str, headers: dict[str, str]) -> _Answer:
        """Stripe's ``GET /v1/payment_intents/search`` for
        ``metadata['key']:'value'``: localstripe's PaymentIntents, filtered."""
        match = _METADATA_QUERY.fullmatch(query.strip())
        if match is None:
            error = {"error": {"type": "invalid_request_error", "message": f"unsupported {query}"}}
            return _Answer(400, "application/json", json.dumps(error).encode())
        key, value = match["key"], re.sub(r"\\(.)", r"\1", match["value"])

        def get(path: str, **params: str) -> dict[str, Any]:
            answer = self._forward("GET", f"{path}?{urlencode(params)}", headers, b"")
            return json.loads(answer.body)

        found = [
            pi
            for pi in list_all(get, "/v1/payment_intents")
            if (pi.get("metadata") or {}).get(key) == value
        ]
        result = {
            "object": "search_result",
            "url": SEARCH_PATH,
            "has_more": False,
            "next_page": None,
            "data": found,
        }
        return _Answer(200, "application/json", json.dumps(result).encode())


def _server_for(proxy: FaultProxy) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, so a dropped answer is a
        # closed connection and nothing lingers between requests.
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self._handle()

        def do_POST(self) -> None:  # noqa: N802
            self._handle()

        def do_DELETE(self) -> None:  # noqa: N802
            self._handle()

        def _handle(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            target = urlsplit(self.path)
            fault = proxy._action_for(self.command, target.path)
            exchange = Exchange(self.command, target.path, fault)
            proxy.exchanges.append(exchange)
            if fault == "error500":
                error = {"error": {"type": "api_error", "message": "fault proxy: error500"}}
                self._answer(_Answer(500, "application/json", json.dumps(error).encode()))
                return
            headers = {
                k: v
                for k, v in self.headers.items()
                if k.lower()
                in ("authorization", "content-type", "idempotency-key", "stripe-version")
            }
            if self.command == "GET" and target.path == SEARCH_PATH:
                query = parse_qs(target.query).get("query", [""])[0]
                answer = proxy._search(query, headers)
            else:
                answer = proxy._forward(self.command, self.path, headers, body)
            exchange.status = answer.status
            if fault == "drop":
                return  # the connection closes with no answer: it reached Stripe
            if fault == "delay":
                proxy._release.wait(proxy.delay_seconds)
            self._answer(answer)

        def _answer(self, answer: _Answer) -> None:
            try:
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)
            except OSError:
                pass  # the client gave up (a delayed answer): nobody to tell

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


@pytest.fixture
def fault_proxy(localstripe_url: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(localstripe_url)
    yield proxy
    proxy.close()


def gateway_at(url: str, *, timeout: float = ADAPTER_TIMEOUT) -> StripePaymentGateway:
    return StripePaymentGateway(api_key=LOCALSTRIPE_KEY, api_base=url, timeout=timeout)


@pytest.fixture
def stripe_gateway(fault_proxy: FaultProxy) -> Iterator[StripePaymentGateway]:
    """The adapter, pointed at localstripe through this test's fault proxy,
    with a short timeout."""
    gateway = gateway_at(fault_proxy.url)
    yield gateway
    gateway.close()


# --- a stub for what localstripe cannot say -------------------------------------


@dataclass
class Asked:
    method: str
    path: str
    query: dict[str, list[str]]
    form: dict[str, list[str]]
    headers: dict[str, str]


class StubStripe:
    """An HTTP server on 127.0.0.1 answering each request with the next of
    ``script``: ``(status, body)`` pairs, ``body`` a dict sent as JSON."""

    def __init__(self, script: list[tuple[int, dict[str, Any]]]) -> None:
        self.script = list(script)
        self.asked: list[Asked] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self._handle()

            def do_POST(self) -> None:  # noqa: N802
                self._handle()

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = urlsplit(self.path)
                stub.asked.append(
                    Asked(
                        self.command,
                        target.path,
                        parse_qs(target.query),
                        parse_qs(body.decode()),
                        {k.lower(): v for k, v in self.headers.items()},
                    )
                )
                status, answer = stub.script.pop(0) if stub.script else (599, {})
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def stripe_error(kind: str, message: str, **fields: str) -> dict[str, Any]:
    """A Stripe error body (https://docs.stripe.com/api/errors)."""
    return {"error": {"type": kind, "message": message, **fields}}


def payment_intent(pi_id: str, status: str, **fields: Any) -> dict[str, Any]:
    """A PaymentIntent as Stripe answers it (the fields the adapter reads)."""
    return {
        "id": pi_id,
        "object": "payment_intent",
        "amount": 4200,
        "currency": "eur",
        "status": status,
        "client_secret": f"{pi_id}_secret_stub",
        "created": 1_760_000_000,
        "latest_charge": None,
        "last_payment_error": None,
        "metadata": {},
        **fields,
    }


@pytest.fixture(name="stub")
def stub_fixture() -> Iterator[Callable[..., tuple[StubStripe, StripePaymentGateway]]]:
    """``stub(*script)``: a :class:`StubStripe` answering the script, and a
    gateway at it; both closed after the test."""
    made: list[tuple[StubStripe, StripePaymentGateway]] = []

    def start(*script: tuple[int, dict[str, Any]]) -> tuple[StubStripe, StripePaymentGateway]:
        server = StubStripe(list(script))
        made.append((server, gateway_at(server.url)))
        return made[-1]

    yield start
    for server, gateway in made:
        gateway.close()
        server.close()
