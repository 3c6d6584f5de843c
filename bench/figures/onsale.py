"""Figure 10: the on-sale (issue 14). 2,000 buyers, distinct users, for a
1,000-seat event (20 rows of 50) on the real stack, the worker charging at a
zero-latency gateway: how long until sold out, what the buyers were answered
and how fast, and that no seat was sold twice. 5 runs (``--full``: 20), each
on a fresh event.

Buyers: ``CLIENTS`` closed-loop clients, each its own keep-alive connection,
each taking the next buyer (a bench user of its own: ``BenchDB.ensure_users``)
as soon as the previous one is done, until every buyer has had a turn or the
event is sold out. 70% of the buyers ask for a quantity, 1 to 4 at random
(best available); 30% read the seat map first (``GET
/api/events/{id}/seats/``, served from the catalog cache) and name 1 to 4
seats at random among those it shows available (a buyer whose map shows none
leaves). A buyer answered 409 (``not_enough_seats`` or ``seat_unavailable``)
tries once more with a quantity of 1, as a buyer settles for one seat, unless
the answer says nothing is available any more or the event is sold out.
Every request is a new ``Idempotency-Key``.

Measured per run, from the first request: the time to sold out (no seat
``available`` in the database, polled, or a ``not_enough_seats`` answer with
``available`` 0, whichever is seen first), and the time until every saga is
terminal (the last one's ``updated_at``); the 202s and the 409s by code with
their p50/p99; the seats sold and held at the end; the double sales (a seat
in more than one CONFIRMED reservation, or sold with no CONFIRMED
reservation). The figure fails if a run has a double sale, sells more seats
than the event has, answers anything but 202/409, or ends with a different
number of sagas than of 202s. Baselines: the 202s per second against figure
1's reserve rate of the same invocation (c=16, else c=4; "n/a" when figure 1
did not run), the time to sold out against the time to every saga terminal,
the 409s' latency against the 202s'.

The stack's web and worker run with the catalog cache on Redis (the bench's
database, ``--redis-db``) for this figure, as in production
(docs/design.md, "The edges"), and are restarted as they were afterwards;
each run starts and ends with the stack drained.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from bench.common import Context, Figure, PhaseFailed, lat_summary, log, ratio
from bench.cpu import per_purchase
from bench.db import BenchDB
from bench.figures import e2e, webhooks
from bench.load import auth_headers, http_client, start_purchase
from devtools.processes import poll

FIGURE = Figure(
    phase="onsale", key="10_onsale", label="10 on-sale", timeout=lambda ctx: 240 + _runs(ctx) * 240
)
BUYERS = 2000
ROWS, ROW_SIZE = 20, 50
SEATS = ROWS * ROW_SIZE
# More clients than gunicorn's 16 threads: the web tier always has a queue,
# as at an on-sale.
CLIENTS = 32
NAMED_SHARE = 0.3
MAX_QUANTITY = 4
PAYMENT_METHOD = "pm_card_visa"
SOLD_OUT_POLL_S = 0.025
TERMINAL = ("CONFIRMED", "COMPENSATED")
CODES = ("not_enough_seats", "seat_unavailable")


def fixtures(db: BenchDB, scale: int = SEATS, r: int = 0) -> tuple[list[int], int]:
    """Figure 10's database fixtures at ``scale`` seats: the buyers (two per
    seat, ``BUYERS`` at the default scale: ``buyers``) and one run's event
    (``sale_event``)."""
    return buyers(db, BUYERS * scale // SEATS), sale_event(db, r, scale)


def buyers(db: BenchDB, n: int) -> list[int]:
    """``n`` bench users with their tokens, made once before the first run."""
    return db.ensure_users(n)


def sale_event(db: BenchDB, r: int, seats: int = SEATS) -> int:
    """A fresh event of ``seats`` seats in rows of ``ROW_SIZE`` (best available
    needs rows), one per run."""
    return db.make_event(f"bench on-sale {r}", seats, row_size=ROW_SIZE)[0]


def _runs(ctx: Context) -> int:
    return 20 if ctx.full else 5


# --- the buyers ------------------------------------------------------------------------


class _OnSale:
    """``CLIENTS`` threads for one run. Each first reads the seat map (its
    connection is open and the catalog cached, as buyers wait on the page),
    then waits at ``start``; released, it takes buyers one after the other
    until none is left or ``sold_out`` is set."""

    def __init__(self, ctx: Context, users: list[int], event: int, seed: int):
        self.ctx, self.users, self.event = ctx, users, event
        self.path = f"/api/events/{event}/seats/"
        plan = random.Random(seed)
        self.plan = [
            ("named" if plan.random() < NAMED_SHARE else "quantity", plan.randint(1, MAX_QUANTITY))
            for _ in users
        ]
        self.seed = seed
        self.next = 0
        self.lock = threading.Lock()
        self.start = threading.Barrier(CLIENTS + 1, timeout=120)
        self.sold_out = threading.Event()
        self.sold_out_answered_at: float | None = None  # monotonic
        # (buyer, attempt, kind, asked, status, code, secs, answered, seats)
        self.records: list[list[tuple]] = [[] for _ in range(CLIENTS)]
        self.gets: list[list[float]] = [[] for _ in range(CLIENTS)]
        self.left_on_map = 0  # buyers whose seat map showed no seat
        self.failures: list[str] = []
        self.threads = [
            threading.Thread(target=self._client, args=(k,), daemon=True) for k in range(CLIENTS)
        ]

    def _client(self, k: int) -> None:
        rng = random.Random(self.seed * 1000 + k)
        try:
            with http_client(self.ctx.stack.base_url, None) as client:
                if client.get(self.path).status_code != 200:
                    raise PhaseFailed(f"GET {self.path} before the on-sale did not answer 200")
                self.start.wait()
                while not self.sold_out.is_set():
                    with self.lock:
                        buyer, self.next = self.next, self.next + 1
                    if buyer >= len(self.users):
                        return
                    self._buyer(client, rng, k, buyer)
        except threading.BrokenBarrierError:
            pass
        except Exception as exc:  # noqa: BLE001 - reported by the run
            self.failures.append(f"client {k}: {type(exc).__name__}: {exc}")
            self.sold_out.set()  # the others stop too: the run is lost
            self.start.abort()

    def _buyer(self, client, rng: random.Random, k: int, buyer: int) -> None:
        kind, asked = self.plan[buyer]
        headers = auth_headers(self.users[buyer])
        if kind == "named":
            started = time.perf_counter()
            r = client.get(self.path)
            self.gets[k].append(time.perf_counter() - started)
            if r.status_code != 200:
                raise PhaseFailed(f"GET {self.path} answered {r.status_code}: {r.text[:200]}")
            free = [s["ref"] for s in r.json() if s["status"] == "available"]
            if not free:
                with self.lock:
                    self.left_on_map += 1
                return
            body: dict[str, Any] = {"seats": rng.sample(free, min(asked, len(free)))}
        else:
            body = {"quantity": asked}
        if (
            self._attempt(
                client,
                k,
                buyer,
                "first",
                kind,
                len(body.get("seats", ())) or asked,
                {"event": self.event, **body, "payment_method": PAYMENT_METHOD},
                headers,
            )
            and not self.sold_out.is_set()
        ):
            self._attempt(
                client,
                k,
                buyer,
                "retry",
                "quantity",
                1,
                {"event": self.event, "quantity": 1, "payment_method": PAYMENT_METHOD},
                headers,
            )

    def _attempt(
        self,
        client,
        k: int,
        buyer: int,
        attempt: str,
        kind: str,
        asked: int,
        body: dict,
        headers: dict,
    ) -> bool:
        """One purchase start; True when the buyer may try again (a 409 that
        does not say the event is sold out)."""
        status, secs, answer = start_purchase(client, body, headers=headers)
        answered = time.monotonic()
        code = answer.get("code") if status == 409 else None
        seats = answer.get("seats") if status == 202 else None
        self.records[k].append((buyer, attempt, kind, asked, status, code, secs, answered, seats))
        if status not in (202, 409):
            raise PhaseFailed(
                f"buyer {buyer} ({kind} {asked}) answered {status}: {answer.get('head')}"
            )
        if code == "not_enough_seats" and answer.get("available") == 0:
            with self.lock:
                if self.sold_out_answered_at is None:
                    self.sold_out_answered_at = answered
            self.sold_out.set()
            return False
        return status == 409

    def all_records(self) -> list[tuple]:
        return [r for rs in self.records for r in rs]

    def end(self) -> None:
        self.sold_out.set()
        self.start.abort()
        for th in self.threads:
            th.join(120)


# --- one run ---------------------------------------------------------------------------


def _one_run(ctx: Context, users: list[int], r: int) -> dict:
    event = sale_event(ctx.db, r)
    sale = _OnSale(ctx, users, event, seed=1400 + r)
    window = e2e.cpu_window(ctx)
    cpu = None
    for th in sale.threads:
        th.start()
    try:
        sale.start.wait()
        window.start()
        t0, t0_epoch = time.monotonic(), time.time()
        sold_out_polled = _watch(ctx, sale, event, t0)
        buyers_done = time.monotonic()
        cpu = window.stop()
    except threading.BrokenBarrierError:
        sale.failures.append("the clients were not all ready")
    finally:
        sale.end()
    if sale.failures:
        raise PhaseFailed(f"on-sale run {r}: {sale.failures[:3]}")
    ctx.stack.check_alive()
    seen = [t for t in (sold_out_polled, sale.sold_out_answered_at) if t is not None]
    sold_out_s = min(seen) - t0 if seen else None
    terminal_s = wait_terminal(ctx, event) - t0_epoch
    quiet = webhooks._quiet(ctx, 180)
    if not quiet:
        msg = f"on-sale run {r}: the stack did not drain within 180s (queue {ctx.broker.depth()})"
        log("!! " + msg)
        ctx.results["notes"].append(msg)
    out = _summary(
        sale,
        event,
        t0=t0,
        sold_out_s=sold_out_s,
        buyers_done_s=buyers_done - t0,
        terminal_s=terminal_s,
    )
    out.update(run=r, drained=quiet, **_database(ctx, event))
    out["cpu"] = _cpu_per_202(cpu, out["202"])
    out["problems"] = _problems(out)
    return out


def _cpu_per_202(cpu: dict | None, accepted: int) -> dict | None:
    """The machine's CPU from the opening until sold out (or every buyer
    done), per 202, by process (bench/cpu.py, as figure 2 counts it), and
    how busy the machine was: what the on-sale costs beside figure 1's
    reserve alone, and whether it ran out of CPU or waited."""
    if cpu is None or not accepted:
        return None
    per = per_purchase(cpu, accepted)
    cores = os.cpu_count() or 1
    per["machine_busy_percent"] = round(
        cpu["machine_busy_seconds"] / cpu["seconds"] / cores * 100, 1
    )
    return per


def _watch(ctx: Context, sale: _OnSale, event: int, t0: float) -> float | None:
    """Poll the event's available seats until none is left (returns when it
    was seen) or every client is done (None)."""
    last = t0
    while True:
        (available,) = ctx.db.q1(
            "SELECT count(*) FROM purchases_seat WHERE event_id = %s AND status = 'available'",
            [event],
        )
        now = time.monotonic()
        if available == 0:
            sale.sold_out.set()
            return now
        if not any(th.is_alive() for th in sale.threads):
            return None
        if now - last >= 5:
            log(
                f"   on-sale: {available} seats available after {now - t0:.0f}s, "
                f"{sum(len(x) for x in sale.records)} requests"
            )
            last = now
        time.sleep(SOLD_OUT_POLL_S)


def wait_terminal(ctx: Context, event: int, label: str = "on-sale") -> float:
    """Until every saga of the event is CONFIRMED or COMPENSATED (``PhaseFailed``
    after 300 s, ``label`` naming the figure); the epoch of the last one's move."""
    seen = {"live": None, "last": None}

    def terminal() -> bool:
        seen["live"], seen["last"] = ctx.db.q1(
            "SELECT count(*) FILTER (WHERE state <> ALL(%s)), extract(epoch FROM max(updated_at))"
            " FROM purchases_purchasesaga WHERE event_id = %s",
            [list(TERMINAL), event],
        )
        if seen["live"]:
            ctx.stack.check_alive()
        return seen["live"] == 0

    if not poll(
        terminal,
        timeout=300,
        every=0.2,
        progress=lambda: log(f"   {label}: {seen['live']} sagas not terminal yet"),
    ):
        raise PhaseFailed(f"{label}: {seen['live']} sagas still not terminal after 300s")
    return float(seen["last"]) if seen["last"] is not None else time.time()


