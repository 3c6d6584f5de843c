"""The stack `make bench` measures (gunicorn, the fake gateway as its own
gunicorn, a Celery worker, the relay; figure 11 adds a second worker and a
second relay) and the control of its Celery queue."""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.common import PhaseFailed, log
from bench.db import BenchDB
from devtools.processes import (
    ProcessGroup,
    at_lowest_priority,
    background_env,
    celery_beat_argv,
    celery_worker_argv,
    gunicorn_argv,
    poll,
    relay_argv,
)


class Stack(ProcessGroup):
    def __init__(
        self,
        *,
        logdir: Path,
        base_env: dict,
        port: int,
        queue: str,
        hostname: str,
        gateway_port: int,
        gateway_env: dict,
        web_workers: int,
        web_threads: int,
    ):
        # The failed phase prints the logs' tails itself (run.py: figure).
        super().__init__(logdir, base_env, error=PhaseFailed, logs_in_errors=False)
        self.base_env = base_env
        self.port = port
        self.gateway_port = gateway_port
        self.gateway_env = gateway_env
        self.queue = queue
        self.hostname = hostname
        self.latency_ms = 0
        # The fake processor at the lowest CPU priority (figure 15).
        self.gateway_lowered = False
        self.web_workers, self.web_threads = web_workers, web_threads
        # The WSGI application gunicorn serves (figure 12 swaps it).
        self.wsgi = "config.wsgi:application"
        # Figure 11's second pool, on the same queue.
        self.hostname2 = f"second-{hostname}"
        # Extra environment per process name (figure 2's count run: the
        # statement counter's settings) and what it is called in profiles'
        # file names; None: the stack as it runs.
        self.extra_env: Callable[[str], dict[str, str]] | None = None
        self.variant: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self, name: str, argv: list[str], env: dict) -> None:
        env = {
            **env,
            "FAKE_GATEWAY_LATENCY_MS": str(self.latency_ms),
            **(self.extra_env(name) if self.extra_env else {}),
        }
        self.start(
            name,
            argv,
            env=env,
            header=(
                f"\n===== start {dt.datetime.now(dt.UTC).isoformat()} {' '.join(argv)}"
                f" FAKE_GATEWAY_LATENCY_MS={self.latency_ms}"
                f"{f' [{self.variant}]' if self.variant else ''}\n"
            ),
        )
        # For py-spy and friends: the machine may run other stacks of this
        # project, so "pgrep run_relay" is not necessarily ours.
        with open(self.logdir / "pids.txt", "a") as fh:
            fh.write(f"{name} {self.procs[name].pid}\n")

    def start_web(self) -> None:
        self._start(
            "web",
            gunicorn_argv(
                port=self.port, workers=self.web_workers, threads=self.web_threads, app=self.wsgi
            ),
            self.base_env,
        )

    def start_gateway(self) -> None:
        argv = gunicorn_argv(port=self.gateway_port, workers=1, threads=16)
        if self.gateway_lowered:
            argv = at_lowest_priority(argv)
        self._start("gateway", argv, self.gateway_env)

    def start_worker(self) -> None:
        self._start(
            "worker",
            celery_worker_argv(
                queue=self.queue,
                concurrency=4,
                hostname=self.hostname,
                extra=["--include=bench.tasks"],
            ),
            background_env(self.base_env),
        )

    def start_webhook_worker(self) -> None:
        """Webhook attempts' own pool, on their own queue (the settings derive
        it from the stack's: ``<queue>-webhooks``), as in production."""
        self._start(
            "webhooks",
            celery_worker_argv(
                queue=f"{self.queue}-webhooks", concurrency=2, hostname=f"webhooks-{self.hostname}"
            ),
            background_env(self.base_env),
        )

    def start_refund_worker(self) -> None:
        """Money back's own pool, one process that lowers its own CPU
        priority (config/cpu_priority.py), on its own queue (the settings
        derive it from the stack's: ``<queue>-refunds``), as the Procfile
        runs it."""
        self._start(
            "refunds",
            celery_worker_argv(
                queue=f"{self.queue}-refunds",
                concurrency=1,
                hostname=f"refunds-{self.hostname}",
            ),
            background_env(self.base_env),
        )

    def start_admission_worker(self) -> None:
        """The waiting rooms' ticks' own process, on their own queue (the
        settings derive it from the stack's: ``<queue>-admission``), as the
        Procfile runs it."""
        self._start(
            "admission",
            celery_worker_argv(
                queue=f"{self.queue}-admission",
                concurrency=1,
                hostname=f"admission-{self.hostname}",
                extra=["--pool=solo"],
            ),
            background_env(self.base_env),
        )

    def start_beat(self, schedule: Path) -> None:
        """Beat, for the figure that needs it (17: the breaker's trial)."""
        self._start("beat", celery_beat_argv(schedule=str(schedule)), background_env(self.base_env))

    def start_relay(self) -> None:
        self._start("relay", relay_argv(), background_env(self.base_env))

    def start_worker2(self) -> None:
        """A second pool like the first, on the same queue (figure 11)."""
        self._start(
            "worker2",
            celery_worker_argv(
                queue=self.queue,
                concurrency=4,
                hostname=self.hostname2,
                extra=["--include=bench.tasks"],
            ),
            background_env(self.base_env),
        )

    def start_relay2(self) -> None:
        """A second relay (figure 11): relays share the work by SKIP LOCKED claims."""
        self._start("relay2", relay_argv(), background_env(self.base_env))

    def scale_out(self, app) -> None:
        """Figure 11: the second pool and the second relay, ready."""
        self.start_worker2()
        self.start_relay2()
        self.wait_ping(app, destination=[self.hostname2], timeout=60, ping_timeout=1.0)
        self.wait_relay("relay2")

    def scale_in(self) -> None:
        for name in ("worker2", "relay2"):
            self.stop(name)

    def start_all(self, app) -> None:
        self.start_gateway()
        self.start_web()
        self.start_worker()
        self.start_webhook_worker()
        self.start_refund_worker()
        self.start_relay()
        self.wait_web()
        self.wait_worker(app)
        self.wait_relay()

    def ensure_running(self, app) -> None:
        """A process that died in an earlier figure is restarted for the next."""
        starts = {
            "gateway": self.start_gateway,
            "web": self.start_web,
            "worker": self.start_worker,
            "webhooks": self.start_webhook_worker,
            "refunds": self.start_refund_worker,
            "relay": self.start_relay,
            "worker2": self.start_worker2,
            "relay2": self.start_relay2,
        }
        for name, code in self.dead().items():
            log(f"!! {name} had exited ({code}); restarting it")
            self.procs.pop(name)
            starts[name]()
        self.wait_web()
        self.wait_worker(app)

    # readiness

    def wait_web(self, timeout: float = 60) -> None:
        def answers(url: str) -> bool:
            try:
                # The fake gateway answers any unknown path with JSON, without
                # touching the database: it proves gunicorn and the mount.
                r = httpx.get(f"{url}/fake-gateway/v1/bench-ready", timeout=2, trust_env=False)
            except httpx.HTTPError:
                return False
            return r.status_code == 404 and "unknown_endpoint" in r.text

        for name, url in (
            ("web", self.base_url),
            ("gateway", f"http://127.0.0.1:{self.gateway_port}"),
        ):
            self.wait_for(
                functools.partial(answers, url), f"gunicorn ({name}) to answer", timeout, every=0.3
            )

    def wait_worker(self, app, timeout: float = 60) -> None:
        self.wait_ping(app, destination=[self.hostname], timeout=timeout, ping_timeout=1.0)

    def wait_relay(self, name: str = "relay", timeout: float = 30) -> None:
        def started() -> bool:
            return "outbox relay started" in self.log(name).rsplit("===== start", 1)[-1]

        self.wait_for(started, f"the relay ({name}) to start", timeout, every=0.2)


