"""Chaos: an event's cancellation refunds 2,000 purchases while the workers
are SIGKILLed and the relay dies (issue 34); afterwards each purchase was
refunded exactly once at the processor, the ledger nets zero, nothing is
owed and ``manage.py audit_sagas`` reports nothing.

The stack of ``tests/chaos.py`` (gunicorn serving the API and the fake
gateway, two Celery workers, the outbox relay, beat, on a disposable
PostgreSQL and Redis). The run:

1. an organizer (its owner's token) and an event of 2,000 seats; 2,000
   CONFIRMED purchases of one seat each, made by ``manage.py shell``
   processes of the stack's environment through ``purchases.services``
   (``purchase_start``, then ``saga_charge`` with the in-process fake gateway,
   whose charges land in the same tables the stack's fake gateway reads: a
   real charge per purchase), before the workers start; then the stack
   settles (the confirmations' emails, the hold timers, the charge tasks
   that find their saga CONFIRMED);
2. the owner cancels the event through the API (``POST
   /api/organizers/{slug}/events/{id}/cancel/``), refunds paced at
   ``REFUND_RATE_PER_SECOND`` (30/s: 67 s for 2,000 if the workers keep
   up; on 2 busy cores they do about 10/s), 15 % of the refunds losing
   their answer after the refund was made (``FAKE_GATEWAY_CHAOS_TIMEOUT_RATE``
   applies to refunds too: the step looks them up);
3. during the run every pool process of both workers is SIGKILLed at once,
   three times, and the relay once (SIGKILL, down 3 s, started again as a
   supervisor would);
4. the run is polled until its status is ``done`` (bounded), then the
   stack settles (the refund emails).

Then, from the disposable database and the fake gateway's own tables: every
purchase is still CONFIRMED with exactly one refund row, of the event's
cancellation, succeeded, for all it cost; at the processor exactly one
refund under that row's id (``fake_gateway_fakerefund.refund_id``),
succeeded, of that amount, no refund nobody asked for, and no refund asked
twice unless a look-up in between found none (the fake's request log); per
intent what the processor refunded equals the charge; the ledger holds per
intent one charge and one refund entry naming the row, netting zero, and
zero over the event; no refund pending, no operator alert; every seat
released, and a purchase of one refused (``sales_closed``); one
refund email per refund; the progress (``GET …/cancellation/``) ``done``
with ``refunded`` == ``purchases`` == 2,000, ``failed`` 0, ``owed`` 0; no
process exited on its own; ``audit_sagas`` reports no violation and no
finding.

Marker ``chaos``, skipped unless selected (``make chaos``) or
``CHAOS_CANCEL=1``. ``CHAOS_CANCEL_PURCHASES``, ``CHAOS_CANCEL_RATE`` and
``CHAOS_CANCEL_LOSS`` change the number of purchases, the pace and the share
of lost refund answers; ``CHAOS_SEED`` fixes the random choices. On a
failure the report names each purchase at fault with its saga's dossier, its
refund rows, the processor's refunds and its log lines; the processes' logs
stay in the test's ``tmp_path``.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import string
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from . import chaos

unavailable = chaos.servers_available()
pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(unavailable is not None, reason=f"chaos stack: {unavailable}"),
]

SLUG = "chaos-cancel"
OWNER = "chaos-owner"
REASON = "chaos: the venue flooded"
PRICE = 2500


@dataclass(frozen=True)
class Scenario:
    purchases: int = int(os.environ.get("CHAOS_CANCEL_PURCHASES", 2000))
    rate: float = float(os.environ.get("CHAOS_CANCEL_RATE", 30))
    # The share of refunds whose answer is lost after the refund was made.
    loss: float = float(os.environ.get("CHAOS_CANCEL_LOSS", 0.15))
    buyers: int = 40
    buy_processes: int = 4
    workers: int = 2
    concurrency: int = 4  # pool processes per worker: a lost answer holds one 0.5 s
    # When the faults come, as fractions of the run's expected length
    # (purchases / rate), from the cancel on.
    worker_kills: tuple[float, ...] = (0.15, 0.45, 0.75)
    relay_kill: float = 0.3
    relay_down_seconds: float = 3.0

    @property
    def expected_seconds(self) -> float:
        return self.purchases / self.rate

    @property
    def run_bound_seconds(self) -> float:
        """The longest the run may take: four times its pace (on 2 busy
        cores the workers, not the pace, set it: about 10 refunds/s), and
        two minutes for the faults (each kill costs a lease, 10 s, and a
        redelivery)."""
        return 4 * self.expected_seconds + 120

    def settings(self) -> dict[str, Any]:
        return {
            **chaos.SETTINGS,
            "REFUND_RATE_PER_SECOND": self.rate,
            "FAKE_GATEWAY_CHAOS_TIMEOUT_RATE": self.loss,
            # A refund cut by a kill is asked again after a lease and a
            # redelivery; the chaser's alert is for refunds stuck for real.
            "REFUND_CHASE_SECONDS": 300,
        }


SCENARIO = Scenario()
# After the run is done: its refund emails, the last outbox rows.
SETTLE_BOUND_SECONDS = 120


# --- the stack -----------------------------------------------------------------------


@pytest.fixture
def selected(request):
    # Before the stack: a skipped run starts no server.
    chosen = "chaos" in (request.config.getoption("markexpr") or "")
    if not (chosen or os.environ.get("CHAOS_CANCEL") == "1"):
        pytest.skip("the cancellation chaos run: select it with -m chaos (make chaos)")


@dataclass
class Rig:
    stack: chaos.ChaosStack
    pg: chaos.Postgres
    redis: chaos.Redis
    db: chaos.Db


@pytest.fixture
def rig(selected, tmp_path) -> Iterator[Rig]:
    folder = chaos.make_server_folder()
    pg, redis = chaos.Postgres(folder), chaos.Redis(folder)
    watchdog = stack = None
    try:
        pg.start()
        watchdog = chaos.Watchdog(pg=pg, folder=folder, log=tmp_path / "watchdog.log")
        redis.start()
        stack = chaos.ChaosStack(workdir=tmp_path, pg=pg, redis=redis, settings=SCENARIO.settings())
        stack.manage("migrate", "--no-input", timeout=300)
        yield Rig(stack, pg, redis, chaos.Db(pg.url))
    finally:
        if stack is not None:
            stack.stop()
        redis.stop()
        pg.stop()
        if watchdog is not None:
            watchdog.stop()
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Run:
    """What one run saw, for the checks and the summary."""

    rig: Rig
    scenario: Scenario
    seed: int
    started: float = field(default_factory=time.monotonic)
    timeline: list[str] = field(default_factory=list)
    seeded: dict[str, Any] = field(default_factory=dict)
    bought: Counter[str] = field(default_factory=Counter)
    buy_seconds: float = 0.0
    cancelled_at: float = 0.0  # monotonic
    cancel_answer: str = ""
    done_seconds: float | None = None
    settle_seconds: float = 0.0
    worker_kills: list[int] = field(default_factory=list)  # pool processes killed, per round
    relay_kills: int = 0
    progress_samples: list[str] = field(default_factory=list)
    sales_closed: str = ""
    progress: dict[str, Any] = field(default_factory=dict)
    audit: dict[str, Any] = field(default_factory=dict)

    def note(self, what: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.started:7.1f}s  {what}")

    @property
    def base(self) -> str:
        return f"/api/organizers/{SLUG}/events/{self.seeded['event']}"


# --- seed, buy ---------------------------------------------------------------------

SEED_SCRIPT = """
import json, sys
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from rest_framework.authtoken.models import Token
from organizers.services import organizer_create
from purchases.services import event_create_with_seats