def _summary(
    sale: _OnSale,
    event: int,
    *,
    t0: float,
    sold_out_s: float | None,
    buyers_done_s: float,
    terminal_s: float,
) -> dict:
    recs = sale.all_records()
    ok = [x for x in recs if x[4] == 202]
    refused = [x for x in recs if x[4] == 409]
    refs = [ref for x in ok for ref in x[8]]
    window = sold_out_s if sold_out_s is not None else buyers_done_s
    by_code = {c: sum(1 for x in refused if x[5] == c) for c in CODES}
    by_code.update(
        {str(c): sum(1 for x in refused if x[5] == c) for c in {x[5] for x in refused} - set(CODES)}
    )
    return {
        "event": event,
        "sold_out": sold_out_s is not None,
        "sold_out_s": sold_out_s,
        "buyers_done_s": buyers_done_s,
        "terminal_s": terminal_s,
        "buyers_served": len({x[0] for x in recs}) + sale.left_on_map,
        "buyers_left_on_map": sale.left_on_map,
        "buyers_bought": len({x[0] for x in ok}),
        "requests": len(recs),
        "202": len(ok),
        "409": len(refused),
        "409_by_code": by_code,
        "202_first": sum(1 for x in ok if x[1] == "first"),
        "202_retry": sum(1 for x in ok if x[1] == "retry"),
        "retries": sum(1 for x in recs if x[1] == "retry"),
        "202_by_kind": {
            k: sum(1 for x in ok if x[1] == "first" and x[2] == k) for k in ("quantity", "named")
        },
        "first_by_kind": {
            k: sum(1 for x in recs if x[1] == "first" and x[2] == k) for k in ("quantity", "named")
        },
        "seats_in_202s": len(refs),
        "refs_in_two_202s": len(refs) - len(set(refs)),
        "rate_202_per_s": len(ok) / window if window else None,
        "latency_202": lat_summary([x[6] for x in ok]),
        "latency_409": lat_summary([x[6] for x in refused]),
        "latency_409_by_code": {
            c: lat_summary([x[6] for x in refused if x[5] == c]) for c in CODES
        },
        "latency_seat_map": lat_summary([s for g in sale.gets for s in g]),
        # Whatever the answer: which requests are slow, and when they were sent.
        "latency_first_by_kind": {
            k: lat_summary([x[6] for x in recs if x[1] == "first" and x[2] == k])
            for k in ("quantity", "named")
        },
        "latency_quantity_by_n": {
            n: lat_summary([x[6] for x in recs if x[2] == "quantity" and x[3] == n])
            for n in range(1, MAX_QUANTITY + 1)
        },
        "slowest": [
            {
                "attempt": x[1],
                "kind": x[2],
                "asked": x[3],
                "status": x[4],
                "code": x[5],
                "sent_s": round(x[7] - x[6] - t0, 3),
                "secs": round(x[6], 3),
            }
            for x in sorted(recs, key=lambda x: -x[6])[:10]
        ],
    }


