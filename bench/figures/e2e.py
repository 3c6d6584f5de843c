"""Figure 2: end to end, confirmed purchases per second at 8 clients against
pgbench -N and against the reserve alone at the same 8 clients in the same
run; the request phase and the drain after it; the committed transactions
per purchase, quiesced, against pgbench's per reserve transaction (figure
1); the CPU per confirmed purchase by process over the end-to-end window;
and, from a second, shorter run with the statement counter
(bench/sqlcount), the statements, commits and round trips per purchase by
step."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from bench import sqlcount
from bench.common import (
    BENCH_DB,
    PGBENCH_DB,
    STATS_FLUSH_SECONDS,
    Context,
    Figure,
    PhaseFailed,
    log,
    ratio,
)
from bench.cpu import LABELS, NOT_COUNTED, WindowCPU, per_purchase
from bench.db import BenchDB
from bench.figures import reserve
from bench.load import http_client, post_purchase
from devtools.processes import poll

CLIENTS = 8
# The count run: at most this many purchases (per-step averages settle long
# before).
COUNT_RUN_PURCHASES = 300


def fixtures(db: BenchDB, scale: int, name: str = "bench e2e") -> int:
    """Figure 2's database fixture, one per run: an event of ``scale`` seats
    S1..S<scale>, one per purchase (figures 9 and 11 take theirs here too)."""
    return db.make_event(name, scale)[0]


def purchases(ctx: Context) -> int:
    """Purchases per end-to-end run (figures 2, 9 and 11)."""
    return ctx.args.e2e_purchases or (2000 if ctx.full else 300)


def _timeout(ctx: Context) -> float:
    reserve_alone = ctx.warmup + ctx.dur + 60
    count_run = 180 + 2 * STATS_FLUSH_SECONDS + min(purchases(ctx), COUNT_RUN_PURCHASES) / 2
    return (420 if not ctx.full else 1200) + purchases(ctx) / 5 + reserve_alone + count_run


FIGURE = Figure(phase="e2e", key="2_e2e", label="2 end to end", timeout=_timeout)


def run(ctx: Context) -> None:
    total = purchases(ctx)
    fig: dict = {"purchases": total, "clients": CLIENTS}
    ctx.results["figures"][FIGURE.key] = fig
    log(f"   reserve alone at c={CLIENTS} (the worker paused), figure 2's baseline")
    fig["reserve_alone"] = reserve.reserve_alone(ctx, CLIENTS)

    ev = fixtures(ctx.db, total)
    log("   quiescing, then measuring the background rate of transactions")
    if not ctx.broker.quiesce(ctx.db, 120):
        ctx.results["notes"].append("e2e: the stack was not quiet before the run")
    time.sleep(STATS_FLUSH_SECONDS)
    s_a = ctx.db.stats()
    time.sleep(8)
    s_b = ctx.db.stats()
    noise_rate = (s_b["xact_commit"] - s_a["xact_commit"]) / (s_b["t"] - s_a["t"])
    own_b = ctx.db.autocommits

    window = cpu_window(ctx)
    window.start()
    try:
        m = measure(ctx, ev, total, "e2e")
    finally:
        cpu = window.stop()
    fig.update(m)
    fig["cpu_window"] = cpu
    fig["cpu_ms_per_purchase"] = per_purchase(cpu, total)
    fig["beat"] = "not run: the bench starts no celery beat (the sweeps it schedules are off)"

    quiet = ctx.broker.quiesce(ctx.db, 180)
    (emails_left,) = ctx.db.q1(
        "SELECT count(*) FROM outbox_outboxmessage WHERE event_id = %s"
        " AND completed_at IS NULL AND cancelled_at IS NULL",
        [ev],
    )
    time.sleep(STATS_FLUSH_SECONDS)
    s_c = ctx.db.stats()
    commits = s_c["xact_commit"] - s_b["xact_commit"]
    noise = noise_rate * (s_c["t"] - s_b["t"])
    # The bench's own polling (every saga CONFIRMED? the outbox drained?)
    # commits on the same database; not the product's.
    own = ctx.db.autocommits - own_b
    per_purchase_txn = (commits - noise - own) / total
    log(
        f"   e2e: {per_purchase_txn:.1f} committed transactions per purchase "
        f"(raw {commits}, background {noise:.0f}, the bench's own {own})"
    )

    log(f"   pgbench -N (built-in simple-update) at {CLIENTS} clients, {ctx.dur:.0f}s")
    pgb = ctx.pgbench.run(
        args=[
            "-N",
            "-M",
            ctx.pgbench.mode,
            "-c",
            str(CLIENTS),
            "-j",
            str(CLIENTS),
            "-T",
            str(int(ctx.dur)),
        ],
        db=PGBENCH_DB,
        timeout=ctx.dur + 120,
        tag="simple-update",
    )
    reserve_txn = (
        ctx.results["figures"]
        .get("1_reserve", {})
        .get("levels", {})
        .get("4", {})
        .get("pgbench", {})
        .get("xact_commit_per_txn")
    )
    fig.update(
        {
            "quiesced": quiet,
            "outbox_rows_left": emails_left,
            "xact_commit_delta": commits,
            "background_xact_per_s": noise_rate,
            "background_xact": noise,
            "bench_own_xact": own,
            "transactions_per_purchase": per_purchase_txn,
            "rows_written_per_purchase": _rows_written(s_b, s_c, total),
            "pgbench_simple_update": pgb,
            "reserve_transactions_per_request_pgbench": reserve_txn,
        }
    )
    fig["sql"] = _count_run(ctx, min(total, COUNT_RUN_PURCHASES))
    ctx.rows += rows(fig)


# --- one end-to-end run ------------------------------------------------------------------


def measure(ctx: Context, ev: int, total: int, label: str) -> dict:
    """``total`` purchases of event ``ev`` at ``CLIENTS`` clients: the
    confirmed rate (first request to the last saga ``CONFIRMED``), the
    request phase (first request to the last answer) and the drain after
    it (until every saga is terminal and none of the event's outbox rows
    is due and unsettled: the last of those moves, as the database
    stamped it)."""
    log(f"   {label}: {total} purchases at {CLIENTS} clients")
    t_first = time.time()
    statuses, errors = _purchase(ctx, ev, total)
    t_sent = time.time()
    if statuses.get(202, 0) != total:
        raise PhaseFailed(f"{label}: statuses {statuses}: {errors}")
    seconds = float(_wait_confirmed(ctx, ev, total)) - t_first
    drained_at = _wait_drained(ctx, ev, label)
    request_s = t_sent - t_first
    drain_s = max(0.0, drained_at - t_sent)
    log(
        f"   {label}: {total} confirmed in {seconds:.1f}s = {total / seconds:.1f}/s "
        f"(requests took {request_s:.1f}s, the drain after them {drain_s:.1f}s)"
    )
    return {
        "event": ev,
        "purchases": total,
        "seconds": seconds,
        "confirmed_per_s": total / seconds,
        "statuses": statuses,
        "request_phase_seconds": request_s,
        "drain_seconds": drain_s,
        "drain_over_request_phase": ratio(drain_s, request_s),
    }


def _purchase(ctx: Context, ev: int, total: int) -> tuple[dict[int, int], list[str]]:
    """``total`` purchases of seats S1..S<total> from ``CLIENTS`` threads."""
    counter = itertools.count(1)
    statuses: dict[int, int] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def client_loop(k: int) -> None:
        with http_client(ctx.stack.base_url, ctx.users[k]) as client:
            while (n := next(counter)) <= total:
                status, _, head = post_purchase(client, event_id=ev, ref=f"S{n}")
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1
                    if status != 202 and len(errors) < 5:
                        errors.append(f"{status} {head}")

    threads = [threading.Thread(target=client_loop, args=(k,), daemon=True) for k in range(CLIENTS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return statuses, errors


def _wait_confirmed(ctx: Context, ev: int, total: int):
    """Poll until every saga of the event is CONFIRMED; the last one's epoch."""
    seen = {"confirmed": 0, "last_at": None}

    def all_confirmed() -> bool:
        seen["confirmed"], other_final, seen["last_at"] = ctx.db.q1(
            "SELECT count(*) FILTER (WHERE state = 'CONFIRMED'),"
            " count(*) FILTER (WHERE state NOT IN ('CONFIRMED', 'PENDING', 'CHARGING')),"
            " extract(epoch FROM max(updated_at) FILTER (WHERE state = 'CONFIRMED'))"
            " FROM purchases_purchasesaga WHERE event_id = %s",
            [ev],
        )
        if seen["confirmed"] == total:
            return True
        if other_final:
            raise PhaseFailed(f"e2e: {other_final} sagas ended elsewhere than CONFIRMED")
        ctx.stack.check_alive()
        return False

    if not poll(
        all_confirmed,
        timeout=600 if ctx.full else 240,
        every=0.2,
        progress=lambda: log(f"   e2e: {seen['confirmed']}/{total} confirmed"),
    ):
        raise PhaseFailed(f"e2e: only {seen['confirmed']}/{total} confirmed in time")
    return seen["last_at"]


