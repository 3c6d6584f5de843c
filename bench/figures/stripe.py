"""Figure 14: the charge path's CPU per purchase with the Stripe adapter
(payments/stripe/, the official ``stripe`` library) against the fake
gateway's HTTP adapter (payments/gateway.py), in the same run (issue 33,
"Measured"; docs/performance.md, "Stripe's SDK on the charge path").

Each run is figure 2's end-to-end measurement (the same purchases at the
same 8 clients, first request to the last ``CONFIRMED``, and the drain) on
the product's processes (web, worker, webhooks worker, relay) restarted in
the side's mode, after an unmeasured warm-up on the fresh processes. The
Stripe side charges at a localstripe started by the figure for that run
(its own process, on a free port, its store empty): a PaymentIntent created,
its id committed, then confirmed, two calls where the fake side makes one.
The sides alternate (``ORDER``), so that the machine's drift weighs on both.

Measured over each run's window, by process (bench/cpu.py, as figure 2):
the worker's CPU per confirmed purchase (the table's first row), the web's
(the same requests on both sides: about 1), PostgreSQL's on the product's
database, the product's total, and apart, never as ours, the processor's
(localstripe, or the fake gateway and its database); the charge step's
latency (``CHARGING`` to ``CONFIRMED`` in the saga's history) and the
gateway calls' (``purchases_gatewayanswer``). The figure fails if a
purchase does not confirm, or was charged by another processor than its
side's (Stripe's: one succeeded PaymentIntent per purchase at localstripe).
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.common import BENCH_DB, Context, Figure, PhaseFailed, log, mean_of, ratio
from bench.cpu import WindowCPU, per_purchase
from bench.db import BenchDB
from bench.figures import e2e, gateway_latency, webhooks
from devtools.processes import ProcessGroup, free_port

# Each side twice, neither always first or last.
ORDER = ("fake", "stripe", "stripe", "fake")
FIGURE = Figure(
    phase="stripe",
    key="14_stripe",
    label="14 charge CPU Stripe SDK vs fake HTTP",
    timeout=lambda ctx: 300 + len(ORDER) * (240 + e2e.purchases(ctx) / 4),
)
# The processes whose behaviour PAYMENT_GATEWAY decides (the web writes the
# saga's processor, the workers call it), restarted for each run.
PRODUCT = ("relay", "webhooks", "refunds", "worker", "web")
# Purchases on the fresh processes before each window: their first
# connections, caches and the Stripe client's first request are not the
# steady state.
WARMUP_PURCHASES = 40
# localstripe takes any key of the right shape; these are nobody's.
SECRET_KEY = "sk_test_boxofficebench"
STRIPE_ENV = {
    "PAYMENT_GATEWAY": "stripe",
    "STRIPE_SECRET_KEY": SECRET_KEY,
    "STRIPE_PUBLISHABLE_KEY": "pk_test_boxofficebench",
    "STRIPE_WEBHOOK_SECRET": "whsec_boxofficebench",
}
# Per-purchase CPU keys (bench/cpu.py's, and the processor's root) summed.
OURS = ("web", "worker", "webhooks", "refunds", "relay", "pg_product", "redis")
PROCESSOR = ("localstripe", "gateway", "pg_gateway")


def fixtures(db: BenchDB, scale: int, name: str = "bench stripe") -> int:
    """Figure 14's database fixture, one per run and one per warm-up:
    figure 2's, an event of ``scale`` seats, one per purchase."""
    return e2e.fixtures(db, scale, name)