def _database(ctx: Context, event: int) -> dict:
    """The event as the database has it once every saga is terminal."""
    seats = dict(
        ctx.db.q(
            "SELECT status, count(*) FROM purchases_seat WHERE event_id = %s GROUP BY status",
            [event],
        )
    )
    sagas = dict(
        ctx.db.q(
            "SELECT state, count(*) FROM purchases_purchasesaga WHERE event_id = %s GROUP BY state",
            [event],
        )
    )
    confirmed, confirmed_links, live_links = ctx.db.q1(
        "SELECT (SELECT count(*) FROM purchases_reservation WHERE event_id = %(e)s"
        "          AND status = 'CONFIRMED'),"
        "       (SELECT count(*) FROM purchases_reservationseat rs"
        "          JOIN purchases_reservation r ON r.id = rs.reservation_id"
        "         WHERE r.event_id = %(e)s AND r.status = 'CONFIRMED'),"
        "       (SELECT count(*) FROM purchases_reservationseat WHERE event_id = %(e)s"
        "          AND released_at IS NULL)",
        {"e": event},
    )
    in_two, sold_alone = double_sales(ctx.db, event)
    return {
        "seats": SEATS,
        "seats_by_status": seats,
        "seats_sold": seats.get("sold", 0),
        "seats_held": seats.get("held", 0),
        "seats_available": seats.get("available", 0),
        "sagas": sum(sagas.values()),
        "sagas_by_state": sagas,
        "reservations_confirmed": confirmed,
        "seats_in_confirmed_reservations": confirmed_links,
        "live_seat_links": live_links,
        "seats_in_two_confirmed_reservations": in_two,
        "seats_sold_unconfirmed": sold_alone,
        "double_sales": in_two + sold_alone,
    }