User = get_user_model()
owner = User.objects.create(username={owner!r}, email="owner@example.com")
organizer = organizer_create(slug={slug!r}, name="chaos venue", owner=owner).organizer
event = event_create_with_seats(organizer=organizer, name="chaos: the cancelled night",
                                starts_at=timezone.now() + timedelta(days=30), rows={rows!r},
                                seats_per_row={per_row}, price_amount={price})
with transaction.atomic():
    buyers = [User.objects.create(username=f"buyer{{n}}", email=f"buyer{{n}}@example.com")
              for n in range({buyers})]
    tokens = [Token.objects.create(user=user).key for user in (owner, buyers[0])]
refs = list(event.seats.order_by("id").values_list("ref", flat=True))
sys.stdout.write("SEED " + json.dumps({{"event": event.pk, "owner_token": tokens[0],
    "buyer_token": tokens[1], "buyers": [b.pk for b in buyers], "seats": refs}}))
"""

# One CONFIRMED purchase per seat given, each by the next buyer, through the
# services, charged by the in-process fake gateway (the same tables as the
# stack's): the answers of these charges are never lost, the chaos is the
# cancellation's.
BUY_SCRIPT = """
import json, sys
from collections import Counter
from django.conf import settings
from django.contrib.auth import get_user_model
from payments.fake_gateway.inprocess import InProcessFakeGateway
from purchases.services import purchase_start, saga_charge

settings.FAKE_GATEWAY_CHAOS_TIMEOUT_RATE = 0
gateway = InProcessFakeGateway()
buyer_ids = {buyers!r}
users = {{u.pk: u for u in get_user_model().objects.filter(pk__in=buyer_ids)}}
states = Counter()
for n, ref in enumerate({seats!r}):
    started = purchase_start(user=users[buyer_ids[n % len(buyer_ids)]],
                             idempotency_key=f"chaos-seed-{{ref}}", event_id={event},
                             seat_refs=[ref], payment_method="pm_card_visa")
    states[saga_charge(saga_id=started.saga_id, gateway=gateway).state] += 1