class Localstripe:
    """The Stripe side's processor: ``.venv/bin/localstripe --from-scratch``
    on a free port, its own process group, logging to ``localstripe.log``
    beside the stack's logs. Never imported: it is GPL-3.0 and a test tool."""

    NAME = "localstripe"

    def __init__(self, logdir: Path) -> None:
        self.group = ProcessGroup(logdir, dict(os.environ), error=PhaseFailed)
        self.url: str | None = None

    @property
    def pid(self) -> int | None:
        proc = self.group.procs.get(self.NAME)
        return proc.pid if proc is not None else None

    def start(self) -> str:
        binary = Path(sys.executable).with_name("localstripe")
        if not binary.exists():
            raise PhaseFailed(f"stripe: no {binary} (a dev dependency: make install)")
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.group.start(
            self.NAME,
            [str(binary), "--from-scratch", "--port", str(port)],
            header=f"\n===== start localstripe on {self.url}\n",
        )
        self.group.wait_for(self._answers, f"localstripe on {self.url}", timeout=60, every=0.2)
        return self.url

    def stop(self) -> None:
        self.group.stop(self.NAME)
        self.url = None

    def _answers(self) -> bool:
        try:
            r = httpx.get(
                f"{self.url}/v1/balance", auth=(SECRET_KEY, ""), timeout=1, trust_env=False
            )
        except httpx.TransportError:
            return False
        return r.is_success

    def payment_intents(self) -> dict[str, int]:
        """Every PaymentIntent it holds, counted by status."""
        statuses: Counter[str] = Counter()
        params = {"limit": "100"}
        with httpx.Client(base_url=self.url or "", auth=(SECRET_KEY, ""), timeout=30) as http:
            while True:
                page = http.get("/v1/payment_intents", params=params)
                page.raise_for_status()
                data = page.json()
                statuses.update(pi["status"] for pi in data["data"])
                if not data["has_more"] or not data["data"]:
                    return dict(statuses)
                params["starting_after"] = data["data"][-1]["id"]


def run(ctx: Context) -> None:
    total = e2e.purchases(ctx)
    runs: dict[str, list[dict]] = {"fake": [], "stripe": []}
    fig: dict[str, Any] = {
        "purchases_per_run": total,
        "warmup_purchases": WARMUP_PURCHASES,
        "clients": e2e.CLIENTS,
        "order": ORDER,
        "runs": runs,
    }
    ctx.results["figures"][FIGURE.key] = fig
    if ctx.stack.latency_ms != 0:
        gateway_latency.restart_with(ctx, 0)  # figure 3 leaves the gateway at 300 ms
    processor = Localstripe(ctx.logdir)
    try:
        for how in ORDER:
            runs[how].append(_one_run(ctx, how, total, processor))
    finally:
        processor.stop()
        _serve(ctx, None)
    ctx.rows += rows(fig)


def _one_run(ctx: Context, how: str, total: int, processor: Localstripe) -> dict:
    """One side's run on freshly started processes (and, for Stripe, a
    fresh localstripe): the warm-up, then the measured purchases."""
    processor.stop()
    api_base = processor.start() if how == "stripe" else None
    _serve(ctx, how, api_base)
    warm = fixtures(ctx.db, WARMUP_PURCHASES, f"bench stripe {how} warm-up")
    e2e.measure(ctx, warm, WARMUP_PURCHASES, f"{how} warm-up")
    if not webhooks._quiet(ctx, 120):
        ctx.results["notes"].append(f"stripe ({how}): the stack was not quiet before the run")
    ev = fixtures(ctx.db, total, f"bench stripe {how}")
    window = _cpu_window(ctx, processor.pid)
    window.start()
    try:
        m = e2e.measure(ctx, ev, total, f"charge {how}")
    finally:
        cpu = window.stop()
    per = per_purchase(cpu, total)
    m.update(
        {
            "mode": how,
            "cpu_window": cpu,
            "cpu_ms_per_purchase": per,
            "cpu": summary(per),
            "charge_step": _charge_step(ctx, ev),
            "gateway_calls": _gateway_calls(ctx, ev),
        }
    )
    m["checks"] = _check(ctx, ev, total, how, processor)
    s = m["cpu"]
    log(
        f"   charge {how}: worker {s['worker']:.2f} ms, web {s['web']:.2f} ms, "
        f"postgres {s['pg_product']:.2f} ms per purchase; processor {s['processor']:.2f} ms "
        f"(not ours); charge step p50 {m['charge_step']['p50_ms']:.1f} ms"
    )
    return m


def _mode_env(how: str | None, api_base: str | None) -> dict[str, str] | None:
    if how is None:
        return None  # as the stack starts them
    if how == "fake":
        # Said, not assumed: the bench's own environment could name Stripe.
        return {"PAYMENT_GATEWAY": "fake"}
    assert api_base is not None  # localstripe started first
    return {
        **STRIPE_ENV,
        "STRIPE_API_BASE": api_base,
        "STRIPE_JS_URL": f"{api_base}/js.stripe.com/v3/",
    }


