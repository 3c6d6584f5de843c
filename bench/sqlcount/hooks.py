"""The counters of bench/sqlcount, inside a stack process (see the package's
docstring). Installed by the app's ``ready()``; nothing here runs unless the
process was started with ``bench.sqlcount.settings``.

On each new connection (``connection_created``, which Django sends on every
connect of a connection object): one ``execute_wrapper`` that counts each
statement under the current step, and counters around this connection
object's ``commit``, ``rollback`` and ``is_usable`` (the health check's
``SELECT 1`` goes to psycopg directly, past the wrappers). A transaction
counts once it sent a statement: an ``atomic`` block that ran none
commits nothing at the server.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from pathlib import Path

from celery import signals as celery_signals
from django.core.signals import request_finished, request_started
from django.db.backends.signals import connection_created
from django.urls import Resolver404, resolve

from bench.sqlcount import FIELDS

ROLE = os.environ.get("BENCH_SQLCOUNT_ROLE", "process")
DIRECTORY = Path(os.environ.get("BENCH_SQLCOUNT_DIR", "."))
FLUSH_EVERY = 0.5

_local = threading.local()  # .step: the request's or task's, else the role


class _Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.steps: dict[str, dict[str, int]] = {}
        self.dirty = False
        self.flusher: threading.Thread | None = None

    def add(self, field: str) -> None:
        step = getattr(_local, "step", None) or ROLE
        with self.lock:
            counts = self.steps.get(step)
            if counts is None:
                counts = self.steps[step] = dict.fromkeys(FIELDS, 0)
            counts[field] += 1
            self.dirty = True
            if self.flusher is None:
                self.flusher = threading.Thread(
                    target=_flush_loop, daemon=True, name="bench-sqlcount"
                )
                self.flusher.start()


_counts = _Counts()


def _reset_in_child() -> None:
    # A forked pool process starts from zero with a lock of its own (the
    # parent's may have been held by another thread at the fork).
    global _counts
    _counts = _Counts()


def flush() -> None:
    counts = _counts
    with counts.lock:
        if not counts.dirty:
            return
        data = json.dumps({"role": ROLE, "pid": os.getpid(), "steps": counts.steps})
        counts.dirty = False
    path = DIRECTORY / f"{ROLE}-{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(data)
    os.replace(tmp, path)


def _flush_loop() -> None:
    while True:
        time.sleep(FLUSH_EVERY)
        try:
            flush()
        except OSError:
            pass  # the bench removed the directory: the run is over


# --- the connection ----------------------------------------------------------------


def _count_execute(execute, sql, params, many, context):
    conn = context["connection"]
    in_transaction = conn.in_atomic_block or not conn.get_autocommit()
    _counts.add("statements")
    if in_transaction:
        conn.bench_sqlcount_dirty = True
    try:
        result = execute(sql, params, many, context)
    except Exception:
        if not in_transaction:
            _counts.add("autocommit_errors")
        raise
    if not in_transaction:
        _counts.add("autocommit")
    return result


def _on_connection_created(sender, connection, **kwargs) -> None:
    _counts.add("connects")
    connection.bench_sqlcount_dirty = False
    if getattr(connection, "bench_sqlcount_installed", False):
        return  # the same connection object reconnecting
    connection.bench_sqlcount_installed = True
    connection.execute_wrappers.append(_count_execute)
    commit, rollback, is_usable = connection.commit, connection.rollback, connection.is_usable

    def counted_commit():
        dirty, connection.bench_sqlcount_dirty = connection.bench_sqlcount_dirty, False
        try:
            commit()
        except Exception:
            if dirty:
                _counts.add("txn_rollbacks")
            raise
        if dirty:
            _counts.add("transactions")

    def counted_rollback():
        dirty, connection.bench_sqlcount_dirty = connection.bench_sqlcount_dirty, False
        rollback()
        if dirty:
            _counts.add("txn_rollbacks")

    def counted_is_usable():
        if connection.connection is not None:
            _counts.add("health_checks")
        return is_usable()

    connection.commit = counted_commit
    connection.rollback = counted_rollback
    connection.is_usable = counted_is_usable


# --- the step ----------------------------------------------------------------------


def _request_started(sender, environ=None, **kwargs) -> None:
    environ = environ or {}
    try:
        match = resolve(environ.get("PATH_INFO", "/"))
        name = match.view_name or match._func_path
    except Resolver404:
        name = "(no view)"
    _local.step = f"{ROLE} {environ.get('REQUEST_METHOD', '?')} {name}"


def _request_finished(sender, **kwargs) -> None:
    _local.step = None


def _task_prerun(sender=None, task=None, **kwargs) -> None:
    _local.step = f"{ROLE} {getattr(task, 'name', sender)}"


def _task_postrun(sender=None, **kwargs) -> None:
    _local.step = None


def install() -> None:
    DIRECTORY.mkdir(parents=True, exist_ok=True)
    connection_created.connect(_on_connection_created, weak=False)
    if ROLE == "web":
        request_started.connect(_request_started, weak=False)
        request_finished.connect(_request_finished, weak=False)
    celery_signals.task_prerun.connect(_task_prerun, weak=False)
    celery_signals.task_postrun.connect(_task_postrun, weak=False)
    os.register_at_fork(after_in_child=_reset_in_child)
    atexit.register(flush)