def _wait_drained(ctx: Context, ev: int, label: str) -> float:
    """Poll until no saga of the event is non-terminal and none of its
    outbox rows is due and unsettled; the epoch of the last of those
    moves (a saga's, a row completed or cancelled)."""
    left = {"sagas": 0, "rows": 0}

    def drained() -> bool:
        left["sagas"], left["rows"] = ctx.db.q1(
            "SELECT (SELECT count(*) FROM purchases_purchasesaga WHERE event_id = %s"
            "        AND state NOT IN ('CONFIRMED', 'COMPENSATED')),"
            " (SELECT count(*) FROM outbox_outboxmessage WHERE event_id = %s"
            "  AND completed_at IS NULL AND cancelled_at IS NULL AND dead_at IS NULL"
            "  AND available_at <= now())",
            [ev, ev],
        )
        return left["sagas"] == 0 and left["rows"] == 0

    if not poll(
        drained,
        timeout=600 if ctx.full else 240,
        every=0.2,
        progress=lambda: log(
            f"   {label}: draining, {left['sagas']} sagas and {left['rows']} outbox rows owed"
        ),
    ):
        raise PhaseFailed(f"{label}: not drained in time: {left}")
    (at,) = ctx.db.q1(
        "SELECT extract(epoch FROM greatest("
        " (SELECT max(updated_at) FROM purchases_purchasesaga WHERE event_id = %s),"
        " (SELECT max(greatest(completed_at, cancelled_at)) FROM outbox_outboxmessage"
        "  WHERE event_id = %s)))",
        [ev, ev],
    )
    return float(at)


