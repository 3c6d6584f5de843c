"""A worker and the web outlive a PostgreSQL restart: a dead connection is
dropped between tasks (requests) instead of failing every one after the
restart; and a busy connection is not health-checked before each one (the
check is a transaction of its own)."""

import psycopg
import pytest
from celery import signals
from django.db import OperationalError, close_old_connections, connection
from django.db.backends.postgresql.base import DatabaseWrapper
from django.http import HttpResponse
from django.test import RequestFactory

from config.celery import app
from config.middleware import BusyConnectionMiddleware


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
    signals.task_prerun.send(sender=None)  # and before the next task, at once

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


@pytest.mark.django_db(transaction=True)
def test_a_connection_killed_while_the_worker_was_idle_is_checked_before_the_next_task(monkeypatch):
    # The chaos run: a pool process idle through a PostgreSQL restart failed
    # its next task on the dead connection, minutes after the restart.
    from config import celery as celery_config

    app.finalize()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    signals.task_postrun.send(sender=None)
    _kill_own_backend()
    monkeypatch.setattr(
        celery_config, "_last_task_ended", celery_config._last_task_ended - 60
    )  # a minute without a task

    signals.task_prerun.send(sender=None)

    with connection.cursor() as cursor:  # the task's first query
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


# --- the web: config.middleware.BusyConnectionMiddleware ------------------------------


def _select_one(request):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return HttpResponse(str(cursor.fetchone()[0]))


def _serve(view=_select_one):
    """One request as the WSGI handler serves it: Django's connection upkeep
    at its start and end (request_started / request_finished), the
    middleware around the view."""
    close_old_connections()
    try:
        return BusyConnectionMiddleware(view)(RequestFactory().get("/"))
    finally:
        close_old_connections()


@pytest.fixture
def checks(monkeypatch, settings):
    """Counts Django's health checks (the real ones run)."""
    settings.DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    connection.health_check_enabled = True  # type: ignore[attr-defined]  # stubs lack it
    made = []
    real = DatabaseWrapper.is_usable

    def is_usable(self):
        made.append(self.alias)
        return real(self)

    monkeypatch.setattr(DatabaseWrapper, "is_usable", is_usable)
    return made


@pytest.mark.django_db(transaction=True)
def test_a_busy_web_connection_is_not_checked_before_each_request(checks):
    _serve()  # connects (a new connection is healthy) and is used
    checks.clear()

    for _ in range(5):
        assert _serve().content == b"1"

    assert checks == []  # without the middleware: one SELECT 1 per request


@pytest.mark.django_db(transaction=True)
def test_a_web_connection_idle_past_the_limit_is_checked_and_replaced(checks, settings):
    _serve()
    settings.DB_IDLE_CHECK_AFTER_SECONDS = 0  # every connection counts as idle now
    _kill_own_backend()
    checks.clear()

    assert _serve().content == b"1"  # the check found it dead: a new connection

    assert checks == ["default"]


@pytest.mark.django_db(transaction=True)
def test_a_busy_web_connection_killed_fails_one_request_and_the_next_reconnects(checks):
    _serve()
    _kill_own_backend()

    with pytest.raises(OperationalError):
        _serve()  # the request that meets the restart: nothing was committed

    assert _serve().content == b"1"
