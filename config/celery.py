"""The Celery app. JSON only, acks late, prefetch 1; see settings."""

import contextlib
import os
import time
import warnings

from celery import Celery, concurrency, signals
from celery.exceptions import SecurityWarning
from django.conf import settings
from django.db import close_old_connections, connections

from config import cpu_priority, tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("boxoffice")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# What a task prints (the console email backend's emails under make run) is
# output, not a warning (docs/operations.md, "Logs").
app.conf.worker_redirect_stdouts_level = "INFO"


@signals.worker_process_init.connect
def _pool_process_out_of_the_group(**kwargs):
    # A supervisor that stops a process by signalling its whole process group
    # (honcho under make run, docs/operations.md) would kill the pool processes
    # in mid-task, and the master would log each death at ERROR. In a group of
    # their own, only the master hears the SIGTERM and stops its pool in order
    # (warm shutdown: running tasks finish). Each still dies with the master
    # (Celery sets their parent-death signal to SIGKILL).
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)


# Tracing (config/tracing.py) is set up where tasks run: in each pool process
# after the fork (a provider's export thread and an instrumented connection
# do not survive one), or in the worker itself when its pool does not fork.
# Beat only publishes. With no OTEL_* variable set, each call does nothing.


@signals.worker_init.connect
def _tracing_in_a_worker_that_does_not_fork(sender=None, **kwargs):
    pool = concurrency.get_implementation(getattr(sender, "pool_cls", None) or "prefork")
    if "prefork" not in pool.__module__:
        tracing.tracing_init(instrument=tracing.WORKER)


@signals.worker_process_init.connect
def _tracing_in_a_pool_process(**kwargs):
    tracing.tracing_init(instrument=tracing.WORKER)


@signals.worker_process_shutdown.connect
def _spans_out_before_a_pool_process_exits(**kwargs):
    # A pool process leaves with os._exit: no atexit hook exports its last batch.
    tracing.tracing_flush()


@signals.worker_init.connect
def _refunds_take_the_cpu_the_sales_leave(sender=None, **kwargs):
    # A worker of the refunds' queue alone (its own pool: docs/refunds.md)
    # lowers its CPU priority before its pool forks (config/cpu_priority.py).
    consumed = set(sender.app.amqp.queues.consume_from or ()) if sender else set()
    if consumed and consumed <= {settings.CELERY_REFUND_QUEUE}:
        cpu_priority.background()


@signals.beat_init.connect
def _tracing_in_beat(**kwargs):
    tracing.tracing_init(instrument=tracing.PUBLISHER)


@signals.celeryd_init.connect
def _no_root_advice_in_development(**kwargs):
    # Sent just before the worker checks its user. make run (DEBUG) as root, in
    # a container or a VM, would print Celery's advice against root workers at
    # every start; the image of a deployment runs as a non-root user
    # (Dockerfile), and there the advice stays.
    if settings.DEBUG:
        warnings.filterwarnings(
            "ignore",
            message="You're running the worker with superuser privileges",
            category=SecurityWarning,
        )


@app.on_after_finalize.connect
def _db_reuse(sender, **kwargs):
    # Celery's Django fix-up closes the connection around every task unless
    # this key is set (it reads the old upper-case name).
    sender.conf["CELERY_DB_REUSE_MAX"] = settings.CELERY_DB_REUSE_MAX


# A pool process idle for longer than DB_IDLE_CHECK_AFTER_SECONDS checks its
# database connections before its next task (one SELECT 1): a PostgreSQL
# restart while it waited must not fail that task. A busy process skips the
# check, so a purchase's tasks cost no extra query; a restart in mid-stream
# fails at most the task that meets it, which is retried (and its connection
# closed, below). The web does the same (config/middleware.py).
_last_task_ended = time.monotonic()


@signals.task_prerun.connect
def _check_connections_after_idle(**kwargs):
    if time.monotonic() - _last_task_ended > settings.DB_IDLE_CHECK_AFTER_SECONDS:
        # Django's own check around each request: a connection that errored
        # or outlived CONN_MAX_AGE is closed, and with CONN_HEALTH_CHECKS the
        # next query first makes sure the connection is alive.
        close_old_connections()


@signals.task_postrun.connect
def _drop_dead_connections(**kwargs):
    # With DB reuse on, Celery's fix-up looks at connections only every
    # CELERY_DB_REUSE_MAX tasks, so a worker would keep a connection killed by
    # a PostgreSQL restart and fail every task after it. A connection on which
    # a database error occurred is checked and closed if it is dead; the next
    # task reconnects.
    global _last_task_ended
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.errors_occurred:
            conn.close_if_unusable_or_obsolete()
    _last_task_ended = time.monotonic()