def _problems(run: dict) -> list[str]:
    """What fails the figure (the first four) or only deserves a note."""
    out = []
    if run["double_sales"]:
        out.append(f"FAIL {run['double_sales']} double sales")
    sold = max(run["seats_sold"], run["seats_in_confirmed_reservations"])
    if sold > SEATS:
        out.append(f"FAIL {sold} seats sold of {SEATS}")
    if run["sagas"] != run["202"]:
        out.append(f"FAIL {run['sagas']} sagas for {run['202']} answers 202")
    if run["refs_in_two_202s"] and not run["sagas_by_state"].get("COMPENSATED"):
        out.append(f"FAIL {run['refs_in_two_202s']} seats in two 202 answers, none released")
    if not run["sold_out"]:
        out.append(
            f"not sold out: {run['seats_available']} seats left after {run['buyers_served']} buyers"
        )
    if run["seats_held"]:
        out.append(f"{run['seats_held']} seats still held with every saga terminal")
    if run["seats_sold"] != run["seats_in_202s"] and not run["sagas_by_state"].get("COMPENSATED"):
        out.append(f"{run['seats_sold']} seats sold for {run['seats_in_202s']} in 202 answers")
    return out


# --- the figure ------------------------------------------------------------------------


def _restart(ctx: Context, *, cache_on_redis: bool) -> None:
    """Web and worker with the catalog cache on the bench's Redis database, or
    as the stack started them; the gateway at 0 ms (figure 3 may have left it
    at 300)."""
    stack = ctx.stack
    stack.stop("web")
    stack.stop("worker")
    if stack.latency_ms != 0:
        stack.stop("gateway")
    ctx.broker.purge()
    started_with = stack.base_env
    if cache_on_redis:
        cache_url = started_with["CELERY_BROKER_URL"].replace("redis://", "rediscache://", 1)
        stack.base_env = {**started_with, "CACHE_URL": cache_url}
    how = "with the cache on Redis" if cache_on_redis else "as the stack started them"
    log(f"   restarting web and worker {how}")
    try:
        if stack.latency_ms != 0:
            stack.latency_ms = 0
            stack.start_gateway()
        stack.start_web()
        stack.start_worker()
    finally:
        stack.base_env = started_with
    stack.wait_web()
    stack.wait_worker(ctx.broker.app)