sys.stdout.write("BOUGHT " + json.dumps(states))
"""


def seed(run: Run) -> None:
    n = run.scenario.purchases
    rows = string.ascii_uppercase[:20]
    done = run.rig.stack.manage(
        "shell",
        "-c",
        SEED_SCRIPT.format(
            owner=OWNER,
            slug=SLUG,
            rows=rows,
            per_row=math.ceil(n / len(rows)),
            price=PRICE,
            buyers=run.scenario.buyers,
        ),
        timeout=300,
    )
    run.seeded = json.loads(done.stdout.split("SEED ", 1)[1])
    run.note(f"seeded: event {run.seeded['event']} with {len(run.seeded['seats'])} seats")


def buy(run: Run) -> None:
    """``purchases`` CONFIRMED purchases of one seat each, by
    ``buy_processes`` shells at once."""
    started = time.monotonic()
    seats = run.seeded["seats"][: run.scenario.purchases]
    k = run.scenario.buy_processes
    slices = [seats[i::k] for i in range(k)]

    def one(part: list[str]) -> dict[str, int]:
        done = run.rig.stack.manage(
            "shell",
            "-c",
            BUY_SCRIPT.format(buyers=run.seeded["buyers"], seats=part, event=run.seeded["event"]),
            timeout=900,
            check=False,
        )
        if "BOUGHT " not in done.stdout:
            raise AssertionError(
                f"a buying shell failed ({done.returncode}):\n{done.stderr[-3000:]}"
            )
        return json.loads(done.stdout.split("BOUGHT ", 1)[1])

    with ThreadPoolExecutor(k) as pool:
        for states in pool.map(one, slices):
            run.bought.update(states)
    run.buy_seconds = time.monotonic() - started
    run.note(
        f"bought {sum(run.bought.values())} in {run.buy_seconds:.1f}s "
        f"({k} shells): {dict(run.bought)}"
    )


def start_stack(run: Run) -> None:
    stack = run.rig.stack
    for n in range(1, run.scenario.workers + 1):
        stack.start_worker(f"worker{n}", concurrency=run.scenario.concurrency)
    stack.start_relay()
    stack.start_beat()
    stack.wait_ready()
    run.note("workers, relay and beat ready")


def settle(run: Run, *, what: str, bound: float) -> tuple[int, int, int]:
    """Until no saga is live, no outbox row due and the Celery queue empty
    (bounded). Returns what was left (live sagas, due rows, queued tasks)."""
    started = time.monotonic()
    left = (-1, -1, -1)
    while time.monotonic() < started + bound:
        for name in run.rig.stack.supervise():
            run.note(f"{name} had exited: restarted (reported as a failure)")
        live, due = run.rig.db.unsettled()
        queued = run.rig.redis.queue_length(run.rig.stack.queue) or 0
        left = (live, due, queued)
        if left == (0, 0, 0):
            break
        time.sleep(0.5)
    seconds = time.monotonic() - started
    run.note(f"{what}: settled after {seconds:.1f}s (live, due, queued: {left})")
    run.settle_seconds = seconds
    return left


# --- the cancellation and its faults -----------------------------------------------------


def api(run: Run) -> httpx.Client:
    return httpx.Client(
        base_url=run.rig.stack.base_url,
        headers={"Authorization": f"Token {run.seeded['owner_token']}"},
        timeout=30,
    )


def cancel(run: Run) -> None:
    """The owner cancels the event through the API: ``202``."""
    with api(run) as http:
        answer = http.post(f"{run.base}/cancel/", json={"reason": REASON})
    run.cancelled_at = time.monotonic()
    run.cancel_answer = f"{answer.status_code} {answer.text[:300]}"
    run.note(f"event cancelled: {run.cancel_answer}")
    if answer.status_code != 202:
        raise AssertionError(f"POST {run.base}/cancel/ answered {run.cancel_answer}")


def progress(run: Run) -> dict[str, Any]:
    """The run's progress as the owner reads it."""
    with api(run) as http:
        answer = http.get(f"{run.base}/cancellation/")
    if answer.status_code != 200:
        return {"error": f"GET cancellation/ answered {answer.status_code}: {answer.text[:300]}"}
    return answer.json()