class Broker:
    """The bench's Celery queue (on its own Redis database) and the worker's
    consumer of it."""

    def __init__(self, *, app, redis, queue: str, hostname: str):
        self.app = app
        self.redis = redis
        self.queue = queue
        self.hostname = hostname

    @property
    def queues(self) -> tuple[str, str]:
        """The saga's queue and money back's (``<queue>-refunds``, its own
        pool's): a figure waits for both to drain."""
        return self.queue, f"{self.queue}-refunds"

    def depth(self) -> tuple[int, int]:
        """(tasks queued, tasks taken and not acknowledged)."""
        queued = sum(self.redis.llen(q) for q in self.queues)
        return queued, self.redis.hlen("unacked")

    def purge(self) -> int:
        n = sum(self.redis.llen(q) for q in self.queues)
        self.redis.delete(*self.queues)
        if n:
            log(f"   purged {n} queued tasks")
        return n

    def pause_consumer(self) -> bool:
        reply = self.app.control.cancel_consumer(
            self.queue, destination=[self.hostname], reply=True, timeout=5
        )
        return bool(reply)

    def resume_consumer(self) -> bool:
        reply = self.app.control.add_consumer(
            self.queue, destination=[self.hostname], reply=True, timeout=5
        )
        return bool(reply)

    def send(self, name: str, count: int, args_fn) -> None:
        with self.app.producer_or_acquire() as producer:
            for i in range(count):
                self.app.send_task(name, args=args_fn(i), queue=self.queue, producer=producer)

    def wait_drained(
        self, timeout: float | None, what: str, *, also=None, every: float = 0.05
    ) -> bool:
        """Until no task is queued or in flight (and ``also()`` holds, if given)."""

        def drained() -> bool:
            return self.depth() == (0, 0) and (also is None or also())

        def progress() -> None:
            queued, unacked = self.depth()
            log(f"   waiting for {what}: {queued} queued, {unacked} in flight")

        return poll(drained, timeout=timeout, every=every, progress=progress)

    def quiesce(self, db: BenchDB, timeout: float = 120) -> bool:
        """No task queued or running, and no outbox row due and not done."""
        deadline = time.monotonic() + timeout

        def quiet() -> bool:
            if not self.wait_drained(max(1.0, deadline - time.monotonic()), "the queue to drain"):
                return False
            (due,) = db.q1(
                "SELECT count(*) FROM outbox_outboxmessage WHERE completed_at IS NULL"
                " AND cancelled_at IS NULL AND dead_at IS NULL AND available_at <= now()"
            )
            return due == 0

        return poll(quiet, timeout=timeout, every=0.5)
