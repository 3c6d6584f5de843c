"""Chaos harness: the whole boxoffice stack on servers it is allowed to break.

A disposable PostgreSQL and a disposable Redis (started here, on free ports,
in a temporary folder, so they may be restarted), gunicorn serving the API
and the fake gateway, Celery workers, the outbox relay and Celery beat with
fast sweeps, all as separate processes; a purchase load over HTTP; and the
faults: SIGKILL of worker children, Redis restarted empty, PostgreSQL
restarted, charges whose answer is lost after the charge landed, and a flaky
webhook receiver (``FlakyReceiver``, a thread of the test process) that
answers 500, hangs or goes down.

Nothing here imports Django at module level: the test process reads the
disposable database with psycopg, and the same file is run as a module for
two helper processes::

    python -m tests.chaos beat       # Celery beat, waking every second
    python -m tests.chaos watchdog   # stops PostgreSQL if the test process dies
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from standardwebhooks import Webhook

from devtools.processes import (
    ROOT,
    ProcessGroup,
    background_env,
    celery_worker_argv,
    children,
    die_with_parent,
    free_port,
    gunicorn_argv,
    listening,
    manage_argv,
    pg_bin,
    relay_argv,
    spawn,
    wait_until,
)

PAYMENT_METHODS = {
    # method: share of the purchases
    "pm_card_visa": 0.35,
    "pm_card_chargeDeclined": 0.15,
    "pm_card_timeout_charged": 0.15,
    "pm_card_timeout_not_charged": 0.15,
    "pm_card_unreachable": 0.20,
}
# Short timings so that a whole story fits in seconds; every one of them is an
# ordinary setting (README, "Settings").
SETTINGS: dict[str, Any] = {
    "PURCHASE_HOLD_SECONDS": 8,
    "RECONCILE_BACKOFF_SECONDS": "1,1,2,2,3,3",
    "RESUME_AFTER_SECONDS": 5,
    "PAYMENT_GATEWAY_TIMEOUT_SECONDS": 0.5,
    "FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS": 0.8,
    # Redeliveries 5 s apart, 20 hand-overs in all (then a dead letter).
    "OUTBOX_REDELIVER_SECONDS": ",".join(["5"] * 19),
    # A delivery killed with its worker is retried once its lease runs out.
    "OUTBOX_CLAIM_LEASE_SECONDS": 10,
    # An event whose hand-over on commit was lost with a killed process (or
    # its message with a killed worker) is the relay's after this.
    "OUTBOX_HAND_OVER_GRACE_SECONDS": 5,
    "COMPENSATION_DEADLINE_SECONDS": 30,
    "FAKE_GATEWAY_CHAOS_TIMEOUT_RATE": 0.3,
    "RESUME_SWEEP_SECONDS": 2,
    "CHASE_SWEEP_SECONDS": 5,
    # Outgoing webhooks to the flaky receiver on 127.0.0.1 (docs/api.md,
    # "Webhooks"). A hang holds a worker process this long, and the saga's
    # steps wait behind it on the same workers: short, so that the hangs do
    # not starve the purchases on the 2-core machines this runs on.
    "WEBHOOK_ALLOW_LOCAL_URLS": "true",
    "WEBHOOK_TIMEOUT_SECONDS": 0.5,
    # 20 retries (21 attempts) over 82 s. A delivery owes at most: the
    # attempts refused while the receiver is down (its longest outage is 21 s
    # in the long run: attempts at 0, 1, 2, 4, 6, 9, 12, 17 and 22 s, so 9
    # at most, fewer when the workers are busy), then the receiver's failures
    # in a row (at most FlakyReceiver.MAX_FAILURES = 3) and one success: 13,
    # with 8 to spare. So with the receiver back up every delivery ends
    # delivered, and one that ends failed is a bug, not bad luck.
    "WEBHOOK_RETRY_SECONDS": ",".join(["1", "1", "2", "2", "3", "3"] + ["5"] * 14),
}
WEBHOOK_TYPES = (
    "purchase.confirmed",
    "purchase.failed",
    "purchase.refunded",
    "purchase.needs_attention",
)
TERMINAL = ("CONFIRMED", "COMPENSATED")
ESCALATED = ("UNKNOWN_EXPIRED", "COMPENSATION_PENDING")


# --- disposable servers ----------------------------------------------------------


def _pg_bin(name: str) -> str:
    found = pg_bin(name)
    if not found:
        raise RuntimeError(f"no {name}: install PostgreSQL (apt-get install postgresql)")
    return found


def servers_available() -> str | None:
    """Why the chaos stack cannot run here, or None."""
    try:
        _pg_bin("pg_ctl")
        _pg_bin("initdb")
    except RuntimeError as exc:
        return str(exc)
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        return "no redis-server/redis-cli (apt-get install redis-server)"
    return None


class Postgres:
    """A throw-away cluster, run as ``postgres`` when we are root (it refuses root)."""

    def __init__(self, base: Path) -> None:
        self.dir = base / "pg"
        self.port = free_port()
        self.user = _whoami()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.pg_ctl = _pg_bin("pg_ctl")
        self.restarts = 0
        # (went down, came back), local time as the logs write it
        self.outages: list[tuple[datetime.datetime, datetime.datetime]] = []

    @property
    def url(self) -> str:
        return f"postgres://{self.user}@127.0.0.1:{self.port}/boxoffice"

    def _run(self, *argv: str, timeout: float = 60) -> None:
        subprocess.run(
            [*self.as_user, *argv],
            check=True,
            timeout=timeout,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def start(self) -> None:
        self.dir.mkdir(parents=True)
        if self.as_user:
            shutil.chown(self.dir, "postgres")
        self._run(_pg_bin("initdb"), "-D", str(self.dir), "-U", self.user, "--auth=trust")
        # fsync off: the data is thrown away; the restart we test is a
        # process restart (-m fast), which loses nothing that was committed.
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=300"
        )
        self._run(
            self.pg_ctl,
            "-D",
            str(self.dir),
            "-l",
            str(self.dir / "log"),
            "-w",
            "-o",
            options,
            "start",
        )
        import psycopg

        with psycopg.connect(self.url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as c:
            c.execute("CREATE DATABASE boxoffice")

    def restart(self) -> float:
        """``pg_ctl restart -m fast``: every connection is cut. Returns seconds down."""
        started = time.monotonic()
        down = datetime.datetime.now()
        self._run(
            self.pg_ctl,
            "-D",
            str(self.dir),
            "-l",
            str(self.dir / "log"),
            "-w",
            "-m",
            "fast",
            "restart",
        )
        self.restarts += 1
        self.outages.append((down, datetime.datetime.now()))
        return time.monotonic() - started

    def stop(self) -> None:
        if (self.dir / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                self._run(self.pg_ctl, "-D", str(self.dir), "-m", "immediate", "stop", timeout=30)


class Redis:
    """A throw-away Redis in the foreground (it dies with us), never saving."""

    def __init__(self, base: Path) -> None:
        self.dir = base
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = spawn(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            log=self.dir / "redis.log",
        )
        wait_until(lambda: listening(self.port), "Redis to listen", 10)

    def restart_empty(self, *, down_seconds: float = 1.0) -> None:
        """``shutdown nosave``, then a new empty server on the same port: every
        queued and unacknowledged task is gone."""
        subprocess.run(
            ["redis-cli", "-p", str(self.port), "shutdown", "nosave"],
            timeout=10,
            capture_output=True,
        )
        assert self.proc is not None  # started
        self.proc.wait(10)
        time.sleep(down_seconds)
        self.start()
        self.restarts += 1

    def queue_length(self, queue: str) -> int | None:
        done = subprocess.run(
            ["redis-cli", "-p", str(self.port), "llen", queue],
            capture_output=True,
            text=True,
            timeout=5,
        )
        try:
            return int(done.stdout.strip())
        except ValueError:
            return None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class LocalstripeServer:
    """A throw-away localstripe (Stripe's API, emulated: a dev dependency,
    docs/stripe.md, "Testing against localstripe") in the foreground, from
    scratch, for a Stripe-mode run: its PaymentIntents are that run's only."""

    def __init__(self, base: Path) -> None:
        self.dir = base
        self.port = free_port()
        self.executable = Path(sys.executable).with_name("localstripe")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @staticmethod
    def unavailable() -> str | None:
        """Why no localstripe can run here, or None."""
        if not Path(sys.executable).with_name("localstripe").exists():
            return "no localstripe in the virtualenv (make install: a dev dependency)"
        return None

    def start(self) -> None:
        self.proc = spawn(
            [str(self.executable), "--from-scratch", "--port", str(self.port)],
            log=self.dir / "localstripe.log",
        )
        wait_until(lambda: listening(self.port), "localstripe to listen", 30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _whoami() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


class Watchdog:
    """A helper process outside our process group that stops PostgreSQL (a
    daemon that ``pg_ctl`` detaches, so PDEATHSIG cannot reach it) and removes
    the folder if the test process dies without tearing down."""

    def __init__(self, *, pg: Postgres, folder: Path, log: Path) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.chaos",
                "watchdog",
                "--parent",
                str(os.getpid()),
                "--pgdata",
                str(pg.dir),
                "--pg-ctl",
                pg.pg_ctl,
                "--as-postgres",
                "1" if pg.as_user else "0",
                "--folder",
                str(folder),
            ],
            cwd=ROOT,
            stdout=open(log, "ab"),
            stderr=subprocess.STDOUT,  # noqa: SIM115
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def _watchdog_main(args) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while os.getppid() == args.parent:
        time.sleep(0.5)
    as_user = ["runuser", "-u", "postgres", "--"] if args.as_postgres == "1" else []
    subprocess.run(
        [*as_user, args.pg_ctl, "-D", args.pgdata, "-m", "immediate", "stop"],
        timeout=60,
        check=False,
    )
    shutil.rmtree(args.folder, ignore_errors=True)