def try_to_buy(run: Run) -> None:
    """A purchase of the first seat (released by its refund, or about to be)
    on the cancelled event: refused, ``sales_closed``."""
    with httpx.Client(base_url=run.rig.stack.base_url, timeout=30) as http:
        answer = http.post(
            "/api/purchases/",
            json={
                "event": run.seeded["event"],
                "seats": run.seeded["seats"][:1],
                "payment_method": "pm_card_visa",
            },
            headers={
                "Authorization": f"Token {run.seeded['buyer_token']}",
                "Idempotency-Key": f"chaos-after-cancel-{uuid.uuid4()}",
            },
        )
    run.sales_closed = f"{answer.status_code} {answer.text[:200]}"
    run.note(f"a purchase after the cancel: {run.sales_closed}")


def run_status(db: chaos.Db, event: int) -> tuple[str, Counter[str]]:
    """The run's status and its refund rows by status, from the tables."""
    found = db.rows("SELECT status FROM purchases_eventcancellation WHERE event_id = %s", (event,))
    refunds = Counter(
        dict(
            db.rows(
                "SELECT status, count(*) FROM purchases_refund WHERE event_id = %s GROUP BY 1",
                (event,),
            )
        )
    )
    return (found[0][0] if found else "none"), refunds


def drive(run: Run) -> bool:
    """The faults on their schedule while the run goes on, until it is done
    (bounded). True if it finished."""
    scenario, stack, db = run.scenario, run.rig.stack, run.rig.db
    t0, rng = run.cancelled_at, random.Random(run.seed)
    faults = sorted(
        [(t0 + f * scenario.expected_seconds, "workers") for f in scenario.worker_kills]
        + [(t0 + scenario.relay_kill * scenario.expected_seconds, "relay")]
    )
    faults = [(at + rng.uniform(-1, 1), what) for at, what in faults]
    next_sample = t0
    while time.monotonic() < t0 + scenario.run_bound_seconds:
        now = time.monotonic()
        status, refunds = run_status(db, run.seeded["event"])
        if faults and now >= faults[0][0]:
            _, what = faults.pop(0)
            fault(run, what, refunds)
        for name in stack.supervise():
            run.note(f"{name} had exited: restarted (reported as a failure)")
        if now >= next_sample:
            counts = dict(sorted(refunds.items()))
            run.progress_samples.append(f"{now - t0:5.1f}s {status} {counts}")
            next_sample += 10
        if status == "done":
            run.done_seconds = time.monotonic() - t0
            run.note(f"the run is done after {run.done_seconds:.1f}s: refunds {dict(refunds)}")
            break
        time.sleep(0.25)
    for _, what in faults:
        run.note(f"the run ended before the {what} kill: not made")
    return run.done_seconds is not None


def fault(run: Run, what: str, refunds: Counter[str]) -> None:
    stack = run.rig.stack
    if what == "workers":
        killed = stack.kill_all_worker_children()
        run.worker_kills.append(len(killed))
        run.note(
            f"SIGKILL every worker pool process ({len(killed)}: "
            + ", ".join(f"{name}/{pid}" for name, pid in killed)
            + f"); refunds then {dict(refunds)}"
        )
    else:
        pid = stack.kill_and_restart("relay", down_seconds=run.scenario.relay_down_seconds)
        run.relay_kills += 1
        run.note(
            f"SIGKILL the relay ({pid}), started again after "
            f"{run.scenario.relay_down_seconds:g}s; refunds then {dict(refunds)}"
        )


# --- the checks ----------------------------------------------------------------------

# Per purchase of the event: its state and its refund rows.
PURCHASES_SQL = """
SELECT s.id::text, s.state, s.amount, count(r.id),
       count(r.id) FILTER (WHERE r.source = 'event_cancellation' AND r.status = 'succeeded'
                           AND r.amount = s.amount),
       coalesce(string_agg(r.source || ' ' || r.status || ' ' || r.amount, ', '), '')
  FROM purchases_purchasesaga s
  LEFT JOIN purchases_refund r ON r.saga_id = s.id AND r.event_id = s.event_id
 WHERE s.event_id = %s
 GROUP BY s.id, s.state, s.amount
"""

# Per refund row of the event: the processor's refunds under its id.
PROCESSOR_SQL = """
SELECT r.saga_id::text, r.id::text, r.amount, s.intent_id, count(f.id),
       count(f.id) FILTER (WHERE f.status = 'succeeded' AND f.amount = r.amount
                           AND f.intent_id = s.intent_id),
       coalesce(string_agg(f.id || ' ' || f.intent_id || ' ' || f.status || ' ' || f.amount,
                           ', '), '')
  FROM purchases_refund r
  JOIN purchases_purchasesaga s ON s.id = r.saga_id AND s.event_id = r.event_id
  LEFT JOIN fake_gateway_fakerefund f ON f.refund_id = r.id::text
 WHERE r.event_id = %s
 GROUP BY r.saga_id, r.id, r.amount, s.intent_id
"""