def _serve(ctx: Context, how: str | None, api_base: str | None = None) -> None:
    """The product's processes (``PRODUCT``) restarted in mode ``how``; None:
    restarted as the stack starts them. The fake gateway is left running."""
    stack = ctx.stack
    env = _mode_env(how, api_base)
    log(
        f"   restarting web, worker, webhooks and refunds workers and relay:"
        f" {how or 'as the stack runs'}"
    )
    for name in PRODUCT:
        stack.stop(name)
    stack.extra_env = (lambda name: env if name in PRODUCT else {}) if env else None
    stack.variant = how and f"charge-{how}"
    stack.start_web()
    stack.start_worker()
    stack.start_webhook_worker()
    stack.start_refund_worker()
    stack.start_relay()
    stack.wait_web()
    stack.wait_worker(ctx.broker.app)
    stack.wait_relay()


def _cpu_window(ctx: Context, processor_pid: int | None) -> WindowCPU:
    """Figure 2's window (e2e.cpu_window), with localstripe as a root of its
    own: a child of this process, it would otherwise count as the load
    generator."""
    roots = {n: p.pid for n, p in ctx.stack.procs.items()}
    if processor_pid is not None:
        roots[Localstripe.NAME] = processor_pid
    return WindowCPU(
        roots=roots,
        pg=ctx.pg,
        redis_pid=e2e._redis_pid(ctx),
        excluded=ctx.profiler.pids() if ctx.profiler else [],
    )


def summary(per: dict) -> dict[str, float]:
    """ms per purchase: the keys the table shows, ours and the processor's."""

    def ms(key: str) -> float:
        return per.get(key) or 0.0

    return {
        "worker": ms("worker"),
        "web": ms("web"),
        "pg_product": ms("pg_product"),
        "ours": round(sum(ms(k) for k in OURS), 2),
        "processor": round(sum(ms(k) for k in PROCESSOR), 2),
        "localstripe": ms("localstripe"),
        "fake_gateway": round(ms("gateway") + ms("pg_gateway"), 2),
    }


def _charge_step(ctx: Context, ev: int) -> dict:
    """The charge step per saga of the event: its move into ``CHARGING`` to
    its move into ``CONFIRMED`` (the create and its commit included)."""
    n, p50, p99 = ctx.db.q1(
        "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) FROM ("
        " SELECT extract(epoch FROM max(at) FILTER (WHERE to_state = 'CONFIRMED')"
        "  - min(at) FILTER (WHERE to_state = 'CHARGING')) * 1000 AS ms"
        " FROM purchases_sagahistory WHERE event_id = %s GROUP BY saga_id) x",
        [ev],
    )
    return {"sagas": n, "p50_ms": p50, "p99_ms": p99}


def _gateway_calls(ctx: Context, ev: int) -> dict:
    """The gateway's calls of the event's sagas, as the saga recorded them:
    count and latency by what was asked."""
    found = ctx.db.q(
        "SELECT asked, count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms),"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY latency_ms)"
        " FROM purchases_gatewayanswer WHERE event_id = %s GROUP BY asked ORDER BY asked",
        [ev],
    )
    return {asked: {"n": n, "p50_ms": p50, "p99_ms": p99} for asked, n, p50, p99 in found}


def _check(ctx: Context, ev: int, total: int, how: str, processor: Localstripe) -> dict:
    """Every purchase of the run confirmed, by its side's processor: the
    sagas' ``processor`` (and Stripe's ``pi_`` ids), and for Stripe one
    succeeded PaymentIntent per purchase of the run and its warm-up, none
    in another state. The figure fails otherwise: a run that charged
    elsewhere measured the wrong thing."""
    found = ctx.db.q(
        "SELECT processor, count(*), count(*) FILTER (WHERE left(processor_ref, 3) = 'pi_')"
        " FROM purchases_purchasesaga WHERE event_id = %s AND state = 'CONFIRMED'"
        " GROUP BY processor",
        [ev],
    )
    sagas = {p: {"confirmed": n, "with_pi": pi} for p, n, pi in found}
    out: dict[str, Any] = {"confirmed_by_processor": sagas}
    problems = []
    if sagas.get(how, {}).get("confirmed") != total or len(sagas) != 1:
        problems.append(f"{total} purchases, CONFIRMED by processor: {sagas}")
    if how == "stripe":
        if sagas.get("stripe", {}).get("with_pi") != total:
            problems.append(f"sagas without a PaymentIntent id: {sagas}")
        out["localstripe_payment_intents"] = intents = processor.payment_intents()
        if intents != {"succeeded": total + WARMUP_PURCHASES}:
            problems.append(
                f"localstripe holds {intents}, want {total + WARMUP_PURCHASES} succeeded"
            )
    if problems:
        raise PhaseFailed(f"stripe ({how}): " + "; ".join(problems))
    return out


