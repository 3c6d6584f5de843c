"""Figure 12: what tracing costs when nothing asks for it. The reserve at
c=4 (figure 1's request path alone: the worker paused) served by the
product's web with no ``OTEL_*`` variable set, against the same web built
without tracing (bench/wsgi_without_tracing.py: ``config.tracing`` replaced by
bare functions, the SDK never imported), in the order off, without, without,
off, so that a drift of the machine falls on both."""

from __future__ import annotations

import statistics
from typing import Any

from bench.common import WITHOUT_TRACING_MARK as MARK
from bench.common import Context, Figure, PhaseFailed, log, ratio
from bench.figures import reserve

FIGURE = Figure(
    phase="tracing",
    key="12_tracing",
    label="12 tracing off vs without",
    timeout=lambda ctx: 120 + 4 * (ctx.warmup + ctx.dur + 90),
)

CLIENTS = 4
PRODUCT = "config.wsgi:application"
WITHOUT = "bench.wsgi_without_tracing:application"


def run(ctx: Context) -> None:
    asked = [k for k in ctx.stack.base_env if k.startswith("OTEL_")]
    if asked:
        raise PhaseFailed(f"tracing: the stack's environment sets {asked}: 'off' would not be off")
    fig: dict[str, Any] = {"clients": CLIENTS, "off": [], "without": []}
    ctx.results["figures"][FIGURE.key] = fig
    try:
        for how in ("off", "without", "without", "off"):
            _serve(ctx, WITHOUT if how == "without" else PRODUCT)
            log(f"   tracing {how}: reserve c={CLIENTS}")
            fig[how].append(reserve.reserve_alone(ctx, CLIENTS))
    finally:
        _serve(ctx, PRODUCT)
    ctx.rows += rows(fig)


def _serve(ctx: Context, app: str) -> None:
    stack = ctx.stack
    if stack.wsgi == app and "web" in stack.procs:
        return
    web_log = stack.logdir / "web.log"
    marks_before = _marks(web_log)
    stack.stop("web")
    stack.wsgi = app
    log(f"   restarting gunicorn with {app}")
    stack.start_web()
    stack.wait_web()
    served = _marks(web_log) - marks_before
    if app == WITHOUT and served < 1:
        raise PhaseFailed(f"tracing: gunicorn did not load {app} (no '{MARK}' in {web_log})")


def _marks(path) -> int:
    return path.read_text(errors="replace").count(MARK) if path.exists() else 0


def _mean(runs: list[dict], get) -> float:
    return statistics.fmean(get(r) for r in runs)


def _each(runs: list[dict]) -> str:
    return ", ".join(f"{r['throughput_per_s']:.1f}" for r in runs)


def rows(fig: dict) -> list[dict]:
    off, without = fig["off"], fig["without"]

    def rate(runs):
        return _mean(runs, lambda r: r["throughput_per_s"])

    def p99(runs):
        return _mean(runs, lambda r: r["latency_202"]["p99_ms"])

    def web_cpu(runs):
        return _mean(runs, lambda r: (r.get("cpu_ms_per_202") or {}).get("web") or 0.0)

    c = fig["clients"]
    return [
        {
            "figure": f"12 reserve c={c} throughput, tracing off (no OTEL_*) vs built without",
            "measured": f"{rate(off):.1f} req/s ({_each(off)})",
            "baseline": f"{rate(without):.1f} req/s ({_each(without)})",
            "ratio": ratio(rate(off), rate(without)),
        },
        {
            "figure": f"12 reserve c={c} p99, tracing off vs built without",
            "measured": f"{p99(off):.1f} ms",
            "baseline": f"{p99(without):.1f} ms",
            "ratio": ratio(p99(off), p99(without)),
        },
        {
            "figure": f"12 reserve c={c} web CPU per request, tracing off vs built without",
            "measured": f"{web_cpu(off):.2f} ms",
            "baseline": f"{web_cpu(without):.2f} ms",
            "ratio": ratio(web_cpu(off), web_cpu(without)),
        },
    ]
