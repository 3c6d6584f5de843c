"""Figure 7: the Celery transport on the bench's worker pool, a no-op task
and a one-small-transaction task (bench/tasks.py); and the table's last row,
figure 2's confirmed purchases per second against the small-transaction rate."""

from __future__ import annotations

import time

from bench.common import COUNTER_ROWS, Context, Figure, PhaseFailed, log, ratio
from bench.db import BenchDB

FIGURE = Figure(
    phase="celery",
    key="7_celery",
    label="7 celery task rates",
    timeout=lambda ctx: 240 if not ctx.full else 900,
)


def _task_rate(ctx: Context, name: str, count: int, *, args_fn, done_fn) -> dict:
    """Fill the queue while the consumer is cancelled, add it back, time the drain."""
    broker = ctx.broker
    if not broker.wait_drained(60, "an empty queue"):
        raise PhaseFailed("the queue did not drain before the task-rate run")
    paused = broker.pause_consumer()
    log(f"   {name}: enqueueing {count} (consumer paused: {paused})")
    t_enq = time.monotonic()
    broker.send(name, count, args_fn)
    enqueue_s = time.monotonic() - t_enq
    t0 = time.monotonic()
    if paused:
        broker.resume_consumer()
    broker.wait_drained(None, f"{name} tasks", also=done_fn, every=0.01)
    secs = time.monotonic() - (t0 if paused else t_enq)
    return {
        "tasks": count,
        "seconds": secs,
        "per_s": count / secs,
        "enqueue_seconds": enqueue_s,
        "prefilled_queue": paused,
    }


def fixtures(db: BenchDB, scale: int = COUNTER_ROWS) -> None:
    """Figure 7's database fixtures, the tables of bench/tasks.py (the bench's
    own, no migration makes them), made afresh: ``scale`` counters at 0
    (the task takes counter n % COUNTER_ROWS + 1: the default is the
    minimum) and an empty log."""
    db.q("DROP TABLE IF EXISTS bench_counter, bench_log")
    db.q("CREATE TABLE bench_counter (id int PRIMARY KEY, n bigint NOT NULL)")
    db.q("INSERT INTO bench_counter SELECT g, 0 FROM generate_series(1, %s) g", [scale])
    db.q(
        "CREATE TABLE bench_log (id bigserial PRIMARY KEY, counter_id int, "
        "task_no int, at timestamptz NOT NULL DEFAULT now())"
    )


def run(ctx: Context) -> None:
    n_noop = 20000 if ctx.full else 3000
    n_txn = 10000 if ctx.full else 2000
    fixtures(ctx.db)
    noop = _task_rate(ctx, "bench.noop", n_noop, args_fn=lambda i: [], done_fn=lambda: True)
    log(f"   no-op: {noop['per_s']:.0f} tasks/s")
    txn = _task_rate(
        ctx,
        "bench.small_txn",
        n_txn,
        args_fn=lambda i: [i],
        done_fn=lambda: ctx.db.q1("SELECT count(*) FROM bench_log")[0] >= n_txn,
    )
    log(f"   small transaction: {txn['per_s']:.0f} tasks/s")
    ctx.results["figures"][FIGURE.key] = {"noop": noop, "small_txn": txn}
    ctx.rows.append(
        {
            "figure": "7 celery small-txn task rate",
            "measured": f"{txn['per_s']:.0f} tasks/s",
            "baseline": f"{noop['per_s']:.0f} no-op tasks/s",
            "ratio": ratio(txn["per_s"], noop["per_s"]),
        }
    )


def combined_rows(figures: dict) -> list[dict]:
    """Figure 2 against figure 7, when both ran: what one purchase costs
    beyond one small-transaction task."""
    e2e, celery = figures.get("2_e2e"), figures.get(FIGURE.key)
    if not (e2e and celery):
        return []
    return [
        {
            "figure": "2/7 e2e confirmed/s vs small-txn task/s",
            "measured": f"{e2e['confirmed_per_s']:.1f} /s",
            "baseline": f"{celery['small_txn']['per_s']:.0f} tasks/s",
            "ratio": ratio(e2e["confirmed_per_s"], celery["small_txn"]["per_s"]),
        }
    ]
