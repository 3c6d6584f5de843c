"""Figure 8: the catalog cache (issue 13). ``GET /api/events/{id}/seats/`` of a
2,000-seat event at 4 and 16 clients, served from the cache against the same
view reading the database (``AVAILABILITY_CACHE=off``), a ``304`` against a
cached ``200``; and what the invalidation costs a purchase: reserve
throughput with the on-commit bump against without it.

The bench's stack caches on Redis (the bench's own database, ``--redis-db``:
bench/prepare.py); for this figure gunicorn is restarted once with the cache
on and once off, then as it was. The worker's consumer is paused while purchases are
measured, as in figure 1: the reserve is the request path alone.
"""

from __future__ import annotations

import threading
import time

import httpx

from bench.common import Context, Figure, PhaseFailed, lat_summary, log, ratio
from bench.db import BenchDB
from bench.load import closed_loop

FIGURE = Figure(
    phase="catalog",
    key="8_catalog",
    label="8 catalog cache",
    timeout=lambda ctx: 300 + 9 * (ctx.warmup + ctx.dur + 10),
)
SEATS = 2000
CLIENTS = (4, 16)  # the reserve pairs in run() are written out for these


def fixtures(db: BenchDB, scale: int = SEATS, name: str = "bench catalog") -> int:
    """Figure 8's database fixture: an event of ``scale`` seats (the one read,
    and one per reserve measurement, sized from the duration)."""
    return db.make_event(name, scale)[0]


def run(ctx: Context) -> None:
    fig: dict = {"seats": SEATS}
    ctx.results["figures"][FIGURE.key] = fig
    event = fixtures(ctx.db, SEATS)
    path = f"/api/events/{event}/seats/"
    try:
        _restart_web(ctx, AVAILABILITY_CACHE="on")
        for c in CLIENTS:
            fig[f"cached_c{c}"] = _gets(ctx, path, c, label=f"seats cached c={c}")
        etag = httpx.get(ctx.stack.base_url + path, trust_env=False, timeout=30).headers["ETag"]
        fig["not_modified_c16"] = _gets(
            ctx, path, 16, label="seats 304 c=16", headers={"If-None-Match": etag}, expect=304
        )
        # Each pair back to back, in the order on, off, off, on: the
        # machine's drift over the run weighs on both sides alike.
        fig["reserve_invalidating_c4"] = _reserve(ctx, 4, "invalidating")
        _restart_web(ctx, AVAILABILITY_CACHE="off")
        fig["reserve_not_invalidating_c4"] = _reserve(ctx, 4, "not invalidating")
        fig["reserve_not_invalidating_c16"] = _reserve(ctx, 16, "not invalidating")
        _restart_web(ctx, AVAILABILITY_CACHE="on")
        fig["reserve_invalidating_c16"] = _reserve(ctx, 16, "invalidating")
        _restart_web(ctx, AVAILABILITY_CACHE="off")
        for c in CLIENTS:
            fig[f"database_c{c}"] = _gets(ctx, path, c, label=f"seats database c={c}")
    finally:
        _restart_web(ctx)
        _forget_cache(ctx)
    ctx.rows += rows(fig)


def _restart_web(ctx: Context, **env: str) -> None:
    """gunicorn with the stack's environment, and with Redis as its cache and
    ``env`` when given (no argument: as the stack started it)."""
    stack = ctx.stack
    stack.stop("web")
    started_with = stack.base_env
    if env:
        cache_url = started_with["CELERY_BROKER_URL"].replace("redis://", "rediscache://", 1)
        stack.base_env = {**started_with, "CACHE_URL": cache_url, **env}
    try:
        log(f"   restarting gunicorn with {env or 'the stack environment'}")
        stack.start_web()
    finally:
        stack.base_env = started_with
    stack.wait_web()


def _forget_cache(ctx: Context) -> None:
    """The catalog's keys in the bench's Redis database (versions do not expire)."""
    keys = list(ctx.broker.redis.scan_iter(match="*:availability:*", count=1000))
    if keys:
        ctx.broker.redis.delete(*keys)