# Refunds asked more than once at the processor without a look-up in between
# finding nothing there (the only reason to ask again, under the same key).
ASKED_SQL = """
SELECT r.saga_id::text, r.id::text, q.creates, q.not_found
  FROM purchases_refund r
  JOIN (SELECT refund_id, count(*) FILTER (WHERE endpoint = 'create_refund') AS creates,
               count(*) FILTER (WHERE endpoint = 'retrieve_refund' AND status_code = 404)
                 AS not_found
          FROM fake_gateway_fakerequest WHERE refund_id <> '' GROUP BY 1) q
    ON q.refund_id = r.id::text
 WHERE r.event_id = %s AND q.creates > 1 + q.not_found
"""

# Per purchase: the processor's charge, what it refunded, the intent's status.
INTENTS_SQL = """
SELECT s.id::text, s.intent_id, s.amount, coalesce(c.charged, 0), coalesce(f.refunded, 0),
       coalesce(f.refunds, 0), i.status
  FROM purchases_purchasesaga s
  LEFT JOIN fake_gateway_fakeintent i ON i.intent_id = s.intent_id
  LEFT JOIN (SELECT intent_id, sum(amount) AS charged FROM fake_gateway_fakecharge GROUP BY 1) c
         ON c.intent_id = s.intent_id
  LEFT JOIN (SELECT intent_id, sum(amount) FILTER (WHERE status = 'succeeded') AS refunded,
                    count(*) AS refunds
               FROM fake_gateway_fakerefund GROUP BY 1) f ON f.intent_id = s.intent_id
 WHERE s.event_id = %s
"""

# Per purchase: its ledger entries (a refund entry naming one of its rows).
LEDGER_SQL = """
SELECT s.id::text, s.intent_id, count(l.id) FILTER (WHERE l.kind = 'charge'),
       count(l.id) FILTER (WHERE l.kind = 'refund'),
       count(l.id) FILTER (WHERE l.kind = 'refund' AND l.refund_id IN (
           SELECT r.id FROM purchases_refund r WHERE r.saga_id = s.id AND r.event_id = s.event_id)),
       count(l.id) FILTER (WHERE l.kind NOT IN ('charge', 'refund')),
       coalesce(sum(l.amount), 0)
  FROM purchases_purchasesaga s
  LEFT JOIN ledger_ledgerentry l ON l.intent_id = s.intent_id
 WHERE s.event_id = %s
 GROUP BY s.id, s.event_id, s.intent_id
"""


def purchase_problems(db: chaos.Db, event: int, expected: int) -> tuple[list[str], set[str]]:
    """Each purchase CONFIRMED with one refund row, the cancellation's,
    succeeded, for all it cost."""
    problems: list[str] = []
    suspects: set[str] = set()
    found = db.rows(PURCHASES_SQL, (event,))
    if len(found) != expected:
        problems.append(f"purchases: {len(found)} sagas for the event, {expected} bought")
    for saga_id, state, amount, refunds, right, listed in found:
        if state != "CONFIRMED" or refunds != 1 or right != 1:
            problems.append(
                f"purchase {saga_id} {state} ({amount}): {refunds} refund row(s) [{listed}]; "
                "one of the cancellation, succeeded, for all it cost, expected"
            )
            suspects.add(saga_id)
    return problems, suspects


def processor_problems(db: chaos.Db, event: int) -> tuple[list[str], set[str]]:
    """Exactly one refund at the processor per refund row, under its id,
    succeeded, of its amount, on the purchase's intent; none nobody asked
    for; per intent the processor refunded its whole charge."""
    problems: list[str] = []
    suspects: set[str] = set()
    for saga_id, refund_id, amount, intent, made, right, listed in db.rows(PROCESSOR_SQL, (event,)):
        if made != 1 or right != 1:
            problems.append(
                f"processor: refund {refund_id} of {amount} for {saga_id} ({intent}): "
                f"{made} refund(s) at the processor [{listed}]"
            )
            suspects.add(saga_id)
    for saga_id, refund_id, creates, not_found in db.rows(ASKED_SQL, (event,)):
        problems.append(
            f"processor: refund {refund_id} of {saga_id} asked {creates} times with only "
            f"{not_found} look-up(s) finding nothing: asked again blind"
        )
        suspects.add(saga_id)
    for refund_id, intent, amount, status in db.rows(
        "SELECT f.refund_id, f.intent_id, f.amount, f.status FROM fake_gateway_fakerefund f "
        "WHERE NOT EXISTS (SELECT 1 FROM purchases_refund r WHERE r.id::text = f.refund_id)"
    ):
        problems.append(
            f"processor: a refund nobody asked for: {refund_id} on {intent}, {amount} {status}"
        )
    for saga_id, intent, amount, charged, refunded, refunds, status in db.rows(
        INTENTS_SQL, (event,)
    ):
        if (charged, refunded, refunds, status) != (amount, amount, 1, "refunded"):
            problems.append(
                f"processor: {intent} of {saga_id} ({amount}): charged {charged}, refunded "
                f"{refunded} in {refunds} refund(s), intent {status}"
            )
            suspects.add(saga_id)
    return problems, suspects