# --- the table ---------------------------------------------------------------------------


def _each(runs: list[dict], key: str) -> str:
    return ", ".join(f"{r['cpu'][key]:.2f}" for r in runs)


def _calls_per_purchase(runs: list[dict]) -> float:
    return mean_of(
        runs, lambda r: sum(c["n"] for c in r["gateway_calls"].values()) / r["purchases"]
    )


def _calls(runs: list[dict]) -> str:
    """Calls per purchase, and each kind's p50 (the mean of the runs')."""
    asked = sorted({a for r in runs for a in r["gateway_calls"]})
    p50 = ", ".join(
        f"{a} {mean_of(runs, lambda r, a=a: r['gateway_calls'][a]['p50_ms']):.1f} ms" for a in asked
    )
    return f"{_calls_per_purchase(runs):.2f} (p50: {p50})"


def rows(fig: dict) -> list[dict]:
    stripe, fake = fig["runs"]["stripe"], fig["runs"]["fake"]
    if not (stripe and fake):
        return []

    def cpu(runs: list[dict], key: str) -> float:
        return mean_of(runs, lambda r: r["cpu"][key])

    def step(runs: list[dict], p: str) -> float:
        return mean_of(runs, lambda r: r["charge_step"][f"{p}_ms"])

    def rate(runs: list[dict]) -> float:
        return mean_of(runs, lambda r: r["confirmed_per_s"])

    shown = (
        ("worker", "worker (celery + pool)"),
        ("web", "web (same requests: about 1)"),
        ("pg_product", f"postgres {BENCH_DB}"),
        ("ours", "the product's (web, workers, relay, its postgres, redis)"),
    )
    out: list[dict[str, Any]] = [
        {
            "figure": f"14 CPU per purchase, Stripe SDK vs fake HTTP adapter: {label}",
            "measured": f"{cpu(stripe, key):.2f} ms ({_each(stripe, key)})",
            "baseline": f"{cpu(fake, key):.2f} ms ({_each(fake, key)})",
            "ratio": ratio(cpu(stripe, key), cpu(fake, key)),
        }
        for key, label in shown
    ]
    out += [
        {
            "figure": "14 the processor's CPU per purchase, not ours: localstripe vs fake gateway",
            "measured": f"{cpu(stripe, 'processor'):.2f} ms",
            "baseline": f"{cpu(fake, 'processor'):.2f} ms (with its postgres)",
            "ratio": ratio(cpu(stripe, "processor"), cpu(fake, "processor")),
        },
        {
            "figure": "14 gateway calls per purchase, as the saga recorded them: Stripe vs fake",
            "measured": _calls(stripe),
            "baseline": _calls(fake),
            "ratio": ratio(_calls_per_purchase(stripe), _calls_per_purchase(fake)),
        },
        {
            "figure": "14 charge step CHARGING -> CONFIRMED p50, localstripe vs fake gateway",
            "measured": f"{step(stripe, 'p50'):.1f} ms",
            "baseline": f"{step(fake, 'p50'):.1f} ms",
            "ratio": ratio(step(stripe, "p50"), step(fake, "p50")),
            "note": f"p99 {step(stripe, 'p99'):.0f} vs {step(fake, 'p99'):.0f} ms",
        },
        {
            "figure": f"14 e2e confirmed/s (c={fig['clients']}), localstripe vs fake gateway",
            "measured": f"{rate(stripe):.1f} /s",
            "baseline": f"{rate(fake):.1f} /s",
            "ratio": ratio(rate(stripe), rate(fake)),
        },
    ]
    return out