def _forget_cache(ctx: Context) -> None:
    keys = list(ctx.broker.redis.scan_iter(match="*:availability:*", count=1000))
    if keys:
        ctx.broker.redis.delete(*keys)


def run(ctx: Context) -> None:
    runs = _runs(ctx)
    users = buyers(ctx.db, BUYERS)
    if len(set(users)) != BUYERS:
        raise PhaseFailed(f"on-sale: {len(set(users))} bench users, {BUYERS} needed")
    fig: dict = {
        "buyers": BUYERS,
        "seats": SEATS,
        "rows": ROWS,
        "row_size": ROW_SIZE,
        "clients": CLIENTS,
        "named_share": NAMED_SHARE,
        "max_quantity": MAX_QUANTITY,
        "retry": "once, quantity 1, after a 409 that does not say sold out",
        "runs": [],
    }
    ctx.results["figures"][FIGURE.key] = fig
    webhooks._drain(ctx, "before the on-sale", strict=False)
    try:
        _restart(ctx, cache_on_redis=True)
        for r in range(runs):
            m = _one_run(ctx, users, r)
            fig["runs"].append(m)
            log(
                f"   on-sale run {r + 1}/{runs}: sold out "
                + (f"in {m['sold_out_s']:.2f}s" if m["sold_out"] else "NOT")
                + f", terminal {m['terminal_s']:.1f}s; 202 {m['202']}, 409 {m['409_by_code']};"
                f" p99 202 {m['latency_202']['p99_ms']:.0f} ms,"
                f" 409 {m['latency_409']['p99_ms'] or 0:.0f} ms;"
                f" sold {m['seats_sold']}, held {m['seats_held']}, double {m['double_sales']}"
                + (f"; {m['problems']}" if m["problems"] else "")
            )
    finally:
        webhooks._drain(ctx, "after the on-sale", strict=False)
        _restart(ctx, cache_on_redis=False)
        _forget_cache(ctx)
    fig["aggregate"] = _aggregate(fig["runs"])
    fig["reserve_baseline"] = _reserve_baseline(ctx)
    ctx.rows += rows(fig)
    failed = [
        f"run {m['run']}: {p}" for m in fig["runs"] for p in m["problems"] if p.startswith("FAIL")
    ]
    for m in fig["runs"]:
        for p in m["problems"]:
            if not p.startswith("FAIL"):
                ctx.results["notes"].append(f"on-sale run {m['run']}: {p}")
    if failed:
        raise PhaseFailed(f"on-sale: {failed[:3]}")