def ledger_problems(db: chaos.Db, event: int) -> tuple[list[str], set[str]]:
    """Per intent one charge and one refund entry naming the purchase's
    refund row, netting zero; zero over the event."""
    problems: list[str] = []
    suspects: set[str] = set()
    for saga_id, intent, charges, refunds, named, others, net in db.rows(LEDGER_SQL, (event,)):
        if (charges, refunds, named, others, net) != (1, 1, 1, 0, 0):
            problems.append(
                f"ledger: {intent} of {saga_id}: {charges} charge, {refunds} refund "
                f"({named} naming its refund row), {others} other entries, net {net}"
            )
            suspects.add(saga_id)
    ((total, entries),) = db.rows(
        "SELECT coalesce(sum(amount), 0), count(*) FROM ledger_ledgerentry WHERE event_id = %s",
        (event,),
    )
    if total != 0:
        problems.append(f"ledger: the event nets {total} over {entries} entries, not 0")
    return problems, suspects


def loose_ends(db: chaos.Db, event: int) -> tuple[list[str], set[str]]:
    """No refund pending (anywhere), no operator alert, every seat released
    and back on sale (a cancelled event sells nothing), one refund email
    per refund row."""
    problems: list[str] = []
    suspects: set[str] = set()
    for saga_id, refund_id, status, detail in db.rows(
        "SELECT saga_id::text, id::text, status, detail FROM purchases_refund "
        "WHERE status <> 'succeeded'"
    ):
        problems.append(f"refund {refund_id} of {saga_id} is {status} ({detail})")
        suspects.add(saga_id)
    for saga_id, why in db.rows(
        "SELECT saga_id::text, payload->>'why' FROM outbox_outboxmessage "
        "WHERE topic = 'purchase.needs_operator' ORDER BY id"
    ):
        problems.append(f"operator alert about {saga_id}: {why}")
        suspects.add(saga_id)
    ((live_links,),) = db.rows(
        "SELECT count(*) FROM purchases_reservationseat WHERE event_id = %s "
        "AND released_at IS NULL",
        (event,),
    )
    if live_links:
        problems.append(f"seats: {live_links} seat link(s) of the event not released")
    for status, n in db.rows(
        "SELECT status, count(*) FROM purchases_seat WHERE event_id = %s "
        "AND status <> 'available' GROUP BY 1",
        (event,),
    ):
        problems.append(f"seats: {n} seat(s) of the event {status}, not released")
    return problems, suspects


def email_problems(stack: chaos.ChaosStack, db: chaos.Db, event: int) -> list[str]:
    """One refund email per refund row (counted by Message-ID), none for
    anything else."""
    refunds = {
        refund_id
        for (refund_id,) in db.rows(
            "SELECT id::text FROM purchases_refund WHERE event_id = %s", (event,)
        )
    }
    emails = stack.emails_by_saga()  # keyed by the Reference they carry: the refund's id
    sent = {ref: subjects for ref, subjects in emails.items() if ref in refunds}
    problems = [
        f"email: refund {ref}: {subjects}"
        for ref, subjects in sorted(sent.items())
        if len(subjects) != 1 or not subjects[0].startswith("Refund of")
    ]
    if len(sent) != len(refunds):
        missing = sorted(refunds - set(sent))
        problems.append(
            f"email: {len(refunds) - len(sent)} refund(s) without an email, e.g. {missing[:5]}"
        )
    return problems


def progress_problems(progress: dict[str, Any], expected: int) -> list[str]:
    want = {"status": "done", "purchases": expected, "refunded": expected, "failed": 0, "owed": 0}
    got = {k: progress.get(k) for k in want}
    if isinstance(got["owed"], dict):  # money: {"amount", "currency"}
        got["owed"] = got["owed"].get("amount")
    if progress.get("in_flight") not in (None, 0):
        got["in_flight"] = progress["in_flight"]
    return [] if got == want else [f"progress: {got}, expected {want} (all: {progress})"]


