"""The Celery app. JSON only, acks late, prefetch 1; see settings."""

import os
import time

from celery import Celery, signals
from django.conf import settings
from django.db import close_old_connections, connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("boxoffice")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def _db_reuse(sender, **kwargs):
    # Celery's Django fix-up closes the connection around every task unless
    # this key is set (it reads the old upper-case name).
    sender.conf["CELERY_DB_REUSE_MAX"] = settings.CELERY_DB_REUSE_MAX


# A pool process idle for longer than this checks its database connections
# before its next task (one SELECT 1): a PostgreSQL restart while it waited
# must not fail that task. A busy process skips the check, so a purchase's
# tasks cost no extra query; a restart in mid-stream fails at most the task
# that meets it, which is retried (and its connection closed, below).
IDLE_CHECK_AFTER_SECONDS = 5.0
_last_task_ended = time.monotonic()


@signals.task_prerun.connect
def _check_connections_after_idle(**kwargs):
    if time.monotonic() - _last_task_ended > IDLE_CHECK_AFTER_SECONDS:
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