def _reserve_baseline(ctx: Context) -> dict | None:
    """Figure 1's HTTP measurement at 16 clients, else 4, of this invocation."""
    levels = ctx.results["figures"].get("1_reserve", {}).get("levels", {})
    for c in ("16", "4"):
        http = levels.get(c, {}).get("http")
        if http:
            return {
                "clients": int(c),
                "throughput_per_s": http["throughput_per_s"],
                "p50_ms": http["latency_202"]["p50_ms"],
                "p99_ms": http["latency_202"]["p99_ms"],
                "cpu_ms_per_202": http.get("cpu_ms_per_202"),
            }
    return None


def _spread(values: list) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _by_code(code: str) -> Callable[[dict], Any]:
    return lambda m: m["409_by_code"][code]


# Figure 10's CPU per 202 in the table: these processes, the machine's
# whole, and how busy it was.
CPU_SHOWN = (
    "web",
    "worker",
    "pg_product",
    "gateway",
    "machine_all_processes",
    "machine_busy_percent",
)


def _cpu_of(key: str) -> Callable[[dict], Any]:
    return lambda m: (m.get("cpu") or {}).get(key)


def _aggregate(runs: list[dict]) -> dict:
    keys: dict[str, Callable[[dict], Any]] = {
        "sold_out_s": lambda m: m["sold_out_s"],
        "terminal_s": lambda m: m["terminal_s"],
        "rate_202_per_s": lambda m: m["rate_202_per_s"],
        "202": lambda m: m["202"],
        "409": lambda m: m["409"],
        **{f"409_{c}": _by_code(c) for c in CODES},
        "p50_202_ms": lambda m: m["latency_202"]["p50_ms"],
        "p99_202_ms": lambda m: m["latency_202"]["p99_ms"],
        "p50_409_ms": lambda m: m["latency_409"]["p50_ms"],
        "p99_409_ms": lambda m: m["latency_409"]["p99_ms"],
        "p50_seat_map_ms": lambda m: m["latency_seat_map"]["p50_ms"],
        "p99_seat_map_ms": lambda m: m["latency_seat_map"]["p99_ms"],
        "seats_sold": lambda m: m["seats_sold"],
        "seats_held": lambda m: m["seats_held"],
        "buyers_served": lambda m: m["buyers_served"],
        "requests": lambda m: m["requests"],
        **{f"cpu_{k}": _cpu_of(k) for k in CPU_SHOWN},
    }
    out: dict[str, Any] = {k: _spread([get(m) for m in runs]) for k, get in keys.items()}
    out["runs"] = len(runs)
    out["runs_sold_out"] = sum(1 for m in runs if m["sold_out"])
    out["double_sales"] = sum(m["double_sales"] for m in runs)
    return out


