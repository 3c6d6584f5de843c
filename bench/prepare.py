"""The setup of `make bench` before its stack starts: the environment the
stack runs with, the databases, Django in-process (SQL capture and the Celery
control channel), and what the JSON records about the run."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import django
import psycopg
from django.conf import settings
from django.db import connection, connections

from bench.common import BENCH_DB, GATEWAY_DB, HOLD_SECONDS, PGBENCH_DB, SWEEPS_DB, log
from bench.db import PG, BenchDB
from bench.pgbench import Pgbench
from devtools.processes import ROOT, manage_argv


def stack_env(
    *, pg: PG, broker_url: str, queue: str, gateway_port: int, metrics_dir: Path
) -> tuple[dict, dict]:
    """(the product's processes' environment, the fake gateway's)."""
    base_env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": pg.url(BENCH_DB),
        "CELERY_BROKER_URL": broker_url,
        "CELERY_TASK_DEFAULT_QUEUE": queue,
        "DEBUG": "false",
        "SECRET_KEY": "bench",
        "TICKET_KEY_SECRETS": "YmVuY2gtb25seS10aWNrZXQta2V5LW5vdC1zZWNyZXQ=",
        "ALLOWED_HOSTS": "127.0.0.1",
        "FAKE_GATEWAY_ENABLED": "true",
        "PAYMENT_GATEWAY_URL": f"http://127.0.0.1:{gateway_port}/fake-gateway/v1",
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
    # The catalog's cache and the throttles' counts on the bench's own Redis
    # database, as in production (not the checkout's var/cache files, which
    # make run shares).
    base_env["CACHE_URL"] = broker_url.replace("redis://", "rediscache://", 1)
    # The fake gateway as Compose runs it: its own URLs only, its statements
    # prepared (docs/performance.md, "The fake processor").
    gateway_env = {
        **base_env,
        "DATABASE_URL": pg.url(GATEWAY_DB),
        "ROOT_URLCONF": "payments.fake_gateway.standalone_urls",
        "DB_SERVER_SIDE_BINDING": "true",
    }
    return base_env, gateway_env


def create_databases(
    pg: PG, pgbench: Pgbench, *, base_env: dict, gateway_env: dict, logdir: Path
) -> None:
    log(f"databases: {BENCH_DB}, {SWEEPS_DB}, {PGBENCH_DB}, {GATEWAY_DB} on {pg.host}:{pg.port}")
    for db, env in ((BENCH_DB, base_env), (GATEWAY_DB, gateway_env)):
        pg.recreate(db)
        with open(logdir / "migrate.log", "ab") as out:
            subprocess.run(
                manage_argv("migrate", "--no-input"),
                cwd=ROOT,
                env=env,
                check=True,
                timeout=180,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
    # A copy of the empty schema for figure 6, before anything connects.
    pg.recreate(SWEEPS_DB, template=BENCH_DB)
    pg.recreate(PGBENCH_DB)
    pgbench.init(PGBENCH_DB, scale=5)


def start_django(base_env: dict):
    """Django in this process, with the stack's settings; returns the Celery app."""
    os.environ.update({k: v for k, v in base_env.items() if k != "FAKE_GATEWAY_LATENCY_MS"})
    django.setup()
    # After django.setup(): config.celery reads the settings the environment above selects.
    from config.celery import app

    return app


def pgbench_mode() -> str:
    """pgbench's -M: the query protocol Django's connections use. Server-side
    binding is the extended protocol; with a ``prepare_threshold`` (what
    ``DB_SERVER_SIDE_BINDING`` sets, ``DB_PREPARE_THRESHOLD``), psycopg
    prepares a statement run that often on a connection: pgbench's
    ``prepared``."""
    options = settings.DATABASES["default"].get("OPTIONS") or {}
    if options.get("server_side_binding") is not True:
        return "simple"
    return "extended" if options.get("prepare_threshold") is None else "prepared"


def describe(
    results: dict, args: argparse.Namespace, db: BenchDB, *, queue: str, broker_url: str, port: int
) -> None:
    """What the JSON records about the run: protocol, machine, configuration, commit."""
    binding = (settings.DATABASES["default"].get("OPTIONS") or {}).get("server_side_binding")
    results["protocol"] = {
        "django_server_side_binding": binding,
        "psycopg": psycopg.__version__,
        "pgbench_mode": pgbench_mode(),
        "prepare_threshold": (settings.DATABASES["default"].get("OPTIONS") or {}).get(
            "prepare_threshold"
        ),
        "why": "Django's psycopg 3 backend uses ClientCursor (client-side binding) unless "
        "OPTIONS['server_side_binding'] is True; ClientCursor sends with "
        "PQsendQuery = simple query protocol; server-side binding with a "
        "prepare_threshold prepares statements (pgbench -M prepared)",
    }
    results["machine"] = {
        "cpus": os.cpu_count(),
        "postgres": db.q1("SELECT version()")[0],
        **{
            k: db.q1(f"SHOW {k}")[0]
            for k in (
                "fsync",
                "synchronous_commit",
                "shared_buffers",
                "max_connections",
                # Recorded: with it off (as on the machines so far), dead rows
                # pile up from one phase to the next.
                "autovacuum",
            )
        },
    }
    results["config"] = {
        "queue": queue,
        "broker": broker_url,
        "port": port,
        "relay_poll_seconds": settings.OUTBOX_POLL_SECONDS,
        "outbox_batch_size": settings.OUTBOX_BATCH_SIZE,
        "conn_max_age": settings.DATABASES["default"]["CONN_MAX_AGE"],
        "conn_health_checks": settings.DATABASES["default"]["CONN_HEALTH_CHECKS"],
        "celery_db_reuse_max": settings.CELERY_DB_REUSE_MAX,
        "purchase_hold_seconds": HOLD_SECONDS,
        "gunicorn": f"gthread, {args.web_workers} workers x {args.web_threads} threads",
        "worker": "prefork, concurrency 4",
    }
    results["git"] = git_state()
    connection.close()


def git_state() -> dict:
    def run(*argv):
        return subprocess.run(
            ["git", *argv], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()

    return {
        "commit": run("rev-parse", "HEAD"),
        "dirty_files": [ln[3:] for ln in run("status", "--porcelain").splitlines()],
    }


def close_connections() -> None:
    """Django's connections in this process (SQL capture, figure 6)."""
    connections.close_all()
