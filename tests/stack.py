"""A real stack for end-to-end stories: a Celery worker and an outbox relay as
separate processes, on Redis and the test PostgreSQL database, calling the
fake gateway over HTTP on pytest-django's live server."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # A test run that is killed (CI timeout, ^C twice) must not leave workers
    # behind consuming from its queue: the kernel kills them with us.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Stack:
    def __init__(self, *, gateway_url: str, workdir: Path, extra_env: dict | None = None):
        self.workdir = workdir
        self.mail_dir = workdir / "mail"
        self.mail_dir.mkdir(parents=True, exist_ok=True)
        db = connection.settings_dict
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": (
                f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
                f"/{db['NAME']}"
            ),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "CELERY_TASK_DEFAULT_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
            "PAYMENT_GATEWAY_URL": gateway_url,
            "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
            "EMAIL_FILE_PATH": str(self.mail_dir),
            "OUTBOX_POLL_SECONDS": "0.2",
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "INFO",
            **(extra_env or {}),
        }
        self.procs: dict[str, subprocess.Popen] = {}

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self.procs[name] = subprocess.Popen(
            argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent,
        )

    def start_worker(self, name: str = "worker", concurrency: int = 2) -> None:
        self._start(name, [
            sys.executable, "-m", "celery", "-A", "config", "worker",
            f"--queues={settings.CELERY_TASK_DEFAULT_QUEUE}", f"--concurrency={concurrency}",
            "--without-gossip", "--without-mingle", "--loglevel=INFO", f"--hostname={name}@%h",
        ])

    def start_relay(self, name: str = "relay") -> None:
        self._start(name, [sys.executable, "manage.py", "run_relay", "--poll", "0.2"])

    def wait_ready(self, timeout: float = 30) -> None:
        from config.celery import app

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if app.control.ping(timeout=0.5):
                return
        raise AssertionError("the Celery worker did not answer a ping\n" + self.logs())

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}\n" + self.logs())

    def stop(self, name: str | None = None, sig: int = signal.SIGTERM) -> None:
        for key in [name] if name else list(self.procs):
            proc = self.procs.pop(key)
            if proc.poll() is None:
                os.killpg(proc.pid, sig)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text(errors='replace')[-6000:]}"
            for p in sorted(self.workdir.glob("*.log"))
        )

    def emails(self) -> list[str]:
        """Every email the worker sent, as text (the file backend's output)."""
        text = "".join(p.read_text() for p in sorted(self.mail_dir.glob("*")))
        return [m for m in text.split("-" * 79) if "Subject:" in m]

    def wait_for(self, predicate: Callable[[], bool], what: str, timeout: float = 45) -> None:
        """Poll until ``predicate()`` holds (the stack is asynchronous)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            self.check_alive()
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}\n" + self.logs())