# --- the table -------------------------------------------------------------------------


def _mm(s: dict, fmt: str, unit: str = "") -> str:
    if s["median"] is None:
        return "n/a"
    return f"{s['median']:{fmt}}{unit} ({s['min']:{fmt}}-{s['max']:{fmt}})"


def rows(fig: dict) -> list[dict]:
    a, base = fig["aggregate"], fig["reserve_baseline"]
    n = a["runs"]
    med = {k: v["median"] for k, v in a.items() if isinstance(v, dict)}
    if base:
        rate_base = f"{base['throughput_per_s']:.1f} req/s (1 reserve c={base['clients']})"
        lat_base = f"{base['p50_ms']:.1f} / {base['p99_ms']:.1f} ms (1 reserve c={base['clients']})"
    else:
        rate_base = lat_base = "n/a (figure 1 not run)"
    head = f"10 on-sale {SEATS:,} seats, {BUYERS:,} buyers, c={CLIENTS}"
    return [
        {
            "figure": f"{head}: time to sold out ({a['runs_sold_out']}/{n} runs sold out; "
            f"median (min-max) of {n}) vs to every saga terminal",
            "measured": _mm(a["sold_out_s"], ".2f", " s"),
            "baseline": _mm(a["terminal_s"], ".1f", " s"),
            "ratio": ratio(med["sold_out_s"], med["terminal_s"]),
        },
        {
            "figure": "10 on-sale 202s per second until sold out vs reserve",
            "measured": _mm(a["rate_202_per_s"], ".1f", " /s"),
            "baseline": rate_base,
            "ratio": ratio(med["rate_202_per_s"], base["throughput_per_s"] if base else None),
        },
        {
            "figure": "10 on-sale answers 202 / 409 not_enough_seats / 409 seat_unavailable "
            "(medians; ratio: share of 202s)",
            "measured": f"{med['202']:.0f} / {med['409_not_enough_seats']:.0f} / "
            f"{med['409_seat_unavailable']:.0f}",
            "baseline": f"{med['requests']:.0f} requests from {med['buyers_served']:.0f} buyers",
            "ratio": ratio(med["202"], med["requests"]),
        },
        {
            "figure": "10 on-sale 202 p50 / p99 (medians of runs) vs reserve (p99 ratio)",
            "measured": f"{med['p50_202_ms']:.0f} / {med['p99_202_ms']:.0f} ms",
            "baseline": lat_base,
            "ratio": ratio(med["p99_202_ms"], base["p99_ms"] if base else None),
        },
        {
            "figure": "10 on-sale 409 p50 / p99 vs the 202s (p99 ratio)",
            "measured": (
                f"{med['p50_409_ms']:.0f} / {med['p99_409_ms']:.0f} ms"
                if med["p99_409_ms"] is not None
                else "no 409"
            ),
            "baseline": f"{med['p50_202_ms']:.0f} / {med['p99_202_ms']:.0f} ms",
            "ratio": ratio(med["p99_409_ms"], med["p99_202_ms"]),
        },
        {
            "figure": "10 on-sale seats sold, median (min-max); held at the end (max)",
            "measured": f"{_mm(a['seats_sold'], '.0f')}; {a['seats_held']['max']} held",
            "baseline": f"{SEATS} seats",
            "ratio": ratio(a["seats_sold"]["min"], SEATS),
        },
        _cpu_row(med, base),
        {
            "figure": f"10 on-sale double sales (all {n} runs)",
            "measured": str(a["double_sales"]),
            "baseline": "0",
            "ratio": "",
        },
    ]