# --- a flaky webhook receiver ------------------------------------------------------


@dataclass(frozen=True)
class Heard:
    """One request the receiver got, and what it answered."""

    webhook_id: str
    event_type: str | None
    saga_id: str | None
    verified: bool
    answer: str  # "204", "500", "hang" (no answer), "400" (bad signature)


class FlakyReceiver:
    """The seller's endpoint, a threaded HTTP server of the test process on
    127.0.0.1. Each request's signature is verified with the Standard Webhooks
    library and the request recorded; it is answered, at random, 500 for a
    third, nothing for a third (the handler sleeps past the stack's
    ``WEBHOOK_TIMEOUT_SECONDS``), 204 for the rest, except that one
    webhook-id is failed at most ``MAX_FAILURES`` times in a row and, once
    answered 204, is answered 204 again (a receiver that deduplicates by
    webhook-id). A bad signature gets 400. ``down()`` closes the listening
    socket (connections refused) until ``up()`` binds the same port again."""

    MAX_FAILURES = 3

    def __init__(self, *, hang_seconds: float) -> None:
        self.hang_seconds = hang_seconds
        self.lock = threading.Lock()
        self.heard: list[Heard] = []
        self.failures: Counter = Counter()  # webhook-id -> failures in a row
        self.accepted: set[str] = set()  # webhook-ids answered 204
        self.secret: str | None = None
        self.rng = random.Random(0)
        self.outages: list[list[datetime.datetime | None]] = []  # [down, up], UTC
        self.port = free_port()
        self.server: ThreadingHTTPServer | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/chaos-hook"

    def arm(self, *, secret: str, seed: int) -> None:
        self.secret, self.rng = secret, random.Random(seed)

    def up(self) -> None:
        if self.server is not None:
            return
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                answer = receiver._answer(body, {k.lower(): v for k, v in self.headers.items()})
                if answer == "hang":
                    time.sleep(receiver.hang_seconds)
                    self.close_connection = True
                    return  # the sender gave up already
                self.send_response(int(answer))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", self.port), Handler)
        threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="webhook-receiver",
            daemon=True,
        ).start()
        if self.outages and self.outages[-1][1] is None:
            self.outages[-1][1] = datetime.datetime.now(datetime.UTC)

    def down(self) -> None:
        """Stop listening: every connection is refused until ``up()``."""
        if self.server is None:
            return
        self.server.shutdown()
        self.server.server_close()
        self.server = None
        self.outages.append([datetime.datetime.now(datetime.UTC), None])

    @property
    def is_down(self) -> bool:
        return self.server is None

    def close(self) -> None:
        self.down()

    def _answer(self, body: bytes, headers: dict[str, str]) -> str:
        webhook_id = headers.get("webhook-id", "")
        try:
            if self.secret is None:
                raise LookupError("no secret yet")
            Webhook(self.secret).verify(body, headers)
            verified = True
        except Exception:  # any refusal of the library, or no secret yet
            verified = False
        try:
            message = json.loads(body)
            event_type, saga_id = message["type"], message["data"]["purchase"]["id"]
        except (ValueError, KeyError, TypeError):
            event_type = saga_id = None
        with self.lock:
            if not verified:
                answer = "400"
            elif webhook_id in self.accepted or self.failures[webhook_id] >= self.MAX_FAILURES:
                answer = "204"
            else:
                answer = self.rng.choice(("500", "hang", "204"))
            if answer == "204":
                self.accepted.add(webhook_id)
            else:
                self.failures[webhook_id] += 1
            self.heard.append(Heard(webhook_id, event_type, saga_id, verified, answer))
        return answer

    def answers(self) -> Counter:
        with self.lock:
            return Counter(h.answer for h in self.heard)


