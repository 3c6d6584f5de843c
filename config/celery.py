"""The Celery app. JSON only, acks late, prefetch 1; see settings."""

import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("boxoffice")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def _db_reuse(sender, **kwargs):
    # Celery's Django fix-up closes the connection around every task unless
    # this key is set (it reads the old upper-case name).
    from django.conf import settings

    sender.conf["CELERY_DB_REUSE_MAX"] = settings.CELERY_DB_REUSE_MAX


@signals.task_prerun.connect
@signals.task_postrun.connect
def _drop_dead_connections(**kwargs):
    # With DB reuse on, Celery's fix-up looks at connections only every
    # CELERY_DB_REUSE_MAX tasks, so a worker would keep a connection killed by
    # a PostgreSQL restart and fail every task after it. A connection on which
    # a database error occurred is checked (Django's own check, as around each
    # request) and closed if it is dead; the next query reconnects. Healthy
    # connections cost nothing here: no query per task.
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.errors_occurred:
            conn.close_if_unusable_or_obsolete()
