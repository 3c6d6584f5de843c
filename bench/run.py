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

Figures (see bench/README.md for how to read them):

1. reserve: POST /api/purchases/ at 1, 4, 16 clients vs pgbench running the
   same SQL (bench/reserve.sql) at the same concurrency;
2. end to end: confirmed purchases/s vs pgbench -N; transactions per purchase;
3. gateway latency off the request path: reserve p99 at 300 ms vs 0 ms;
4. timers: fire lag of 10,000 armed timers vs the relay's poll interval;
5. hot seat: 200 buyers for 10 seats, sold exactly 10 in every run;
6. sweeps: the resumer, chaser and relay queries at 10k vs 1M finished sagas;
7. Celery: no-op and one-small-transaction task rates on the same pool.

Progress goes to stderr; the table to stdout; everything measured to
bench/results/<UTC timestamp>.json (and the processes' logs beside it).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import glob
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
RESERVE_SQL = BENCH / "reserve.sql"

BENCH_DB = "boxoffice_bench"
SWEEPS_DB = "boxoffice_bench_sweeps"
PGBENCH_DB = "boxoffice_bench_pgbench"
# The fake gateway runs as its own process on its own database, as a real
# processor is outside the product: the product database's commit counts
# (figure 2) are then the product's alone.
GATEWAY_DB = "boxoffice_bench_gateway"

# Long enough that no hold-expiry timer written during the run fires during the
# run (a purchase left PENDING on purpose would otherwise wake up mid-figure).
HOLD_SECONDS = 7200
# PostgreSQL 15 flushes a backend's statistics at most once a second, and an
# idle backend 10 s after its last transaction: wait this long before reading
# pg_stat_* as "quiesced".
STATS_FLUSH_SECONDS = 12.0
PR_SET_PDEATHSIG = 1
_T0 = time.monotonic()


# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------


def log(msg: str) -> None:
    elapsed = time.monotonic() - _T0
    print(f"[{int(elapsed // 60):02d}:{elapsed % 60:04.1f}] {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], p: float) -> float | None:
    """Linear-interpolated percentile, p in [0, 100]."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def lat_summary(seconds: list[float]) -> dict:
    ms = [x * 1000 for x in seconds]
    return {
        "n": len(ms),
        "p50_ms": pct(ms, 50),
        "p90_ms": pct(ms, 90),
        "p99_ms": pct(ms, 99),
        "max_ms": max(ms) if ms else None,
        "mean_ms": statistics.fmean(ms) if ms else None,
    }


def ratio(a, b) -> float | None:
    if a is None or b in (None, 0):
        return None
    return a / b


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # A bench that is killed hard must not leave a worker consuming or a
    # gunicorn listening: the kernel kills them with us.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def find_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if versions:
        return versions[-1]
    raise SystemExit(f"make bench: {name} not found (install postgresql-client)")


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, CPU ticks used so far, user + system)."""
    table = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            raw = Path(stat).read_text()
            f = raw[raw.rindex(")") + 2:].split()
            table[int(stat.split("/")[2])] = (int(f[1]), int(f[11]) + int(f[12]))
    return table


def tree_cpu_seconds(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each named process and its descendants
    (children that exited are not counted: sample around a window)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, root in roots.items():
        todo, ticks = [root], 0
        while todo:
            pid = todo.pop()
            ticks += table.get(pid, (0, 0))[1]
            todo += children.get(pid, [])
        out[name] = ticks / hz
    return out


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class PhaseTimeout(Exception):
    pass


class PhaseFailed(Exception):
    pass


# --------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------


class PG:
    """Where PostgreSQL is (from DATABASE_URL), and connections to our databases."""

    def __init__(self, url: str):
        u = urlparse(url)
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 5432
        self.user = unquote(u.username) if u.username else os.environ.get("USER", "postgres")
        self.password = unquote(u.password) if u.password else None

    def url(self, db: str) -> str:
        auth = self.user + (f":{self.password}" if self.password else "")
        return f"postgres://{auth}@{self.host}:{self.port}/{db}"

    def connect(self, db: str, autocommit: bool = True):
        import psycopg

        return psycopg.connect(
            host=self.host, port=self.port, user=self.user, password=self.password,
            dbname=db, autocommit=autocommit, application_name="boxoffice-bench",
        )

    def recreate(self, db: str, template: str | None = None) -> None:
        with self.connect("postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            template_clause = f' TEMPLATE "{template}"' if template else ""
            conn.execute(f'CREATE DATABASE "{db}"{template_clause}')

    def drop(self, db: str) -> None:
        with self.connect("postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

    def pg_env(self) -> dict:
        env = dict(os.environ)
        if self.password:
            env["PGPASSWORD"] = self.password
        return env

    def pg_args(self) -> list[str]:
        return ["-h", self.host, "-p", str(self.port), "-U", self.user]


# --------------------------------------------------------------------------
# The stack: gunicorn, Celery worker, relay
# --------------------------------------------------------------------------


class Stack:
    def __init__(self, *, logdir: Path, base_env: dict, port: int, queue: str, hostname: str,
                 gateway_port: int, gateway_env: dict):
        self.logdir = logdir
        self.base_env = base_env
        self.port = port
        self.gateway_port = gateway_port
        self.gateway_env = gateway_env
        self.queue = queue
        self.hostname = hostname
        self.procs: dict[str, subprocess.Popen] = {}
        self.latency_ms = 0
        self.web_workers, self.web_threads = 2, 8

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict:
        return {**self.base_env, "FAKE_GATEWAY_LATENCY_MS": str(self.latency_ms)}

    def _start(self, name: str, argv: list[str], env: dict | None = None) -> None:
        out = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        out.write(f"\n===== start {dt.datetime.now(dt.UTC).isoformat()} {' '.join(argv)}"
                  f" FAKE_GATEWAY_LATENCY_MS={self.latency_ms}\n".encode())
        out.flush()
        self.procs[name] = subprocess.Popen(
            argv, cwd=ROOT, env=env or self.env(), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent,
        )
        out.close()
        # For py-spy and friends: the machine may run other stacks of this
        # project, so "pgrep run_relay" is not necessarily ours.
        with open(self.logdir / "pids.txt", "a") as fh:
            fh.write(f"{name} {self.procs[name].pid}\n")

    def start_web(self) -> None:
        self._start("web", [
            sys.executable, "-m", "gunicorn", "config.wsgi:application",
            "-b", f"127.0.0.1:{self.port}", "--worker-class", "gthread",
            "--workers", str(self.web_workers), "--threads", str(self.web_threads),
        ])

    def start_gateway(self) -> None:
        self._start("gateway", [
            sys.executable, "-m", "gunicorn", "config.wsgi:application",
            "-b", f"127.0.0.1:{self.gateway_port}", "--worker-class", "gthread",
            "--workers", "1", "--threads", "16",
        ], env={**self.gateway_env, "FAKE_GATEWAY_LATENCY_MS": str(self.latency_ms)})

    def start_worker(self) -> None:
        self._start("worker", [
            sys.executable, "-m", "celery", "-A", "config", "worker", "--concurrency=4",
            f"--queues={self.queue}", "--without-gossip", "--without-mingle",
            "--include=bench.tasks", f"--hostname={self.hostname}", "--loglevel=INFO",
        ])

    def start_relay(self) -> None:
        self._start("relay", [sys.executable, "manage.py", "run_relay"])

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise PhaseFailed(f"{name} exited with {proc.returncode}")

    def tails(self, lines: int = 40) -> str:
        out = []
        for path in sorted(self.logdir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name} (last {len(text)} lines) ---\n" + "\n".join(text))
        return "\n".join(out)

    # readiness ---------------------------------------------------------------

    def wait_web(self, timeout: float = 60) -> None:
        import httpx

        for name, url in (("web", self.base_url),
                          ("gateway", f"http://127.0.0.1:{self.gateway_port}")):
            deadline = time.monotonic() + timeout
            while True:
                self.check_alive()
                try:
                    # The fake gateway answers any unknown path with JSON,
                    # without touching the database: it proves gunicorn and
                    # the mount.
                    r = httpx.get(f"{url}/fake-gateway/v1/bench-ready", timeout=2,
                                  trust_env=False)
                    if r.status_code == 404 and "unknown_endpoint" in r.text:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise PhaseFailed(f"gunicorn ({name}) did not answer in time")
                time.sleep(0.3)

    def wait_worker(self, app, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if app.control.ping(destination=[self.hostname], timeout=1.0):
                return
        raise PhaseFailed("the Celery worker did not answer a ping")

    def wait_relay(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        path = self.logdir / "relay.log"
        while time.monotonic() < deadline:
            self.check_alive()
            text = path.read_text(errors="replace") if path.exists() else ""
            last = text.rsplit("===== start", 1)[-1]
            if "outbox relay started" in last:
                return
            time.sleep(0.2)
        raise PhaseFailed("the relay did not start")


# --------------------------------------------------------------------------
# HTTP load
# --------------------------------------------------------------------------


def http_client(base_url: str, token: str):
    import httpx

    return httpx.Client(
        base_url=base_url,
        headers={"Authorization": f"Token {token}"},
        timeout=httpx.Timeout(60.0),
        trust_env=False,  # 127.0.0.1 only, never through a proxy
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
    )


def post_purchase(client, *, event_id: int, ref: str) -> tuple[int, float, str]:
    """One purchase start; (status, seconds, body head). A connection dropped
    by the server (keep-alive race) is retried once with the same
    Idempotency-Key, which is exactly what the key is for."""
    import httpx

    key = uuid.uuid4().hex
    body = {"event": event_id, "seats": [ref], "payment_method": "pm_card_visa"}
    started = time.perf_counter()
    for attempt in (1, 2):
        try:
            r = client.post("/api/purchases/", json=body, headers={"Idempotency-Key": key})
            head = "" if r.status_code in (202, 409) else r.text[:300]
            return r.status_code, time.perf_counter() - started, head
        except httpx.TransportError as exc:
            if attempt == 2:
                return -1, time.perf_counter() - started, f"{type(exc).__name__}: {exc}"
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------
# The bench
# --------------------------------------------------------------------------


class Bench:
    def __init__(self, args):
        self.args = args
        self.full = args.full
        self.stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.json_path = RESULTS / f"{self.stamp}.json"
        self.logdir = RESULTS / f"{self.stamp}.logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix="boxoffice-bench-"))

        db_url = os.environ.get("DATABASE_URL")
        redis_url = os.environ.get("REDIS_URL") or os.environ.get("CELERY_BROKER_URL")
        if not db_url or not db_url.startswith(("postgres://", "postgresql://")):
            raise SystemExit("make bench: needs DATABASE_URL=postgres://... "
                             "(run it through scripts/with-services.sh)")
        if not redis_url or not redis_url.startswith("redis://"):
            raise SystemExit("make bench: needs REDIS_URL=redis://... "
                             "(run it through scripts/with-services.sh)")
        self.pg = PG(db_url)
        r = urlparse(redis_url)
        self.broker_url = f"redis://{r.netloc}/{args.redis_db}"
        self.queue = f"boxoffice-bench-{os.getpid()}"
        self.hostname = f"bench-{os.getpid()}@bench"
        self.port = free_port()
        self.gateway_port = free_port()
        self.pgbench = find_bin("pgbench")

        self.results: dict = {
            "started_at": dt.datetime.now(dt.UTC).isoformat(),
            "args": vars(args),
            "figures": {},
            "failures": [],
            "notes": [],
        }
        self.rows: list[dict] = []
        self.stack: Stack | None = None
        self.db = None
        self.redis = None
        self.app = None
        self.users: list[int] = []
        self._redis_was_empty = False
        self._capture_sql: list[str] = []

    # -- durations ------------------------------------------------------------

    @property
    def dur(self) -> float:
        return self.args.duration or (60.0 if self.full else 12.0)

    @property
    def warmup(self) -> float:
        return 5.0 if self.full else 3.0

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

    def machine_load(self, seconds: float = 1.0) -> dict:
        """What else the (shared) machine was doing over ``seconds``: the CPU
        used by processes that are neither ours nor PostgreSQL's, as a share
        of all cores, and the busiest of them."""
        def snapshot() -> dict[int, tuple[int, int, str, int]]:
            procs = {}
            for stat in glob.glob("/proc/[0-9]*/stat"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    raw = Path(stat).read_text()
                    comm = raw[raw.index("(") + 1:raw.rindex(")")]
                    f = raw[raw.rindex(")") + 2:].split()
                    procs[int(stat.split("/")[2])] = (int(f[1]), int(f[11]) + int(f[12]),
                                                      comm, 0)
            return procs

        before = snapshot()
        time.sleep(seconds)
        after = snapshot()
        parents = {pid: v[0] for pid, v in after.items()}
        me = os.getpid()

        def ours(pid: int) -> bool:
            for _ in range(50):
                if pid == me:
                    return True
                pid = parents.get(pid, 0)
                if pid <= 1:
                    return False
            return False

        hz = os.sysconf("SC_CLK_TCK")
        cores = os.cpu_count() or 1
        busy, total = [], 0.0
        for pid, (_, ticks, comm, _) in after.items():
            if ours(pid) or comm.startswith("postgres") or pid not in before:
                continue
            share = (ticks - before[pid][1]) / hz / seconds / cores * 100
            total += share
            if share >= 2:
                busy.append((share, f"{comm}({pid}) {share:.0f}%"))
        return {"loadavg": Path("/proc/loadavg").read_text().split()[:3],
                "other_cpu_percent_of_machine": round(total, 1),
                "busy_others": [b for _, b in sorted(busy, reverse=True)[:6]]}

    def figure(self, key: str, label: str, timeout: float, fn) -> None:
        """Run one figure; a failure is recorded (with the logs' tails) and the
        run goes on with the next figure."""
        self.results.setdefault("load", {})[key] = {"before": self.machine_load()}
        try:
            with self.phase(label, timeout):
                if self.stack is not None and self.stack.procs:
                    self.ensure_stack()
                fn()
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"
            log(f"!! phase {label!r} FAILED: {detail}")
            traceback.print_exc(file=sys.stderr)
            if self.stack is not None:
                print(self.stack.tails(), file=sys.stderr)
            self.results["failures"].append({"phase": label, "error": detail,
                                             "traceback": traceback.format_exc()})
            self.rows.append({"figure": f"{label}: FAILED", "measured": detail[:60],
                              "baseline": "", "ratio": ""})
            if self.stack is not None:
                with contextlib.suppress(Exception):
                    self.purge_queue()
        finally:
            self.results["load"][key]["after"] = self.machine_load()

    # -- main ---------------------------------------------------------------

    def run(self) -> int:
        def on_term(signum, frame):
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, on_term)
        # Ctrl-C must tear down even when a shell started us with SIGINT
        # ignored (background jobs of a non-interactive shell).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        wanted = set(self.args.phases.split(",")) if self.args.phases else None

        def want(name: str) -> bool:
            return wanted is None or name in wanted

        interrupted = False
        try:
            with self.phase("setup: databases, fixtures, stack", 240):
                self.setup()
            if want("reserve"):
                self.figure("1_reserve", "1 reserve vs pgbench", 60 + 3 * (2 * self.dur + 60),
                            self.fig_reserve)
            if want("celery"):
                self.figure("7_celery", "7 celery task rates", 240 if not self.full else 900,
                            self.fig_celery)
            if want("e2e"):
                self.figure("2_e2e", "2 end to end", 420 if not self.full else 1200, self.fig_e2e)
            if want("timers"):
                self.figure("4_timers", "4 timers", 300 if not self.full else 600, self.fig_timers)
            if want("hot"):
                self.figure("5_hot_seat", "5 hot seat", 300 if not self.full else 1200,
                            self.fig_hot_seat)
            if want("gateway"):
                self.figure("3_gateway", "3 gateway latency", 240 + 4 * self.dur,
                            self.fig_gateway)
            if self.stack is not None:
                log("stopping the stack")
                self.stack.stop_all()
            if want("sweeps"):
                self.figure("6_sweeps", "6 sweeps at scale", 600 if not self.full else 1800,
                            self.fig_sweeps)
        except KeyboardInterrupt:
            interrupted = True
            log("!! interrupted")
            self.results["failures"].append({"phase": "run", "error": "interrupted"})
        except Exception as exc:
            log(f"!! setup FAILED: {type(exc).__name__}: {exc}")
            traceback.print_exc(file=sys.stderr)
            if self.stack is not None:
                print(self.stack.tails(), file=sys.stderr)
            self.results["failures"].append({"phase": "setup", "error": f"{exc}",
                                             "traceback": traceback.format_exc()})
        finally:
            self.teardown()
            self.write()
        if interrupted:
            return 130
        return 1 if self.results["failures"] else 0

    # ------------------------------------------------------------------------
    # setup / teardown
    # ------------------------------------------------------------------------

    def setup(self) -> None:
        import psycopg

        metrics_dir = self.tmp / "metrics"
        metrics_dir.mkdir()
        base_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": self.pg.url(BENCH_DB),
            "CELERY_BROKER_URL": self.broker_url,
            "CELERY_TASK_DEFAULT_QUEUE": self.queue,
            "DEBUG": "false",
            "SECRET_KEY": "bench",
            "ALLOWED_HOSTS": "127.0.0.1",
            "FAKE_GATEWAY_ENABLED": "true",
            "PAYMENT_GATEWAY_URL": f"http://127.0.0.1:{self.gateway_port}/fake-gateway/v1",
            "PURCHASE_THROTTLE_RATE": "1000000/min",
            "SESSION_COOKIE_SECURE": "false",
            "CSRF_COOKIE_SECURE": "false",
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            "PURCHASE_HOLD_SECONDS": str(HOLD_SECONDS),
            # Emails are rendered and "sent" by the consumers; the dummy backend
            # keeps 10k bodies out of the worker's log.
            "EMAIL_BACKEND": "django.core.mail.backends.dummy.EmailBackend",
            "PYTHONUNBUFFERED": "1",
        }
        base_env.pop("CACHE_URL", None)  # per-process throttle counts; the rate is huge anyway

        log(f"databases: {BENCH_DB}, {SWEEPS_DB}, {PGBENCH_DB}, {GATEWAY_DB} on "
            f"{self.pg.host}:{self.pg.port}")
        gateway_env = {**base_env, "DATABASE_URL": self.pg.url(GATEWAY_DB)}
        for db, env in ((BENCH_DB, base_env), (GATEWAY_DB, gateway_env)):
            self.pg.recreate(db)
            with open(self.logdir / "migrate.log", "ab") as out:
                subprocess.run([sys.executable, "manage.py", "migrate", "--no-input"], cwd=ROOT,
                               env=env, check=True, timeout=180, stdout=out,
                               stderr=subprocess.STDOUT)
        # A copy of the empty schema for figure 6, before anything connects.
        self.pg.recreate(SWEEPS_DB, template=BENCH_DB)
        self.pg.recreate(PGBENCH_DB)
        subprocess.run([self.pgbench, *self.pg.pg_args(), "-i", "-q", "-s", "5", PGBENCH_DB],
                       env=self.pg.pg_env(), check=True, timeout=180, capture_output=True)

        self.db = self.pg.connect(BENCH_DB)
        self.db.execute("CREATE TABLE bench_counter (id int PRIMARY KEY, n bigint NOT NULL)")
        self.db.execute("INSERT INTO bench_counter SELECT g, 0 FROM generate_series(1, 1000) g")
        self.db.execute("CREATE TABLE bench_log (id bigserial PRIMARY KEY, counter_id int, "
                        "task_no int, at timestamptz NOT NULL DEFAULT now())")
        with self.db.transaction():
            rows = self.db.execute(
                "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name,"
                " email, is_staff, is_active, date_joined)"
                " SELECT '!', false, 'bench-' || lpad(g::text, 4, '0'), '', '', '', false, true,"
                " now() FROM generate_series(1, 256) g ORDER BY g RETURNING id"
            ).fetchall()
            self.users = sorted(r[0] for r in rows)
            self.db.execute(
                "INSERT INTO authtoken_token (key, created, user_id)"
                " SELECT md5('bench-token-' || id), now(), id FROM auth_user"
                " WHERE username LIKE 'bench-%%'"
            )
        if self.users != list(range(self.users[0], self.users[0] + 256)):
            raise PhaseFailed("user ids are not contiguous")

        # In-process Django (settings from the same env): SQL capture and the
        # Celery control channel.
        os.environ.update({k: v for k, v in base_env.items() if k != "FAKE_GATEWAY_LATENCY_MS"})
        import django

        django.setup()
        from django.conf import settings
        from django.db import connection

        from config.celery import app

        self.app = app
        binding = (settings.DATABASES["default"].get("OPTIONS") or {}).get("server_side_binding")
        self.protocol = "extended" if binding is True else "simple"
        self.results["protocol"] = {
            "django_server_side_binding": binding,
            "psycopg": psycopg.__version__,
            "pgbench_mode": self.protocol,
            "why": "Django's psycopg 3 backend uses ClientCursor (client-side binding) unless "
                   "OPTIONS['server_side_binding'] is True; ClientCursor sends with "
                   "PQsendQuery = simple query protocol",
        }
        self.results["machine"] = {
            "cpus": os.cpu_count(),
            "postgres": self.q1("SELECT version()")[0],
            **{k: self.q1(f"SHOW {k}")[0] for k in (
                "fsync", "synchronous_commit", "shared_buffers", "max_connections")},
        }
        self.results["config"] = {
            "queue": self.queue, "broker": self.broker_url, "port": self.port,
            "relay_poll_seconds": settings.OUTBOX_POLL_SECONDS,
            "outbox_batch_size": settings.OUTBOX_BATCH_SIZE,
            "conn_max_age": settings.DATABASES["default"]["CONN_MAX_AGE"],
            "conn_health_checks": settings.DATABASES["default"]["CONN_HEALTH_CHECKS"],
            "celery_db_reuse_max": settings.CELERY_DB_REUSE_MAX,
            "purchase_hold_seconds": HOLD_SECONDS,
            "gunicorn": (f"gthread, {self.args.web_workers} workers x "
                         f"{self.args.web_threads} threads"),
            "worker": "prefork, concurrency 4",
        }
        self.results["git"] = self._git()
        connection.close()

        import redis

        self.redis = redis.Redis.from_url(self.broker_url)
        self._redis_was_empty = self.redis.dbsize() == 0
        if not self._redis_was_empty:
            log(f"note: Redis db {self.args.redis_db} is not empty; only keys of "
                f"{self.queue} will be removed at the end")

        # The statements of one real reserve request, before anything else runs.
        self.capture_reserve_sql()

        self.stack = Stack(logdir=self.logdir, base_env=base_env, port=self.port,
                           queue=self.queue, hostname=self.hostname,
                           gateway_port=self.gateway_port, gateway_env=gateway_env)
        self.stack.web_workers = self.args.web_workers
        self.stack.web_threads = self.args.web_threads
        self.stack.start_gateway()
        self.stack.start_web()
        self.stack.start_worker()
        self.stack.start_relay()
        self.stack.wait_web()
        self.stack.wait_worker(self.app)
        self.stack.wait_relay()
        log(f"stack up: gunicorn :{self.port}, fake gateway :{self.gateway_port}, "
            f"worker {self.hostname}, relay; queue {self.queue}")

    def _git(self) -> dict:
        def run(*argv):
            return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True,
                                  text=True).stdout.strip()
        return {"commit": run("rev-parse", "HEAD"),
                "dirty_files": [ln[3:] for ln in run("status", "--porcelain").splitlines()]}

    def ensure_stack(self) -> None:
        """A process that died in an earlier figure is restarted for the next."""
        st = self.stack
        for name, start in (("gateway", st.start_gateway), ("web", st.start_web),
                            ("worker", st.start_worker),
                            ("relay", st.start_relay)):
            proc = st.procs.get(name)
            if proc is not None and proc.poll() is not None:
                log(f"!! {name} had exited ({proc.returncode}); restarting it")
                st.procs.pop(name)
                start()
        st.wait_web()
        st.wait_worker(self.app)

    def teardown(self) -> None:
        log("teardown")
        if self.stack is not None:
            with contextlib.suppress(Exception):
                self.stack.stop_all()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                keys = [k for k in self.redis.scan_iter(count=1000)
                        if self.queue.encode() in k or self._redis_was_empty]
                if keys:
                    self.redis.delete(*keys)
        if self.db is not None:
            with contextlib.suppress(Exception):
                self.db.close()
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if not self.args.keep_dbs:
            for db in (SWEEPS_DB, PGBENCH_DB, GATEWAY_DB):
                with contextlib.suppress(Exception):
                    self.pg.drop(db)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------------
    # database helpers
    # ------------------------------------------------------------------------

    def q(self, sql: str, params=None) -> list[tuple]:
        cur = self.db.execute(sql, params)
        return cur.fetchall() if cur.description else []

    def q1(self, sql: str, params=None) -> tuple:
        rows = self.q(sql, params)
        return rows[0] if rows else None

    def make_event(self, name: str, nseats: int, prefix: str = "S") -> tuple[int, int]:
        """An event with seats prefix1..prefixN, inserted in one statement so
        that their ids are contiguous; returns (event id, id offset)."""
        with self.db.transaction():
            (event_id,) = self.q1(
                "INSERT INTO purchases_event (name, starts_at)"
                " VALUES (%s, now() + interval '30 days') RETURNING id", [name])
            self.q("INSERT INTO purchases_seat (event_id, ref, row, number, price_amount,"
                   " currency, status) SELECT %s, %s || g, %s, g, 5000, 'EUR', 'available'"
                   " FROM generate_series(1, %s) g ORDER BY g",
                   [event_id, prefix, prefix, nseats])
        lo, hi, n = self.q1("SELECT min(id), max(id), count(*) FROM purchases_seat"
                            " WHERE event_id = %s", [event_id])
        if hi - lo + 1 != n:
            raise PhaseFailed("seat ids are not contiguous")
        return event_id, lo - 1

    def token(self, user_id: int) -> str:
        return hashlib.md5(f"bench-token-{user_id}".encode()).hexdigest()

    def db_stats(self) -> dict:
        self.db.execute("SELECT pg_stat_clear_snapshot()")
        xc, xr = self.q1("SELECT xact_commit, xact_rollback FROM pg_stat_database"
                         " WHERE datname = %s", [BENCH_DB])
        tables = {
            r[0]: {"ins": r[1], "upd": r[2], "hot_upd": r[3], "del": r[4]}
            for r in self.q("SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del"
                            " FROM pg_stat_user_tables")
        }
        return {"t": time.monotonic(), "xact_commit": xc, "xact_rollback": xr, "tables": tables}

    # ------------------------------------------------------------------------
    # Celery helpers
    # ------------------------------------------------------------------------

    def queue_depth(self) -> tuple[int, int]:
        return self.redis.llen(self.queue), self.redis.hlen("unacked")

    def purge_queue(self) -> int:
        n = self.redis.llen(self.queue)
        self.redis.delete(self.queue)
        if n:
            log(f"   purged {n} queued tasks")
        return n

    def pause_consumer(self) -> bool:
        reply = self.app.control.cancel_consumer(self.queue, destination=[self.hostname],
                                                 reply=True, timeout=5)
        return bool(reply)

    def resume_consumer(self) -> bool:
        reply = self.app.control.add_consumer(self.queue, destination=[self.hostname],
                                              reply=True, timeout=5)
        return bool(reply)

    def wait_drained(self, timeout: float, what: str) -> bool:
        deadline = time.monotonic() + timeout
        last = 0.0
        while time.monotonic() < deadline:
            queued, unacked = self.queue_depth()
            if queued == 0 and unacked == 0:
                return True
            if time.monotonic() - last > 5:
                log(f"   waiting for {what}: {queued} queued, {unacked} in flight")
                last = time.monotonic()
            time.sleep(0.05)
        return False

    def quiesce(self, timeout: float = 120) -> bool:
        """No task queued or running, and no outbox row due and not done."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.wait_drained(max(1.0, deadline - time.monotonic()), "the queue to drain"):
                (due,) = self.q1(
                    "SELECT count(*) FROM outbox_outboxmessage WHERE completed_at IS NULL"
                    " AND cancelled_at IS NULL AND dead_at IS NULL AND available_at <= now()")
                if due == 0:
                    return True
            time.sleep(0.5)
        return False

    # ------------------------------------------------------------------------
    # load
    # ------------------------------------------------------------------------

    def closed_loop(self, *, label: str, clients: int, warmup: float, duration: float,
                    event_id: int, nseats: int) -> dict:
        """``clients`` threads, each its own user and connection, each sending
        the next request as soon as the previous answered; every request a
        new Idempotency-Key and the next free seat."""
        stop = threading.Event()
        exhausted = threading.Event()
        counter = itertools.count(1)
        records: list[list[tuple]] = [[] for _ in range(clients)]
        errors: list[str] = []
        barrier = threading.Barrier(clients + 1, timeout=60)

        def client_loop(k: int) -> None:
            try:
                with http_client(self.stack.base_url, self.token(self.users[k])) as client:
                    barrier.wait()
                    while not stop.is_set():
                        n = next(counter)
                        if n > nseats:
                            exhausted.set()
                            return
                        t = time.monotonic()
                        status, secs, head = post_purchase(client, event_id=event_id, ref=f"S{n}")
                        records[k].append((t, time.monotonic(), secs, status))
                        if status != 202 and len(errors) < 5:
                            errors.append(f"{status} {head}")
            except threading.BrokenBarrierError:
                pass
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(f"client {k}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=client_loop, args=(k,), daemon=True)
                   for k in range(clients)]
        for th in threads:
            th.start()
        roots = {**{n: p.pid for n, p in self.stack.procs.items()}, "bench_client": os.getpid()}
        cpu = {}
        try:
            barrier.wait()
            start = time.monotonic()
            warm_done = False
            end = start + warmup + duration
            last = start
            while time.monotonic() < end and not exhausted.is_set():
                time.sleep(0.2)
                if not warm_done and time.monotonic() >= start + warmup:
                    warm_done = True
                    cpu["before"] = (tree_cpu_seconds(roots), machine_busy_seconds())
                if time.monotonic() - last >= 5:
                    done = sum(len(r) for r in records)
                    log(f"   {label}: {done} requests, {time.monotonic() - start:.0f}s")
                    last = time.monotonic()
            cpu["after"] = (tree_cpu_seconds(roots), machine_busy_seconds())
        finally:
            stop.set()
            barrier.abort()
            for th in threads:
                th.join(60)
        if exhausted.is_set():
            raise PhaseFailed(f"{label}: the event ran out of seats ({nseats})")
        self.stack.check_alive()
        w0, w1 = start + warmup, start + warmup + duration
        window = [r for rs in records for r in rs if w0 <= r[1] <= w1]
        statuses: dict[str, int] = {}
        for r in window:
            statuses[str(r[3])] = statuses.get(str(r[3]), 0) + 1
        ok = [r[2] for r in window if r[3] == 202]
        bad = len(window) - len(ok)
        cpu_ms = {}
        if "before" in cpu and ok:
            (b, mb), (a, ma) = cpu["before"], cpu["after"]
            used = {n: a[n] - b[n] for n in a}
            # The stack's processes are the bench's children: the client's own
            # share is its tree minus theirs.
            used["bench_client"] -= sum(v for n, v in used.items() if n != "bench_client")
            cpu_ms = {n: round(v * 1000 / len(ok), 2) for n, v in used.items()}
            cpu_ms["machine_all_processes"] = round((ma - mb) * 1000 / len(ok), 2)
            cpu_ms["machine_busy_percent"] = round(
                (ma - mb) / duration / (os.cpu_count() or 1) * 100, 1)
        out = {
            "clients": clients, "duration_s": duration, "warmup_s": warmup,
            "cpu_ms_per_202": cpu_ms,
            "requests": len(window), "statuses": statuses,
            "throughput_per_s": len(ok) / duration,
            "latency_202": lat_summary(ok),
            "errors_sample": errors,
            "started_total": sum(len(r) for r in records),
        }
        if bad > max(1, 0.01 * len(window)):
            raise PhaseFailed(f"{label}: {bad} of {len(window)} requests were not 202: {errors}")
        return out

    # ------------------------------------------------------------------------
    # pgbench
    # ------------------------------------------------------------------------

    def run_pgbench(self, *, args: list[str], db: str, timeout: float, tag: str) -> dict:
        prefix = self.tmp / f"pgb-{tag}"
        cmd = [self.pgbench, *self.pg.pg_args(), "-n", *args, "-l", f"--log-prefix={prefix}", db]
        busy0 = machine_busy_seconds()
        proc = subprocess.Popen(cmd, env=self.pg.pg_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=_die_with_parent)
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
            raise
        busy = machine_busy_seconds() - busy0
        (self.logdir / f"pgbench-{tag}.txt").write_text(f"$ {' '.join(cmd)}\n{out}\n{err}")
        lats = []
        for path in glob.glob(f"{prefix}.*"):
            with open(path) as fh:
                for line in fh:
                    parts = line.split()
                    if len(parts) >= 3 and parts[2].isdigit():
                        lats.append(int(parts[2]) / 1e6)
        tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
        processed = re.search(r"number of transactions actually processed: (\d+)", out)
        failed = re.search(r"number of failed transactions: (\d+)", out)
        aborted = "aborted" in (out + err)
        res = {
            "cmd": " ".join(cmd),
            "tps": float(tps.group(1)) if tps else None,
            "transactions": int(processed.group(1)) if processed else None,
            "failed": int(failed.group(1)) if failed else None,
            "aborted": aborted,
            "latency": lat_summary(lats),
            "stderr_tail": err[-800:],
        }
        if res["transactions"]:
            # Everything the machine did, pgbench and PostgreSQL included
            # (and whatever else runs on a shared box) per transaction.
            res["machine_cpu_ms_per_txn"] = round(busy * 1000 / res["transactions"], 2)
        if proc.returncode != 0 or aborted or res["tps"] is None:
            raise PhaseFailed(f"pgbench {tag} failed (rc {proc.returncode}): {err[-600:]}")
        return res

    # ------------------------------------------------------------------------
    # reserve SQL capture
    # ------------------------------------------------------------------------

    @staticmethod
    def shape(sql: str) -> str:
        s = re.sub(r"\\gset.*$", "", sql.strip()).rstrip(";").strip()
        verb = s.split()[0].upper()
        m = re.search(r'\b(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', s, re.IGNORECASE)
        if verb in ("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT", "ROLLBACK") or not m:
            return verb
        return f"{verb} {m.group(1)}"

    def script_statements(self) -> list[str]:
        return [ln for ln in RESERVE_SQL.read_text().splitlines()
                if ln.strip() and not ln.startswith(("--", "\\"))]

    def capture_reserve_sql(self) -> None:
        """Send one real request through Django in-process and record every
        statement it sends, to check bench/reserve.sql against the product."""
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext

        event_id, _ = self.make_event("bench capture", 1)
        uid = self.users[-1]
        body = {"event": event_id, "seats": ["S1"], "payment_method": "pm_card_visa"}
        with CaptureQueriesContext(connection) as ctx:
            r = Client().post("/api/purchases/", data=json.dumps(body),
                              content_type="application/json", HTTP_HOST="127.0.0.1",
                              HTTP_AUTHORIZATION=f"Token {self.token(uid)}",
                              HTTP_IDEMPOTENCY_KEY="bench-capture")
        if r.status_code != 202:
            raise PhaseFailed(f"capture request answered {r.status_code}: {r.content[:300]!r}")
        captured = [q["sql"] for q in ctx.captured_queries]
        connection.close()
        self._capture_sql = captured
        (self.logdir / "reserve-captured.sql").write_text(";\n".join(captured) + ";\n")
        got = ["SELECT"] + [self.shape(s) for s in captured]  # + the health check
        want = [self.shape(s) for s in self.script_statements()]
        same = got == want
        self.results["reserve_sql"] = {
            "captured_statements": captured,
            "captured_shapes": got,
            "script_shapes": want,
            "script_matches_product": same,
            "round_trips": len(got),
            "transactions": 1 + sum(1 for s in got[:got.index("BEGIN")]),
        }
        if same:
            log(f"   reserve.sql matches the product's reserve: {len(got)} statements")
        else:
            msg = ("bench/reserve.sql no longer matches the product's reserve transaction: "
                   f"product {got} vs script {want}")
            log("!! " + msg)
            self.results["notes"].append(msg)

    # ------------------------------------------------------------------------
    # Figure 1: reserve vs pgbench
    # ------------------------------------------------------------------------

    def fig_reserve(self) -> None:
        levels = [int(x) for x in self.args.reserve_clients.split(",")]
        paused = self.pause_consumer()
        # Charges queue up instead of competing for the two cores: this figure
        # is the request path alone, as pgbench is the SQL alone.
        log(f"   worker consumer paused: {paused}")
        fig = {"levels": {}, "worker_paused": paused}
        self.results["figures"]["1_reserve"] = fig
        prev_tps, prev_n = None, 1
        try:
            for n in levels:
                http_seats = int(1000 * (self.warmup + self.dur)) + 1000
                ev, _ = self.make_event(f"bench reserve c{n}", http_seats)
                log(f"   reserve c={n}: HTTP for {self.warmup:.0f}+{self.dur:.0f}s")
                http = self.closed_loop(label=f"reserve c={n}", clients=n, warmup=self.warmup,
                                        duration=self.dur, event_id=ev, nseats=http_seats)
                log(f"   reserve c={n}: {http['throughput_per_s']:.1f} req/s, "
                    f"p50 {http['latency_202']['p50_ms']:.1f} ms, "
                    f"p99 {http['latency_202']['p99_ms']:.1f} ms")
                self.purge_queue()
                # Every pgbench transaction takes a fresh seat: size the event
                # from the previous level's rate (pgbench -T cannot stop at N).
                est = (prev_tps * n / prev_n if prev_tps else 1500) * self.dur * 1.5
                pgb_seats = int(min(max(est, 20000), 2_000_000))
                ev2, idoff = self.make_event(f"bench pgbench c{n}", pgb_seats)
                before = self.db_stats()
                log(f"   reserve c={n}: pgbench -M {self.protocol} for {self.dur:.0f}s")
                pgb = self.run_pgbench(
                    args=["-M", self.protocol, "-c", str(n), "-j", str(n), "-T", str(int(self.dur)),
                          "-f", str(RESERVE_SQL), "-r",
                          "-D", f"ev={ev2}", "-D", f"idoff={idoff}", "-D", "nbase=0",
                          "-D", f"nclients={n}", "-D", f"ubase={self.users[0]}",
                          "-D", f"run=c{n}", "-D", f"hold={HOLD_SECONDS}", "-D", "i=0"],
                    db=BENCH_DB, timeout=self.dur + 120, tag=f"reserve-c{n}")
                time.sleep(1.5)  # exiting backends flush their statistics
                after = self.db_stats()
                (held,) = self.q1("SELECT count(*) FROM purchases_seat WHERE event_id = %s"
                                  " AND status = 'held'", [ev2])
                if held != pgb["transactions"]:
                    raise PhaseFailed(f"pgbench c={n}: {held} seats held for "
                                      f"{pgb['transactions']} transactions")
                pgb["xact_commit_per_txn"] = ratio(after["xact_commit"] - before["xact_commit"],
                                                   pgb["transactions"])
                prev_tps, prev_n = pgb["tps"], n
                log(f"   pgbench c={n}: {pgb['tps']:.1f} tps, p50 {pgb['latency']['p50_ms']:.1f}"
                    f" ms, p99 {pgb['latency']['p99_ms']:.1f} ms")
                fig["levels"][str(n)] = {"http": http, "pgbench": pgb}
                h, p = http, pgb
                self.rows += [
                    {"figure": f"1 reserve c={n} throughput",
                     "measured": f"{h['throughput_per_s']:.1f} req/s",
                     "baseline": f"{p['tps']:.1f} tps pgbench",
                     "ratio": ratio(h["throughput_per_s"], p["tps"])},
                    {"figure": f"1 reserve c={n} p50",
                     "measured": f"{h['latency_202']['p50_ms']:.1f} ms",
                     "baseline": f"{p['latency']['p50_ms']:.1f} ms",
                     "ratio": ratio(h["latency_202"]["p50_ms"], p["latency"]["p50_ms"])},
                    {"figure": f"1 reserve c={n} p99",
                     "measured": f"{h['latency_202']['p99_ms']:.1f} ms",
                     "baseline": f"{p['latency']['p99_ms']:.1f} ms",
                     "ratio": ratio(h["latency_202"]["p99_ms"], p["latency"]["p99_ms"])},
                ]
                cpu = h.get("cpu_ms_per_202") or {}
                if cpu and p.get("machine_cpu_ms_per_txn"):
                    self.rows.append({
                        "figure": f"1 reserve c={n} machine CPU per request",
                        "measured": f"{cpu['machine_all_processes']:.1f} ms ({cpu['web']:.1f} web)",
                        "baseline": f"{p['machine_cpu_ms_per_txn']:.1f} ms pgbench",
                        "ratio": ratio(cpu["machine_all_processes"], p["machine_cpu_ms_per_txn"]),
                    })
        finally:
            self.purge_queue()
            log(f"   worker consumer resumed: {self.resume_consumer()}")

    # ------------------------------------------------------------------------
    # Figure 7: Celery transport baselines
    # ------------------------------------------------------------------------

    def _task_rate(self, name: str, count: int, *, args_fn, done_fn) -> dict:
        if not self.wait_drained(60, "an empty queue"):
            raise PhaseFailed("the queue did not drain before the task-rate run")
        paused = self.pause_consumer()
        log(f"   {name}: enqueueing {count} (consumer paused: {paused})")
        t_enq = time.monotonic()
        with self.app.producer_or_acquire() as producer:
            for i in range(count):
                self.app.send_task(name, args=args_fn(i), queue=self.queue, producer=producer)
        enqueue_s = time.monotonic() - t_enq
        t0 = time.monotonic()
        if paused:
            self.resume_consumer()
        last = t0
        while True:
            queued, unacked = self.queue_depth()
            if queued == 0 and unacked == 0 and done_fn():
                break
            if time.monotonic() - last > 5:
                log(f"   {name}: {queued} queued, {unacked} in flight")
                last = time.monotonic()
            time.sleep(0.01)
        secs = time.monotonic() - (t0 if paused else t_enq)
        return {"tasks": count, "seconds": secs, "per_s": count / secs,
                "enqueue_seconds": enqueue_s, "prefilled_queue": paused}

    def fig_celery(self) -> None:
        n_noop = 20000 if self.full else 3000
        n_txn = 10000 if self.full else 2000
        self.q("TRUNCATE bench_log")
        noop = self._task_rate("bench.noop", n_noop, args_fn=lambda i: [], done_fn=lambda: True)
        log(f"   no-op: {noop['per_s']:.0f} tasks/s")
        txn = self._task_rate(
            "bench.small_txn", n_txn, args_fn=lambda i: [i],
            done_fn=lambda: self.q1("SELECT count(*) FROM bench_log")[0] >= n_txn)
        log(f"   small transaction: {txn['per_s']:.0f} tasks/s")
        self.results["figures"]["7_celery"] = {"noop": noop, "small_txn": txn}
        self.rows.append({"figure": "7 celery small-txn task rate",
                          "measured": f"{txn['per_s']:.0f} tasks/s",
                          "baseline": f"{noop['per_s']:.0f} no-op tasks/s",
                          "ratio": ratio(txn["per_s"], noop["per_s"])})

    # ------------------------------------------------------------------------
    # Figure 2: end to end
    # ------------------------------------------------------------------------

    def fig_e2e(self) -> None:
        total = 2000 if self.full else 300
        clients = 8
        ev, _ = self.make_event("bench e2e", total)
        log("   quiescing, then measuring the background rate of transactions")
        if not self.quiesce(120):
            self.results["notes"].append("e2e: the stack was not quiet before the run")
        time.sleep(STATS_FLUSH_SECONDS)
        s_a = self.db_stats()
        time.sleep(8)
        s_b = self.db_stats()
        noise_rate = (s_b["xact_commit"] - s_a["xact_commit"]) / (s_b["t"] - s_a["t"])

        counter = itertools.count(1)
        statuses: dict[int, int] = {}
        errors: list[str] = []
        lock = threading.Lock()

        def client_loop(k: int) -> None:
            with http_client(self.stack.base_url, self.token(self.users[k])) as client:
                while (n := next(counter)) <= total:
                    status, _, head = post_purchase(client, event_id=ev, ref=f"S{n}")
                    with lock:
                        statuses[status] = statuses.get(status, 0) + 1
                        if status != 202 and len(errors) < 5:
                            errors.append(f"{status} {head}")

        log(f"   {total} purchases at {clients} clients")
        t_first = time.time()
        threads = [threading.Thread(target=client_loop, args=(k,), daemon=True)
                   for k in range(clients)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        t_sent = time.time()
        if statuses.get(202, 0) != total:
            raise PhaseFailed(f"e2e: statuses {statuses}: {errors}")
        deadline = time.monotonic() + (600 if self.full else 240)
        last = 0.0
        while True:
            confirmed, other_final, last_at = self.q1(
                "SELECT count(*) FILTER (WHERE state = 'CONFIRMED'),"
                " count(*) FILTER (WHERE state NOT IN ('CONFIRMED', 'PENDING', 'CHARGING')),"
                " extract(epoch FROM max(updated_at) FILTER (WHERE state = 'CONFIRMED'))"
                " FROM purchases_purchasesaga WHERE event_id = %s", [ev])
            if confirmed == total:
                break
            if other_final:
                raise PhaseFailed(f"e2e: {other_final} sagas ended elsewhere than CONFIRMED")
            if time.monotonic() > deadline:
                raise PhaseFailed(f"e2e: only {confirmed}/{total} confirmed in time")
            if time.monotonic() - last > 5:
                log(f"   e2e: {confirmed}/{total} confirmed")
                last = time.monotonic()
            self.stack.check_alive()
            time.sleep(0.2)
        seconds = float(last_at) - t_first
        rate = total / seconds
        log(f"   e2e: {total} confirmed in {seconds:.1f}s = {rate:.1f}/s "
            f"(requests took {t_sent - t_first:.1f}s)")
        quiet = self.quiesce(180)
        (emails_left,) = self.q1(
            "SELECT count(*) FROM outbox_outboxmessage WHERE event_id = %s"
            " AND completed_at IS NULL AND cancelled_at IS NULL", [ev])
        time.sleep(STATS_FLUSH_SECONDS)
        s_c = self.db_stats()
        commits = s_c["xact_commit"] - s_b["xact_commit"]
        noise = noise_rate * (s_c["t"] - s_b["t"])
        per_purchase = (commits - noise) / total
        rows_per_purchase = {}
        for table, after in s_c["tables"].items():
            before = s_b["tables"].get(table, {"ins": 0, "upd": 0, "hot_upd": 0, "del": 0})
            d = {k: after[k] - before[k] for k in after}
            if any(d.values()):
                rows_per_purchase[table] = {k: round(v / total, 2) for k, v in d.items() if v}
        log(f"   e2e: {per_purchase:.1f} committed transactions per purchase "
            f"(raw {commits}, background {noise:.0f})")

        log(f"   pgbench -N (built-in simple-update) at {clients} clients, {self.dur:.0f}s")
        pgb = self.run_pgbench(args=["-N", "-M", self.protocol, "-c", str(clients),
                                     "-j", str(clients), "-T", str(int(self.dur))],
                               db=PGBENCH_DB, timeout=self.dur + 120, tag="simple-update")
        reserve_txn = (self.results["figures"].get("1_reserve", {}).get("levels", {})
                       .get("4", {}).get("pgbench", {}).get("xact_commit_per_txn"))
        self.results["figures"]["2_e2e"] = {
            "purchases": total, "clients": clients, "seconds": seconds,
            "confirmed_per_s": rate, "request_phase_seconds": t_sent - t_first,
            "statuses": statuses, "quiesced": quiet, "outbox_rows_left": emails_left,
            "xact_commit_delta": commits, "background_xact_per_s": noise_rate,
            "background_xact": noise, "transactions_per_purchase": per_purchase,
            "rows_written_per_purchase": rows_per_purchase,
            "pgbench_simple_update": pgb,
            "reserve_transactions_per_request_pgbench": reserve_txn,
        }
        self.rows.append({"figure": "2 e2e confirmed purchases/s (c=8)",
                          "measured": f"{rate:.1f} /s",
                          "baseline": f"{pgb['tps']:.0f} tps pgbench -N",
                          "ratio": ratio(rate, pgb["tps"])})
        self.rows.append({"figure": "2 e2e transactions per purchase",
                          "measured": f"{per_purchase:.1f}",
                          "baseline": (f"{reserve_txn:.1f} per reserve (pgbench)"
                                       if reserve_txn else "n/a"),
                          "ratio": ratio(per_purchase, reserve_txn)})

    # ------------------------------------------------------------------------
    # Figure 4: timers
    # ------------------------------------------------------------------------

    def fig_timers(self) -> None:
        n = 10000
        window = 30.0 if self.full else 20.0
        lead = 5.0
        if self.full:
            n = 30000
        if not self.quiesce(120):
            self.results["notes"].append("timers: the stack was not quiet before the run")
        tag = uuid.uuid4().hex[:8]
        # due_at: what outbox_publish writes (the relay claims on it).
        self.q("INSERT INTO outbox_outboxmessage (topic, payload, key, event_id, saga_id,"
               " created_at, available_at, due_at, deliveries)"
               " SELECT 'bench.noop', '{}'::jsonb, 'bench-timer:' || %s || ':' || g, NULL, NULL,"
               " now(), t.at, t.at, 0"
               " FROM generate_series(1, %s) g,"
               " LATERAL (SELECT now() + make_interval(secs => %s + g * %s / %s) AS at) t",
               [tag, n, lead, window, n])
        log(f"   armed {n} timers due from +{lead:.0f}s to +{lead + window:.0f}s "
            "(topic bench.noop: no consumer, delivery only completes them)")
        where = "topic = 'bench.noop' AND key LIKE %s"
        like = f"bench-timer:{tag}:%"
        deadline = time.monotonic() + lead + window + (240 if self.full else 120)
        last = 0.0
        while True:
            fired, completed = self.q1(
                f"SELECT count(fired_at), count(completed_at) FROM outbox_outboxmessage"
                f" WHERE {where}", [like])
            if fired == n:
                break
            if time.monotonic() > deadline:
                raise PhaseFailed(f"timers: only {fired}/{n} fired in time")
            if time.monotonic() - last > 5:
                log(f"   timers: {fired}/{n} fired, {completed} completed")
                last = time.monotonic()
            self.stack.check_alive()
            time.sleep(0.5)
        drained = True
        # The deliveries trail behind (each is a Celery task); wait a bounded
        # time, then finish the bench's own leftovers by hand so that they are
        # not handed over again (OUTBOX_REDELIVER_SECONDS) mid-figure.
        deadline = time.monotonic() + (300 if self.full else 30)
        while True:
            (completed,) = self.q1(f"SELECT count(completed_at) FROM outbox_outboxmessage"
                                   f" WHERE {where}", [like])
            if completed == n:
                break
            if time.monotonic() > deadline:
                drained = False
                self.results["notes"].append(
                    f"timers: {completed}/{n} deliveries completed within the wait; the rest "
                    "were marked completed by the bench and their tasks purged")
                break
            if time.monotonic() - last > 5:
                log(f"   timers: {completed}/{n} deliveries completed")
                last = time.monotonic()
            time.sleep(0.5)
        stats = self.q1(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),"
            " percentile_cont(0.99) WITHIN GROUP (ORDER BY lag), max(lag), avg(lag),"
            " count(*) FILTER (WHERE lag < 0),"
            " percentile_cont(0.5) WITHIN GROUP (ORDER BY done),"
            " percentile_cont(0.99) WITHIN GROUP (ORDER BY done), max(done)"
            " FROM (SELECT extract(epoch FROM fired_at - available_at) AS lag,"
            "              extract(epoch FROM completed_at - available_at) AS done"
            "       FROM outbox_outboxmessage WHERE " + where + ") t", [like])
        p50, p99, mx, avg, early, d50, d99, dmax = (float(x) if x is not None else None
                                                    for x in stats)
        (redelivered,) = self.q1(f"SELECT count(*) FROM outbox_outboxmessage WHERE {where}"
                                 " AND deliveries > 1", [like])
        if not drained:
            self.q(f"UPDATE outbox_outboxmessage SET completed_at = now(), due_at = NULL"
                   f" WHERE {where} AND completed_at IS NULL", [like])
            self.purge_queue()
        poll = self.results["config"]["relay_poll_seconds"]
        self.results["figures"]["4_timers"] = {
            "timers": n, "window_s": window, "lead_s": lead, "relay_poll_seconds": poll,
            "fire_lag_s": {"p50": p50, "p99": p99, "max": mx, "mean": avg},
            "early_fires": int(early),
            "delivered_lag_s": {"p50": d50, "p99": d99, "max": dmax,
                                "of_completed_within_wait": completed},
            "all_delivered": drained,
            "handed_over_more_than_once": redelivered,
        }
        log(f"   timers: fire lag p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max "
            f"{mx * 1000:.0f} ms, early {int(early)}")
        self.rows += [
            {"figure": f"4 timers fire lag p50 ({n})", "measured": f"{p50 * 1000:.0f} ms",
             "baseline": f"{poll * 1000:.0f} ms poll", "ratio": ratio(p50, poll)},
            {"figure": "4 timers fire lag p99", "measured": f"{p99 * 1000:.0f} ms",
             "baseline": f"{poll * 1000:.0f} ms poll", "ratio": ratio(p99, poll)},
            {"figure": "4 timers fire lag max", "measured": f"{mx * 1000:.0f} ms",
             "baseline": f"{poll * 1000:.0f} ms poll", "ratio": ratio(mx, poll)},
            {"figure": "4 timers early fires", "measured": str(int(early)),
             "baseline": "0", "ratio": "ok" if int(early) == 0 else "FAIL"},
            {"figure": "4 timers handed to Celery more than once", "measured": str(redelivered),
             "baseline": "0", "ratio": ratio(redelivered, n)},
        ]

    # ------------------------------------------------------------------------
    # Figure 5: hot seat
    # ------------------------------------------------------------------------

    def fig_hot_seat(self) -> None:
        runs = 100 if self.full else 20
        buyers = 200
        seats = [f"A{i}" for i in range(1, 11)]
        events = [self.make_event(f"bench hot seat {r}", 10, prefix="A")[0] for r in range(runs)]
        start = threading.Barrier(buyers + 1, timeout=120)
        done = threading.Barrier(buyers + 1, timeout=120)
        results: list[list[tuple]] = [[] for _ in range(runs)]
        lock = threading.Lock()
        failures: list[str] = []

        def buyer(k: int) -> None:
            rng = random.Random(1000 + k)
            try:
                with http_client(self.stack.base_url, self.token(self.users[k])) as client:
                    for r in range(runs):
                        start.wait()
                        ref = rng.choice(seats)
                        status, secs, head = post_purchase(client, event_id=events[r], ref=ref)
                        with lock:
                            results[r].append((status, secs, ref, head))
                        done.wait()
            except threading.BrokenBarrierError:
                pass
            except Exception as exc:  # noqa: BLE001
                failures.append(f"buyer {k}: {type(exc).__name__}: {exc}")
                start.abort()
                done.abort()

        threads = [threading.Thread(target=buyer, args=(k,), daemon=True) for k in range(buyers)]
        for th in threads:
            th.start()
        per_run = []
        try:
            for r in range(runs):
                start.wait()
                done.wait()
                res = results[r]
                n202 = sum(1 for x in res if x[0] == 202)
                n409 = sum(1 for x in res if x[0] == 409)
                taken, links, sagas = self.q1(
                    "SELECT (SELECT count(*) FROM purchases_seat WHERE event_id = %(e)s"
                    "          AND status IN ('held', 'sold')),"
                    "       (SELECT count(*) FROM purchases_reservationseat WHERE event_id = %(e)s"
                    "          AND released_at IS NULL),"
                    "       (SELECT count(*) FROM purchases_purchasesaga WHERE event_id = %(e)s)",
                    {"e": events[r]})
                ok = n202 == 10 and n409 == buyers - 10 and taken == 10 and links == 10 \
                    and sagas == 10
                per_run.append({"run": r, "event": events[r], "202": n202, "409": n409,
                                "other": [x[0] for x in res if x[0] not in (202, 409)][:5],
                                "seats_taken": taken, "live_links": links, "sagas": sagas,
                                "ok": ok})
                if not ok:
                    log(f"!! hot seat run {r}: {per_run[-1]}")
                if (r + 1) % 5 == 0 or r + 1 == runs:
                    log(f"   hot seat: {r + 1}/{runs} runs, "
                        f"{sum(1 for p in per_run if p['ok'])} exactly 10 sold")
        finally:
            start.abort()
            done.abort()
            for th in threads:
                th.join(30)
        if failures:
            raise PhaseFailed(f"hot seat: {failures[:3]}")
        lat409 = [x[1] for res in results for x in res if x[0] == 409]
        lat202 = [x[1] for res in results for x in res if x[0] == 202]
        passed = sum(1 for p in per_run if p["ok"])
        s409, s202 = lat_summary(lat409), lat_summary(lat202)
        self.results["figures"]["5_hot_seat"] = {
            "runs": runs, "buyers": buyers, "seats": 10, "runs_exactly_10": passed,
            "latency_409": s409, "latency_202": s202, "per_run": per_run,
        }
        self.rows += [
            {"figure": "5 hot seat runs with exactly 10 sold", "measured": f"{passed}/{runs}",
             "baseline": f"{runs}/{runs}", "ratio": ratio(passed, runs)},
            {"figure": "5 hot seat 409 p50", "measured": f"{s409['p50_ms']:.0f} ms",
             "baseline": f"{s202['p50_ms']:.0f} ms (202s)", "ratio": ratio(s409["p50_ms"],
                                                                          s202["p50_ms"])},
            {"figure": "5 hot seat 409 p99", "measured": f"{s409['p99_ms']:.0f} ms",
             "baseline": f"{s202['p99_ms']:.0f} ms (202s)", "ratio": ratio(s409["p99_ms"],
                                                                          s202["p99_ms"])},
        ]
        if passed != runs:
            raise PhaseFailed(f"hot seat: only {passed}/{runs} runs sold exactly 10 seats")

    # ------------------------------------------------------------------------
    # Figure 3: gateway latency off the request path
    # ------------------------------------------------------------------------

    def fig_gateway(self) -> None:
        clients_list = [4, 16] if self.full else [4]
        fig = {}
        self.results["figures"]["3_gateway"] = fig
        for latency in (0, 300):
            if self.stack.latency_ms != latency:
                log(f"   restarting the fake gateway and the worker with "
                    f"FAKE_GATEWAY_LATENCY_MS={latency}")
                self.stack.stop("gateway")
                self.stack.stop("worker")
                self.purge_queue()
                self.stack.latency_ms = latency
                self.stack.start_gateway()
                self.stack.start_worker()
                self.stack.wait_web()
                self.stack.wait_worker(self.app)
            for c in clients_list:
                self.purge_queue()
                nseats = int(1000 * (self.warmup + self.dur)) + 1000
                ev, _ = self.make_event(f"bench gateway {latency} c{c}", nseats)
                m = self.closed_loop(label=f"gateway {latency}ms c={c}", clients=c,
                                     warmup=self.warmup, duration=self.dur, event_id=ev,
                                     nseats=nseats)
                (confirmed,) = self.q1("SELECT count(*) FROM purchases_purchasesaga"
                                       " WHERE event_id = %s AND state = 'CONFIRMED'", [ev])
                m["charged_during_run"] = confirmed
                fig[f"{latency}ms_c{c}"] = m
                log(f"   gateway {latency} ms c={c}: p50 {m['latency_202']['p50_ms']:.1f} ms, "
                    f"p99 {m['latency_202']['p99_ms']:.1f} ms, {confirmed} charged meanwhile")
        self.purge_queue()
        for c in clients_list:
            slow, fast = fig[f"300ms_c{c}"], fig[f"0ms_c{c}"]
            for p in ("p50", "p99"):
                self.rows.append({
                    "figure": f"3 reserve {p} gateway 300ms vs 0 (c={c})",
                    "measured": f"{slow['latency_202'][p + '_ms']:.1f} ms",
                    "baseline": f"{fast['latency_202'][p + '_ms']:.1f} ms",
                    "ratio": ratio(slow["latency_202"][p + "_ms"], fast["latency_202"][p + "_ms"]),
                })

    # ------------------------------------------------------------------------
    # Figure 6: sweeps at scale
    # ------------------------------------------------------------------------

    def capture_sweep_sql(self) -> dict[str, str]:
        """The exact statements the resumer, the chaser and the relay send,
        captured from the product's own functions (on the bench database)."""
        from django.conf import settings
        from django.db import connection
        from django.test.utils import CaptureQueriesContext
        from django.utils import timezone

        from outbox.relay import next_due_in, relay_claim
        from purchases.sweeps import stale_sagas, sweep_chase

        now = timezone.now()
        out = {}
        with CaptureQueriesContext(connection) as ctx:
            list(stale_sagas(older_than=settings.RESUME_AFTER_SECONDS, now=now)
                 .values_list("pk", "state"))
        out["resumer: stale_sagas"] = ctx.captured_queries[-1]["sql"]
        with CaptureQueriesContext(connection) as ctx:
            sweep_chase(now=now)
        chase = [q["sql"] for q in ctx.captured_queries
                 if q["sql"].startswith("SELECT") and '"purchases_purchasesaga"' in q["sql"]
                 and "FOR UPDATE" not in q["sql"]]
        for i, sql in enumerate(chase, 1):
            out[f"chaser: query {i}"] = sql
        with CaptureQueriesContext(connection) as ctx:
            relay_claim(now=now, limit=settings.OUTBOX_BATCH_SIZE)
        out["relay: relay_claim"] = next(q["sql"] for q in ctx.captured_queries
                                         if q["sql"].startswith("SELECT"))
        with CaptureQueriesContext(connection) as ctx:
            next_due_in(now=now)
        out["relay: next_due_in"] = ctx.captured_queries[-1]["sql"]
        connection.close()
        return out

    @staticmethod
    def _plan_nodes(node):
        yield node
        for child in node.get("Plans", []):
            yield from Bench._plan_nodes(child)

    def explain(self, conn, sql: str, repeat: int = 7) -> dict:
        times, plan = [], None
        for _ in range(repeat):
            with conn.transaction():
                row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql).fetchone()
                plan = row[0][0]
                times.append(plan["Execution Time"])
                raise_rollback(conn)
        root = plan["Plan"]
        scans = sorted({f"{n['Node Type']}:{n.get('Index Name') or n.get('Relation Name')}"
                        for n in self._plan_nodes(root) if "Scan" in n["Node Type"]})
        return {
            "exec_ms_median": statistics.median(times[1:]),
            "exec_ms_all": times,
            "buffers": root.get("Shared Hit Blocks", 0) + root.get("Shared Read Blocks", 0),
            "rows": root.get("Actual Rows"),
            "scans": scans,
        }

    def fig_sweeps(self) -> None:
        small = 10_000
        large = self.args.sweeps_large or 1_000_000
        queries = self.capture_sweep_sql()
        (self.logdir / "sweeps-captured.sql").write_text(
            "\n\n".join(f"-- {k}\n{v};" for k, v in queries.items()))
        conn = self.pg.connect(SWEEPS_DB)
        fig = {"queries": queries, "sizes": {}}
        self.results["figures"]["6_sweeps"] = fig
        try:
            sweeps_seed_live(conn)
            made = 0
            for size in (small, large):
                t = time.monotonic()
                log(f"   sweeps: generating {size - made:,} finished sagas (set-based)")
                sweeps_add_finished(conn, start=made, count=size - made,
                                    rebuild_indexes=(size - made) > 50_000)
                made = size
                gen_s = time.monotonic() - t
                log(f"   sweeps: {size:,} finished sagas in place ({gen_s:.0f}s); EXPLAIN ANALYZE")
                fig["sizes"][str(size)] = {
                    "generate_seconds": gen_s,
                    "plans": {name: self.explain(conn, sql) for name, sql in queries.items()},
                }
        finally:
            conn.close()
        label = f"{large // 1000}k" if large < 1_000_000 else f"{large / 1e6:g}M"
        for name in queries:
            a = fig["sizes"][str(small)]["plans"][name]
            b = fig["sizes"][str(large)]["plans"][name]
            seq = [s for s in b["scans"] if s.startswith("Seq Scan") and
                   ("purchasesaga" in s or "outboxmessage" in s)]
            self.rows.append({
                "figure": f"6 {name} @{label} vs 10k",
                "measured": f"{b['exec_ms_median']:.3f} ms {b['buffers']} buf",
                "baseline": f"{a['exec_ms_median']:.3f} ms {a['buffers']} buf",
                "ratio": ratio(b["exec_ms_median"], a["exec_ms_median"]),
                "note": "SEQ SCAN " + ",".join(seq) if seq else "",
            })
            log(f"   {name}: {a['exec_ms_median']:.3f} ms -> {b['exec_ms_median']:.3f} ms "
                f"({a['buffers']} -> {b['buffers']} buffers) {b['scans']}")

    # ------------------------------------------------------------------------
    # Output
    # ------------------------------------------------------------------------

    def extra_rows(self) -> None:
        figs = self.results["figures"]
        e2e, celery = figs.get("2_e2e"), figs.get("7_celery")
        if e2e and celery:
            self.rows.append({
                "figure": "2/7 e2e confirmed/s vs small-txn task/s",
                "measured": f"{e2e['confirmed_per_s']:.1f} /s",
                "baseline": f"{celery['small_txn']['per_s']:.0f} tasks/s",
                "ratio": ratio(e2e["confirmed_per_s"], celery["small_txn"]["per_s"]),
            })

    def write(self) -> None:
        self.extra_rows()
        self.results["finished_at"] = dt.datetime.now(dt.UTC).isoformat()
        self.results["table"] = self.rows
        self.results["logs"] = str(self.logdir)
        self.json_path.write_text(json.dumps(self.results, indent=2, default=str))

        def fmt(v):
            if isinstance(v, float):
                return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
            return "" if v is None else str(v)

        header = ("figure", "measured", "baseline", "ratio")
        body = [(r["figure"] + (f"  [{r['note']}]" if r.get("note") else ""),
                 fmt(r["measured"]), fmt(r["baseline"]), fmt(r["ratio"])) for r in self.rows]
        widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]
        line = "  ".join("-" * w for w in widths)
        print()
        print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
        print(line)
        for row in body:
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        print()
        print(f"results: {self.json_path.relative_to(ROOT)}  logs: {self.logdir.relative_to(ROOT)}")
        if self.results["failures"]:
            print("FAILED phases: " + ", ".join(f["phase"] for f in self.results["failures"]))
        sys.stdout.flush()


def raise_rollback(conn) -> None:
    """Leave ``with conn.transaction()`` by rolling back (EXPLAIN ANALYZE of a
    SELECT ... FOR UPDATE takes row locks; nothing is kept)."""
    from psycopg import Rollback

    raise Rollback()


# --------------------------------------------------------------------------
# Figure 6 data: set-based generation
# --------------------------------------------------------------------------


def sweeps_seed_live(conn) -> None:
    """A handful of live sagas and due outbox rows, so that every measured
    query finds something: 3 stale PENDING (one of them on a driving timer),
    1 COMPENSATION_PENDING past the deadline, 1 UNKNOWN_EXPIRED, 5 due rows."""
    with conn.transaction():
        conn.execute("INSERT INTO auth_user (password, is_superuser, username, first_name,"
                     " last_name, email, is_staff, is_active, date_joined)"
                     " VALUES ('!', false, 'sweeps', '', '', '', false, true, now())")
        conn.execute("INSERT INTO purchases_event (name, starts_at)"
                     " VALUES ('sweeps', now() + interval '30 days')")
        conn.execute("""
            WITH r AS (
              INSERT INTO purchases_reservation (ref, event_id, buyer_id, status,
                  hold_expires_at, total_amount, currency, created_at)
              SELECT 'L' || g, (SELECT max(id) FROM purchases_event),
                     (SELECT max(id) FROM auth_user), 'HELD', now() + interval '1 hour', 100,
                     'EUR', now() - interval '3 days'
              FROM generate_series(1, 5) g RETURNING id, ref
            )
            INSERT INTO purchases_purchasesaga (id, reservation_id, event_id, buyer_id,
                intent_id, payment_method, amount, currency, state, version, attempts,
                created_at, updated_at)
            SELECT gen_random_uuid(), r.id, (SELECT max(id) FROM purchases_event),
                   (SELECT max(id) FROM auth_user), 'pi_' || r.ref, 'pm_card_visa', 100, 'EUR',
                   (ARRAY['PENDING', 'PENDING', 'PENDING', 'COMPENSATION_PENDING',
                          'UNKNOWN_EXPIRED'])[substr(r.ref, 2)::int],
                   2, 1, now() - interval '3 days', now() - interval '2 days'
            FROM r
        """)
        conn.execute("""
            INSERT INTO outbox_outboxmessage (topic, payload, key, event_id, saga_id, created_at,
                available_at, due_at, deliveries)
            SELECT 'purchase.reconcile', '{}', 'reconcile:' || s.id, s.event_id, s.id, now(),
                   now() + interval '10 minutes', now() + interval '10 minutes', 0
            FROM purchases_purchasesaga s WHERE s.intent_id = 'pi_L1'
        """)
        conn.execute("""
            INSERT INTO outbox_outboxmessage (topic, payload, key, event_id, saga_id, created_at,
                available_at, due_at, deliveries)
            SELECT 'bench.noop', '{}', NULL, NULL, NULL, now() - interval '1 minute',
                   now() - interval '1 minute', now() - interval '1 minute', 0
            FROM generate_series(1, 5)
        """)


def sweeps_add_finished(conn, *, start: int, count: int, rebuild_indexes: bool) -> None:
    """``count`` finished sagas, half CONFIRMED and half COMPENSATED, each with
    its reservation and its two finished outbox rows (the hold timer,
    cancelled or fired; the PurchaseConfirmed / ReservationCancelled event,
    completed). Set-based; for big counts the plain (non-constraint) indexes
    are dropped and rebuilt with their exact definitions, and FK triggers are
    skipped (the rows reference an event and a user that exist)."""
    tables = ("purchases_reservation", "purchases_purchasesaga", "outbox_outboxmessage")
    saved = []
    conn.execute("SET maintenance_work_mem = '256MB'")
    with conn.transaction():
        if rebuild_indexes:
            saved = conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes i WHERE tablename = ANY(%s)"
                " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)",
                [list(tables)]).fetchall()
            for name, _ in saved:
                conn.execute(f'DROP INDEX "{name}"')
        (superuser,) = conn.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        if superuser:
            conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute("""
            WITH r AS (
              INSERT INTO purchases_reservation (ref, event_id, buyer_id, status,
                  hold_expires_at, total_amount, currency, created_at)
              SELECT 'X' || g, (SELECT max(id) FROM purchases_event),
                     (SELECT max(id) FROM auth_user),
                     CASE WHEN g %% 2 = 0 THEN 'CONFIRMED' ELSE 'CANCELLED' END,
                     now() - interval '1 day', 100, 'EUR', now() - interval '1 day'
              FROM generate_series(%s::bigint, %s::bigint) g RETURNING id, ref, status
            )
            INSERT INTO purchases_purchasesaga (id, reservation_id, event_id, buyer_id,
                intent_id, payment_method, amount, currency, state, version, attempts,
                created_at, updated_at)
            SELECT gen_random_uuid(), r.id, (SELECT max(id) FROM purchases_event),
                   (SELECT max(id) FROM auth_user), 'pi_' || r.ref, 'pm_card_visa', 100, 'EUR',
                   CASE WHEN r.status = 'CONFIRMED' THEN 'CONFIRMED' ELSE 'COMPENSATED' END,
                   4, 1, now() - interval '1 day', now() - interval '1 day'
            FROM r
        """, [start + 1, start + count])
        conn.execute("""
            INSERT INTO outbox_outboxmessage (topic, payload, key, event_id, saga_id, created_at,
                available_at, fired_at, handed_over_at, cancelled_at, completed_at, deliveries)
            SELECT 'purchase.hold_expired', '{}'::jsonb, 'hold:' || s.id, s.event_id, s.id,
                   s.created_at, s.created_at + interval '15 minutes',
                   CASE WHEN s.state = 'COMPENSATED' THEN s.updated_at END,
                   CASE WHEN s.state = 'COMPENSATED' THEN s.updated_at END,
                   CASE WHEN s.state = 'CONFIRMED' THEN s.updated_at END,
                   CASE WHEN s.state = 'COMPENSATED' THEN s.updated_at END,
                   CASE WHEN s.state = 'COMPENSATED' THEN 1 ELSE 0 END
            FROM purchases_purchasesaga s JOIN purchases_reservation r ON r.id = s.reservation_id
            WHERE r.ref LIKE 'X%%' AND substr(r.ref, 2)::bigint BETWEEN %s AND %s
            UNION ALL
            SELECT CASE WHEN s.state = 'CONFIRMED' THEN 'PurchaseConfirmed'
                        ELSE 'ReservationCancelled' END,
                   '{}'::jsonb, NULL, s.event_id, s.id,
                   s.updated_at, s.updated_at, s.updated_at, s.updated_at,  -- created..handed
                   NULL, s.updated_at, 1
            FROM purchases_purchasesaga s JOIN purchases_reservation r ON r.id = s.reservation_id
            WHERE r.ref LIKE 'X%%' AND substr(r.ref, 2)::bigint BETWEEN %s AND %s
        """, [start + 1, start + count, start + 1, start + count])
        for _, definition in saved:
            conn.execute(definition)
    for table in tables:
        conn.execute(f"VACUUM ANALYZE {table}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true",
                        help="long variants: 60 s runs, 2000 e2e purchases, 100 hot-seat runs, "
                             "30k timers, c=4 and 16 for the gateway figure")
    parser.add_argument("--phases", default="",
                        help="comma list of figures to run: reserve,celery,e2e,timers,hot,"
                             "gateway,sweeps (default: all)")
    parser.add_argument("--duration", type=float, default=0,
                        help="seconds per throughput measurement (default 12, --full 60)")
    parser.add_argument("--redis-db", type=int, default=14,
                        help="Redis database for the bench's broker (default 14)")
    parser.add_argument("--sweeps-large", type=int, default=0,
                        help="finished sagas for the large sweep measurement (default 1,000,000)")
    parser.add_argument("--reserve-clients", default="1,4,16",
                        help="client counts for figure 1 (default 1,4,16)")
    parser.add_argument("--web-workers", type=int, default=2,
                        help="gunicorn workers (default 2; for experiments)")
    parser.add_argument("--web-threads", type=int, default=8,
                        help="gunicorn threads per worker (default 8; for experiments)")
    parser.add_argument("--keep-dbs", action="store_true",
                        help=f"keep {SWEEPS_DB} and {PGBENCH_DB} ({BENCH_DB} is always kept)")
    args = parser.parse_args()
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    return Bench(args).run()


if __name__ == "__main__":
    sys.exit(main())
