"""Figure 4: 10,000 armed timers due over 20 s; their fire lag against the
relay's poll interval, and none early."""

from __future__ import annotations

import uuid

from bench.common import Context, Figure, PhaseFailed, log, ratio
from bench.db import BenchDB
from devtools.processes import poll

FIGURE = Figure(
    phase="timers",
    key="4_timers",
    label="4 timers",
    timeout=lambda ctx: 300 if not ctx.full else 600,
)
WHERE = "topic = 'bench.noop' AND key LIKE %s"


def run(ctx: Context) -> None:
    n = 30000 if ctx.full else 10000
    window = 30.0 if ctx.full else 20.0
    lead = 5.0
    if not ctx.broker.quiesce(ctx.db, 120):
        ctx.results["notes"].append("timers: the stack was not quiet before the run")
    like = fixtures(ctx.db, n, lead=lead, window=window)
    log(
        f"   armed {n} timers due from +{lead:.0f}s to +{lead + window:.0f}s "
        "(topic bench.noop: no consumer, delivery only completes them)"
    )
    _wait_fired(ctx, like, n, timeout=lead + window + (240 if ctx.full else 120))
    completed = _wait_delivered(ctx, like, n)
    drained = completed == n
    if not drained:
        ctx.results["notes"].append(
            f"timers: {completed}/{n} deliveries completed within the wait; the rest "
            "were marked completed by the bench and their tasks purged"
        )
    stats = ctx.db.q1(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY lag), max(lag), avg(lag),"
        " count(*) FILTER (WHERE lag < 0),"
        " percentile_cont(0.5) WITHIN GROUP (ORDER BY done),"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY done), max(done)"
        " FROM (SELECT extract(epoch FROM fired_at - available_at) AS lag,"
        "              extract(epoch FROM completed_at - available_at) AS done"
        "       FROM outbox_outboxmessage WHERE " + WHERE + ") t",
        [like],
    )
    p50, p99, mx, avg, early, d50, d99, dmax = (float(x) if x is not None else None for x in stats)
    # Every timer fired (_wait_fired): the fire lags are there.
    assert p50 is not None and p99 is not None and mx is not None and early is not None
    (redelivered,) = ctx.db.q1(
        f"SELECT count(*) FROM outbox_outboxmessage WHERE {WHERE} AND deliveries > 1", [like]
    )
    if not drained:
        ctx.db.q(
            f"UPDATE outbox_outboxmessage SET completed_at = now(), due_at = NULL"
            f" WHERE {WHERE} AND completed_at IS NULL",
            [like],
        )
        ctx.broker.purge()
    poll_s = ctx.results["config"]["relay_poll_seconds"]
    ctx.results["figures"][FIGURE.key] = {
        "timers": n,
        "window_s": window,
        "lead_s": lead,
        "relay_poll_seconds": poll_s,
        "fire_lag_s": {"p50": p50, "p99": p99, "max": mx, "mean": avg},
        "early_fires": int(early),
        "delivered_lag_s": {
            "p50": d50,
            "p99": d99,
            "max": dmax,
            "of_completed_within_wait": completed,
        },
        "all_delivered": drained,
        "handed_over_more_than_once": redelivered,
    }
    log(
        f"   timers: fire lag p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max "
        f"{mx * 1000:.0f} ms, early {int(early)}"
    )
    ctx.rows += rows(n, poll_s, p50, p99, mx, int(early), redelivered)


def fixtures(db: BenchDB, scale: int, *, lead: float = 5.0, window: float = 20.0) -> str:
    """Figure 4's database fixture: ``scale`` timers due evenly from +``lead``
    to +``lead``+``window`` seconds; their keys' LIKE pattern."""
    tag = uuid.uuid4().hex[:8]
    db.noop_rows(scale, key_prefix=f"bench-timer:{tag}:", lead_s=lead, window_s=window)
    return f"bench-timer:{tag}:%"


def _count(ctx: Context, column: str, like: str) -> int:
    return ctx.db.q1(f"SELECT count({column}) FROM outbox_outboxmessage WHERE {WHERE}", [like])[0]


def _wait_fired(ctx: Context, like: str, n: int, timeout: float) -> None:
    def all_fired() -> bool:
        if _count(ctx, "fired_at", like) == n:
            return True
        ctx.stack.check_alive()
        return False

    def progress() -> None:
        log(
            f"   timers: {_count(ctx, 'fired_at', like)}/{n} fired, "
            f"{_count(ctx, 'completed_at', like)} completed"
        )

    if not poll(all_fired, timeout=timeout, every=0.5, progress=progress):
        raise PhaseFailed(f"timers: only {_count(ctx, 'fired_at', like)}/{n} fired in time")


def _wait_delivered(ctx: Context, like: str, n: int) -> int:
    """How many deliveries completed within a bounded wait. They trail behind
    (each is a Celery task); the bench finishes its own leftovers by hand
    (run) so that they are not handed over again (OUTBOX_REDELIVER_SECONDS)
    mid-figure."""
    poll(
        lambda: _count(ctx, "completed_at", like) == n,
        timeout=300 if ctx.full else 30,
        every=0.5,
        progress=lambda: log(
            f"   timers: {_count(ctx, 'completed_at', like)}/{n} deliveries completed"
        ),
    )
    return _count(ctx, "completed_at", like)


def rows(
    n: int, poll_s: float, p50: float, p99: float, mx: float, early: int, redelivered: int
) -> list[dict]:
    return [
        {
            "figure": f"4 timers fire lag p50 ({n})",
            "measured": f"{p50 * 1000:.0f} ms",
            "baseline": f"{poll_s * 1000:.0f} ms poll",
            "ratio": ratio(p50, poll_s),
        },
        {
            "figure": "4 timers fire lag p99",
            "measured": f"{p99 * 1000:.0f} ms",
            "baseline": f"{poll_s * 1000:.0f} ms poll",
            "ratio": ratio(p99, poll_s),
        },
        {
            "figure": "4 timers fire lag max",
            "measured": f"{mx * 1000:.0f} ms",
            "baseline": f"{poll_s * 1000:.0f} ms poll",
            "ratio": ratio(mx, poll_s),
        },
        {
            "figure": "4 timers early fires",
            "measured": str(early),
            "baseline": "0",
            "ratio": "ok" if early == 0 else "FAIL",
        },
        {
            "figure": "4 timers handed to Celery more than once",
            "measured": str(redelivered),
            "baseline": "0",
            "ratio": ratio(redelivered, n),
        },
    ]
