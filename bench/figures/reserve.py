"""Figure 1: the reserve (``POST /api/purchases/``) at 1, 4 and 16 clients
against pgbench running the same SQL (bench/reserve.sql) at the same
concurrency; and the check, at setup, that the script is still the
product's transaction."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH_DB,
    HOLD_SECONDS,
    RESERVE_SQL,
    Context,
    Figure,
    PhaseFailed,
    log,
    ratio,
)
from bench.db import BenchDB, token
from bench.load import closed_loop

FIGURE = Figure(
    phase="reserve",
    key="1_reserve",
    label="1 reserve vs pgbench",
    timeout=lambda ctx: 60 + 3 * (2 * ctx.dur + 60),
)


def fixtures(db: BenchDB, scale: int, name: str = "bench reserve") -> tuple[int, int]:
    """Figure 1's database fixture, one per measurement (run sizes it from
    the duration): an event of ``scale`` seats S1..S<scale>, inserted in one
    statement so that their ids are contiguous (bench/reserve.sql takes seat
    ``idoff`` + n); (event id, idoff)."""
    return db.make_event(name, scale)


# --- the script against the product ----------------------------------------------------


def shape(sql: str) -> str:
    s = re.sub(r"\\gset.*$", "", sql.strip()).rstrip(";").strip()
    verb = s.split()[0].upper()
    m = re.search(r'\b(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', s, re.IGNORECASE)
    if verb in ("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT", "ROLLBACK") or not m:
        return verb
    return f"{verb} {m.group(1)}"


def script_statements() -> list[str]:
    return [
        ln
        for ln in RESERVE_SQL.read_text().splitlines()
        if ln.strip() and not ln.startswith(("--", "\\"))
    ]


def post_in_process(client, *, user: int, event_id: int, seat: str, key: str):
    """One reserve through Django in this process (``client``: Django's test
    Client; Django is set up by run.py)."""
    body = {"event": event_id, "seats": [seat], "payment_method": "pm_card_visa"}
    return client.post(
        "/api/purchases/",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_HOST="127.0.0.1",
        HTTP_AUTHORIZATION=f"Token {token(user)}",
        HTTP_IDEMPOTENCY_KEY=key,
    )


def check_script(db: BenchDB, users: list[int], logdir: Path, results: dict) -> None:
    """Send one real request through Django in-process and record every
    statement it sends, to check bench/reserve.sql against the product."""
    # Django is set up by run.py (setup) from the environment it builds, after this is imported.
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    event_id, _ = fixtures(db, 2, "bench capture")
    client = Client()
    # Once first, as the load's requests find things: the token cached and
    # the connection just used (no health check). What is captured is the
    # second request, the steady state pgbench's script stands for.
    post_in_process(client, user=users[-1], event_id=event_id, seat="S2", key="bench-warm")
    with CaptureQueriesContext(connection) as ctx:
        r = post_in_process(
            client, user=users[-1], event_id=event_id, seat="S1", key="bench-capture"
        )
    if r.status_code != 202:
        raise PhaseFailed(f"capture request answered {r.status_code}: {r.content[:300]!r}")
    captured = [q["sql"] for q in ctx.captured_queries]
    connection.close()
    (logdir / "reserve-captured.sql").write_text(";\n".join(captured) + ";\n")
    got = [shape(s) for s in captured]
    want = [shape(s) for s in script_statements()]
    same = got == want
    results["reserve_sql"] = {
        "captured_statements": captured,
        "captured_shapes": got,
        "script_shapes": want,
        "script_matches_product": same,
        "round_trips": len(got),
        "transactions": 1 + sum(1 for s in got[: got.index("BEGIN")]),
    }
    if same:
        log(f"   reserve.sql matches the product's reserve: {len(got)} statements")
    else:
        msg = (
            "bench/reserve.sql no longer matches the product's reserve transaction: "
            f"product {got} vs script {want}"
        )
        log("!! " + msg)
        results["notes"].append(msg)


# --- the figure ------------------------------------------------------------------------


def run(ctx: Context) -> None:
    levels = [int(x) for x in ctx.args.reserve_clients.split(",")]
    paused = ctx.broker.pause_consumer()
    # Charges queue up instead of competing for the two cores: this figure
    # is the request path alone, as pgbench is the SQL alone.
    log(f"   worker consumer paused: {paused}")
    fig: dict[str, Any] = {"levels": {}, "worker_paused": paused}
    ctx.results["figures"][FIGURE.key] = fig
    prev_tps, prev_n = None, 1
    try:
        for n in levels:
            http = _http(ctx, n)
            ctx.broker.purge()
            # Every pgbench transaction takes a fresh seat: size the event
            # from the previous level's rate (pgbench -T cannot stop at N).
            est = (prev_tps * n / prev_n if prev_tps else 1500) * ctx.dur * 1.5
            pgb = _pgbench(ctx, n, seats=int(min(max(est, 20000), 2_000_000)))
            prev_tps, prev_n = pgb["tps"], n
            fig["levels"][str(n)] = {"http": http, "pgbench": pgb}
            ctx.rows += rows(n, http, pgb)
    finally:
        ctx.broker.purge()
        log(f"   worker consumer resumed: {ctx.broker.resume_consumer()}")


def reserve_alone(ctx: Context, n: int) -> dict:
    """The request path alone at ``n`` clients, as this figure measures it
    (the worker's consumer paused, the queued charges purged after), without
    pgbench: figure 2's baseline at its own concurrency."""
    paused = ctx.broker.pause_consumer()
    try:
        ctx.broker.purge()
        http = _http(ctx, n)
    finally:
        ctx.broker.purge()
        resumed = ctx.broker.resume_consumer()
    log(f"   worker consumer paused: {paused}, resumed: {resumed}")
    return {**http, "worker_paused": paused}


def _http(ctx: Context, n: int) -> dict:
    http_seats = int(1000 * (ctx.warmup + ctx.dur)) + 1000
    ev, _ = fixtures(ctx.db, http_seats, f"bench reserve c{n}")
    log(f"   reserve c={n}: HTTP for {ctx.warmup:.0f}+{ctx.dur:.0f}s")
    http = closed_loop(
        ctx.stack,
        ctx.users,
        label=f"reserve c={n}",
        clients=n,
        warmup=ctx.warmup,
        duration=ctx.dur,
        event_id=ev,
        nseats=http_seats,
    )
    log(
        f"   reserve c={n}: {http['throughput_per_s']:.1f} req/s, "
        f"p50 {http['latency_202']['p50_ms']:.1f} ms, "
        f"p99 {http['latency_202']['p99_ms']:.1f} ms"
    )
    return http


def _pgbench(ctx: Context, n: int, seats: int) -> dict:
    ev2, idoff = fixtures(ctx.db, seats, f"bench pgbench c{n}")
    before = ctx.db.stats()
    log(f"   reserve c={n}: pgbench -M {ctx.pgbench.mode} for {ctx.dur:.0f}s")
    pgb = ctx.pgbench.run(
        args=[
            "-M",
            ctx.pgbench.mode,
            "-c",
            str(n),
            "-j",
            str(n),
            "-T",
            str(int(ctx.dur)),
            "-f",
            str(RESERVE_SQL),
            "-r",
            "-D",
            f"ev={ev2}",
            "-D",
            f"idoff={idoff}",
            "-D",
            "nbase=0",
            "-D",
            f"nclients={n}",
            "-D",
            f"ubase={ctx.users[0]}",
            "-D",
            f"run={n}",
            "-D",
            f"hold={HOLD_SECONDS}",
            "-D",
            "i=0",
        ],
        db=BENCH_DB,
        timeout=ctx.dur + 120,
        tag=f"reserve-c{n}",
    )
    time.sleep(1.5)  # exiting backends flush their statistics
    after = ctx.db.stats()
    (held,) = ctx.db.q1(
        "SELECT count(*) FROM purchases_seat WHERE event_id = %s AND status = 'held'", [ev2]
    )
    if held != pgb["transactions"]:
        raise PhaseFailed(
            f"pgbench c={n}: {held} seats held for {pgb['transactions']} transactions"
        )
    pgb["xact_commit_per_txn"] = ratio(
        after["xact_commit"] - before["xact_commit"], pgb["transactions"]
    )
    log(
        f"   pgbench c={n}: {pgb['tps']:.1f} tps, p50 {pgb['latency']['p50_ms']:.1f}"
        f" ms, p99 {pgb['latency']['p99_ms']:.1f} ms"
    )
    return pgb


def rows(n: int, h: dict, p: dict) -> list[dict]:
    out = [
        {
            "figure": f"1 reserve c={n} throughput",
            "measured": f"{h['throughput_per_s']:.1f} req/s",
            "baseline": f"{p['tps']:.1f} tps pgbench",
            "ratio": ratio(h["throughput_per_s"], p["tps"]),
        },
        {
            "figure": f"1 reserve c={n} p50",
            "measured": f"{h['latency_202']['p50_ms']:.1f} ms",
            "baseline": f"{p['latency']['p50_ms']:.1f} ms",
            "ratio": ratio(h["latency_202"]["p50_ms"], p["latency"]["p50_ms"]),
        },
        {
            "figure": f"1 reserve c={n} p99",
            "measured": f"{h['latency_202']['p99_ms']:.1f} ms",
            "baseline": f"{p['latency']['p99_ms']:.1f} ms",
            "ratio": ratio(h["latency_202"]["p99_ms"], p["latency"]["p99_ms"]),
        },
    ]
    cpu = h.get("cpu_ms_per_202") or {}
    if cpu and p.get("machine_cpu_ms_per_txn"):
        out.append(
            {
                "figure": f"1 reserve c={n} machine CPU per request",
                "measured": f"{cpu['machine_all_processes']:.1f} ms ({cpu['web']:.1f} web)",
                "baseline": f"{p['machine_cpu_ms_per_txn']:.1f} ms pgbench",
                "ratio": ratio(cpu["machine_all_processes"], p["machine_cpu_ms_per_txn"]),
            }
        )
    return out
