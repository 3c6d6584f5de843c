#!/usr/bin/env python
"""`make bench`: the real stack under load, each figure beside a baseline
measured in the same run on the same machine.

Runs on PostgreSQL + Redis (``DATABASE_URL`` / ``REDIS_URL`` as exported by
scripts/with-services.sh) but never touches their data: it drops and recreates
its own databases (``boxoffice_bench``, ``boxoffice_bench_sweeps``,
``boxoffice_bench_pgbench``), uses its own Redis database (``--redis-db``) and
its own Celery queue (``boxoffice-bench-<pid>``). It starts gunicorn, a Celery
worker pool and the outbox relay as subprocesses (each in its own process
group, killed at the end, on Ctrl-C and on failure) and drives them over HTTP
on 127.0.0.1 only.

Figures (see bench/README.md for how to read them), one module each in
bench/figures/:

1. reserve: POST /api/purchases/ at 1, 4, 16 clients vs pgbench running the
   same SQL (bench/reserve.sql) at the same concurrency;
2. end to end: confirmed purchases/s vs pgbench -N and vs the reserve alone
   at the same 8 clients; the drain after the requests vs the request phase;
   transactions per purchase; CPU per purchase by process; statements,
   commits and round trips per purchase by step (a second run with
   bench/sqlcount's counter);
3. gateway latency off the request path: reserve p99 at 300 ms vs 0 ms;
4. timers: fire lag of 10,000 armed timers vs the relay's poll interval;
5. hot seat: 200 buyers for 10 seats, sold exactly 10 in every run;
6. sweeps: the resumer, chaser and relay queries at 10k vs 1M finished sagas;
7. Celery: no-op and one-small-transaction task rates on the same pool;
8. catalog: the seats served from the cache vs the database; reserve with
   the cache's invalidation vs without;
9. webhooks: e2e with one endpoint vs none; reserve with a receiver that
   hangs past the timeout vs no endpoint;
10. on-sale: 2,000 buyers for 1,000 seats (quantities and named seats), time
   to sold out, 202/409, double sales (must be 0), vs the reserve rate;
11. scale-out: e2e with 2 relays and 2 worker pools vs 1 + 1, and the checks
   that nothing broke (confirmed once, consumers once, ledger = confirmed);
12. tracing: reserve c=4 with tracing off (no ``OTEL_*``) vs the web built
   without it (bench/wsgi_without_tracing.py).
13. seller: creating a 20,000-seat event through the API vs COPY; its seat map
   cached vs the database; reserve c=4 with a buyer limit and sales window vs
   without.
14. stripe: the charge path's CPU per confirmed purchase (worker, web, its
   PostgreSQL) with the Stripe SDK adapter against localstripe vs the fake
   gateway's HTTP adapter, alternated; the processor's CPU apart.
15. cancellation: an event of 10,000 confirmed purchases cancelled, refunds/s
   at the configured pace vs min(pace, the machine's limit, measured at a
   pace far above it), time to done, double refunds (must be 0), and the
   reserve p99 of another event during the run vs without.
16. door: check-in scans/s at 16 clients vs pgbench running the admitting
   insert (bench/checkin.sql) on distinct tickets, every code admitted
   exactly once; offline verification per code in Python and in Chromium.

``--profile PHASE[,PHASE]`` records the stack's processes with py-spy during
those figures (bench/profile.py): flame graphs in the log directory.

This file is the runner: the arguments, the setup and teardown of the
stack, the phase loop, the JSON and the table.

Progress goes to stderr; the table to stdout; everything measured to
bench/results/<UTC timestamp>.json (and the processes' logs beside it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import ModuleType
from urllib.parse import urlparse

# `python bench/run.py` (make bench) puts bench/ on sys.path, not the
# repository: the bench and devtools packages and the apps are imported from it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench import prepare
from bench.common import (
    BENCH_DB,
    GATEWAY_DB,
    PGBENCH_DB,
    RESULTS,
    SWEEPS_DB,
    Context,
    PhaseTimeout,
    log,
)
from bench.db import PG, BenchDB
from bench.figures import WITH_STACK, WITHOUT_STACK, celery_baseline, reserve
from bench.machine import machine_load
from bench.pgbench import Pgbench, find_pgbench
from bench.profile import SUFFIX, Profiler, find_py_spy
from bench.stack import Broker, Stack
from devtools.processes import ROOT, free_port


class Runner:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.json_path = RESULTS / f"{self.stamp}.json"
        self.logdir = RESULTS / f"{self.stamp}.logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix="boxoffice-bench-"))

        db_url = os.environ.get("DATABASE_URL")
        redis_url = os.environ.get("REDIS_URL") or os.environ.get("CELERY_BROKER_URL")
        if not db_url or not db_url.startswith(("postgres://", "postgresql://")):
            raise SystemExit(
                "make bench: needs DATABASE_URL=postgres://... "
                "(run it through scripts/with-services.sh)"
            )
        if not redis_url or not redis_url.startswith("redis://"):
            raise SystemExit(
                "make bench: needs REDIS_URL=redis://... (run it through scripts/with-services.sh)"
            )
        self.pg = PG(db_url)
        self.broker_url = f"redis://{urlparse(redis_url).netloc}/{args.redis_db}"
        self.queue = f"boxoffice-bench-{os.getpid()}"
        self.hostname = f"bench-{os.getpid()}@bench"
        self.port = free_port()
        self.gateway_port = free_port()
        self.pgbench = Pgbench(binary=find_pgbench(), pg=self.pg, tmp=self.tmp, logdir=self.logdir)

        self.results: dict = {
            "started_at": dt.datetime.now(dt.UTC).isoformat(),
            "args": vars(args),
            "figures": {},
            "failures": [],
            "notes": [],
        }
        self.rows: list[dict] = []
        self.profiler = None
        if args.profile:
            binary = find_py_spy()
            assert binary is not None  # the arguments were refused without py-spy
            self.profiler = Profiler(
                phases=set(args.profile.split(",")),
                logdir=self.logdir,
                binary=binary,
                results=self.results,
                fmt=args.profile_format,
                gil=args.profile_gil,
            )
        self.stack: Stack | None = None
        self.db: BenchDB | None = None
        self.redis: redis.Redis | None = None
        self.broker: Broker | None = None
        self.ctx: Context | None = None
        self._redis_was_empty = False

    # -- phases ---------------------------------------------------------------

    @contextlib.contextmanager
    def phase(self, name: str, timeout: float):
        log(f"== {name} (timeout {timeout:.0f}s)")

        def on_alarm(signum, frame):
            raise PhaseTimeout(f"phase {name!r} did not finish within {timeout:.0f}s")

        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        started = time.monotonic()
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        log(f"   {name}: done in {time.monotonic() - started:.1f}s")

    def figure(self, fig: ModuleType) -> None:
        """Run one figure; a failure is recorded (with the logs' tails) and the
        run goes on with the next figure."""
        self.results.setdefault("load", {})[fig.FIGURE.key] = {"before": machine_load()}
        try:
            with self.phase(fig.FIGURE.label, fig.FIGURE.timeout(self.ctx)):
                if self.stack is not None and self.stack.procs:
                    assert self.broker is not None  # made before the stack
                    self.stack.ensure_running(self.broker.app)
                recording = (
                    self.profiler.recording(fig.FIGURE.phase, self.stack)
                    if self.profiler
                    else contextlib.nullcontext()
                )
                with recording:
                    fig.run(self.ctx)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"
            log(f"!! phase {fig.FIGURE.label!r} FAILED: {detail}")
            traceback.print_exc(file=sys.stderr)
            if self.stack is not None:
                print(self.stack.tails(), file=sys.stderr)
            self.results["failures"].append(
                {"phase": fig.FIGURE.label, "error": detail, "traceback": traceback.format_exc()}
            )
            self.rows.append(
                {
                    "figure": f"{fig.FIGURE.label}: FAILED",
                    "measured": detail[:60],
                    "baseline": "",
                    "ratio": "",
                }
            )
            if self.stack is not None and self.broker is not None:
                with contextlib.suppress(Exception):
                    self.broker.purge()
        finally:
            self.results["load"][fig.FIGURE.key]["after"] = machine_load()

    def run(self) -> int:
        def on_term(signum, frame):
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, on_term)
        # Ctrl-C must tear down even when a shell started us with SIGINT
        # ignored (background jobs of a non-interactive shell).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        wanted = set(self.args.phases.split(",")) if self.args.phases else None

        def want(fig: ModuleType) -> bool:
            return wanted is None or fig.FIGURE.phase in wanted

        interrupted = False
        try:
            with self.phase("setup: databases, fixtures, stack", 240):
                self.setup()
            for fig in WITH_STACK:
                if want(fig):
                    self.figure(fig)
            if self.stack is not None:
                log("stopping the stack")
                self.stack.stop()
            for fig in WITHOUT_STACK:
                if want(fig):
                    self.figure(fig)
        except KeyboardInterrupt:
            interrupted = True
            log("!! interrupted")
            self.results["failures"].append({"phase": "run", "error": "interrupted"})
        except Exception as exc:
            log(f"!! setup FAILED: {type(exc).__name__}: {exc}")
            traceback.print_exc(file=sys.stderr)
            if self.stack is not None:
                print(self.stack.tails(), file=sys.stderr)
            self.results["failures"].append(
                {"phase": "setup", "error": f"{exc}", "traceback": traceback.format_exc()}
            )
        finally:
            self.teardown()
            self.write()
        if interrupted:
            return 130
        return 1 if self.results["failures"] else 0

    # -- setup / teardown -----------------------------------------------------

    def setup(self) -> None:
        metrics_dir = self.tmp / "metrics"
        metrics_dir.mkdir()
        base_env, gateway_env = prepare.stack_env(
            pg=self.pg,
            broker_url=self.broker_url,
            queue=self.queue,
            gateway_port=self.gateway_port,
            metrics_dir=metrics_dir,
        )
        # Figure 9's receiver is an HTTP server of this process on 127.0.0.1.
        base_env["WEBHOOK_ALLOW_LOCAL_URLS"] = "true"
        prepare.create_databases(
            self.pg, self.pgbench, base_env=base_env, gateway_env=gateway_env, logdir=self.logdir
        )
        self.db = BenchDB(self.pg.connect(BENCH_DB))
        users = self.db.seed()

        # In-process Django (settings from the same env): SQL capture and the
        # Celery control channel.
        app = prepare.start_django(base_env)
        self.pgbench.mode = prepare.pgbench_mode()
        prepare.describe(
            self.results,
            self.args,
            self.db,
            queue=self.queue,
            broker_url=self.broker_url,
            port=self.port,
        )

        self.redis = redis.Redis.from_url(self.broker_url)
        self._redis_was_empty = self.redis.dbsize() == 0
        if not self._redis_was_empty:
            log(
                f"note: Redis db {self.args.redis_db} is not empty; only keys of "
                f"{self.queue} will be removed at the end"
            )
        self.broker = Broker(app=app, redis=self.redis, queue=self.queue, hostname=self.hostname)

        # The statements of one real reserve request, before anything else runs.
        reserve.check_script(self.db, users, self.logdir, self.results)

        self.stack = Stack(
            logdir=self.logdir,
            base_env=base_env,
            port=self.port,
            queue=self.queue,
            hostname=self.hostname,
            gateway_port=self.gateway_port,
            gateway_env=gateway_env,
            web_workers=self.args.web_workers,
            web_threads=self.args.web_threads,
        )
        self.stack.start_all(app)
        log(
            f"stack up: gunicorn :{self.port}, fake gateway :{self.gateway_port}, "
            f"worker {self.hostname}, relay; queue {self.queue}"
        )
        self.ctx = Context(
            args=self.args,
            results=self.results,
            rows=self.rows,
            logdir=self.logdir,
            pg=self.pg,
            db=self.db,
            stack=self.stack,
            broker=self.broker,
            pgbench=self.pgbench,
            users=users,
            profiler=self.profiler,
        )

    def teardown(self) -> None:
        log("teardown")
        if self.stack is not None:
            with contextlib.suppress(Exception):
                self.stack.stop()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                keys = [
                    k
                    for k in self.redis.scan_iter(count=1000)
                    if self.queue.encode() in k or self._redis_was_empty
                ]
                if keys:
                    self.redis.delete(*keys)
        if self.db is not None:
            with contextlib.suppress(Exception):
                self.db.close()
        with contextlib.suppress(Exception):
            prepare.close_connections()
        if not self.args.keep_dbs:
            for db in (SWEEPS_DB, PGBENCH_DB, GATEWAY_DB):
                with contextlib.suppress(Exception):
                    self.pg.drop(db)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- output ---------------------------------------------------------------

    def write(self) -> None:
        self.rows += celery_baseline.combined_rows(self.results["figures"])
        self.results["finished_at"] = dt.datetime.now(dt.UTC).isoformat()
        self.results["table"] = self.rows
        self.results["logs"] = str(self.logdir)
        self.json_path.write_text(json.dumps(self.results, indent=2, default=str))
        print_table(self.rows)
        print(f"results: {self.json_path.relative_to(ROOT)}  logs: {self.logdir.relative_to(ROOT)}")
        for phase, svgs in self.results.get("profiles", {}).items():
            print(
                f"profile {phase}: "
                + (
                    "  ".join(str(Path(f).relative_to(ROOT)) for f in svgs)
                    or "no flame graph written"
                )
            )
        if self.results["failures"]:
            print("FAILED phases: " + ", ".join(f["phase"] for f in self.results["failures"]))
        sys.stdout.flush()


def print_table(rows: list[dict]) -> None:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return "" if v is None else str(v)

    header = ("figure", "measured", "baseline", "ratio")
    body = [
        (
            r["figure"] + (f"  [{r['note']}]" if r.get("note") else ""),
            fmt(r["measured"]),
            fmt(r["baseline"]),
            fmt(r["ratio"]),
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]
    line = "  ".join("-" * w for w in widths)
    print()
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print(line)
    for row in body:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    print()


def check_profile(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--profile names figures that run with the stack, and py-spy is there."""
    if not args.profile:
        return
    with_stack = {fig.FIGURE.phase for fig in WITH_STACK}
    names = set(args.profile.split(","))
    unknown = names - with_stack - {fig.FIGURE.phase for fig in WITHOUT_STACK}
    if unknown:
        parser.error(f"--profile: unknown phase(s) {', '.join(sorted(unknown))}")
    if names - with_stack:
        parser.error(
            f"--profile: {', '.join(sorted(names - with_stack))} run(s) without the "
            "stack: no process to profile"
        )
    if not find_py_spy():
        parser.error("--profile needs py-spy: .venv/bin/pip install py-spy (or make install)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--full",
        action="store_true",
        help="long variants: 60 s runs, 2000 e2e purchases, 100 hot-seat runs, "
        "30k timers, c=4 and 16 for the gateway figure",
    )
    parser.add_argument(
        "--phases",
        default="",
        help="comma list of figures to run: reserve,celery,e2e,timers,hot,"
        "gateway,catalog,tracing,webhooks,onsale,scaleout,seller,stripe,cancellation,door,breaker,"
        "waitingroom,sweeps "
        "(default: all)",
    )
    parser.add_argument(
        "--profile",
        default="",
        metavar="PHASE[,PHASE]",
        help="record the stack's processes with py-spy during these figures "
        "(names as --phases); flame graphs (SVG) in the logs directory",
    )
    parser.add_argument(
        "--profile-format",
        default="flamegraph",
        choices=sorted(SUFFIX),
        help="py-spy's output for --profile: flamegraph (SVG, the default), raw "
        "(collapsed stacks, text) or speedscope (JSON)",
    )
    parser.add_argument(
        "--profile-gil",
        action="store_true",
        help="--profile records only the samples holding the GIL (Python's CPU, "
        "not the waits on the database or the network)",
    )
    parser.add_argument(
        "--e2e-purchases",
        type=int,
        default=0,
        help="purchases per end-to-end run, figures 2, 9, 11 and 14 (default 300, figure 9 "
        "1000, --full 2000)",
    )
    parser.add_argument(
        "--cancel-purchases",
        type=int,
        default=0,
        help="confirmed purchases of figure 15's cancellation (default 10000; its run at the "
        "machine's limit takes at most 5000); a short check: --cancel-purchases 2000",
    )
    parser.add_argument(
        "--cancel-pace",
        type=float,
        default=0,
        help="figure 15's REFUND_RATE_PER_SECOND, refunds per second (default 20, the product's)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=0,
        help="seconds per throughput measurement (default 12, --full 60)",
    )
    parser.add_argument(
        "--redis-db",
        type=int,
        default=14,
        help="Redis database for the bench's broker (default 14)",
    )
    parser.add_argument(
        "--sweeps-large",
        type=int,
        default=0,
        help="finished sagas for the large sweep measurement (default 1,000,000)",
    )
    parser.add_argument(
        "--reserve-clients", default="1,4,16", help="client counts for figure 1 (default 1,4,16)"
    )
    parser.add_argument(
        "--web-workers", type=int, default=2, help="gunicorn workers (default 2; for experiments)"
    )
    parser.add_argument(
        "--web-threads",
        type=int,
        default=8,
        help="gunicorn threads per worker (default 8; for experiments)",
    )
    parser.add_argument(
        "--keep-dbs",
        action="store_true",
        help=f"keep {SWEEPS_DB} and {PGBENCH_DB} ({BENCH_DB} is always kept)",
    )
    args = parser.parse_args()
    check_profile(parser, args)
    os.chdir(ROOT)
    return Runner(args).run()


if __name__ == "__main__":
    sys.exit(main())
