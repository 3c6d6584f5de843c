"""One POST of a webhook to a checked address, outside any transaction.

The request goes to :attr:`url_safety.Target.address` (the address that was
checked), with the endpoint's host name in the ``Host`` header and, for TLS,
as the server name the certificate is verified against (httpcore's
``sni_hostname``): nothing resolves the name a second time. No redirect is
followed, no proxy from the environment is used (it would resolve the name
itself), and only the start of the answer is read.

The request is handed to an httpx transport (the connection pool) rather
than a client: a client's cookies, authentication, redirects and event hooks
are nothing a webhook uses, and they were a quarter of the send's CPU
(a profile of make bench's figure 9).

A worker process keeps the connection of an attempt that got an answer for
the next attempt to the same checked target (:class:`_Transports`): the
key is the address that was checked, the port, the scheme and the names
sent (``Host``, TLS server name), so a connection is reused only where a new
one would have gone, and each attempt checks its URL again first. An
attempt that fails or runs out of time closes its connection.
"""

from __future__ import annotations

import functools
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import httpx

from config.transactions import open_transaction_alias

from .url_safety import DEFAULT_PORTS, Target

EXCERPT_CHARS = 500
# The whole exchange's deadline is the timeout and this: httpx's own timeouts
# (per connect, write, read) answer first whenever they can say which.
_DEADLINE_SLACK_SECONDS = 0.5
_READ_AT_MOST = 4096  # bytes of the answer's body read at all
USER_AGENT = "boxoffice-webhooks/1"


class NetworkCallInTransaction(RuntimeError):
    pass


def assert_no_transaction(what: str) -> None:
    """A POST inside a transaction would hold its locks across a receiver
    that may hang for the whole timeout (docs/design.md, "House rules")."""
    alias = open_transaction_alias()
    if alias is not None:
        raise NetworkCallInTransaction(f"{what} called inside a transaction on {alias!r}")


@dataclass(frozen=True)
class Answer:
    """What one attempt got: a status code (None: no answer), how long it
    took (None: nothing was sent), why it is not a success, and the start
    of the answer's body."""

    status_code: int | None = None
    latency_ms: float | None = None
    error: str = ""
    excerpt: str = ""

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default TLS settings (certifi's roots), built once per process:
    building them is most of what a new transport costs (about 20 ms of CPU,
    measured by make bench's figure 9), and a context is safe to share."""
    return httpx.create_ssl_context()


def build_request(target: Target, *, headers: dict[str, str], body: bytes) -> httpx.Request:
    address = f"[{target.address}]" if ":" in target.address else target.address
    if target.port != DEFAULT_PORTS[target.scheme]:
        address += f":{target.port}"
    url = f"{target.scheme}://{address}{target.path}"
    return httpx.Request(
        "POST",
        url,
        content=body,
        headers={**headers, "Host": target.host_header, "User-Agent": USER_AGENT},
        extensions={"sni_hostname": target.host} if target.scheme == "https" else {},
    )


# Receivers whose connections a worker process keeps (the least recently
# used beyond it is closed); httpx closes a connection idle for 5 s itself.
KEPT_TARGETS = 32


class _Transports:
    """One httpx transport per checked target, each used by one attempt at a
    time (taken, then given back), with one connection at most. A transport
    follows no redirect and reads no proxy from the environment: it sends
    the request it is given, to the address in its URL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: OrderedDict[tuple, httpx.HTTPTransport] = OrderedDict()

    def take(self, target: Target) -> httpx.HTTPTransport:
        with self._lock:
            transport = self._idle.pop(_key(target), None)
        if transport is None:
            transport = httpx.HTTPTransport(
                verify=_tls(),
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            )
        return transport

    def give_back(self, target: Target, transport: httpx.HTTPTransport) -> None:
        closing = []
        with self._lock:
            if (other := self._idle.pop(_key(target), None)) is not None:
                closing.append(other)  # two attempts to one target at once: keep one
            self._idle[_key(target)] = transport
            while len(self._idle) > KEPT_TARGETS:
                closing.append(self._idle.popitem(last=False)[1])
        for spare in closing:
            spare.close()


def _key(target: Target) -> tuple:
    # The host name is both the Host header and the TLS server name.
    return (target.scheme, target.address, target.port, target.host)


_transports = _Transports()


def post(target: Target, *, headers: dict[str, str], body: bytes, timeout: float) -> Answer:
    """POST ``body`` to ``target``; never raises for what the network or the
    receiver does.

    ``timeout`` bounds each connect, write and read (httpx's timeouts) and
    also the whole exchange: a receiver that trickles its answer a byte at a
    time never trips a per-read timeout, so the exchange runs in a thread of
    its own and the attempt ends at the deadline whatever it is doing. The
    connection is then closed, which ends that thread at its next read."""
    assert_no_transaction("webhook POST")
    request = build_request(target, headers={**headers, "Accept-Encoding": "identity"}, body=body)
    request.extensions["timeout"] = httpx.Timeout(timeout).as_dict()
    started = time.monotonic()
    transport = _transports.take(target)
    outcome: list[Answer] = []
    exchange = threading.Thread(
        target=lambda: outcome.append(_exchange(transport, request, started, timeout)),
        name="webhook-post",
        daemon=True,
    )
    exchange.start()
    exchange.join(timeout + _DEADLINE_SLACK_SECONDS)
    if outcome:
        if outcome[0].status_code is not None:
            # An answer: httpcore kept its connection only if it was read
            # to its end, else closed it; either way the transport is clean.
            _transports.give_back(target, transport)
        else:
            transport.close()
        return outcome[0]
    transport.close()  # the abandoned exchange fails at its next read and ends
    return Answer(
        latency_ms=_ms_since(started), error=f"timeout after {timeout:g}s (no complete answer)"
    )


def _exchange(
    transport: httpx.HTTPTransport, request: httpx.Request, started: float, timeout: float
) -> Answer:
    try:
        response = transport.handle_request(request)
        try:
            latency = _ms_since(started)
            head = b""
            # Raw bytes: a compressed answer is not inflated here.
            for chunk in response.iter_raw():
                head += chunk
                if len(head) >= _READ_AT_MOST:
                    break
        finally:
            response.close()
    except httpx.TimeoutException as exc:
        return Answer(
            latency_ms=_ms_since(started),
            error=f"timeout after {timeout:g}s ({type(exc).__name__})",
        )
    except httpx.HTTPError as exc:
        return Answer(latency_ms=_ms_since(started), error=_short(f"{type(exc).__name__}: {exc}"))
    excerpt = head.decode("utf-8", errors="replace")[:EXCERPT_CHARS]
    code = response.status_code
    if 200 <= code < 300:
        error = ""
    elif response.is_redirect:
        error = _short(
            f"HTTP {code}: redirect to {response.headers.get('location', '?')} not followed"
        )
    else:
        error = f"HTTP {code}"
    return Answer(status_code=code, latency_ms=latency, error=error, excerpt=excerpt)


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


def _short(text: str) -> str:
    return text if len(text) <= 500 else text[:499] + "…"
