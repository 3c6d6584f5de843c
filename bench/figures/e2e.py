"""Figure 2: end to end, confirmed purchases per second at 8 clients against
pgbench -N; and the committed transactions per purchase, quiesced, against
pgbench's per reserve transaction (figure 1)."""

from __future__ import annotations

import itertools
import threading
import time

from bench.common import PGBENCH_DB, STATS_FLUSH_SECONDS, Context, Figure, PhaseFailed, log, ratio
from bench.load import http_client, post_purchase
from devtools.processes import poll

FIGURE = Figure(phase="e2e", key="2_e2e", label="2 end to end",
                timeout=lambda ctx: 420 if not ctx.full else 1200)
CLIENTS = 8


def run(ctx: Context) -> None:
    total = 2000 if ctx.full else 300
    ev, _ = ctx.db.make_event("bench e2e", total)
    log("   quiescing, then measuring the background rate of transactions")
    if not ctx.broker.quiesce(ctx.db, 120):
        ctx.results["notes"].append("e2e: the stack was not quiet before the run")
    time.sleep(STATS_FLUSH_SECONDS)
    s_a = ctx.db.stats()
    time.sleep(8)
    s_b = ctx.db.stats()
    noise_rate = (s_b["xact_commit"] - s_a["xact_commit"]) / (s_b["t"] - s_a["t"])

    log(f"   {total} purchases at {CLIENTS} clients")
    t_first = time.time()
    statuses, errors = _purchase(ctx, ev, total)
    t_sent = time.time()
    if statuses.get(202, 0) != total:
        raise PhaseFailed(f"e2e: statuses {statuses}: {errors}")
    seconds = float(_wait_confirmed(ctx, ev, total)) - t_first
    rate = total / seconds
    log(f"   e2e: {total} confirmed in {seconds:.1f}s = {rate:.1f}/s "
        f"(requests took {t_sent - t_first:.1f}s)")
    quiet = ctx.broker.quiesce(ctx.db, 180)
    (emails_left,) = ctx.db.q1(
        "SELECT count(*) FROM outbox_outboxmessage WHERE event_id = %s"
        " AND completed_at IS NULL AND cancelled_at IS NULL", [ev])
    time.sleep(STATS_FLUSH_SECONDS)
    s_c = ctx.db.stats()
    commits = s_c["xact_commit"] - s_b["xact_commit"]
    noise = noise_rate * (s_c["t"] - s_b["t"])
    per_purchase = (commits - noise) / total
    log(f"   e2e: {per_purchase:.1f} committed transactions per purchase "
        f"(raw {commits}, background {noise:.0f})")

    log(f"   pgbench -N (built-in simple-update) at {CLIENTS} clients, {ctx.dur:.0f}s")
    pgb = ctx.pgbench.run(args=["-N", "-M", ctx.pgbench.mode, "-c", str(CLIENTS),
                                "-j", str(CLIENTS), "-T", str(int(ctx.dur))],
                          db=PGBENCH_DB, timeout=ctx.dur + 120, tag="simple-update")
    reserve_txn = (ctx.results["figures"].get("1_reserve", {}).get("levels", {})
                   .get("4", {}).get("pgbench", {}).get("xact_commit_per_txn"))
    ctx.results["figures"][FIGURE.key] = {
        "purchases": total, "clients": CLIENTS, "seconds": seconds,
        "confirmed_per_s": rate, "request_phase_seconds": t_sent - t_first,
        "statuses": statuses, "quiesced": quiet, "outbox_rows_left": emails_left,
        "xact_commit_delta": commits, "background_xact_per_s": noise_rate,
        "background_xact": noise, "transactions_per_purchase": per_purchase,
        "rows_written_per_purchase": _rows_written(s_b, s_c, total),
        "pgbench_simple_update": pgb,
        "reserve_transactions_per_request_pgbench": reserve_txn,
    }
    ctx.rows += rows(rate, per_purchase, pgb, reserve_txn)


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

    threads = [threading.Thread(target=client_loop, args=(k,), daemon=True)
               for k in range(CLIENTS)]
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
            " FROM purchases_purchasesaga WHERE event_id = %s", [ev])
        if seen["confirmed"] == total:
            return True
        if other_final:
            raise PhaseFailed(f"e2e: {other_final} sagas ended elsewhere than CONFIRMED")
        ctx.stack.check_alive()
        return False

    if not poll(all_confirmed, timeout=600 if ctx.full else 240, every=0.2,
                progress=lambda: log(f"   e2e: {seen['confirmed']}/{total} confirmed")):
        raise PhaseFailed(f"e2e: only {seen['confirmed']}/{total} confirmed in time")
    return seen["last_at"]


def _rows_written(s_b: dict, s_c: dict, total: int) -> dict:
    out = {}
    for table, after in s_c["tables"].items():
        before = s_b["tables"].get(table, {"ins": 0, "upd": 0, "hot_upd": 0, "del": 0})
        d = {k: after[k] - before[k] for k in after}
        if any(d.values()):
            out[table] = {k: round(v / total, 2) for k, v in d.items() if v}
    return out


def rows(rate: float, per_purchase: float, pgb: dict, reserve_txn: float | None) -> list[dict]:
    return [
        {"figure": "2 e2e confirmed purchases/s (c=8)",
         "measured": f"{rate:.1f} /s",
         "baseline": f"{pgb['tps']:.0f} tps pgbench -N",
         "ratio": ratio(rate, pgb["tps"])},
        {"figure": "2 e2e transactions per purchase",
         "measured": f"{per_purchase:.1f}",
         "baseline": (f"{reserve_txn:.1f} per reserve (pgbench)" if reserve_txn else "n/a"),
         "ratio": ratio(per_purchase, reserve_txn)},
    ]