def _sets_time_zone(ctx: Context) -> bool:
    """Whether Django sends SET TIME ZONE on each new connection (the
    server's default differs from the connection's time zone)."""
    from django.db import connection  # Django is set up by run.py, from the stack's env

    (server,) = ctx.db.q1("SELECT current_setting('TimeZone')")
    return server != connection.timezone_name


def cpu_window(ctx: Context) -> WindowCPU:
    """CPU by process over the stack as it runs now (figures 2 and 9)."""
    return WindowCPU(
        roots={n: p.pid for n, p in ctx.stack.procs.items()},
        pg=ctx.pg,
        redis_pid=_redis_pid(ctx),
        excluded=ctx.profiler.pids() if ctx.profiler else [],
    )


def _redis_pid(ctx: Context) -> int | None:
    try:
        return int(ctx.broker.redis.info("server")["process_id"])
    except Exception:  # noqa: BLE001 - a Redis we cannot ask is one we cannot measure
        return None


def _rows_written(s_b: dict, s_c: dict, total: int) -> dict:
    out = {}
    for table, after in s_c["tables"].items():
        before = s_b["tables"].get(table, {"ins": 0, "upd": 0, "hot_upd": 0, "del": 0})
        d = {k: after[k] - before[k] for k in after}
        if any(d.values()):
            out[table] = {k: round(v / total, 2) for k, v in d.items() if v}
    return out


# --- the count run -----------------------------------------------------------------------