def audit(run: Run) -> list[str]:
    """``manage.py audit_sagas --json`` in the stack's environment (it asks
    the stack's fake gateway over HTTP)."""
    done = run.rig.stack.manage("audit_sagas", "--json", timeout=900, check=False)
    run.note(f"audit exited {done.returncode}")
    try:
        run.audit = json.loads(done.stdout)
    except ValueError:
        return [
            f"audit_sagas printed no report (exit {done.returncode}):\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        ]
    failures = [
        f"audit: {v['invariant']} saga {v['saga_id']} {v['intent_id']}: {v['detail']}"
        for v in run.audit.get("violations", [])
    ]
    failures += [
        f"audit finding: {f['name']} saga {f['saga_id']}: {f['detail']}"
        for f in run.audit.get("findings", [])
    ]
    failures += [f"audit: unverified {u}" for u in run.audit.get("unverified", [])]
    if done.returncode != 0 and not failures:
        failures.append(f"audit_sagas exited {done.returncode}: {done.stderr[-2000:]}")
    return failures


def check(run: Run) -> tuple[list[str], set[str]]:
    """Every check after the run (the module docstring). Returns (failures,
    saga ids at fault)."""
    db, event, n = run.rig.db, run.seeded["event"], run.scenario.purchases
    failures: list[str] = []
    suspects: set[str] = set()
    for problems, blamed in (
        purchase_problems(db, event, n),
        processor_problems(db, event),
        ledger_problems(db, event),
        loose_ends(db, event),
    ):
        failures += problems
        suspects |= blamed
    failures += email_problems(run.rig.stack, db, event)
    run.progress = progress(run)
    failures += progress_problems(run.progress, n)
    if not (run.sales_closed.startswith("409") and "sales_closed" in run.sales_closed):
        failures.append(f"a purchase on the cancelled event was not refused: {run.sales_closed}")
    wanted = (len(run.scenario.worker_kills), 1)
    if (len(run.worker_kills), run.relay_kills) != wanted or 0 in run.worker_kills:
        failures.append(
            f"faults: worker kill rounds {run.worker_kills} (pool processes killed each), relay "
            f"kills {run.relay_kills}; {wanted[0]} rounds and 1 relay kill wanted during the run"
        )
    failures += audit(run)
    run.rig.stack.supervise()
    failures += [
        f"process {name} exited with {code} during the run (the harness restarted it); "
        f"its log ended with:\n{tail}"
        for name, code, tail in run.rig.stack.crashes
    ]
    return failures, suspects


def dossier(run: Run, saga_id: str) -> str:
    """The tables' dossier of a purchase, its refund rows, the processor's
    refunds on its intent, and its log lines."""
    db = run.rig.db
    lines = [db.dossier(saga_id), "  refund rows:"]
    refund_ids = []
    for row in db.rows(
        "SELECT id::text, source, status, amount, asked, lookups, detail, processor_ref, "
        "created_at, settled_at FROM purchases_refund WHERE saga_id = %s ORDER BY created_at",
        (saga_id,),
    ):
        refund_ids.append(row[0])
        lines.append("    " + " ".join(str(v) for v in row))
    lines.append("  at the processor:")
    for row in db.rows(
        "SELECT f.id, f.refund_id, f.intent_id, f.amount, f.status, f.created "
        "FROM fake_gateway_fakerefund f JOIN purchases_purchasesaga s "
        "ON f.intent_id = s.intent_id WHERE s.id = %s ORDER BY f.created",
        (saga_id,),
    ):
        lines.append("    " + " ".join(str(v) for v in row))
    for refund_id in refund_ids:
        lines.append(f"  log lines of refund {refund_id}:\n" + run.rig.stack.grep(refund_id, 30))
    lines.append("  log lines:\n" + run.rig.stack.grep(saga_id, limit=40))
    return "\n".join(lines)


# --- the summary ------------------------------------------------------------------------


def summary(run: Run) -> str:
    db, scenario, event = run.rig.db, run.scenario, run.seeded.get("event")
    lines = [f"=== chaos (event cancellation) summary; seed {run.seed} ==="]
    lines.append(
        f"bought {sum(run.bought.values())} purchases of one seat in {run.buy_seconds:.1f}s "
        f"({scenario.buy_processes} shells): {dict(run.bought)}"
    )
    lines.append(f"cancel: {run.cancel_answer}")
    if run.done_seconds:
        lines.append(
            f"the run: done after {run.done_seconds:.1f}s for {scenario.purchases} purchases at "
            f"{scenario.rate:g}/s asked: {scenario.purchases / run.done_seconds:.1f} refunds/s "
            f"achieved (the pace alone: {scenario.expected_seconds:.1f}s)"
        )
    else:
        lines.append(f"the run: NOT done within {scenario.run_bound_seconds:.0f}s")
    lines.append(
        f"faults: {len(run.worker_kills)} rounds of SIGKILL to every worker pool process "
        f"({run.worker_kills} processes), relay SIGKILLed {run.relay_kills} time(s) "
        f"(down {scenario.relay_down_seconds:g}s); refund answers lost at {scenario.loss:.0%}"
    )
    lines += _processor_lines(db)
    lines += _refund_lines(db, event)
    lines.append(f"progress (the owner's): {run.progress}")
    lines.append(f"a purchase after the run: {run.sales_closed}")
    lines.append(
        f"audit: {run.audit.get('sagas_checked')} checked, {run.audit.get('sagas_skipped')} "
        f"skipped, {run.audit.get('intents_checked')} intents asked, counts "
        f"{run.audit.get('counts')}"
    )
    stack = run.rig.stack
    lines.append(
        "processes that exited on their own (restarted by the harness): "
        + (", ".join(f"{n} (exit {c})" for n, c, _ in stack.crashes) or "none")
    )
    lines.append(
        f"durations: settle after the run {run.settle_seconds:.1f}s, total "
        f"{time.monotonic() - run.started:.0f}s; logs in {stack.workdir}"
    )
    lines.append("progress (seconds since the cancel, status, refund rows by status):")
    lines += [f"  {s}" for s in run.progress_samples]
    lines.append("timeline:")
    lines += [f"  {t}" for t in run.timeline]
    return "\n".join(lines)


def _processor_lines(db: chaos.Db) -> list[str]:
    calls: dict[str, Counter[str]] = defaultdict(Counter)
    for endpoint, code, timed_out, n in db.rows(
        "SELECT endpoint, status_code, timed_out, count(*) FROM fake_gateway_fakerequest "
        "WHERE endpoint IN ('create_refund', 'retrieve_refund', 'list_refunds') GROUP BY 1, 2, 3"
    ):
        calls[endpoint][f"{code}{' lost' if timed_out else ''}"] += n
    made = Counter(dict(db.rows("SELECT status, count(*) FROM fake_gateway_fakerefund GROUP BY 1")))
    return [
        "processor: refund calls (status, lost = the answer timed out): "
        + ", ".join(f"{e} {dict(c)}" for e, c in sorted(calls.items())),
        f"processor: refunds made {dict(made)}",
    ]


def _refund_lines(db: chaos.Db, event: int | None) -> list[str]:
    if event is None:
        return []
    by = Counter(
        f"{source} {status}"
        for source, status in db.rows(
            "SELECT source, status FROM purchases_refund WHERE event_id = %s", (event,)
        )
    )
    lookups = Counter(
        n for (n,) in db.rows("SELECT lookups FROM purchases_refund WHERE event_id = %s", (event,))
    )
    asked = Counter(
        f"{asked} {answer}"
        for asked, answer in db.rows(
            "SELECT asked, answer FROM purchases_gatewayanswer WHERE refund_id IS NOT NULL"
        )
    )
    seconds = sorted(
        float(s)
        for (s,) in db.rows(
            "SELECT EXTRACT(EPOCH FROM settled_at - created_at) FROM purchases_refund "
            "WHERE event_id = %s AND settled_at IS NOT NULL",
            (event,),
        )
    )
    lines = [
        f"refund rows: {dict(by)}; look-ups per refund: {dict(sorted(lookups.items()))}",
        f"refund steps' answers (asked, answer): {dict(sorted(asked.items()))}",
    ]
    if seconds:
        lines.append(
            f"refund opened to settled: median {seconds[len(seconds) // 2]:.1f}s, "
            f"p95 {seconds[int(0.95 * (len(seconds) - 1))]:.1f}s, max {seconds[-1]:.1f}s"
        )
    return lines


# --- the test ------------------------------------------------------------------------------


def run_scenario(run: Run) -> tuple[str, list[str]]:
    stack = run.rig.stack
    stack.start_web()  # boots while the shells seed and buy
    seed(run)
    buy(run)
    start_stack(run)
    failures = []
    left = settle(run, what="the purchases", bound=4 * SETTLE_BOUND_SECONDS)
    if left != (0, 0, 0):
        failures.append(f"the purchases did not settle before the cancel: {left}")
    cancel(run)
    if not drive(run):
        status, refunds = run_status(run.rig.db, run.seeded["event"])
        failures.append(
            f"the run is {status} after {run.scenario.run_bound_seconds:.0f}s: refunds "
            f"{dict(refunds)}"
        )
    left = settle(run, what="after the run", bound=SETTLE_BOUND_SECONDS)
    if left != (0, 0, 0):
        failures.append(f"not settled {SETTLE_BOUND_SECONDS}s after the run: {left}")
    try_to_buy(run)
    problems, suspects = check(run)
    failures += problems
    suspects |= {v["saga_id"] for v in run.audit.get("violations", []) if v.get("saga_id")}
    text = summary(run)
    if failures:
        failures += [dossier(run, saga_id) for saga_id in sorted(suspects)[:8]]
        (stack.workdir / "failures.txt").write_text("\n".join(failures))
    return text, failures


def test_chaos_cancellation(rig, capsys):
    seed_value = int(os.environ.get("CHAOS_SEED", time.time_ns() % 1_000_000))
    run = Run(rig, SCENARIO, seed_value)
    text, failures = run_scenario(run)
    with capsys.disabled():
        print("\n" + text)
    assert not failures, "\n".join(failures)
