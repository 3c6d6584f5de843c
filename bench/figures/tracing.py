"""Figure 12: what tracing costs when nothing asks for it. The reserve at
c=4 (figure 1's request path alone: the worker paused) served by the
product's web with no ``OTEL_*`` variable set, against the same web built
without tracing (bench/wsgi_without_tracing.py: ``config.tracing`` replaced by
bare functions, the SDK never imported), in the order of ``ORDER``, so that
a drift of the machine falls on both."""

from __future__ import annotations

from typing import Any

from bench.common import WITHOUT_TRACING_MARK as MARK
from bench.common import Context, Figure, PhaseFailed, log, mean_of, ratio
from bench.db import BenchDB
from bench.figures import reserve

FIGURE = Figure(
    phase="tracing",
    key="12_tracing",
    label="12 tracing off vs without",
    timeout=lambda ctx: 120 + 6 * (ctx.warmup + ctx.dur + 150),
)

CLIENTS = 4
# Each side three times, so that neither is always first or last.
ORDER = ("off", "without", "without", "off", "off", "without")
PRODUCT = "config.wsgi:application"
WITHOUT = "bench.wsgi_without_tracing:application"


def run(ctx: Context) -> None:
    asked = [k for k in ctx.stack.base_env if k.startswith("OTEL_")]
    if asked:
        raise PhaseFailed(f"tracing: the stack's environment sets {asked}: 'off' would not be off")
    fig: dict[str, Any] = {"clients": CLIENTS, "off": [], "without": []}
    ctx.results["figures"][FIGURE.key] = fig
    try:
        for how in ORDER:
            _serve(ctx, WITHOUT if how == "without" else PRODUCT)
            # What the figure before left running (a drain) is not this run's.
            if not ctx.broker.quiesce(ctx.db, 120):
                ctx.results["notes"].append(f"tracing {how}: the stack was not quiet first")
            log(f"   tracing {how}: reserve c={CLIENTS}")
            fig[how].append(reserve.reserve_alone(ctx, CLIENTS))
    finally:
        _serve(ctx, PRODUCT)
    fig["helpers"] = _helpers_in_process(ctx)
    ctx.rows += rows(fig)


def fixtures(db: BenchDB, scale: int = 50) -> int:
    """Figure 12's own database fixture: the event of ``scale`` seats whose
    reserves go through Django in this process (``_helpers_in_process``).
    Each side's reserve is figure 1's measurement, on figure 1's fixture
    (``reserve.reserve_alone``)."""
    return db.make_event("bench tracing helpers", scale)[0]


def _helpers_in_process(ctx: Context, requests: int = 50) -> dict:
    """What tracing off does in a reserve, exactly: ``requests`` reserves
    through Django in this process (set up by run.py, nothing set for
    tracing) with every public function of config.tracing counted, then each
    timed alone (its off path); the cost per request is their sum."""
    import functools
    import timeit

    from django.db import connection
    from django.test import Client

    from config import tracing

    assert not tracing.enabled(), "tracing is on in the bench process"
    names = [
        n
        for n, f in vars(tracing).items()
        if callable(f)
        and not n.startswith("_")
        and getattr(f, "__module__", "") == tracing.__name__
    ]
    calls: dict[str, list] = {n: [] for n in names}
    real = {n: getattr(tracing, n) for n in names}

    def counting(name):
        def wrapper(*args, **kwargs):
            calls[name].append((args, kwargs))
            return real[name](*args, **kwargs)

        return wrapper

    event_id = fixtures(ctx.db, requests)
    client, user = Client(), ctx.users[-1]
    for name in names:
        setattr(tracing, name, counting(name))
    try:
        for i in range(requests):
            r = reserve.post_in_process(
                client, user=user, event_id=event_id, seat=f"S{i + 1}", key=f"bench-tracing-{i}"
            )
            if r.status_code != 202:
                raise PhaseFailed(f"tracing helpers: the reserve answered {r.status_code}")
    finally:
        for name in names:
            setattr(tracing, name, real[name])
        connection.close()
    per_call_ns = {}
    for name, made in calls.items():
        if made:
            args, kwargs = made[0]
            n, seconds = timeit.Timer(functools.partial(real[name], *args, **kwargs)).autorange()
            per_call_ns[name] = seconds / n * 1e9
    per_request = {n: len(made) / requests for n, made in calls.items() if made}
    ns = sum(per_request[n] * per_call_ns[n] for n in per_request)
    log(f"   tracing helpers per reserve, off: {per_request}, {ns / 1000:.2f} us")
    return {"calls_per_request": per_request, "ns_per_call": per_call_ns, "ns_per_request": ns}


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


def _each(runs: list[dict]) -> str:
    return ", ".join(f"{r['throughput_per_s']:.1f}" for r in runs)


def rows(fig: dict) -> list[dict]:
    off, without = fig["off"], fig["without"]

    def rate(runs):
        return mean_of(runs, lambda r: r["throughput_per_s"])

    def p99(runs):
        return mean_of(runs, lambda r: r["latency_202"]["p99_ms"])

    def web_cpu(runs):
        return mean_of(runs, lambda r: (r.get("cpu_ms_per_202") or {}).get("web") or 0.0)

    c, h = fig["clients"], fig["helpers"]
    return [
        {
            "figure": f"12 reserve c={c} throughput, tracing off (no OTEL_*) vs built without",
            "measured": f"{rate(off):.1f} req/s ({_each(off)})",
            "baseline": f"{rate(without):.1f} req/s ({_each(without)})",
            "ratio": ratio(rate(off), rate(without)),
        },
        {
            "figure": "12 tracing's helpers per reserve when off, timed in-process",
            "measured": f"{sum(h['calls_per_request'].values()):.0f} calls, "
            f"{h['ns_per_request'] / 1000:.2f} µs",
            "baseline": f"{web_cpu(off):.2f} ms web CPU per request",
            "ratio": ratio(h["ns_per_request"] / 1e6, web_cpu(off)),
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
