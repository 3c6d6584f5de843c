"""Figure 18: the waiting room (issue 36, part 2; docs/waiting-room.md).
Buyers arrive at ``OVERLOAD`` times the charge rate the stack can serve, for
an event whose hold is short (``HOLD_S``): without a room the purchases to
charge pile up past what a hold serves and holds expire before their
charge; with the room, buyers wait before any seat is held and none should.
The fake processor answers in ``GATEWAY_LATENCY_MS`` for the figure
(restarted with it, and as it was afterwards): with an instant processor
this machine's web starts fewer purchases a second than its worker charges,
and no queue of charges forms.

First the charge capacity is measured on this stack: ``CAPACITY_PURCHASES``
purchases of one seat started as fast as 16 clients can, the worker
charging them; the confirmations per second while it was never idle (the
confirmed sagas' ``updated_at``: (n - 1) / (last - first)).

Then two sales of ``SEATS`` seats, each to ``BUYERS`` distinct buyers
arriving at ``OVERLOAD`` x capacity a second (open loop: ``CLIENTS``
threads send each buyer's request at its time, or as soon as one is free),
each asking for one seat by quantity (best available). A buyer answered
``503 waiting_room`` asks again after its ``Retry-After``; ``409
not_enough_seats`` ends them (sold out); a ``202`` too. Beat runs for the
figure (the rooms' ticks are beat's), and the ticks' own worker on their own
queue, as the Procfile runs them.

- **without a room** (``waiting_room`` off): the baseline;
- **with the room**, its sale opening ``OPENS_IN_S`` after the first
  arrival (those before are drawn at random at the opening).

Measured per sale: the holds expired before their charge (sagas that went
``EXPIRED``: goal 0 with the room), seats sold twice (0), the seats sold, the
time from the first arrival (or the opening) to sold out, each buyer's wait
from their first request to their 202 (p50/p99), the answers by status and
code; with the room, the order of admission against arrival for those who
came after the opening (the share of pairs of such buyers whose numbers in
the room are in their order of arrival: 1.0 is first come first served)
and how many were drawn. The figure fails on a seat sold twice, an answer
that is not 202, 409 or 503 ``waiting_room``, or a hold expired with the
room.
"""

from __future__ import annotations

import heapq
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import Context, Figure, PhaseFailed, lat_summary, log
from bench.db import BenchDB
from bench.figures import gateway_latency, onsale
from bench.load import auth_headers, http_client, post_purchase, start_purchase
from devtools.processes import poll

FIGURE = Figure(
    phase="waitingroom", key="18_waiting_room", label="18 waiting room", timeout=lambda ctx: 900
)
# A card processor answering in a second, as processors do under an
# on-sale's load: the worker's 4 processes, each charging bursts of at most 16
# with 8 calls at a time, serve fewer charges a second than the web starts,
# so that charging is the bottleneck of the sale, as it is at a real on-sale.
# (At figure 3's 300 ms, and at 600 ms, the bursts charged as fast as this
# machine's web started purchases, and the baseline formed no queue:
# docs/performance.md.)
GATEWAY_LATENCY_MS = 1000
CAPACITY_PURCHASES = 200
CAPACITY_CLIENTS = 16
SEATS = 1000
BUYERS = 1600
HOLD_S = 15
OVERLOAD = 5.0
CLIENTS = 32
OPENS_IN_S = 5
SALE_LIMIT_S = 240.0
ROW_SIZE = 50


