"""Figure 5: 200 buyers released together onto an event with 10 seats, 20
runs; every run must sell exactly 10. The 409s' latency against the 202s'."""

from __future__ import annotations

import random
import threading

from bench.common import Context, Figure, PhaseFailed, lat_summary, log, ratio
from bench.db import BenchDB
from bench.load import http_client, post_purchase

FIGURE = Figure(
    phase="hot",
    key="5_hot_seat",
    label="5 hot seat",
    timeout=lambda ctx: 300 if not ctx.full else 1200,
)
BUYERS = 200
SEATS = [f"A{i}" for i in range(1, 11)]


def fixtures(db: BenchDB, scale: int) -> list[int]:
    """Figure 5's database fixture: ``scale`` events (one per run) of the 10
    seats ``SEATS``; their ids."""
    return [db.make_event(f"bench hot seat {r}", len(SEATS), prefix="A")[0] for r in range(scale)]


class _Buyers:
    """``BUYERS`` threads, each its own user and connection; for each run,
    all wait at ``start``, ask for one of the 10 seats at random, and wait at
    ``done``."""

    def __init__(self, ctx: Context, events: list[int]):
        self.ctx, self.events = ctx, events
        self.start = threading.Barrier(BUYERS + 1, timeout=120)
        self.done = threading.Barrier(BUYERS + 1, timeout=120)
        self.results: list[list[tuple]] = [[] for _ in events]  # (status, secs, ref, head)
        self.lock = threading.Lock()
        self.failures: list[str] = []
        self.threads = [
            threading.Thread(target=self._buyer, args=(k,), daemon=True) for k in range(BUYERS)
        ]

    def _buyer(self, k: int) -> None:
        rng = random.Random(1000 + k)
        try:
            with http_client(self.ctx.stack.base_url, self.ctx.users[k]) as client:
                for r, event in enumerate(self.events):
                    self.start.wait()
                    ref = rng.choice(SEATS)
                    status, secs, head = post_purchase(client, event_id=event, ref=ref)
                    with self.lock:
                        self.results[r].append((status, secs, ref, head))
                    self.done.wait()
        except threading.BrokenBarrierError:
            pass
        except Exception as exc:  # noqa: BLE001 - reported by run
            self.failures.append(f"buyer {k}: {type(exc).__name__}: {exc}")
            self.start.abort()
            self.done.abort()

    def end(self) -> None:
        self.start.abort()
        self.done.abort()
        for th in self.threads:
            th.join(30)


def _check_run(ctx: Context, r: int, event: int, res: list[tuple]) -> dict:
    n202 = sum(1 for x in res if x[0] == 202)
    n409 = sum(1 for x in res if x[0] == 409)
    taken, links, sagas = ctx.db.q1(
        "SELECT (SELECT count(*) FROM purchases_seat WHERE event_id = %(e)s"
        "          AND status IN ('held', 'sold')),"
        "       (SELECT count(*) FROM purchases_reservationseat WHERE event_id = %(e)s"
        "          AND released_at IS NULL),"
        "       (SELECT count(*) FROM purchases_purchasesaga WHERE event_id = %(e)s)",
        {"e": event},
    )
    ok = n202 == 10 and n409 == BUYERS - 10 and taken == 10 and links == 10 and sagas == 10
    return {
        "run": r,
        "event": event,
        "202": n202,
        "409": n409,
        "other": [x[0] for x in res if x[0] not in (202, 409)][:5],
        "seats_taken": taken,
        "live_links": links,
        "sagas": sagas,
        "ok": ok,
    }


def run(ctx: Context) -> None:
    runs = 100 if ctx.full else 20
    events = fixtures(ctx.db, runs)
    buyers = _Buyers(ctx, events)
    for th in buyers.threads:
        th.start()
    per_run = []
    try:
        for r in range(runs):
            buyers.start.wait()
            buyers.done.wait()
            per_run.append(_check_run(ctx, r, events[r], buyers.results[r]))
            if not per_run[-1]["ok"]:
                log(f"!! hot seat run {r}: {per_run[-1]}")
            if (r + 1) % 5 == 0 or r + 1 == runs:
                log(
                    f"   hot seat: {r + 1}/{runs} runs, "
                    f"{sum(1 for p in per_run if p['ok'])} exactly 10 sold"
                )
    finally:
        buyers.end()
    if buyers.failures:
        raise PhaseFailed(f"hot seat: {buyers.failures[:3]}")
    lat409 = [x[1] for res in buyers.results for x in res if x[0] == 409]
    lat202 = [x[1] for res in buyers.results for x in res if x[0] == 202]
    passed = sum(1 for p in per_run if p["ok"])
    s409, s202 = lat_summary(lat409), lat_summary(lat202)
    ctx.results["figures"][FIGURE.key] = {
        "runs": runs,
        "buyers": BUYERS,
        "seats": 10,
        "runs_exactly_10": passed,
        "latency_409": s409,
        "latency_202": s202,
        "per_run": per_run,
    }
    ctx.rows += rows(runs, passed, s409, s202)
    if passed != runs:
        raise PhaseFailed(f"hot seat: only {passed}/{runs} runs sold exactly 10 seats")


def rows(runs: int, passed: int, s409: dict, s202: dict) -> list[dict]:
    return [
        {
            "figure": "5 hot seat runs with exactly 10 sold",
            "measured": f"{passed}/{runs}",
            "baseline": f"{runs}/{runs}",
            "ratio": ratio(passed, runs),
        },
        {
            "figure": "5 hot seat 409 p50",
            "measured": f"{s409['p50_ms']:.0f} ms",
            "baseline": f"{s202['p50_ms']:.0f} ms (202s)",
            "ratio": ratio(s409["p50_ms"], s202["p50_ms"]),
        },
        {
            "figure": "5 hot seat 409 p99",
            "measured": f"{s409['p99_ms']:.0f} ms",
            "baseline": f"{s202['p99_ms']:.0f} ms (202s)",
            "ratio": ratio(s409["p99_ms"], s202["p99_ms"]),
        },
    ]
