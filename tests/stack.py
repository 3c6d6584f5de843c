"""A real stack for end-to-end stories: a Celery worker and an outbox relay as
separate processes, on Redis and the test PostgreSQL database, calling the
fake gateway over HTTP on pytest-django's live server."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.db import connection

from config.celery import app
from devtools.processes import ProcessGroup, background_env, celery_worker_argv, relay_argv


class Stack(ProcessGroup):
    def __init__(self, *, gateway_url: str, workdir: Path, extra_env: dict | None = None):
        self.workdir = workdir
        self.mail_dir = workdir / "mail"
        self.mail_dir.mkdir(parents=True, exist_ok=True)
        db = connection.settings_dict
        super().__init__(
            workdir,
            {
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DATABASE_URL": (
                    f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
                    f"/{db['NAME']}"
                ),
                "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
                "CELERY_TASK_DEFAULT_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
                "CELERY_WEBHOOK_QUEUE": settings.CELERY_WEBHOOK_QUEUE,
                "CELERY_REFUND_QUEUE": settings.CELERY_REFUND_QUEUE,
                "PAYMENT_GATEWAY_URL": gateway_url,
                "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
                "EMAIL_FILE_PATH": str(self.mail_dir),
                "OUTBOX_POLL_SECONDS": "0.2",
                "OUTBOX_HAND_OVER_ON_COMMIT": "true",
                "PYTHONUNBUFFERED": "1",
                "LOG_LEVEL": "INFO",
                **(extra_env or {}),
            },
            tail_chars=6000,
        )

    @classmethod
    @contextlib.contextmanager
    def running(
        cls,
        live_server,
        workdir: Path,
        *,
        extra_env: dict | None = None,
        concurrency: int = 2,
        webhooks: bool = False,
    ) -> Iterator[Stack]:
        """A worker (and, with ``webhooks``, a webhook worker) and a relay,
        started and ready, calling the fake gateway on ``live_server``;
        stopped on the way out."""
        stack = cls(
            gateway_url=f"{live_server.url}/fake-gateway/v1", workdir=workdir, extra_env=extra_env
        )
        try:
            stack.start_worker(concurrency=concurrency)
            if webhooks:
                stack.start_webhook_worker(concurrency=concurrency)
            stack.start_relay()
            stack.wait_ready()
            yield stack
        finally:
            stack.stop()

    def start_worker(self, name: str = "worker", concurrency: int = 2) -> None:
        """The saga's pool; here it consumes money back's queue and the
        rooms' ticks' too (settings.CELERY_REFUND_QUEUE and
        CELERY_ADMISSION_QUEUE: pools of their own in production)."""
        queues = (
            settings.CELERY_TASK_DEFAULT_QUEUE,
            settings.CELERY_REFUND_QUEUE,
            settings.CELERY_ADMISSION_QUEUE,
        )
        self.start(
            name,
            celery_worker_argv(
                queue=",".join(queues),
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
                queue=settings.CELERY_WEBHOOK_QUEUE, concurrency=concurrency, hostname=f"{name}@%h"
            ),
            env=background_env(self.env),
        )

    def start_relay(self, name: str = "relay") -> None:
        self.start(name, relay_argv(poll=0.2), env=background_env(self.env))

    def wait_ready(self, timeout: float = 30) -> None:
        self.wait_ping(app, timeout=timeout)

    def emails(self) -> list[str]:
        """Every email the worker sent, as text (the file backend's output)."""
        text = "".join(p.read_text() for p in sorted(self.mail_dir.glob("*")))
        return [m for m in text.split("-" * 79) if "Subject:" in m]
