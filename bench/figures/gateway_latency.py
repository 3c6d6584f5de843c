"""Figure 3: the gateway's latency is off the request path; reserve p50 and
p99 with the worker charging at a 300 ms gateway against a 0 ms one."""

from __future__ import annotations

from typing import Any

from bench.common import Context, Figure, log, ratio
from bench.db import BenchDB
from bench.load import closed_loop

FIGURE = Figure(
    phase="gateway",
    key="3_gateway",
    label="3 gateway latency",
    timeout=lambda ctx: 240 + 4 * ctx.dur,
)
LATENCIES_MS = (0, 300)


def fixtures(db: BenchDB, scale: int, name: str = "bench gateway") -> int:
    """Figure 3's database fixture, one per measurement (run sizes it from the
    duration): an event of ``scale`` seats S1..S<scale>."""
    return db.make_event(name, scale)[0]


def restart_gateway(ctx: Context, how: str) -> None:
    """The fake gateway and the worker restarted as the stack now says
    (its ``latency_ms``, its ``gateway_lowered``), the web tier not; the
    worker stopped first."""
    log(f"   restarting the fake gateway and the worker {how}")
    # The worker first: charges sent to a gateway already stopped go unknown,
    # and ten of them open the processor's breaker (purchases/breaker.py),
    # which then refuses every purchase of the measurement (503).
    ctx.stack.stop("worker")
    ctx.stack.stop("gateway")
    ctx.broker.purge()
    ctx.stack.start_gateway()
    ctx.stack.start_worker()
    ctx.stack.wait_web()
    ctx.stack.wait_worker(ctx.broker.app)


def restart_with(ctx: Context, latency: int) -> None:
    """The fake gateway and the worker with FAKE_GATEWAY_LATENCY_MS=latency."""
    ctx.stack.latency_ms = latency
    restart_gateway(ctx, f"with FAKE_GATEWAY_LATENCY_MS={latency}")


def run(ctx: Context) -> None:
    clients_list = [4, 16] if ctx.full else [4]
    fig: dict[str, Any] = {}
    ctx.results["figures"][FIGURE.key] = fig
    for latency in LATENCIES_MS:
        if ctx.stack.latency_ms != latency:
            restart_with(ctx, latency)
        for c in clients_list:
            ctx.broker.purge()
            nseats = int(1000 * (ctx.warmup + ctx.dur)) + 1000
            ev = fixtures(ctx.db, nseats, f"bench gateway {latency} c{c}")
            m = closed_loop(
                ctx.stack,
                ctx.users,
                label=f"gateway {latency}ms c={c}",
                clients=c,
                warmup=ctx.warmup,
                duration=ctx.dur,
                event_id=ev,
                nseats=nseats,
            )
            (confirmed,) = ctx.db.q1(
                "SELECT count(*) FROM purchases_purchasesaga"
                " WHERE event_id = %s AND state = 'CONFIRMED'",
                [ev],
            )
            m["charged_during_run"] = confirmed
            fig[f"{latency}ms_c{c}"] = m
            log(
                f"   gateway {latency} ms c={c}: p50 {m['latency_202']['p50_ms']:.1f} ms, "
                f"p99 {m['latency_202']['p99_ms']:.1f} ms, {confirmed} charged meanwhile"
            )
    ctx.broker.purge()
    for c in clients_list:
        ctx.rows += rows(c, slow=fig[f"300ms_c{c}"], fast=fig[f"0ms_c{c}"])


def rows(c: int, *, slow: dict, fast: dict) -> list[dict]:
    return [
        {
            "figure": f"3 reserve {p} gateway 300ms vs 0 (c={c})",
            "measured": f"{slow['latency_202'][p + '_ms']:.1f} ms",
            "baseline": f"{fast['latency_202'][p + '_ms']:.1f} ms",
            "ratio": ratio(slow["latency_202"][p + "_ms"], fast["latency_202"][p + "_ms"]),
        }
        for p in ("p50", "p99")
    ]