def _gets(
    ctx: Context,
    path: str,
    clients: int,
    *,
    label: str,
    headers: dict | None = None,
    expect: int = 200,
) -> dict:
    """``clients`` closed-loop anonymous clients, each its own keep-alive
    connection, GETting ``path`` for the warm-up and the measured window."""
    stop = threading.Event()
    barrier = threading.Barrier(clients + 1, timeout=60)
    records: list[list[tuple]] = [[] for _ in range(clients)]  # (answered, secs, status)
    errors: list[str] = []

    def loop(k: int) -> None:
        try:
            with httpx.Client(
                base_url=ctx.stack.base_url,
                headers=headers or {},
                timeout=httpx.Timeout(60.0),
                trust_env=False,
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            ) as client:
                barrier.wait()
                while not stop.is_set():
                    started = time.perf_counter()
                    answer = client.get(path)
                    records[k].append(
                        (
                            time.monotonic(),
                            time.perf_counter() - started,
                            answer.status_code,
                            len(answer.content),
                        )
                    )
        except threading.BrokenBarrierError:
            pass
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(f"client {k}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(clients)]
    for th in threads:
        th.start()
    log(f"   {label}: {ctx.warmup:.0f}+{ctx.dur:.0f}s")
    barrier.wait()
    start = time.monotonic()
    time.sleep(ctx.warmup + ctx.dur)
    stop.set()
    for th in threads:
        th.join(60)
    ctx.stack.check_alive()
    w0, w1 = start + ctx.warmup, start + ctx.warmup + ctx.dur
    window = [r for rs in records for r in rs if w0 <= r[0] <= w1]
    ok = [r[1] for r in window if r[2] == expect]
    if errors or len(ok) != len(window) or not ok:
        raise PhaseFailed(
            f"{label}: {len(window) - len(ok)} of {len(window)} answers were not "
            f"{expect}: {errors[:3]}"
        )
    out = {
        "clients": clients,
        "requests": len(window),
        "throughput_per_s": len(ok) / ctx.dur,
        "latency": lat_summary(ok),
        "body_bytes": window[-1][3],
    }
    log(
        f"   {label}: {out['throughput_per_s']:.1f} req/s, p50 {out['latency']['p50_ms']:.1f} "
        f"ms, p99 {out['latency']['p99_ms']:.1f} ms, {out['body_bytes']} bytes"
    )
    return out


def _reserve(ctx: Context, clients: int, how: str) -> dict:
    nseats = int(1000 * (ctx.warmup + ctx.dur)) + 1000
    event = fixtures(ctx.db, nseats, f"bench catalog reserve {how} c{clients}")
    paused = ctx.broker.pause_consumer()
    try:
        ctx.broker.purge()
        m = closed_loop(
            ctx.stack,
            ctx.users,
            label=f"reserve {how} c={clients}",
            clients=clients,
            warmup=ctx.warmup,
            duration=ctx.dur,
            event_id=event,
            nseats=nseats,
        )
    finally:
        ctx.broker.purge()
        if paused:
            ctx.broker.resume_consumer()
    log(
        f"   reserve {how} c={clients}: {m['throughput_per_s']:.1f} req/s, "
        f"p50 {m['latency_202']['p50_ms']:.1f} ms, p99 {m['latency_202']['p99_ms']:.1f} ms"
    )
    return m


def rows(fig: dict) -> list[dict]:
    out = []
    for c in CLIENTS:
        cached, database = fig[f"cached_c{c}"], fig[f"database_c{c}"]
        out += [
            {
                "figure": f"8 seats of {SEATS:,} c={c} throughput, cached vs database",
                "measured": f"{cached['throughput_per_s']:.1f} req/s",
                "baseline": f"{database['throughput_per_s']:.1f} req/s",
                "ratio": ratio(cached["throughput_per_s"], database["throughput_per_s"]),
            },
            {
                "figure": f"8 seats of {SEATS:,} c={c} p50 / p99, cached vs database",
                "measured": f"{cached['latency']['p50_ms']:.1f} / {cached['latency']['p99_ms']:.1f}"
                " ms",
                "baseline": f"{database['latency']['p50_ms']:.1f} / "
                f"{database['latency']['p99_ms']:.1f} ms",
                "ratio": ratio(cached["latency"]["p50_ms"], database["latency"]["p50_ms"]),
            },
        ]
    not_modified, cached = fig["not_modified_c16"], fig["cached_c16"]
    out.append(
        {
            "figure": "8 seats c=16 throughput, 304 vs cached 200",
            "measured": f"{not_modified['throughput_per_s']:.1f} req/s",
            "baseline": f"{cached['throughput_per_s']:.1f} req/s",
            "ratio": ratio(not_modified["throughput_per_s"], cached["throughput_per_s"]),
        }
    )
    for c in CLIENTS:
        on, off = fig[f"reserve_invalidating_c{c}"], fig[f"reserve_not_invalidating_c{c}"]
        out.append(
            {
                "figure": f"8 reserve c={c} throughput, invalidating vs not",
                "measured": f"{on['throughput_per_s']:.1f} req/s "
                f"(p99 {on['latency_202']['p99_ms']:.0f} ms)",
                "baseline": f"{off['throughput_per_s']:.1f} req/s "
                f"(p99 {off['latency_202']['p99_ms']:.0f} ms)",
                "ratio": ratio(on["throughput_per_s"], off["throughput_per_s"]),
            }
        )
    return out