ENDPOINT_SCRIPT = """
import json, sys
from webhooks.services import webhook_endpoint_create

endpoint = webhook_endpoint_create(url={url!r}, events={events!r},
                                   description="chaos: a flaky receiver")
sys.stdout.write("ENDPOINT " + json.dumps({{"id": endpoint.pk, "secret": endpoint.secret}}))
"""


def create_endpoint(stack: ChaosStack, *, url: str, events=WEBHOOK_TYPES) -> dict:
    """An endpoint subscribed to ``events``, through the service (its URL
    checked with the stack's settings); returns its id and secret."""
    done = stack.manage("shell", "-c", ENDPOINT_SCRIPT.format(url=url, events=list(events)))
    return json.loads(done.stdout.split("ENDPOINT ", 1)[1])


# --- the stack --------------------------------------------------------------------


class ChaosStack(ProcessGroup):
    """web (gunicorn), workers, relay and beat on the disposable servers."""

    def __init__(self, *, workdir: Path, pg: Postgres, redis: Redis, settings: dict) -> None:
        self.workdir = workdir
        self.mail_dir = workdir / "mail"
        self.mail_dir.mkdir(parents=True, exist_ok=True)
        self.web_port = free_port()
        self.queue = f"boxoffice-chaos-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.webhook_queue = f"{self.queue}-webhooks"
        self.refund_queue = f"{self.queue}-refunds"
        self.base_url = f"http://127.0.0.1:{self.web_port}"
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTEST", "DJANGO", "CELERY", "EMAIL", "CACHE"))
        }
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "config.settings",
                "DEBUG": "false",
                "SECRET_KEY": "x",
                "ALLOWED_HOSTS": "127.0.0.1",
                "FAKE_GATEWAY_ENABLED": "true",
                "PURCHASE_THROTTLE_RATE": "1000000/min",
                # Off: the chaos loses answers and restarts the gateway on
                # purpose, which would pause payments (tests/test_breaker.py).
                "PAYMENT_BREAKER_ENABLED": "false",
                "DATABASE_URL": pg.url,
                "CELERY_BROKER_URL": redis.url,
                "REDIS_URL": redis.url,
                "CELERY_TASK_DEFAULT_QUEUE": self.queue,
                "CELERY_WEBHOOK_QUEUE": self.webhook_queue,
                "CELERY_REFUND_QUEUE": self.refund_queue,
                "PAYMENT_GATEWAY_URL": f"{self.base_url}/fake-gateway/v1",
                "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
                "EMAIL_FILE_PATH": str(self.mail_dir),
                "BOXOFFICE_VAR_DIR": str(workdir / "var"),
                "PYTHONUNBUFFERED": "1",
                "LOG_LEVEL": "INFO",
                **{k: str(v) for k, v in settings.items()},
            }
        )
        super().__init__(workdir, env)
        self.kills: list[tuple[float, str, int]] = []
        # (name, exit code, log tail) of every process that died on its own
        self.crashes: list[tuple[str, int, str]] = []

    # processes

    def manage(self, *args: str, timeout: float = 120, check: bool = True):
        return subprocess.run(
            manage_argv(*args),
            cwd=ROOT,
            env=self.env,
            timeout=timeout,
            capture_output=True,
            text=True,
            check=check,
            preexec_fn=die_with_parent,
        )

    def start_web(self, *, workers: int = 2, threads: int = 16) -> None:
        self.start(
            "web",
            gunicorn_argv(
                port=self.web_port,
                workers=workers,
                threads=threads,
                extra=[
                    "--timeout",
                    "60",
                    "--graceful-timeout",
                    "5",
                    "--access-logfile",
                    "-",
                    "--access-logformat",
                    "%(m)s %(U)s %(s)s %(L)s",
                ],
            ),
        )

    def start_worker(self, name: str, concurrency: int = 2) -> None:
        """A saga pool that consumes money back's queue too (its own pool in
        production): every pool the chaos kills may hold a refund."""
        self.start(
            name,
            celery_worker_argv(
                queue=f"{self.queue},{self.refund_queue}",
                concurrency=concurrency,
                hostname=f"{name}@%h",
            ),
            env=background_env(self.env),
        )

    def start_webhook_worker(self, name: str = "webhooks", concurrency: int = 2) -> None:
        """The pool of webhook attempts (settings.CELERY_WEBHOOK_QUEUE)."""
        self.start(
            name,
            celery_worker_argv(
                queue=self.webhook_queue, concurrency=concurrency, hostname=f"{name}@%h"
            ),
            env=background_env(self.env),
        )

    def start_relay(self) -> None:
        self.start("relay", relay_argv(poll=0.5), env=background_env(self.env))

    def start_beat(self) -> None:
        self.start(
            "beat", [sys.executable, "-m", "tests.chaos", "beat"], env=background_env(self.env)
        )

    def wait_ready(self, timeout: float = 60) -> None:
        import httpx

        def web_up() -> bool:
            try:
                return httpx.get(f"{self.base_url}/api/events/", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        def ready(name: str) -> bool:
            return " ready." in self.log(name)

        self.wait_for(web_up, "gunicorn to answer", timeout, every=0.3)
        for name in self.procs:
            if name.startswith("worker"):
                self.wait_for(
                    functools.partial(ready, name), f"{name} to be ready", timeout, every=0.3
                )

    def supervise(self) -> list[str]:
        """Start again every process that exited, as a supervisor would
        (Compose: ``restart: unless-stopped``), and remember the crash: the
        run goes on so that what follows a crash is tested too, and the crash
        is reported as a failure. Returns the names restarted."""
        restarted = []
        for name, code in self.dead().items():
            self.crashes.append((name, code, self.log(name)[-3000:]))
            self.start(
                name,
                self.argv[name],
                env=self.envs[name],
                header=f"\n=== exited with {code}; restarted by the harness ===\n",
            )
            restarted.append(name)
        return restarted

    def worker_children(self, name: str) -> list[int]:
        return children(self.procs[name].pid)

    def kill_worker_child(self, rng: random.Random) -> tuple[str, int] | None:
        """SIGKILL one pool process of a random worker (never the master)."""
        workers = [n for n in self.procs if n.startswith("worker")]
        rng.shuffle(workers)
        for name in workers:
            children = self.worker_children(name)
            if children:
                pid = rng.choice(children)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    self.kills.append((time.monotonic(), name, pid))
                    return name, pid
        return None

    def kill_all_worker_children(self) -> list[tuple[str, int]]:
        """SIGKILL every pool process of every worker at once (the masters
        start new ones): each task running is cut wherever it was. Returns
        (worker, pid) of each process killed."""
        killed = []
        for name in sorted(n for n in self.procs if n.startswith("worker")):
            for pid in self.worker_children(name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    self.kills.append((time.monotonic(), name, pid))
                    killed.append((name, pid))
        return killed

    def kill_and_restart(self, name: str, *, down_seconds: float = 1.0) -> int:
        """SIGKILL the process ``name`` with its whole process group (as the
        kernel's OOM killer or a lost container would), leave it down for
        ``down_seconds``, then start it again as a supervisor would. Not a
        crash (``supervise`` never sees it dead). Returns the pid killed."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self.kills.append((time.monotonic(), name, proc.pid))
        time.sleep(down_seconds)
        self.start(
            name,
            self.argv[name],
            env=self.envs[name],
            header=f"\n=== SIGKILLed by the harness; started again after {down_seconds:g}s ===\n",
        )
        return proc.pid

    def stop(self, name: str | None = None, *, first: Iterable[str] = ()) -> None:
        super().stop(
            name,
            first=(
                *first,
                "beat",
                "relay",
                *sorted(n for n in self.procs if n.startswith("worker")),
                "web",
            ),
        )

    # logs and mail

    def grep(self, needle: str, limit: int = 60) -> str:
        lines = []
        for path in sorted(self.workdir.glob("*.log")):
            for line in path.read_text(errors="replace").splitlines():
                if needle in line:
                    lines.append(f"{path.stem}: {line}")
        return "\n".join(lines[:limit])

    # A task that failed because its process's database connection is dead.
    DEAD_CONNECTION = re.compile(
        r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+): \w+/(ForkPoolWorker-\d+)\] .*"
        r"OperationalError\('(the connection is (?:closed|lost)|terminating connection[^']*)",
        re.M,
    )

    def dead_connection_errors(
        self, *, after: datetime.datetime, before: datetime.datetime | None = None
    ) -> list[str]:
        """Task runs between ``after`` and ``before`` that failed on a dead
        database connection, per pool process: "worker/process: first..last (count)"."""
        spans: dict[str, list] = {}
        for name in sorted(n for n in self.procs if n.startswith("worker")):
            for at, process, _ in self.DEAD_CONNECTION.findall(self.log(name)):
                # Milliseconds count: a task that met the next restart must
                # not be dated into the window before it.
                when = datetime.datetime.strptime(at, "%Y-%m-%d %H:%M:%S,%f")
                if when > after and (before is None or when < before):
                    span = spans.setdefault(f"{name}/{process}", [when, when, 0])
                    span[1] = when
                    span[2] += 1
        return [
            f"{k}: {a:%H:%M:%S}..{b:%H:%M:%S} ({n} task runs)" for k, (a, b, n) in spans.items()
        ]

    def task_results(self) -> Counter:
        """(task, result) -> count, from the workers' "succeeded" log lines."""
        found: Counter[tuple[str, str]] = Counter()
        pattern = re.compile(r"Task ([\w.]+)\[[^\]]+\] succeeded in [\d.]+s: '?([\w]+)")
        for path in self.workdir.glob("worker*.log"):
            for task, result in pattern.findall(path.read_text(errors="replace")):
                found[task, result if not result.isdigit() else "ok"] += 1
        return found

    def emails_by_saga(self) -> dict[str, list[str]]:
        """saga id -> subjects of the emails sent about it (the file backend's
        output), one per Message-ID: a resend after a crash between sending
        and the inbox write carries the first send's Message-ID, so it is the
        same email to every mail server and client."""
        out: dict[str, list[str]] = defaultdict(list)
        seen: set[str] = set()
        self.resends = 0
        for path in sorted(self.mail_dir.glob("*")):
            for message in path.read_text(errors="replace").split("-" * 79):
                subject = re.search(r"^Subject: (.*)$", message, re.M)
                ref = re.search(r"Reference ([0-9a-f-]{36})", message)
                # A long Message-ID (a refund's) is folded onto the next line.
                mid = re.search(r"^Message-ID:[ \t]*(?:\n[ \t]+)?(\S.*)$", message, re.M | re.I)
                if not (subject and ref):
                    continue
                if mid and mid.group(1) in seen:
                    self.resends += 1
                    continue
                if mid:
                    seen.add(mid.group(1))
                out[ref.group(1)].append(subject.group(1))
        return out


# --- seed, load ----------------------------------------------------------------------


SEED_SCRIPT = """
import json, sys
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from rest_framework.authtoken.models import Token
from organizers.models import Organizer
from purchases.services import event_create_with_seats

users, rows, per_row = {users}, {rows!r}, {per_row}
organizer, _ = Organizer.objects.get_or_create(slug="chaos", defaults={{"name": "chaos venue"}})
event = event_create_with_seats(organizer=organizer, name="chaos night", starts_at=timezone.now(),
                                rows=rows, seats_per_row=per_row, price_amount=2500)
tokens = []
with transaction.atomic():
    for n in range(users):
        user = get_user_model().objects.create(username=f"chaos{{n}}",
                                               email=f"chaos{{n}}@example.com")
        tokens.append(Token.objects.create(user=user).key)
refs = list(event.seats.order_by("id").values_list("ref", flat=True))
sys.stdout.write("SEED " + json.dumps({{"event": event.pk, "tokens": tokens, "seats": refs}}))
"""


def seed(stack: ChaosStack, *, users: int, rows: str, per_row: int) -> dict:
    done = stack.manage("shell", "-c", SEED_SCRIPT.format(users=users, rows=rows, per_row=per_row))
    return json.loads(done.stdout.split("SEED ", 1)[1])


@dataclass
class LoadStats:
    requests: Counter = field(default_factory=Counter)  # "202", "409", "500", "connect_error"...
    sagas: dict = field(default_factory=dict)  # saga id -> payment method
    replays: int = 0
    replay_mismatches: list = field(default_factory=list)
    reused_key_refusals: int = 0
    reused_key_wrong: list = field(default_factory=list)


class PurchaseLoad:
    """Threads that buy seats over HTTP, with every test payment method, as
    many users; some requests repeat their Idempotency-Key (same body: must
    replay the same purchase; another body: must be refused with 422)."""

    def __init__(
        self,
        *,
        base_url: str,
        seed_data: dict,
        threads: int,
        mean_gap: float,
        rng_seed: int,
        hot_seats: int = 12,
        methods: dict[str, float] | None = None,
    ) -> None:
        self.base_url = base_url
        # payment method -> share of the purchases (the fake's test cards
        # unless given: the Stripe-mode run buys with localstripe's)
        self.methods = methods or PAYMENT_METHODS
        self.event = seed_data["event"]
        self.tokens = seed_data["tokens"]
        self.seats = seed_data["seats"]
        self.hot = self.seats[:hot_seats]
        self.threads_n = threads
        self.mean_gap = mean_gap
        self.rng_seed = rng_seed
        self.stats = LoadStats()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for n in range(self.threads_n):
            t = threading.Thread(
                target=self._run,
                args=(random.Random(self.rng_seed + n),),
                name=f"load-{n}",
                daemon=True,
            )
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(30)

    def _count(self, key: str) -> None:
        with self.lock:
            self.stats.requests[key] += 1

    def _post(self, client, token: str, key: str, body: dict):
        import httpx

        try:
            answer = client.post(
                "/api/purchases/",
                json=body,
                headers={"Authorization": f"Token {token}", "Idempotency-Key": key},
            )
        except httpx.HTTPError as exc:
            self._count(type(exc).__name__)
            return None
        self._count(str(answer.status_code))
        return answer

    def _run(self, rng: random.Random) -> None:
        import httpx

        methods, weights = zip(*self.methods.items(), strict=True)
        with httpx.Client(base_url=self.base_url, timeout=15) as client:
            while not self.stopping.is_set():
                token = rng.choice(self.tokens)
                method = rng.choices(methods, weights)[0]
                pool = self.hot if rng.random() < 0.2 else self.seats
                seats = rng.sample(pool, rng.choice((1, 1, 2)))
                body = {"event": self.event, "seats": seats, "payment_method": method}
                key = f"chaos-{uuid.uuid4()}"
                answer = self._post(client, token, key, body)
                if answer is not None and answer.status_code == 202:
                    saga_id = answer.json()["id"]
                    with self.lock:
                        self.stats.sagas[saga_id] = method
                    roll = rng.random()
                    if roll < 0.10:
                        self._replay(client, token, key, body, answer)
                    elif roll < 0.13:
                        self._reuse_with_other_body(client, token, key, body)
                self.stopping.wait(rng.uniform(0, 2 * self.mean_gap))

    def _replay(self, client, token, key, body, first) -> None:
        again = self._post(client, token, key, body)
        if again is None or again.status_code >= 500:
            return  # the server could not answer (a restart): proves nothing
        with self.lock:
            self.stats.replays += 1
            if again.status_code != 202 or again.content != first.content:
                self.stats.replay_mismatches.append(
                    (key, first.status_code, first.text[:200], again.status_code, again.text[:200])
                )

    def _reuse_with_other_body(self, client, token, key, body) -> None:
        # Another of the load's methods (with the fake's cards:
        # pm_card_chargeDeclined for pm_card_visa, as before).
        another = next(m for m in self.methods if m != "pm_card_visa")
        other = {
            **body,
            "payment_method": "pm_card_visa"
            if body["payment_method"] != "pm_card_visa"
            else another,
        }
        again = self._post(client, token, key, other)
        if again is None or again.status_code >= 500:
            return
        with self.lock:
            if again.status_code == 422:
                self.stats.reused_key_refusals += 1
            else:
                self.stats.reused_key_wrong.append((key, again.status_code, again.text[:200]))


# --- reading the disposable database ---------------------------------------------


class Db:
    """Short autocommit connections (the server may have been restarted)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def rows(self, sql: str, params=()) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    def unsettled(self) -> tuple[int, int]:
        """(sagas neither terminal nor escalated, outbox rows due and not done)."""
        live = self.rows(
            "SELECT count(*) FROM purchases_purchasesaga WHERE state <> ALL(%s)",
            (list(TERMINAL + ESCALATED),),
        )[0][0]
        due = self.rows(
            "SELECT count(*) FROM outbox_outboxmessage WHERE completed_at IS NULL "
            "AND cancelled_at IS NULL AND available_at <= now()"
        )[0][0]
        return live, due

    def pending_deliveries(self) -> int:
        """Webhook deliveries still owed an attempt."""
        return self.rows("SELECT count(*) FROM webhooks_webhookdelivery WHERE status = 'pending'")[
            0
        ][0]

    def webhook_deliveries(self) -> list[tuple[str, str, str, str, int]]:
        """(saga id, type, status, webhook-id, attempts) of every delivery."""
        return [
            (str(saga_id), *rest)
            for saga_id, *rest in self.rows(
                "SELECT saga_id, event_type, status, message_id, armed_attempt "
                "FROM webhooks_webhookdelivery ORDER BY id"
            )
        ]

    def webhook_attempts(self) -> list[tuple[datetime.datetime, int | None, str]]:
        """(started at, status code, error) of every attempt."""
        return self.rows("SELECT at, status_code, error FROM webhooks_webhookattempt")

    def webhook_owed(self) -> dict[str, set[str]]:
        """saga id -> the webhook types it owes a subscriber to all of them,
        from the tables (docs/api.md, "Webhooks"): confirmed if it ever was
        CONFIRMED; refunded or failed if COMPENSATED, as the ledger holds a
        refund or not; refunded too if CONFIRMED and its refund rows that
        succeeded give back all it cost (docs/refunds.md); needs_attention if
        an alert named it."""
        owed: dict[str, set[str]] = {}
        for saga_id, state, confirmed, refunded, alerted, given_back in self.rows(
            "SELECT s.id, s.state, "
            "EXISTS (SELECT 1 FROM purchases_sagahistory h WHERE h.saga_id = s.id "
            "        AND h.to_state = 'CONFIRMED'), "
            "EXISTS (SELECT 1 FROM ledger_ledgerentry l WHERE l.intent_id = s.intent_id "
            "        AND l.kind = 'refund'), "
            "EXISTS (SELECT 1 FROM outbox_outboxmessage o WHERE o.saga_id = s.id "
            "        AND o.topic = 'purchase.needs_operator'), "
            "(SELECT coalesce(sum(r.amount), 0) >= s.amount FROM purchases_refund r "
            " WHERE r.saga_id = s.id AND r.event_id = s.event_id AND r.status = 'succeeded') "
            "FROM purchases_purchasesaga s"
        ):
            types = set()
            if confirmed:
                types.add("purchase.confirmed")
            if state == "COMPENSATED":
                types.add("purchase.refunded" if refunded else "purchase.failed")
            if state == "CONFIRMED" and given_back:
                types.add("purchase.refunded")
            if alerted:
                types.add("purchase.needs_attention")
            owed[str(saga_id)] = types
        return owed

    def outcomes(self) -> dict[str, Counter]:
        out: dict[str, Counter] = defaultdict(Counter)
        for method, state, n in self.rows(
            "SELECT payment_method, state, count(*) FROM purchases_purchasesaga "
            "GROUP BY 1, 2 ORDER BY 1, 2"
        ):
            out[method][state] = n
        return out

    def settle_times(self) -> list[tuple[str, str, float]]:
        """(saga id, state, seconds from start to its first terminal or escalated state)."""
        return [
            (str(saga_id), state, seconds)
            for saga_id, state, seconds in self.rows(
                "SELECT s.id, s.state, EXTRACT(EPOCH FROM min(h.at) - s.created_at) "
                "FROM purchases_purchasesaga s JOIN purchases_sagahistory h ON h.saga_id = s.id "
                "WHERE h.to_state = ANY(%s) GROUP BY s.id, s.state, s.created_at",
                (list(TERMINAL + ESCALATED),),
            )
        ]

    def states(self) -> dict[str, str]:
        return {str(i): s for i, s in self.rows("SELECT id, state FROM purchases_purchasesaga")}

    def fake_gateway_checks(self) -> list[str]:
        """The fake gateway's charges against the ledger: at most one charge
        per intent, the ledger's net equal to what the gateway holds (its
        charge, less its refunds that succeeded: ``fake_gateway_fakerefund``,
        the whole-charge refund of a compensation among them)."""
        problems = []
        for intent, n in self.rows(
            "SELECT intent_id, count(*) FROM fake_gateway_fakecharge GROUP BY 1 HAVING count(*) > 1"
        ):
            problems.append(f"{intent}: {n} charges at the gateway")
        for intent, ledger, gateway in self.rows(
            """
            WITH l AS (SELECT intent_id, sum(amount) AS net FROM ledger_ledgerentry GROUP BY 1),
                 c AS (SELECT intent_id, sum(amount) AS net FROM fake_gateway_fakecharge
                       GROUP BY 1),
                 r AS (SELECT intent_id, sum(amount) AS net FROM fake_gateway_fakerefund
                       WHERE status = 'succeeded' GROUP BY 1),
                 g AS (SELECT c.intent_id, c.net - coalesce(r.net, 0) AS net
                       FROM c LEFT JOIN r ON r.intent_id = c.intent_id)
            SELECT coalesce(l.intent_id, g.intent_id), coalesce(l.net, 0), coalesce(g.net, 0)
            FROM l FULL JOIN g ON l.intent_id = g.intent_id
            WHERE coalesce(l.net, 0) <> coalesce(g.net, 0)
            """
        ):
            problems.append(f"{intent}: ledger net {ledger} != gateway captured {gateway}")
        return problems

    def independent_checks(self, *, fake_gateway: bool = True) -> list[str]:
        """The money and seat invariants straight from the tables, as a second
        opinion beside the auditor (which reads the gateway through its API).
        ``fake_gateway=False`` (a run against another processor, whose
        records are not in our tables): the seats and the ledger only."""
        problems = self.fake_gateway_checks() if fake_gateway else []
        # A refund that releases seats ends their links (the purchase stays
        # CONFIRMED) and the seat may be sold again: live links only.
        for ref, n in self.rows(
            "SELECT s.ref, count(*) FROM purchases_reservationseat rs "
            "JOIN purchases_seat s ON s.id = rs.seat_id "
            "JOIN purchases_reservation r ON r.id = rs.reservation_id "
            "WHERE r.status = 'CONFIRMED' AND rs.released_at IS NULL "
            "GROUP BY s.id, s.ref HAVING count(*) > 1"
        ):
            problems.append(f"seat {ref} sold to {n} confirmed reservations")
        # A CONFIRMED saga stays CONFIRMED when money goes back: one ledger
        # refund entry per refund row that succeeded (docs/refunds.md).
        for saga_id, state, charges, refunds, succeeded in self.rows(
            "SELECT s.id, s.state, "
            "count(*) FILTER (WHERE l.kind = 'charge'), count(*) FILTER (WHERE l.kind = 'refund'), "
            "(SELECT count(*) FROM purchases_refund r WHERE r.saga_id = s.id "
            " AND r.event_id = s.event_id AND r.status = 'succeeded') "
            "FROM purchases_purchasesaga s LEFT JOIN ledger_ledgerentry l "
            "ON l.intent_id = s.intent_id WHERE s.state IN ('CONFIRMED', 'COMPENSATED') "
            "GROUP BY s.id, s.state, s.event_id"
        ):
            if state == "CONFIRMED" and (charges, refunds) != (1, succeeded):
                problems.append(
                    f"saga {saga_id} CONFIRMED with {charges} charge(s), "
                    f"{refunds} refund(s) in the ledger"
                    + (f" for {succeeded} refund(s) that succeeded" if succeeded else "")
                )
            if state == "COMPENSATED" and charges != refunds:
                problems.append(
                    f"saga {saga_id} COMPENSATED with {charges} charge(s), "
                    f"{refunds} refund(s) in the ledger"
                )
        return problems

    def export(self, path: Path) -> None:
        """Every saga with its history, as JSON, for reading after the run."""
        sagas = {}
        for saga_id, state, method, intent, created in self.rows(
            "SELECT id, state, payment_method, intent_id, created_at FROM purchases_purchasesaga"
        ):
            sagas[str(saga_id)] = {
                "state": state,
                "method": method,
                "intent": intent,
                "created": created.isoformat(),
                "history": [],
            }
        for saga_id, at, frm, to, actor, reason in self.rows(
            "SELECT saga_id, at, from_state, to_state, actor, reason FROM purchases_sagahistory "
            "ORDER BY at, id"
        ):
            sagas[str(saga_id)]["history"].append([at.isoformat(), frm, to, actor, reason])
        path.write_text(json.dumps(sagas, indent=1))

    def dossier(self, saga_id: str) -> str:
        """Everything the tables know about one saga, for a failure report."""
        found = self.rows(
            "SELECT id, state, version, payment_method, intent_id, created_at, updated_at "
            "FROM purchases_purchasesaga WHERE id = %s",
            (saga_id,),
        )
        if not found:
            return f"saga {saga_id}: no such saga"
        (saga,) = found
        lines = [
            f"saga {saga[0]} {saga[1]} v{saga[2]} {saga[3]} {saga[4]} "
            f"created {saga[5]:%H:%M:%S.%f} updated {saga[6]:%H:%M:%S.%f}",
            "  history:",
        ]
        for at, frm, to, actor, reason in self.rows(
            "SELECT at, from_state, to_state, actor, reason FROM purchases_sagahistory "
            "WHERE saga_id = %s ORDER BY at, id",
            (saga_id,),
        ):
            lines.append(f"    {at:%H:%M:%S.%f} {frm or '-'} -> {to} [{actor}] {reason}")
        lines.append("  gateway answers:")
        for at, asked, answer, detail, attempt in self.rows(
            "SELECT at, asked, answer, detail, attempt FROM purchases_gatewayanswer "
            "WHERE saga_id = %s ORDER BY at, id",
            (saga_id,),
        ):
            lines.append(f"    {at:%H:%M:%S.%f} {asked} -> {answer} ({detail}) attempt {attempt}")
        lines.append("  outbox:")
        for row in self.rows(
            "SELECT id, topic, key, available_at, fired_at, handed_over_at, completed_at, "
            "cancelled_at, deliveries FROM outbox_outboxmessage WHERE saga_id = %s ORDER BY id",
            (saga_id,),
        ):
            stamp = [f"{t:%H:%M:%S.%f}" if t else "-" for t in row[3:8]]
            lines.append(
                f"    #{row[0]} {row[1]} {row[2]} due {stamp[0]} fired {stamp[1]} "
                f"handed {stamp[2]} done {stamp[3]} cancelled {stamp[4]} "
                f"deliveries {row[8]}"
            )
        lines.append("  gateway requests:")
        for created, endpoint, status, timed_out in self.rows(
            "SELECT r.created, r.endpoint, r.status_code, r.timed_out "
            "FROM fake_gateway_fakerequest r WHERE r.intent_id = %s ORDER BY r.id",
            (saga[4],),
        ):
            lines.append(
                f"    {created:%H:%M:%S.%f} {endpoint} -> {status}"
                + (" (timed out)" if timed_out else "")
            )
        lines.append("  webhooks:")
        for delivery_id, event_type, status, message_id in self.rows(
            "SELECT id, event_type, status, message_id FROM webhooks_webhookdelivery "
            "WHERE saga_id = %s ORDER BY id",
            (saga_id,),
        ):
            lines.append(f"    {event_type} {message_id} {status}")
            for number, at, code, error in self.rows(
                "SELECT number, at, status_code, error FROM webhooks_webhookattempt "
                "WHERE delivery_id = %s ORDER BY number",
                (delivery_id,),
            ):
                lines.append(f"      #{number} {at:%H:%M:%S.%f} -> {code or '-'} {error}")
        lines.append("  ledger:")
        for kind, amount, at in self.rows(
            "SELECT kind, amount, created_at FROM ledger_ledgerentry WHERE intent_id = %s "
            "ORDER BY id",
            (saga[4],),
        ):
            lines.append(f"    {at:%H:%M:%S.%f} {kind} {amount}")
        return "\n".join(lines)


# --- webhooks, from the tables and from the receiver ------------------------------


def webhook_problems(db: Db, receiver: FlakyReceiver) -> tuple[list[str], set[str]]:
    """With one endpoint subscribed to every type and the receiver up again:
    every saga has exactly the deliveries its story owes (``Db.webhook_owed``),
    none of a type that contradicts it, each delivered; the receiver heard one
    webhook-id per (saga, type), the delivery's, answered 204 at least once;
    and every request it got was signed right. Returns (problems, sagas)."""
    problems: list[str] = []
    suspects: set[str] = set()
    owed = db.webhook_owed()
    deliveries = db.webhook_deliveries()
    got: dict[str, set[str]] = defaultdict(set)
    for saga_id, event_type, status, message_id, attempts in deliveries:
        got[saga_id].add(event_type)
        if status != "delivered":
            problems.append(
                f"webhook: {event_type} for saga {saga_id} ({message_id}) is "
                f"{status} after {attempts} attempt(s) with the receiver up"
            )
            suspects.add(saga_id)
    for saga_id in sorted(set(owed) | set(got)):
        if saga_id not in owed:
            problems.append(f"webhook: deliveries for a saga that does not exist: {saga_id}")
            continue
        missing, extra = owed[saga_id] - got[saga_id], got[saga_id] - owed[saga_id]
        if missing or extra:
            problems.append(
                f"webhook: saga {saga_id} owes {sorted(owed[saga_id])}; missing "
                f"{sorted(missing)}, contradicting {sorted(extra)}"
            )
            suspects.add(saga_id)

    with receiver.lock:
        heard = list(receiver.heard)
        accepted = set(receiver.accepted)
    ids: dict[tuple[str | None, str | None], set[str]] = defaultdict(set)
    for h in heard:
        ids[h.saga_id, h.event_type].add(h.webhook_id)
    unsigned = [h for h in heard if not h.verified]
    if unsigned:
        problems.append(
            f"webhook: {len(unsigned)} request(s) failed signature verification, "
            f"e.g. {unsigned[:3]}"
        )
    stored = {
        (saga_id, event_type): message_id for saga_id, event_type, _, message_id, _ in deliveries
    }
    for key, seen in sorted(ids.items(), key=str):
        heard_saga, heard_type = key
        theirs = (
            stored.get((heard_saga, heard_type))
            if heard_saga is not None and heard_type is not None
            else None
        )
        if seen != {theirs}:
            problems.append(
                f"webhook: the receiver heard webhook-id(s) {sorted(seen)} for "
                f"{key[1]} of saga {key[0]}; the delivery's is {theirs}"
            )
            if key[0]:
                suspects.add(key[0])
    for (saga_id, event_type), message_id in stored.items():
        if message_id not in accepted:
            problems.append(
                f"webhook: {event_type} for saga {saga_id} ({message_id}) was "
                "never answered 2xx by the receiver"
            )
            suspects.add(saga_id)
    return problems, suspects


def webhook_summary(db: Db, receiver: FlakyReceiver) -> list[str]:
    deliveries = db.webhook_deliveries()
    statuses = Counter(d[2] for d in deliveries)
    types = Counter(d[1] for d in deliveries)
    attempts = db.webhook_attempts()
    outages = [
        (down, up) for down, up in receiver.outages if down is not None and up is not None
    ]  # (down: always set)
    refused = [at for at, code, error in attempts if error.startswith("ConnectError")]
    # An attempt's time is taken just before it connects.
    while_down = sum(
        1
        for at in refused
        for down, up in outages
        if down - datetime.timedelta(seconds=1) <= at <= up
    )
    kinds = Counter(
        "2xx"
        if code is not None and 200 <= code < 300
        else f"HTTP {code}"
        if code is not None
        else "timeout"
        if error.startswith("timeout")
        else "refused"
        if error.startswith("ConnectError")
        else "other"
        for _, code, error in attempts
    )
    down_for = sum((up - down).total_seconds() for down, up in outages)
    return [
        f"webhooks: {len(deliveries)} deliveries {dict(statuses)}, by type {dict(types)}",
        f"webhook attempts: {len(attempts)} {dict(sorted(kinds.items()))}; refused while the "
        f"receiver was down ({len(outages)} outage(s), {down_for:.1f}s): {while_down}",
        f"receiver heard {len(receiver.heard)} requests, answered {dict(receiver.answers())} "
        f"(hang = no answer within {SETTINGS['WEBHOOK_TIMEOUT_SECONDS']}s)",
    ]


# --- beat, waking every second ---------------------------------------------------------


def _beat_main() -> None:
    """Celery beat with the product's schedule (sweep intervals from the
    settings above), waking at least every second."""
    import django

    django.setup()
    from config.celery import app

    var = Path(os.environ["BOXOFFICE_VAR_DIR"])
    var.mkdir(parents=True, exist_ok=True)
    app.Beat(schedule=str(var / "celerybeat-schedule"), loglevel="INFO", max_interval=1).run()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("beat")
    dog = sub.add_parser("watchdog")
    dog.add_argument("--parent", type=int, required=True)
    dog.add_argument("--pgdata", required=True)
    dog.add_argument("--pg-ctl", required=True)
    dog.add_argument("--as-postgres", default="0")
    dog.add_argument("--folder", required=True)
    args = parser.parse_args(argv)
    if args.command == "beat":
        _beat_main()
    else:
        _watchdog_main(args)


def make_server_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="boxoffice-chaos-"))
    folder.chmod(0o755)  # the postgres user must reach its data folder
    return folder


if __name__ == "__main__":
    main()