def _count_run(ctx: Context, n: int) -> dict:
    """``n`` purchases on a stack restarted with the statement counter
    (bench/sqlcount), then the stack restarted as it was: the counter's cost
    stays out of the CPU measured above. Per step and per purchase, minus
    what the same processes did per second idle just before. And the check
    of the counter: the product's commits it counted against
    ``pg_stat_database``'s over the same run (both raw, the bench's own
    polling taken out of the latter)."""
    directory = ctx.logdir / "sqlcount"
    directory.mkdir(exist_ok=True)
    app = ctx.broker.app
    log(f"   statements per step: {n} purchases on a stack with the counter (bench/sqlcount)")
    ctx.stack.stop()
    ctx.stack.extra_env = lambda name: sqlcount.env(directory, name)
    ctx.stack.variant = "sqlcount"
    try:
        ctx.stack.start_all(app)
        ev = fixtures(ctx.db, n, "bench e2e statements")
        if not ctx.broker.quiesce(ctx.db, 120):
            ctx.results["notes"].append("e2e count run: the stack was not quiet before the run")
        time.sleep(1.5)  # the start-up's statements flushed
        before, t0 = sqlcount.read(directory), time.monotonic()
        # Idle: what the stack does with no load; and PostgreSQL's statistics flushed.
        time.sleep(STATS_FLUSH_SECONDS)
        idle, t1 = sqlcount.read(directory), time.monotonic()
        s1, own1 = ctx.db.stats(), ctx.db.autocommits
        m = measure(ctx, ev, n, "e2e count run")
        quiet = ctx.broker.quiesce(ctx.db, 120)
        time.sleep(STATS_FLUSH_SECONDS)
        s2, own2 = ctx.db.stats(), ctx.db.autocommits
    finally:
        t2 = time.monotonic()
        ctx.stack.stop()
        ctx.stack.extra_env = ctx.stack.variant = None
        log("   restarting the stack without the counter")
        ctx.stack.start_all(app)
    after = sqlcount.read(directory)  # the processes wrote their last counts at exit
    raw = sqlcount.minus(after, idle)
    background = sqlcount.minus(idle, before)
    counted = sqlcount.minus(raw, background, scale=(t2 - t1) / (t1 - t0))
    steps = {
        step: {k: round(v / n, 3) for k, v in sqlcount.summary(c).items()}
        for step, c in sorted(counted.items())
        if any(round(v / n, 2) for v in c.values())
    }
    product = [s for s in steps if not s.startswith("gateway")]
    total = {
        k: round(sum(steps[s][k] for s in product), 3)
        for k in ("statements", "commits", "round_trips")
    }
    product_raw = [c for step, c in raw.items() if not step.startswith("gateway")]
    connects = sum(c["connects"] for c in product_raw)
    check = {
        # A new connection commits once as its session starts (PostgreSQL
        # reads its catalogs in a transaction), and once more for Django's
        # SET TIME ZONE when the server's differs.
        "counted_commits": sum(sqlcount.summary(c)["commits"] for c in product_raw)
        + connects * (2 if _sets_time_zone(ctx) else 1),
        "connects": connects,
        "pg_stat_database_commits": s2["xact_commit"] - s1["xact_commit"] - (own2 - own1),
        "bench_own_commits": own2 - own1,
    }
    log(
        f"   counter check: {check['counted_commits']:.0f} commits counted, "
        f"{check['pg_stat_database_commits']} in pg_stat_database"
    )
    return {
        "purchases": n,
        "run": m,
        "quiesced": quiet,
        "directory": str(directory),
        "idle_seconds": t1 - t0,
        "window_seconds": t2 - t1,
        "raw": raw,
        "idle": background,
        "per_purchase": steps,
        "product_total": total,
        "counter_check": check,
    }


# --- the table ---------------------------------------------------------------------------


