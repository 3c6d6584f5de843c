"""A worker outlives a PostgreSQL restart: its dead connection is dropped
between tasks instead of failing every task after the restart."""

import psycopg
import pytest
from celery import signals
from django.db import OperationalError, connection

from config.celery import app


def _kill_own_backend():
    pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    with psycopg.connect(autocommit=True, **params) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


@pytest.mark.django_db(transaction=True)
def test_a_connection_killed_between_tasks_is_replaced_before_the_next_task():
    app.finalize()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    _kill_own_backend()
    with pytest.raises(OperationalError), connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # the task that met the restart fails

    signals.task_postrun.send(sender=None)  # what the worker sends after it
    signals.task_prerun.send(sender=None)   # and before the next task, at once

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


@pytest.mark.django_db(transaction=True)
def test_a_connection_killed_while_the_worker_was_idle_is_checked_before_the_next_task(
        monkeypatch):
    # The chaos run: a pool process idle through a PostgreSQL restart failed
    # its next task on the dead connection, minutes after the restart.
    from config import celery as celery_config

    app.finalize()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    signals.task_postrun.send(sender=None)
    _kill_own_backend()
    monkeypatch.setattr(celery_config, "_last_task_ended",
                        celery_config._last_task_ended - 60)  # a minute without a task

    signals.task_prerun.send(sender=None)

    with connection.cursor() as cursor:  # the task's first query
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