def _cpu_row(med: dict, base: dict | None) -> dict:
    """The machine's CPU per 202 during the on-sale (medians of runs), by
    process, against figure 1's per request at the same clients."""
    if med.get("cpu_machine_all_processes") is None:
        return {
            "figure": "10 on-sale machine CPU per 202",
            "measured": "n/a",
            "baseline": "",
            "ratio": "",
        }
    parts = ", ".join(
        f"{med[f'cpu_{k}']:.1f} {label}"
        for k, label in (
            ("web", "web"),
            ("worker", "worker"),
            ("pg_product", "pg"),
            ("gateway", "processor"),
        )
        if med.get(f"cpu_{k}") is not None
    )
    cpu = base.get("cpu_ms_per_202") if base else None
    return {
        "figure": "10 on-sale machine CPU per 202 until sold out, ms (machine busy %) vs reserve",
        "measured": f"{med['cpu_machine_all_processes']:.1f} ({parts}; busy "
        f"{med['cpu_machine_busy_percent']:.0f} %)",
        "baseline": (
            f"{cpu['machine_all_processes']:.1f} ({cpu['web']:.1f} web; busy "
            f"{cpu['machine_busy_percent']:.0f} %)"
            if cpu
            else "n/a"
        ),
        "ratio": ratio(
            med["cpu_machine_all_processes"], cpu["machine_all_processes"] if cpu else None
        ),
    }


def double_sales(db: BenchDB, event: int) -> tuple[int, int]:
    """The event's double sales: (seats in more than one CONFIRMED
    reservation, seats sold that no CONFIRMED reservation holds)."""
    return db.q1(
        "SELECT (SELECT count(*) FROM (SELECT rs.seat_id FROM purchases_reservationseat rs"
        "          JOIN purchases_reservation r ON r.id = rs.reservation_id"
        "         WHERE r.event_id = %(e)s AND r.status = 'CONFIRMED'"
        "         GROUP BY rs.seat_id HAVING count(*) > 1) AS twice),"
        "       (SELECT count(*) FROM purchases_seat s WHERE s.event_id = %(e)s"
        "          AND s.status = 'sold' AND NOT EXISTS (SELECT 1"
        "            FROM purchases_reservationseat rs"
        "            JOIN purchases_reservation r ON r.id = rs.reservation_id"
        "           WHERE rs.seat_id = s.id AND r.status = 'CONFIRMED'))",
        {"e": event},
    )