def rows(fig: dict) -> list[dict]:
    rate, pgb = fig["confirmed_per_s"], fig["pgbench_simple_update"]
    alone = fig["reserve_alone"]
    reserve_txn = fig["reserve_transactions_per_request_pgbench"]
    per_purchase_txn = fig["transactions_per_purchase"]
    out = [
        {
            "figure": f"2 e2e confirmed purchases/s (c={CLIENTS})",
            "measured": f"{rate:.1f} /s",
            "baseline": f"{pgb['tps']:.0f} tps pgbench -N",
            "ratio": ratio(rate, pgb["tps"]),
        },
        {
            "figure": f"2 e2e confirmed/s vs reserve alone (c={CLIENTS})",
            "note": "goal >= 0.5",
            "measured": f"{rate:.1f} /s",
            "baseline": f"{alone['throughput_per_s']:.1f} req/s reserve alone",
            "ratio": ratio(rate, alone["throughput_per_s"]),
        },
        {
            "figure": "2 e2e drain after the last request vs the request phase",
            "note": "goal <= 1",
            "measured": f"{fig['drain_seconds']:.1f} s",
            "baseline": f"{fig['request_phase_seconds']:.1f} s requests",
            "ratio": fig["drain_over_request_phase"],
        },
        {
            "figure": "2 e2e transactions per purchase",
            "measured": f"{per_purchase_txn:.1f}",
            "baseline": (f"{reserve_txn:.1f} per reserve (pgbench)" if reserve_txn else "n/a"),
            "ratio": ratio(per_purchase_txn, reserve_txn),
        },
    ]
    return out + cpu_rows(fig) + sql_rows(fig)


def cpu_rows(fig: dict) -> list[dict]:
    """ms of CPU per confirmed purchase by process: each as a share of the
    total; the total against the whole machine's per reserve alone."""
    cpu = fig["cpu_ms_per_purchase"]
    total = cpu["total"]
    alone = (fig["reserve_alone"].get("cpu_ms_per_202") or {}).get("machine_all_processes")
    out: list[dict[str, Any]] = []
    for key, label in LABELS.items():
        v = cpu.get(key)
        if key == "beat":
            out.append(
                {
                    "figure": "2 e2e CPU per purchase: beat",
                    "measured": "not run",
                    "baseline": "the bench starts no beat",
                    "ratio": None,
                }
            )
        elif v is not None:
            out.append(
                {
                    "figure": f"2 e2e CPU per purchase: {label}",
                    "measured": f"{v:.2f} ms",
                    "baseline": f"of {total:.1f} ms total",
                    "ratio": ratio(v, total),
                }
            )
    out.append(
        {
            "figure": "2 e2e CPU per purchase: total of the above",
            "measured": f"{total:.1f} ms",
            "baseline": (f"{alone:.1f} ms machine per reserve alone" if alone else "n/a"),
            "ratio": ratio(total, alone),
        }
    )
    left_out = ", ".join(f"{k} {cpu[k]:.1f} ms" for k in NOT_COUNTED if cpu.get(k))
    out.append(
        {
            "figure": "2 e2e CPU per purchase: whole machine (others' work too)",
            "measured": f"{cpu['machine_all_processes']:.1f} ms",
            "baseline": f"not counted: {left_out or 'none'}",
            "ratio": ratio(total, cpu["machine_all_processes"]),
        }
    )
    return out


def sql_rows(fig: dict) -> list[dict]:
    """Statements, commits and round trips per purchase by step (count run);
    the product's total commits against pg_stat_database's of the measured
    run."""
    sql = fig["sql"]
    out: list[dict[str, Any]] = []
    for step, s in sql["per_purchase"].items():
        where = " (gateway's database)" if step.startswith("gateway") else ""
        out.append(
            {
                "figure": f"2 e2e SQL per purchase: {step}{where}",
                "measured": f"{s['statements']:.2f} stmts, {s['commits']:.2f} commits",
                "baseline": f"{s['round_trips']:.2f} round trips",
                "ratio": None,
            }
        )
    t, check = sql["product_total"], sql["counter_check"]
    out += [
        {
            "figure": f"2 e2e SQL per purchase: total on {BENCH_DB}",
            "measured": f"{t['statements']:.1f} stmts, {t['commits']:.1f} commits",
            "baseline": f"{fig['transactions_per_purchase']:.1f} commits (pg, measured run)",
            "ratio": ratio(t["commits"], fig["transactions_per_purchase"]),
            "note": f"{t['round_trips']:.1f} round trips",
        },
        {
            "figure": "2 e2e SQL counter check: commits counted vs pg_stat_database (count run)",
            "measured": f"{check['counted_commits']:.0f}",
            "baseline": f"{check['pg_stat_database_commits']}",
            "ratio": ratio(check["counted_commits"], check["pg_stat_database_commits"]),
        },
    ]
    return out
