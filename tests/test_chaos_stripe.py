"""Chaos in Stripe mode (issue 33): purchases keep flowing while the Stripe
adapter's calls lose their answers, time out or fail, and workers are
SIGKILLed, some of them in the middle of a charge; afterwards nobody was
charged twice, no compensated purchase kept a charge, no PaymentIntent is
left that could still be charged, the ledger equals what Stripe holds, and
``manage.py audit_sagas`` (asking Stripe through the adapter) reports nothing.

The stack of ``tests/chaos.py`` (gunicorn, two Celery workers, the outbox
relay, beat, on a disposable PostgreSQL and Redis) runs with
``PAYMENT_GATEWAY=stripe``, its ``STRIPE_API_BASE`` a fault proxy
(``ChaosProxy``, the harness's ``FaultProxy`` with seeded random faults, in
this process) in front of a localstripe of its own (``chaos.LocalstripeServer``;
the proxy also serves the PaymentIntent search localstripe lacks). Faults:

- each create, confirm, retrieve (and search), cancel and refund call meets,
  with probability ``fault_rate``, one of ``drop`` (localstripe acted, the
  answer is lost), ``delay`` (the answer comes after the adapter's timeout)
  or ``error500`` (nothing reached localstripe), all through the settle;
- every ``kill_every`` seconds a worker's pool process is SIGKILLed, in turn
  at random (as the fake-mode chaos does) or *mid-call*: the next create,
  confirm, cancel or refund that a pool process sends is forwarded, answered
  by localstripe, and its sender is killed before the answer reaches it (the
  proxy finds the process by its socket);
- customer service refunds a few CONFIRMED purchases every ``refund_every``
  seconds (``purchase_refund`` in a ``manage.py shell`` of the stack's
  environment): each opens a refund row (the purchase stays CONFIRMED,
  docs/refunds.md) that the refund step asks of Stripe and looks up, so
  that refunds meet the faults and the kills too.

The load buys with ``pm_card_visa`` (charges), ``pm_card_chargeCustomerFail``
(declined at the charge) and a PaymentMethod of the 3-D Secure card, whose
buyers (``Buyers``) pass, fail or abandon the authentication, some after the
hold's expiry. Marker ``chaos`` only, skipped unless selected (``make
chaos`` runs it after ``tests/test_chaos.py``) or ``CHAOS_STRIPE=1``; about
3 minutes 15 s in all (``CHAOS_SEED``, ``CHAOS_STRIPE_FAULT_RATE``;
``CHAOS_STRIPE_LOAD_SECONDS`` shortens the load, 150 s by default). On a
failure the report names each saga at fault with its history, gateway answers,
outbox rows, ledger, its PaymentIntents at localstripe and its log lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from devtools.processes import children

from . import chaos
from .stripe_harness import (
    CARD_3DS,
    FAULTS,
    LOCALSTRIPE_KEY,
    SEARCH_PATH,
    FaultProxy,
    Localstripe,
    _Answer,  # what a FaultProxy's steps return (the harness's own type)
    list_all,
)

# The adapter's timeout, and how long a ``delay`` holds its answer (past it).
STRIPE_TIMEOUT_SECONDS = 1.0
DELAY_SECONDS = 3.0
SETTINGS: dict[str, Any] = {
    **chaos.SETTINGS,
    "PAYMENT_GATEWAY": "stripe",
    "FAKE_GATEWAY_ENABLED": "false",
    "STRIPE_SECRET_KEY": LOCALSTRIPE_KEY,
    "STRIPE_PUBLISHABLE_KEY": "pk_test_boxoffice",
    "STRIPE_WEBHOOK_SECRET": "whsec_chaos",
    "STRIPE_TIMEOUT_SECONDS": STRIPE_TIMEOUT_SECONDS,
}
# localstripe's test cards (docs/stripe.md, "Test cards"), as shares of the
# purchases; THREE_D_SECURE stands for a PaymentMethod of the 3-D Secure card
# made at localstripe before the load (what Stripe.js makes in a browser).
THREE_D_SECURE = "3ds"
METHODS = {"pm_card_visa": 0.7, "pm_card_chargeCustomerFail": 0.15, THREE_D_SECURE: 0.15}
# What the buyer of a purchase waiting for 3-D Secure does, as shares: pass
# it, fail it, or walk away (the hold's expiry must cancel the intent).
BUYER_CHOICES = {"pass": 0.5, "fail": 0.2, "abandon": 0.3}
# How long a buyer takes, in seconds (uniform): past the hold
# (PURCHASE_HOLD_SECONDS, 8 s), some race its expiry.
BUYER_SECONDS = (0.5, 10.0)
SETTLED = ("CONFIRMED", "COMPENSATED")
# Worth an operator's look, not a failure, when an alert names them.
ESCALATED = ("UNKNOWN_EXPIRED", "COMPENSATION_PENDING")
# A PaymentIntent that a confirm (or the buyer) could still charge.
CHARGEABLE = ("requires_confirmation", "requires_action")
# After the load: a hold, a resumer pass, the probe schedule, a lost
# delivery's lease and redelivery, refund retries; polled, so a run that
# settles sooner waits no longer.
SETTLE_BOUND_SECONDS = 120
WORKERS = ("worker1", "worker2")

unavailable = chaos.servers_available() or chaos.LocalstripeServer.unavailable()
pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(unavailable is not None, reason=f"chaos stack: {unavailable}"),
]


@dataclass(frozen=True)
class Scenario:
    load_seconds: float = 150
    threads: int = 4
    mean_gap: float = 1.0  # seconds between one thread's purchases, on average
    kill_every: float = 3
    fault_rate: float = 0.15
    refund_every: float = 10
    refunds_per_round: int = 2
    users: int = 30
    rows: str = "ABCDEFGHIJ"
    per_row: int = 60


# --- the proxy: random faults, and the sender killed mid-call ------------------------

# (operation, method, whole path): the adapter's calls, as the proxy sees them.
OPERATIONS: tuple[tuple[str, str, re.Pattern[str]], ...] = tuple(
    (operation, method, re.compile(path))
    for operation, method, path in (
        ("create", "POST", r"/v1/payment_intents"),
        ("confirm", "POST", r"/v1/payment_intents/[^/]+/confirm"),
        ("cancel", "POST", r"/v1/payment_intents/[^/]+/cancel"),
        ("search", "GET", r"/v1/payment_intents/search"),
        ("retrieve", "GET", r"/v1/payment_intents/[^/]+"),
        # a refund row's (or a compensation's) create, its look-up by
        # Stripe's id, and the list by PaymentIntent (a look-up by our id)
        ("refund", "POST", r"/v1/refunds"),
        ("refund retrieve", "GET", r"/v1/refunds/[^/]+"),
        ("refund list", "GET", r"/v1/refunds"),
    )
)
# The calls after which a sender may be killed: those that change something.
WRITES = frozenset({"create", "confirm", "cancel", "refund"})


def operation_of(method: str, path: str) -> str | None:
    for operation, verb, pattern in OPERATIONS:
        if verb == method and pattern.fullmatch(path):
            return operation
    return None


# Stripe's search for the PaymentIntents of one of our intents (the only
# query the adapter makes: payments/stripe/answers.py, ``search_query``).
INTENT_QUERY = re.compile(r"metadata\['intent_id'\]:'(?P<value>(?:[^'\\]|\\.)*)'")


@dataclass(frozen=True)
class Kill:
    """A sender killed mid-call: the call, its pid, the PaymentIntent it was about."""

    operation: str
    pid: int
    payment_intent: str


def _payment_intent_of(answer: _Answer) -> str:
    """The PaymentIntent a create, confirm, cancel or refund answered about."""
    with contextlib.suppress(ValueError, AttributeError):
        made = json.loads(answer.body)
        return str(made.get("payment_intent") or made.get("id") or "")
    return ""


class ChaosProxy(FaultProxy):
    """The harness's fault proxy with seeded random faults: while
    ``faulting``, each call of an operation of :data:`OPERATIONS` meets one
    of ``FAULTS`` with probability ``rate``. ``arm_kill()``: the next write
    (:data:`WRITES`) whose sender ``killer`` accepts (it returns the pid it
    killed, given the sender's port) is forwarded and answered by
    localstripe, then its sender killed before the answer goes back.

    Its search by ``metadata['intent_id']`` reads the PaymentIntents this
    proxy saw created for that intent (every create goes through it; one
    that met ``error500`` made none), one retrieve each: the harness's
    search lists all of localstripe's, page by page, which with thousands
    of them takes longer than the adapter's timeout and made every look-up
    by our intent id time out."""

    def __init__(self, upstream: str, *, rate: float, seed: int, delay_seconds: float) -> None:
        self.rate = rate
        self.faulting = False
        self.rng = random.Random(seed)
        self.calls: Counter[str] = Counter()
        self.injected: Counter[tuple[str, str]] = Counter()
        self.killer: Callable[[int], int | None] | None = None
        self.kills: list[Kill] = []
        self._kill_armed = False
        self._sender = threading.local()
        self._created: dict[str, list[str]] = defaultdict(list)  # intent id -> pi ids
        super().__init__(upstream, delay_seconds=delay_seconds)
        self._remember_senders()

    def _remember_senders(self) -> None:
        """Each request's handler thread notes its sender's port first."""
        proxy = self
        base: Any = self._server.RequestHandlerClass

        class Handler(base):
            def _handle(self) -> None:
                proxy._sender.port = self.client_address[1]
                super()._handle()

        self._server.RequestHandlerClass = Handler

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 0)

    def arm_kill(self) -> bool:
        """Arm the mid-call kill; False if it was armed already (not fired)."""
        with self._lock:
            was, self._kill_armed = self._kill_armed, True
        return not was

    def disarm(self) -> None:
        with self._lock:
            self.faulting = False
            self._kill_armed = False

    def _action_for(self, method: str, path: str) -> str:
        operation = operation_of(method, path)
        if operation is None:
            return ""
        with self._lock:
            self.calls[operation] += 1
            if not self.faulting or self.rng.random() >= self.rate:
                return ""
            fault = self.rng.choice(FAULTS)
            self.injected[operation, fault] += 1
            return fault

    def _forward(self, method: str, target: str, headers: dict[str, str], body: bytes) -> _Answer:
        answer = super()._forward(method, target, headers, body)
        operation = operation_of(method, urlsplit(target).path)
        if operation == "create" and answer.status == 200:
            made = json.loads(answer.body)
            with self._lock:
                self._created[(made.get("metadata") or {}).get("intent_id", "")].append(made["id"])
        if operation in WRITES and self.killer is not None and self._claim_kill():
            pid = self.killer(getattr(self._sender, "port", 0))
            if pid is None:
                self.arm_kill()  # not a pool process's call (a shell's): the next one
            else:
                self.kills.append(Kill(operation or "", pid, _payment_intent_of(answer)))
        return answer

    def _search(self, query: str, headers: dict[str, str]) -> _Answer:
        match = INTENT_QUERY.fullmatch(query.strip())
        if match is None:
            return super()._search(query, headers)
        with self._lock:
            ids = list(self._created.get(re.sub(r"\\(.)", r"\1", match["value"]), []))
        found = [
            json.loads(self._forward("GET", f"/v1/payment_intents/{pi}", headers, b"").body)
            for pi in ids
        ]
        result = {
            "object": "search_result",
            "url": SEARCH_PATH,
            "has_more": False,
            "next_page": None,
            "data": found,
        }
        return _Answer(200, "application/json", json.dumps(result).encode())

    def _claim_kill(self) -> bool:
        with self._lock:
            armed, self._kill_armed = self._kill_armed, False
        return armed


def socket_owner(port: int, peer_port: int, pids: Iterable[int]) -> int | None:
    """Which of ``pids`` holds the TCP socket from local ``port`` to
    ``peer_port`` on 127.0.0.1 (``/proc/net/tcp*``, then each process's fds)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, remote = fields[1].rsplit(":", 1)[1], fields[2].rsplit(":", 1)[1]
                if int(local, 16) == port and int(remote, 16) == peer_port:
                    inodes.add(f"socket:[{fields[9]}]")
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                        return pid
    return None


def pool_killer(stack: chaos.ChaosStack, proxy: ChaosProxy) -> Callable[[int], int | None]:
    """SIGKILL the workers' pool process whose call came from ``port`` (never a
    master, the web or a shell): its pid, or None when none is its sender."""

    def kill(port: int) -> int | None:
        pids = [pid for name in WORKERS if (p := stack.procs.get(name)) for pid in children(p.pid)]
        pid = socket_owner(port, proxy.port, pids)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pid

    return kill


# --- customer service refunds some purchases -------------------------------------------

REFUND_SCRIPT = """
import json, sys
from purchases.models import PurchaseSaga
from purchases.services import By, purchase_refund

picked = PurchaseSaga.objects.filter(state="CONFIRMED", refunds__isnull=True).order_by("?")[:{n}]
done = []
for saga_id in picked.values_list("id", flat=True):
    try:
        saga = purchase_refund(saga_id=saga_id, reason="chaos: the buyer asked",
                               by=By.operator("chaos"))
        done.append(f"refund opened, saga {{saga.state}}")
    except Exception as exc:
        done.append(type(exc).__name__)
sys.stdout.write("REFUNDS " + json.dumps(done))
"""


class OperatorRefunds:
    """A thread asking, every ``every`` seconds, for the refund of up to
    ``per_round`` CONFIRMED purchases not refunded yet, in a ``manage.py
    shell`` of the stack's environment: each opens a refund row, which the
    workers ask of Stripe (through the proxy). ``results``: "refund opened,
    saga CONFIRMED" for each, or the error's name."""

    def __init__(self, stack: chaos.ChaosStack, *, every: float, per_round: int) -> None:
        self.stack, self.every, self.per_round = stack, every, per_round
        self.results: Counter[str] = Counter()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="refunds", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(120)

    def _run(self) -> None:
        while not self.stopping.wait(self.every):
            done = self.stack.manage(
                "shell", "-c", REFUND_SCRIPT.format(n=self.per_round), timeout=120, check=False
            )
            if "REFUNDS " not in done.stdout:
                self.results[f"shell exited {done.returncode}"] += 1
                continue
            self.results.update(json.loads(done.stdout.split("REFUNDS ", 1)[1]))


# --- buyers who must authenticate (3-D Secure) ---------------------------------------


class Buyers:
    """A thread playing the buyers of the purchases waiting for 3-D Secure:
    each saga seen in REQUIRES_ACTION gets one choice of
    :data:`BUYER_CHOICES`, carried out after :data:`BUYER_SECONDS`, through
    localstripe's ``_authenticate`` with the client secret the saga holds,
    as localstripe's Stripe.js stand-in does from the browser (not through
    the proxy: the buyer's browser talks to Stripe, not to us).
    ``outcomes``: (choice, what localstripe answered)."""

    def __init__(self, db: chaos.Db, localstripe_url: str, *, seed: int) -> None:
        self.db = db
        self.api = Localstripe(localstripe_url)
        self.rng = random.Random(seed)
        self.seen: set[str] = set()
        self.due: list[tuple[float, str, str, str]] = []  # (when, choice, pi, secret)
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="buyers", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(60)
        self.api.close()

    def _run(self) -> None:
        choices, weights = zip(*BUYER_CHOICES.items(), strict=True)
        while not self.stopping.wait(0.3):
            with contextlib.suppress(Exception):  # PostgreSQL is the stack's: ask again
                for saga_id, pi, secret in self.db.rows(
                    "SELECT id, processor_ref, action_secret FROM purchases_purchasesaga "
                    "WHERE state = 'REQUIRES_ACTION' AND action_secret <> ''"
                ):
                    if str(saga_id) not in self.seen:
                        self.seen.add(str(saga_id))
                        when = time.monotonic() + self.rng.uniform(*BUYER_SECONDS)
                        self.due.append((when, self.rng.choices(choices, weights)[0], pi, secret))
            for item in [d for d in self.due if d[0] <= time.monotonic()]:
                self.due.remove(item)
                self._act(*item[1:])

    def _act(self, choice: str, pi: str, secret: str) -> None:
        if choice == "abandon":
            self.outcomes[choice, "-"] += 1
            return
        try:
            done = self.api.authenticate(pi, secret, success=choice == "pass")
            self.outcomes[choice, done["status"]] += 1
        except httpx.HTTPStatusError as exc:
            # 400: not waiting any more (the hold's expiry cancelled it)
            self.outcomes[choice, f"refused {exc.response.status_code}"] += 1


# --- what Stripe holds ------------------------------------------------------------------


@dataclass(frozen=True)
class SagaRow:
    saga_id: str
    state: str
    method: str
    processor: str
    processor_ref: str
    alerted: bool
    # What its refund rows that succeeded gave back (a CONFIRMED saga's).
    refunded: int = 0


def saga_rows(db: chaos.Db) -> dict[str, SagaRow]:
    """intent id -> the saga, from the tables."""
    return {
        intent: SagaRow(str(saga_id), state, method, processor, ref, alerted, int(refunded))
        for saga_id, intent, state, method, processor, ref, alerted, refunded in db.rows(
            "SELECT s.id, s.intent_id, s.state, s.payment_method, s.processor, s.processor_ref, "
            "EXISTS (SELECT 1 FROM outbox_outboxmessage o WHERE o.saga_id = s.id "
            "        AND o.topic = 'purchase.needs_operator'), "
            "(SELECT coalesce(sum(r.amount), 0) FROM purchases_refund r WHERE r.saga_id = s.id "
            " AND r.event_id = s.event_id AND r.status = 'succeeded') "
            "FROM purchases_purchasesaga s"
        )
    }


def ledger_nets(db: chaos.Db) -> dict[str, int]:
    return {
        intent: int(net)
        for intent, net in db.rows(
            "SELECT intent_id, sum(amount) FROM ledger_ledgerentry GROUP BY 1"
        )
    }


def payment_intents(url: str) -> list[dict[str, Any]]:
    """Every PaymentIntent localstripe holds, asked directly (not through the
    proxy), each with its latest charge nested."""
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {LOCALSTRIPE_KEY}"}, timeout=30
    ) as http:

        def get(path: str, **params: str) -> dict[str, Any]:
            answer = http.get(path, params=params)
            answer.raise_for_status()
            return answer.json()

        found = list_all(get, "/v1/payment_intents")
        for pi in found:
            if isinstance(pi.get("latest_charge"), str):
                pi["latest_charge"] = get(f"/v1/charges/{pi['latest_charge']}")
        return found


def captured_and_refunded(pi: dict[str, Any]) -> tuple[int, int]:
    """(amount captured, amount refunded) of one PaymentIntent."""
    charge = pi.get("latest_charge") or {}
    if pi["status"] != "succeeded" and not charge.get("amount_refunded"):
        return 0, 0
    return int(charge.get("amount", pi["amount"])), int(charge.get("amount_refunded") or 0)


def chargeable(pi: dict[str, Any]) -> bool:
    """Could a confirm (or the buyer's authentication) still charge it? In
    Stripe, a failed attempt leaves ``requires_payment_method`` with no
    payment method; a fresh one with a method attached is chargeable."""
    if pi["status"] in CHARGEABLE:
        return True
    return (
        pi["status"] == "requires_payment_method"
        and bool(pi.get("payment_method"))
        and not pi.get("last_payment_error")
    )


def stripe_problems(
    sagas: dict[str, SagaRow], intents: list[dict[str, Any]], ledger: dict[str, int]
) -> tuple[list[str], set[str]]:
    """Per purchase, against its PaymentIntents (grouped by
    ``metadata.intent_id``): at most one succeeded; exactly one, the recorded
    one, for a CONFIRMED saga, refunded at Stripe exactly what its refund
    rows that succeeded gave back (nothing, unless customer service refunded
    it); none succeeded and unrefunded for a COMPENSATED one; none left
    chargeable; the ledger's net equal to captured minus refunded. Returns
    (problems, saga ids at fault)."""
    problems: list[str] = []
    suspects: set[str] = set()
    by_intent: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pi in intents:
        by_intent[(pi.get("metadata") or {}).get("intent_id") or ""].append(pi)
    for intent in sorted(set(by_intent) - set(sagas)):
        ids = [pi["id"] for pi in by_intent[intent]]
        problems.append(f"stripe: PaymentIntents {ids} name intent {intent!r}: no such saga")
    for intent, saga in sorted(sagas.items()):
        found = by_intent.get(intent, [])
        wrong = _purchase_problems(saga, found, ledger.get(intent, 0))
        if wrong:
            suspects.add(saga.saga_id)
            problems += [f"stripe: saga {saga.saga_id} {saga.state} ({intent}): {w}" for w in wrong]
    return problems, suspects


def _purchase_problems(saga: SagaRow, found: list[dict[str, Any]], ledger_net: int) -> list[str]:
    wrong = []
    succeeded = [pi for pi in found if pi["status"] == "succeeded"]
    unrefunded = [pi["id"] for pi in succeeded if (m := captured_and_refunded(pi))[1] < m[0]]
    if len(succeeded) > 1:
        wrong.append(f"charged {len(succeeded)} times: {[pi['id'] for pi in succeeded]}")
    if saga.state == "CONFIRMED":
        if len(succeeded) != 1:
            wrong.append(f"{len(succeeded)} succeeded, {len(unrefunded)} unrefunded")
        elif succeeded[0]["id"] != saga.processor_ref:
            wrong.append(f"charged {succeeded[0]['id']}, recorded {saga.processor_ref!r}")
        elif (given := captured_and_refunded(succeeded[0])[1]) != saga.refunded:
            wrong.append(f"refunded {given} at Stripe, {saga.refunded} by its refund rows")
    if saga.state == "COMPENSATED" and unrefunded:
        wrong.append(f"compensated, yet charged and not refunded: {unrefunded}")
    left = [f"{pi['id']} {pi['status']}" for pi in found if chargeable(pi)]
    if left:
        wrong.append(f"left chargeable: {left}")
    if saga.processor_ref and saga.processor_ref not in {pi["id"] for pi in found}:
        wrong.append(f"recorded {saga.processor_ref}, which localstripe does not have")
    net = sum(c - r for c, r in map(captured_and_refunded, found))
    if net != ledger_net:
        wrong.append(f"ledger net {ledger_net} != captured minus refunded {net}")
    return wrong


# --- the run --------------------------------------------------------------------------------


@dataclass
class Rig:
    stack: chaos.ChaosStack
    pg: chaos.Postgres
    redis: chaos.Redis
    localstripe: chaos.LocalstripeServer
    proxy: ChaosProxy
    seed: int


@dataclass
class Run:
    """What one run saw, for the checks and the summary."""

    rig: Rig
    scenario: Scenario
    started: float = field(default_factory=time.monotonic)
    timeline: list[str] = field(default_factory=list)
    load: chaos.PurchaseLoad | None = None
    refunds: OperatorRefunds | None = None
    buyers: Buyers | None = None
    three_d_secure: str = ""  # the PaymentMethod of the 3-D Secure card

    def method(self, name: str) -> str:
        """The payment method the load sends for a name of :data:`METHODS`."""
        return self.three_d_secure if name == THREE_D_SECURE else name

    def label(self, method: str) -> str:
        return f"3-D Secure ({method})" if method == self.three_d_secure else method

    load_seconds: float = 0.0
    settle_seconds: float = 0.0
    audit: dict[str, Any] = field(default_factory=dict)
    intents: list[dict[str, Any]] = field(default_factory=list)

    def note(self, what: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.started:7.1f}s  {what}")


@pytest.fixture
def selected(request):
    # Before the stack: a skipped run starts no server.
    chosen = "chaos" in (request.config.getoption("markexpr") or "")
    if not (chosen or os.environ.get("CHAOS_STRIPE") == "1"):
        pytest.skip("the Stripe-mode chaos run: select it with -m chaos (make chaos)")


@pytest.fixture
def rig(selected, tmp_path) -> Iterator[Rig]:
    seed = int(os.environ.get("CHAOS_SEED", time.time_ns() % 1_000_000))
    folder = chaos.make_server_folder()
    pg, redis = chaos.Postgres(folder), chaos.Redis(folder)
    localstripe = chaos.LocalstripeServer(folder)
    watchdog = stack = proxy = None
    try:
        pg.start()
        watchdog = chaos.Watchdog(pg=pg, folder=folder, log=tmp_path / "watchdog.log")
        redis.start()
        localstripe.start()
        proxy = ChaosProxy(localstripe.url, rate=0.0, seed=seed, delay_seconds=DELAY_SECONDS)
        settings = {**SETTINGS, "STRIPE_API_BASE": proxy.url}
        stack = chaos.ChaosStack(workdir=tmp_path, pg=pg, redis=redis, settings=settings)
        stack.manage("migrate", "--no-input", timeout=300)
        yield Rig(stack, pg, redis, localstripe, proxy, seed)
    finally:
        if stack is not None:
            stack.stop()
        if proxy is not None:
            proxy.close()
        localstripe.stop()
        redis.stop()
        pg.stop()
        if watchdog is not None:
            watchdog.stop()
        shutil.rmtree(folder, ignore_errors=True)


def start(run: Run) -> dict:
    stack, scenario = run.rig.stack, run.scenario
    seeded = chaos.seed(stack, users=scenario.users, rows=scenario.rows, per_row=scenario.per_row)
    stack.start_web()
    for name in WORKERS:
        stack.start_worker(name)
    stack.start_relay()
    stack.start_beat()
    stack.wait_ready()
    run.rig.proxy.killer = pool_killer(stack, run.rig.proxy)
    run.note("stack ready (Stripe mode, through the fault proxy)")
    return seeded


def prepare_load(run: Run, seeded: dict) -> None:
    """The purchase load, customer service's refunds, the 3-D Secure buyers."""
    rig, scenario = run.rig, run.scenario
    with contextlib.closing(Localstripe(rig.localstripe.url)) as api:
        run.three_d_secure = api.card(CARD_3DS)
    run.load = chaos.PurchaseLoad(
        base_url=rig.stack.base_url,
        seed_data=seeded,
        threads=scenario.threads,
        mean_gap=scenario.mean_gap,
        rng_seed=rig.seed,
        methods={run.method(m): share for m, share in METHODS.items()},
    )
    run.refunds = OperatorRefunds(
        rig.stack, every=scenario.refund_every, per_round=scenario.refunds_per_round
    )
    run.buyers = Buyers(chaos.Db(rig.pg.url), rig.localstripe.url, seed=rig.seed)


def drive_load(run: Run) -> None:
    """The load, the refunds, the buyers and the kills for ``load_seconds``;
    the proxy's faults from the start of the load on (and through the
    settle). The buyers go on until the settle is over."""
    rig, scenario = run.rig, run.scenario
    assert run.load is not None and run.refunds is not None and run.buyers is not None
    rng = random.Random(rig.seed)
    rig.proxy.rate, rig.proxy.faulting = scenario.fault_rate, True
    t0 = time.monotonic()
    next_kill, mid_call = t0 + scenario.kill_every, True
    run.load.start()
    run.refunds.start()
    run.buyers.start()
    run.note(f"load started ({scenario.threads} threads), faults at {scenario.fault_rate:.0%}")
    try:
        while time.monotonic() < t0 + scenario.load_seconds:
            if time.monotonic() >= next_kill:
                if mid_call:
                    rig.proxy.arm_kill()
                elif rig.stack.kill_worker_child(rng) is None:
                    run.note("kill: no pool process found")
                next_kill, mid_call = next_kill + scenario.kill_every, not mid_call
            for name in rig.stack.supervise():
                run.note(f"{name} had exited: restarted (reported as a failure)")
            time.sleep(0.2)
    finally:
        run.load.stop()
        run.refunds.stop()
    run.load_seconds = time.monotonic() - t0
    run.note(
        f"load stopped: {sum(run.load.stats.requests.values())} requests, "
        f"{len(run.load.stats.sagas)} purchases accepted, refunds {dict(run.refunds.results)}"
    )


def moving(db: chaos.Db) -> tuple[int, int]:
    """(sagas and refund rows that should still move by themselves, outbox
    rows due and not done). A pending refund is looked up on its timer."""
    live = db.rows(
        "SELECT count(*) FROM purchases_purchasesaga WHERE state <> ALL(%s) "
        "AND NOT (state = 'UNKNOWN_EXPIRED' OR awaiting_operator_since IS NOT NULL)",
        (list(SETTLED),),
    )[0][0]
    pending = db.rows("SELECT count(*) FROM purchases_refund WHERE status = 'pending'")[0][0]
    return live + pending, db.unsettled()[1]


def settle(run: Run, db: chaos.Db) -> tuple[int, int]:
    """Wait (bounded) until nothing moves any more; the faults stay on
    meanwhile, then stop for the audit and the checks."""
    started = time.monotonic()
    live = due = -1
    while time.monotonic() < started + SETTLE_BOUND_SECONDS:
        for name in run.rig.stack.supervise():
            run.note(f"{name} had exited: restarted (reported as a failure)")
        live, due = moving(db)
        if live == 0 and due == 0:
            break
        time.sleep(1)
    run.rig.proxy.disarm()
    run.settle_seconds = time.monotonic() - started
    run.note(f"settled after {run.settle_seconds:.1f}s (moving {live}, due {due}); faults off")
    return live, due


def audit(run: Run) -> list[str]:
    """``manage.py audit_sagas --json`` in the stack's environment: its
    gateway is the Stripe adapter (through the proxy, faults off now)."""
    done = run.rig.stack.manage("audit_sagas", "--json", timeout=600, check=False)
    run.note(f"audit exited {done.returncode}")
    try:
        run.audit = json.loads(done.stdout)
    except ValueError:
        return [f"audit_sagas printed no report (exit {done.returncode}):\n{done.stderr[-4000:]}"]
    failures = [
        f"audit: {v['invariant']} saga {v['saga_id']} {v['intent_id']}: {v['detail']}"
        for v in run.audit["violations"]
    ]
    failures += [
        f"audit finding: {f['name']} saga {f['saga_id']}: {f['detail']}"
        for f in run.audit["findings"]
    ]
    failures += [f"audit: unverified {u}" for u in run.audit["unverified"]]
    if run.audit.get("gateway_url") != "StripePaymentGateway":
        failures.append(f"audit: asked {run.audit.get('gateway_url')!r}, not the Stripe adapter")
    if not run.audit.get("intents_checked"):
        failures.append("audit: no intent was asked at Stripe")
    if done.returncode != 0 and not failures:
        failures.append(f"audit_sagas exited {done.returncode}: {done.stderr[-2000:]}")
    return failures


def check(run: Run, db: chaos.Db, unsettled: tuple[int, int]) -> tuple[list[str], set[str]]:
    """Every check after the audit's. Returns (failures, saga ids at fault)."""
    sagas = saga_rows(db)
    run.intents = payment_intents(run.rig.localstripe.url)
    failures, suspects = stripe_problems(sagas, run.intents, ledger_nets(db))
    failures += [f"tables: {p}" for p in db.independent_checks(fake_gateway=False)]
    for saga_id, refund_id, status, detail in db.rows(
        "SELECT saga_id::text, id::text, status, detail FROM purchases_refund "
        "WHERE status <> 'succeeded'"
    ):
        failures.append(f"refund {refund_id} of saga {saga_id} is {status} ({detail})")
        suspects.add(saga_id)
    if any(unsettled):
        failures.append(
            f"not settled after {SETTLE_BOUND_SECONDS}s: {unsettled[0]} saga(s) or refund(s) "
            f"still moving, {unsettled[1]} outbox row(s) due"
        )
    for saga in sagas.values():
        if saga.processor != "stripe":
            failures.append(f"saga {saga.saga_id} charged by {saga.processor!r}, not Stripe")
        stuck = saga.state not in SETTLED and not (saga.state in ESCALATED and saga.alerted)
        if stuck:
            failures.append(f"saga {saga.saga_id} ended {saga.state} without an alert")
            suspects.add(saga.saga_id)
    failures += _api_and_process_failures(run, set(s.saga_id for s in sagas.values()))
    for operation in ("create", "confirm", "retrieve"):
        injected = sum(n for (op, _), n in run.rig.proxy.injected.items() if op == operation)
        if run.rig.proxy.calls[operation] >= 20 and not injected:
            failures.append(f"proxy: no fault met a {operation} call: the run proves nothing")
    return failures, suspects


def _api_and_process_failures(run: Run, saga_ids: set[str]) -> list[str]:
    assert run.load is not None  # the load ran
    stats, stack = run.load.stats, run.rig.stack
    failures = []
    missing = set(stats.sagas) - saga_ids
    if missing:
        failures.append(f"api: 202 answered for sagas that do not exist: {sorted(missing)[:10]}")
    failures += [
        f"api: a replay differs from the first answer: {m}" for m in stats.replay_mismatches
    ]
    failures += [
        f"api: a reused key with another body was not refused: {w}" for w in stats.reused_key_wrong
    ]
    stack.supervise()
    failures += [
        f"process {name} exited with {code} during the run (the harness restarted it); "
        f"its log ended with:\n{tail}"
        for name, code, tail in stack.crashes
    ]
    return failures


def dossier(run: Run, db: chaos.Db, saga_id: str) -> str:
    """The tables' dossier of a saga, its PaymentIntents at localstripe, its log lines."""
    intent = next((i for i, s in saga_rows(db).items() if s.saga_id == saga_id), "")
    lines = [db.dossier(saga_id), "  payment intents at localstripe:"]
    for pi in run.intents:
        if (pi.get("metadata") or {}).get("intent_id") == intent:
            captured, refunded = captured_and_refunded(pi)
            lines.append(
                f"    {pi['id']} {pi['status']} amount {pi['amount']} created {pi['created']} "
                f"captured {captured} refunded {refunded} "
                f"error {(pi.get('last_payment_error') or {}).get('code')}"
            )
    lines.append("  log lines:\n" + run.rig.stack.grep(saga_id, limit=40))
    if intent:
        lines.append("  adapter log lines:\n" + run.rig.stack.grep(intent, limit=40))
    return "\n".join(lines)


# --- the summary ------------------------------------------------------------------------------


def summary(run: Run, db: chaos.Db) -> str:
    assert run.load is not None and run.refunds is not None  # the load ran
    proxy, stack = run.rig.proxy, run.rig.stack
    lines = [f"=== chaos (Stripe mode) summary; seed {run.rig.seed} ==="]
    lines += _outcome_table(run, db)
    lines.append(
        f"HTTP answers to POST /api/purchases/: {dict(sorted(run.load.stats.requests.items()))}"
    )
    lines.append(
        f"idempotent replays checked: {run.load.stats.replays}; reused keys refused (422): "
        f"{run.load.stats.reused_key_refusals}"
    )
    lines.append(f"refunds asked by customer service: {dict(run.refunds.results)}")
    lines.append(
        "refund rows by (source, status): "
        + str(
            dict(
                db.rows(
                    "SELECT source || ' ' || status, count(*) FROM purchases_refund "
                    "GROUP BY 1 ORDER BY 1"
                )
            )
        )
    )
    lines.append(f"Stripe calls through the proxy: {dict(sorted(proxy.calls.items()))}")
    by_fault = Counter(fault for _, fault in proxy.injected.elements())
    lines.append(
        f"faults injected: {sum(proxy.injected.values())} {dict(by_fault)}; by call: "
        + ", ".join(
            f"{op} {n}"
            for op, n in sorted(Counter(op for op, _ in proxy.injected.elements()).items())
        )
    )
    lines.append(
        f"worker children SIGKILLed: {len(stack.kills)} at random, {len(proxy.kills)} mid-call "
        f"{dict(Counter(k.operation for k in proxy.kills))}"
    )
    lines.append(f"killed mid-call, by (call, the saga's end): {_killed_sagas(run, db)}")
    lines.append(
        "processes that exited on their own (restarted by the harness): "
        + (", ".join(f"{n} (exit {c})" for n, c, _ in stack.crashes) or "none")
    )
    lines += _stripe_lines(run.intents)
    lines += _latency_lines(stack)
    lines += _settle_lines(db)
    if run.buyers is not None:
        lines.append(
            "3-D Secure buyers (choice, localstripe's answer): "
            + str({f"{c} {a}": n for (c, a), n in sorted(run.buyers.outcomes.items())})
        )
    lines += _alert_lines(db)
    lines.append(
        f"audit: {run.audit.get('sagas_checked')} checked, {run.audit.get('sagas_skipped')} "
        f"skipped, {run.audit.get('intents_checked')} intents asked at "
        f"{run.audit.get('gateway_url')}, counts {run.audit.get('counts')}"
    )
    total = time.monotonic() - run.started
    lines.append(
        f"durations: load {run.load_seconds:.0f}s, settle {run.settle_seconds:.1f}s, "
        f"total {total:.0f}s; logs in {stack.workdir}"
    )
    lines.append("timeline:")
    lines += [f"  {t}" for t in run.timeline]
    return "\n".join(lines)


def _outcome_table(run: Run, db: chaos.Db) -> list[str]:
    outcomes = {run.label(method): counts for method, counts in db.outcomes().items()}
    states = sorted({s for c in outcomes.values() for s in c})
    width = max([len(m) for m in outcomes] + [14])
    lines = [f"{'payment method':<{width}}  " + "  ".join(f"{s:>20}" for s in states) + "   total"]
    totals: Counter[str] = Counter()
    for method, counts in sorted(outcomes.items()):
        totals.update(counts)
        lines.append(
            f"{method:<{width}}  "
            + "  ".join(f"{counts.get(s, 0):>20}" for s in states)
            + f"  {sum(counts.values()):>6}"
        )
    lines.append(
        f"{'all':<{width}}  "
        + "  ".join(f"{totals.get(s, 0):>20}" for s in states)
        + f"  {sum(totals.values()):>6}"
    )
    return lines


def _killed_sagas(run: Run, db: chaos.Db) -> dict[str, int]:
    """How the sagas whose call was killed mid-call ended."""
    intent_of = {pi["id"]: (pi.get("metadata") or {}).get("intent_id") for pi in run.intents}
    sagas = saga_rows(db)
    ends: Counter[str] = Counter()
    for kill in run.rig.proxy.kills:
        saga = sagas.get(intent_of.get(kill.payment_intent) or "")
        ends[f"{kill.operation} {saga.state if saga else '?'}"] += 1
    return dict(sorted(ends.items()))


def _alert_lines(db: chaos.Db) -> list[str]:
    alerts = db.rows(
        "SELECT o.saga_id, s.state, o.payload->>'why' FROM outbox_outboxmessage o "
        "JOIN purchases_purchasesaga s ON s.id = o.saga_id "
        "WHERE o.topic = 'purchase.needs_operator' ORDER BY o.id"
    )
    return [
        f"operator alerts: {len(alerts)}, by (saga's state now, why) "
        f"{dict(Counter((state, why) for _, state, why in alerts))}",
        *(f"  alert: saga {saga_id} {state}: {why}" for saga_id, state, why in alerts[:10]),
    ]


def _stripe_lines(intents: list[dict[str, Any]]) -> list[str]:
    per_intent = Counter((pi.get("metadata") or {}).get("intent_id") for pi in intents)
    extra = [pi for pi in intents if per_intent[(pi.get("metadata") or {}).get("intent_id")] > 1]
    refunded = sum(1 for pi in intents if captured_and_refunded(pi)[1])
    return [
        f"localstripe: {len(intents)} PaymentIntents for {len(per_intent)} purchases, "
        f"by status {dict(Counter(pi['status'] for pi in intents))}; {refunded} refunded",
        f"purchases with more than one PaymentIntent (lost creates made again): "
        f"{sum(1 for n in per_intent.values() if n > 1)}, their PaymentIntents by status "
        f"{dict(Counter(pi['status'] for pi in extra))}",
    ]


GATEWAY_CALL = re.compile(r"gateway (\w+) answered (\w+) .*?latency_ms=([\d.]+)")


def _latency_lines(stack: chaos.ChaosStack) -> list[str]:
    """The adapter's calls as the saga's steps logged them (workers only):
    answers by call, and their latency (faults included)."""
    answers: dict[str, Counter[str]] = defaultdict(Counter)
    latency: dict[str, list[float]] = defaultdict(list)
    for name in WORKERS:
        for call, answer, ms in GATEWAY_CALL.findall(stack.log(name)):
            answers[call][answer] += 1
            latency[call].append(float(ms))
    return [
        f"workers' {call} calls: {dict(answers[call])}; latency ms median "
        f"{statistics.median(ms):.0f}, p90 {sorted(ms)[int(0.9 * (len(ms) - 1))]:.0f}"
        for call, ms in sorted(latency.items())
    ]


def _settle_lines(db: chaos.Db) -> list[str]:
    times = db.settle_times()
    if not times:
        return []
    seconds = sorted(t[2] for t in times)
    return [
        f"time to settled/escalated: median {statistics.median(seconds):.1f}s, "
        f"p95 {seconds[int(0.95 * (len(seconds) - 1))]:.1f}s, max {seconds[-1]:.1f}s"
    ]


# --- the test -----------------------------------------------------------------------------------


def run_scenario(rig: Rig, scenario: Scenario) -> tuple[str, list[str]]:
    run = Run(rig, scenario)
    db = chaos.Db(rig.pg.url)
    prepare_load(run, start(run))
    try:
        drive_load(run)
        unsettled = settle(run, db)
    finally:
        assert run.buyers is not None  # prepared
        run.buyers.stop()
    failures = audit(run)
    problems, suspects = check(run, db, unsettled)
    failures += problems
    suspects |= {v["saga_id"] for v in run.audit.get("violations", []) if v["saga_id"]}
    db.export(rig.stack.workdir / "sagas.json")
    (rig.stack.workdir / "payment_intents.json").write_text(json.dumps(run.intents, indent=1))
    text = summary(run, db)
    # A few dossiers every run (the report's own code exercised, and
    # something to read), all of the suspects' on a failure.
    samples = _one_of_each_story(db)
    (rig.stack.workdir / "dossiers.txt").write_text(
        "\n\n".join(dossier(run, db, saga_id) for saga_id in samples)
    )
    if failures:
        failures += [dossier(run, db, saga_id) for saga_id in sorted(suspects)[:8]]
        (rig.stack.workdir / "failures.txt").write_text("\n".join(failures))
    return text, failures


def _one_of_each_story(db: chaos.Db) -> list[str]:
    """A saga of each (method, state, refunded or not)."""
    return [
        str(saga_id)
        for (saga_id,) in db.rows(
            "SELECT DISTINCT ON (s.payment_method, s.state, l.intent_id IS NULL) s.id "
            "FROM purchases_purchasesaga s LEFT JOIN ledger_ledgerentry l "
            "ON l.intent_id = s.intent_id AND l.kind = 'refund' "
            "ORDER BY s.payment_method, s.state, l.intent_id IS NULL, s.created_at"
        )
    ]


def test_chaos_stripe(rig, capsys):
    rate = float(os.environ.get("CHAOS_STRIPE_FAULT_RATE", Scenario.fault_rate))
    load = float(os.environ.get("CHAOS_STRIPE_LOAD_SECONDS", Scenario.load_seconds))
    text, failures = run_scenario(rig, Scenario(fault_rate=rate, load_seconds=load))
    with capsys.disabled():
        print("\n" + text)
    assert not failures, "\n".join(failures)


# --- the harness's own checks, quick: they can fail --------------------------------------------


def _pi(pi_id: str, intent: str, status: str, *, refunded: int = 0, **fields: Any) -> dict:
    charge = {"amount": 2500, "amount_refunded": refunded} if status == "succeeded" else None
    return {
        "id": pi_id,
        "status": status,
        "amount": 2500,
        "created": 1,
        "metadata": {"intent_id": intent},
        "latest_charge": charge,
        "payment_method": "pm_x",
        "last_payment_error": None,
        **fields,
    }


def test_the_stripe_checks_name_each_kind_of_wrong_money(selected):
    def saga(n: int, state: str, ref: str = "", refunded: int = 0) -> SagaRow:
        return SagaRow(f"s{n}", state, "pm_card_visa", "stripe", ref, False, refunded)

    sagas = {
        "i1": saga(1, "CONFIRMED", "pi_1"),  # right: one charge, recorded
        "i2": saga(2, "CONFIRMED", "pi_2a"),  # charged twice
        "i3": saga(3, "COMPENSATED", "pi_3"),  # compensated, charge kept
        "i4": saga(4, "COMPENSATED", "pi_4"),  # refunded: right
        "i5": saga(5, "COMPENSATED", "pi_5"),  # a leftover could still be charged
        "i6": saga(6, "COMPENSATED", "pi_6"),  # declined: right
        "i8": saga(8, "CONFIRMED", "pi_8", refunded=2500),  # its refund row: right
        "i9": saga(9, "CONFIRMED", "pi_9"),  # refunded at Stripe, no row says so
    }
    intents = [
        _pi("pi_1", "i1", "succeeded"),
        _pi("pi_2a", "i2", "succeeded"),
        _pi("pi_2b", "i2", "succeeded"),
        _pi("pi_3", "i3", "succeeded"),
        _pi("pi_4", "i4", "succeeded", refunded=2500),
        _pi("pi_5", "i5", "canceled"),
        _pi("pi_5b", "i5", "requires_confirmation"),
        _pi("pi_6", "i6", "requires_payment_method", last_payment_error={"code": "card_declined"}),
        _pi("pi_7", "i7", "canceled"),  # no such saga
        _pi("pi_8", "i8", "succeeded", refunded=2500),
        _pi("pi_9", "i9", "succeeded", refunded=1000),
    ]
    ledger = {"i1": 2500, "i2": 2500, "i3": 0, "i4": 0, "i8": 0, "i9": 2500}

    problems, suspects = stripe_problems(sagas, intents, ledger)

    assert suspects == {"s2", "s3", "s5", "s9"}
    assert problems == [
        "stripe: PaymentIntents ['pi_7'] name intent 'i7': no such saga",
        "stripe: saga s2 CONFIRMED (i2): charged 2 times: ['pi_2a', 'pi_2b']",
        "stripe: saga s2 CONFIRMED (i2): 2 succeeded, 2 unrefunded",
        "stripe: saga s2 CONFIRMED (i2): ledger net 2500 != captured minus refunded 5000",
        "stripe: saga s3 COMPENSATED (i3): compensated, yet charged and not refunded: ['pi_3']",
        "stripe: saga s3 COMPENSATED (i3): ledger net 0 != captured minus refunded 2500",
        "stripe: saga s5 COMPENSATED (i5): left chargeable: ['pi_5b requires_confirmation']",
        "stripe: saga s9 CONFIRMED (i9): refunded 1000 at Stripe, 0 by its refund rows",
        "stripe: saga s9 CONFIRMED (i9): ledger net 2500 != captured minus refunded 1500",
    ]


CREATE_SCRIPT = """
import sys, httpx
httpx.post(sys.argv[1] + "/v1/payment_intents", auth=(sys.argv[2], ""), timeout=30, data={
    "amount": "2500", "currency": "eur", "payment_method": "pm_card_visa",
    "metadata[intent_id]": "pi_Rkilled"})
"""


def test_the_proxy_faults_calls_and_kills_a_sender_after_stripe_acted(selected, tmp_path):
    """Every call meets a fault at rate 1; then a process creating a
    PaymentIntent through the proxy is killed mid-call: the proxy finds it by
    its socket, localstripe made the PaymentIntent, the sender died of SIGKILL."""
    server = chaos.LocalstripeServer(tmp_path)
    server.start()
    proxy = ChaosProxy(server.url, rate=1.0, seed=1, delay_seconds=0.3)
    sender = None
    try:
        proxy.faulting = True
        with httpx.Client(base_url=proxy.url, auth=(LOCALSTRIPE_KEY, ""), timeout=5) as http:
            for _ in range(6):
                with contextlib.suppress(httpx.HTTPError):
                    http.get("/v1/payment_intents/pi_nothing")
        proxy.disarm()
        owners: list[int | None] = []

        def killer(port: int) -> int | None:
            assert sender is not None  # started below, before its call
            owners.append(socket_owner(port, proxy.port, [sender.pid]))
            if owners[-1] is not None:
                os.kill(sender.pid, signal.SIGKILL)
            return owners[-1]

        proxy.killer = killer
        proxy.arm_kill()
        sender = subprocess.Popen(
            [sys.executable, "-c", CREATE_SCRIPT, proxy.url, LOCALSTRIPE_KEY],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        assert sender.wait(15) == -signal.SIGKILL
        assert owners == [sender.pid]
        assert [(k.operation, k.pid) for k in proxy.kills] == [("create", sender.pid)]
        made = payment_intents(server.url)
        assert [pi["metadata"]["intent_id"] for pi in made] == ["pi_Rkilled"]
        # found by our intent id, as the adapter searches (one retrieve)
        query = "metadata['intent_id']:'pi_Rkilled'"
        found = httpx.get(
            f"{proxy.url}{SEARCH_PATH}", params={"query": query}, auth=(LOCALSTRIPE_KEY, "")
        ).json()["data"]
        assert [pi["id"] for pi in found] == [made[0]["id"]]
        assert proxy.calls["retrieve"] == 6 and sum(proxy.injected.values()) == 6
    finally:
        if sender is not None and sender.poll() is None:
            sender.kill()
        proxy.close()
        server.stop()