def fixtures(db: BenchDB, scale: int = SEATS) -> tuple[int, int]:
    """Figure 18's database fixtures: the capacity's event, and a sale's
    event of ``scale`` seats (``sale_event``)."""
    capacity = db.make_event("bench room capacity", max(1, scale // 2))[0]
    return capacity, sale_event(db, scale, room=True, opens_in_s=OPENS_IN_S)


def sale_event(db: BenchDB, seats: int, *, room: bool, opens_in_s: float | None) -> int:
    """An event of ``seats`` seats with a hold of ``HOLD_S``, its room on or
    off, its sale opening ``opens_in_s`` from now (None: open)."""
    # Rows of 50, as figure 10's hall: best available looks for one seat
    # near a row's middle, and one row of 1,000 would make every buyer read it.
    event = db.make_event(f"bench room {'on' if room else 'off'}", seats, row_size=ROW_SIZE)[0]
    db.q(
        "UPDATE purchases_event SET waiting_room = %s, hold_seconds = %s,"
        " sales_start = CASE WHEN %s::float IS NULL THEN NULL"
        "   ELSE now() + make_interval(secs => %s::float) END WHERE id = %s",
        [room, HOLD_S, opens_in_s, opens_in_s, event],
    )
    return event


def _capacity(ctx: Context) -> float:
    """Confirmations per second of the stack's worker, kept busy."""
    event = ctx.db.make_event("bench room capacity", CAPACITY_PURCHASES)[0]
    seats = iter(range(1, CAPACITY_PURCHASES + 1))
    lock = threading.Lock()

    def client(n: int) -> None:
        http = http_client(ctx.stack.base_url, ctx.users[n])
        while True:
            with lock:
                seat = next(seats, None)
            if seat is None:
                break
            post_purchase(http, event_id=event, ref=f"S{seat}")
        http.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CAPACITY_CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    onsale.wait_terminal(ctx, event, "waiting room")
    # A charge whose answer was lost (UNKNOWN) is confirmed by its
    # reconciliation a minute later, and says nothing of the rate.
    n, first, last = ctx.db.q1(
        "SELECT count(*), min(updated_at), max(updated_at) FROM purchases_purchasesaga s"
        " WHERE event_id = %s AND state = 'CONFIRMED' AND NOT EXISTS ("
        " SELECT 1 FROM purchases_sagahistory h"
        " WHERE h.saga_id = s.id AND h.event_id = s.event_id AND h.to_state = 'UNKNOWN')",
        [event],
    )
    if n < 2 or last <= first:
        raise PhaseFailed(f"waiting room: {n} purchases confirmed to measure the capacity")
    return (n - 1) / (last - first).total_seconds()


class _Sale:
    """The buyers of one sale: each at its arrival time, then again after
    each ``Retry-After``, until a 202 or a 409; ``CLIENTS`` threads."""

    def __init__(self, ctx: Context, event: int, users: list[int], rate: float):
        self.ctx, self.event = ctx, event
        self.t0 = time.monotonic() + 0.5
        self.due = [(self.t0 + k / rate, k) for k in range(len(users))]
        heapq.heapify(self.due)
        self.users = users
        self.lock = threading.Condition()
        self.first: dict[int, float] = {}
        self.done: dict[int, tuple[float, int, str]] = {}
        self.answers: Counter[str] = Counter()
        self.sold_out_at: float | None = None
        self.busy = 0
        self.stopped = False

    def run(self) -> None:
        threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=SALE_LIMIT_S + 60)

    def _next(self) -> int | None:
        with self.lock:
            while True:
                if self.stopped or (not self.due and self.busy == 0):
                    self.lock.notify_all()
                    return None
                if time.monotonic() - self.t0 > SALE_LIMIT_S:
                    self.stopped = True
                    continue
                if self.due:
                    at, k = self.due[0]
                    wait = at - time.monotonic()
                    if wait <= 0:
                        heapq.heappop(self.due)
                        self.busy += 1
                        return k
                    self.lock.wait(timeout=min(wait, 0.5))
                else:
                    self.lock.wait(timeout=0.5)

    def _client(self) -> None:
        # One connection per thread, each request with its buyer's token.
        http = http_client(self.ctx.stack.base_url, None)
        while (k := self._next()) is not None:
            sent = time.monotonic()
            self.first.setdefault(k, sent)
            status, _, answer = start_purchase(
                http,
                {"event": self.event, "quantity": 1, "payment_method": "pm_card_visa"},
                headers=auth_headers(self.users[k]),
            )
            code = _code(status, answer)
            with self.lock:
                self.answers[f"{status} {code}".strip()] += 1
                self.busy -= 1
                if status == 503 and code == "waiting_room":
                    retry = json.loads(answer["head"]).get("retry_after", 1)
                    heapq.heappush(self.due, (time.monotonic() + max(1, retry), k))
                else:
                    self.done[k] = (time.monotonic(), status, code)
                    if code == "not_enough_seats" and self.sold_out_at is None:
                        self.sold_out_at = time.monotonic()
                self.lock.notify_all()
        http.close()


def _code(status: int, answer: dict) -> str:
    if status in (202,):
        return ""
    if status == 409:
        return str(answer.get("code", ""))
    try:
        return str(json.loads(answer.get("head", "")).get("code", ""))
    except ValueError:
        return str(answer.get("head", ""))[:60]


def _one_sale(ctx: Context, users: list[int], rate: float, *, room: bool) -> dict:
    event = sale_event(ctx.db, SEATS, room=room, opens_in_s=OPENS_IN_S if room else None)
    if room:
        # The room opens with beat's next tick (a seller publishes well
        # before the sale; here the event is a second old).
        poll(
            lambda: ctx.db.q1("SELECT 1 FROM purchases_waitingroom WHERE event_id = %s", [event]),
            timeout=30,
            every=0.1,
        )
    (opens_in,) = ctx.db.q1(
        "SELECT COALESCE(EXTRACT(EPOCH FROM sales_start - now()), 0) FROM purchases_event"
        " WHERE id = %s",
        [event],
    )
    sale = _Sale(ctx, event, users, rate)
    opened = time.monotonic() + float(opens_in)
    log(f"   sale {'with' if room else 'without'} a room: {len(users)} buyers at {rate:.0f}/s")
    sale.run()
    onsale.wait_terminal(ctx, event, "waiting room")
    opened = max(opened, sale.t0)
    waits = [done[0] - sale.first[k] for k, done in sale.done.items() if done[1] == 202]
    (expired,) = ctx.db.q1(
        "SELECT count(DISTINCT saga_id) FROM purchases_sagahistory"
        " WHERE event_id = %s AND to_state = 'EXPIRED'",
        [event],
    )
    (sold,) = ctx.db.q1(
        "SELECT count(*) FROM purchases_seat WHERE event_id = %s AND status = 'sold'", [event]
    )
    out: dict[str, Any] = {
        "event": event,
        "room": room,
        "buyers": len(users),
        "arrival_rate_per_s": round(rate, 1),
        "answers": dict(sale.answers),
        "accepted": sum(1 for d in sale.done.values() if d[1] == 202),
        "sold": sold,
        "holds_expired": expired,
        "double_sales": sum(onsale.double_sales(ctx.db, event)),
        "seconds_to_sold_out": (
            round(sale.sold_out_at - opened, 2) if sale.sold_out_at is not None else None
        ),
        "wait_202": lat_summary(waits),
        "timed_out": sale.stopped,
    }
    if room:
        out.update(_order(ctx.db, event, sale, opened))
    log(f"   {json.dumps({k: v for k, v in out.items() if k != 'wait_202'})}")
    return out


def _order(db: BenchDB, event: int, sale: _Sale, opened: float) -> dict:
    """The room's numbers against the order of arrival, for the buyers who
    came after the opening."""
    number = dict(
        db.q(
            "SELECT buyer_id, number FROM purchases_waitingroomentry WHERE event_id = %s",
            [event],
        )
    )
    later = sorted(
        (sale.first[k], number[sale.users[k]])
        for k in sale.first
        if sale.first[k] >= opened + 1.0 and number.get(sale.users[k]) is not None
    )
    numbers = [n for _, n in later]
    pairs = in_order = 0
    for i in range(len(numbers)):
        for j in range(i + 1, len(numbers)):
            pairs += 1
            in_order += numbers[i] < numbers[j]
    drawn = sum(1 for k in sale.first if sale.first[k] < opened)
    return {
        "queued_after_opening": len(numbers),
        "pairs_in_arrival_order": round(in_order / pairs, 4) if pairs else None,
        "arrived_before_opening": drawn,
    }


def run(ctx: Context) -> None:
    fig: dict[str, Any] = {
        "seats": SEATS,
        "buyers": BUYERS,
        "hold_s": HOLD_S,
        "gateway_latency_ms": GATEWAY_LATENCY_MS,
    }
    ctx.results["figures"][FIGURE.key] = fig
    users = onsale.buyers(ctx.db, BUYERS)
    latency = ctx.stack.latency_ms
    gateway_latency.restart_with(ctx, GATEWAY_LATENCY_MS)
    ctx.stack.start_beat(Path(ctx.logdir) / "celerybeat-schedule-room")
    ctx.stack.start_admission_worker()
    try:
        capacity = _capacity(ctx)
        fig["charge_capacity_per_s"] = round(capacity, 1)
        log(f"   charge capacity: {capacity:.1f} confirmations/s")
        rate = OVERLOAD * capacity
        fig["without"] = _one_sale(ctx, users, rate, room=False)
        fig["with"] = _one_sale(ctx, users, rate, room=True)
    finally:
        ctx.stack.stop("beat")
        ctx.stack.stop("admission")
        gateway_latency.restart_with(ctx, latency)
    ctx.rows += rows(fig)
    _judge(fig)


def rows(fig: dict) -> list[dict]:
    without, with_ = fig["without"], fig["with"]

    def wait(s: dict) -> str:
        w = s["wait_202"]
        return f"{w['p50_ms'] / 1000:.1f} / {w['p99_ms'] / 1000:.1f} s" if w["n"] else "n/a"

    return [
        {
            "figure": f"18 room: holds expired before their charge, {SEATS} seats, "
            f"{fig['buyers']} buyers at {without['arrival_rate_per_s']}/s "
            f"(5x {fig['charge_capacity_per_s']} charges/s), hold {HOLD_S} s",
            "measured": f"{with_['holds_expired']} with the room",
            "baseline": f"{without['holds_expired']} without",
            "ratio": "",
        },
        {
            "figure": "18 room: seats sold; seats sold twice",
            "measured": f"{with_['sold']}; {with_['double_sales']}",
            "baseline": f"{without['sold']}; {without['double_sales']}",
            "ratio": "",
        },
        {
            "figure": "18 room: seconds from the opening to sold out",
            "measured": str(with_["seconds_to_sold_out"]),
            "baseline": str(without["seconds_to_sold_out"]),
            "ratio": "",
        },
        {
            "figure": "18 room: each buyer's wait for the 202, p50 / p99",
            "measured": wait(with_),
            "baseline": wait(without),
            "ratio": "",
        },
        {
            "figure": "18 room: pairs of buyers after the opening numbered in arrival order",
            "measured": str(with_.get("pairs_in_arrival_order")),
            "baseline": f"{with_.get('queued_after_opening')} queued after the opening, "
            f"{with_.get('arrived_before_opening')} drawn",
            "ratio": "",
        },
    ]


def _judge(fig: dict) -> None:
    problems = []
    for name in ("without", "with"):
        sale = fig[name]
        unexpected = {
            k: v
            for k, v in sale["answers"].items()
            if k not in ("202", "409 not_enough_seats", "503 waiting_room")
        }
        if unexpected:
            problems.append(f"{name}: unexpected answers {unexpected}")
        if sale["double_sales"]:
            problems.append(f"{name}: {sale['double_sales']} seats sold twice")
        if sale["timed_out"]:
            problems.append(f"{name}: buyers still waiting after {SALE_LIMIT_S:.0f}s")
    if fig["with"]["holds_expired"]:
        problems.append(f"{fig['with']['holds_expired']} holds expired with the room")
    if problems:
        raise PhaseFailed("; ".join(problems))
