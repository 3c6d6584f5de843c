"""The operators' tools while PostgreSQL is down (issue 30, item 8): ``/metrics``
still serves the process's own counters and says ``boxoffice_database_up 0``;
``manage.py audit_sagas`` exits 2 ("could not audit") naming the database,
never 1 ("violations found") with a traceback (docs/operations.md, "Metrics",
"Commands").

The database is down for real: this test's connection is pointed at a closed
port of 127.0.0.1 (the shared PostgreSQL keeps running), as tests/test_health.py
does for ``/readyz``."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import InterfaceError, OperationalError, ProgrammingError, connection
from django.test import Client
from prometheus_client import REGISTRY

from config import metrics
from devtools.processes import free_port
from purchases.models import PurchaseSaga
from purchases.ops.metrics import database_unreachable

from .test_metrics import _value

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "s3cret-db-password"

# The connection is closed and reopened: no test transaction may wrap it.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def database_down(monkeypatch):
    """The ``default`` connection, pointed at a port nothing listens on (its
    settings are restored, and it reconnects, after the test)."""
    port = free_port()
    connection.close()
    for key, value in (("HOST", "127.0.0.1"), ("PORT", str(port)), ("PASSWORD", PASSWORD)):
        monkeypatch.setitem(connection.settings_dict, key, value)
    yield port
    connection.close()


@pytest.fixture
def statement_timeout():
    """A database that answers but cancels this connection's queries: another
    session holds the sagas' table locked and this one waits 200 ms at most
    (``statement_timeout``), so reading sagas raises QueryCanceled, an
    OperationalError that is no outage."""
    db = connection.settings_dict
    holder = psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"]
    )
    holder.execute(f"LOCK TABLE {PurchaseSaga._meta.db_table} IN ACCESS EXCLUSIVE MODE")
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = 200")
    yield
    connection.close()  # the setting goes with the session
    holder.rollback()
    holder.close()


# --- what counts as down ----------------------------------------------------------------


def _wrapped(cause: Exception) -> OperationalError:
    """What Django's wrapper raises for a driver's error: its own, from it."""
    try:
        raise OperationalError(str(cause)) from cause
    except OperationalError as exc:
        return exc


UNREACHABLE = [
    psycopg.OperationalError("connection failed: Connection refused"),  # no SQLSTATE
    psycopg.errors.ConnectionFailure("08006"),
    psycopg.errors.ConnectionException("08000"),
    psycopg.errors.AdminShutdown("57P01"),
    psycopg.errors.CrashShutdown("57P02"),
    psycopg.errors.CannotConnectNow("57P03"),
]
REACHABLE = [
    psycopg.errors.QueryCanceled("57014: statement_timeout"),
    psycopg.errors.DeadlockDetected("40P01"),
    psycopg.errors.LockNotAvailable("55P03"),
    psycopg.errors.SerializationFailure("40001"),
]


@pytest.mark.parametrize("cause", UNREACHABLE, ids=lambda e: type(e).__name__)
def test_a_connection_failure_is_the_database_unreachable(cause):
    assert database_unreachable(_wrapped(cause))
    assert database_unreachable(cause)  # outside Django's wrapper


@pytest.mark.parametrize("cause", REACHABLE, ids=lambda e: type(e).__name__)
def test_an_operational_error_of_a_database_that_answers_is_not_unreachable(cause):
    assert not database_unreachable(_wrapped(cause))
    assert not database_unreachable(cause)


def test_an_interface_error_is_unreachable_and_other_errors_are_not():
    assert database_unreachable(InterfaceError("connection already closed"))
    assert database_unreachable(psycopg.InterfaceError("the connection is closed"))
    assert not database_unreachable(ProgrammingError("relation does not exist"))
    assert not database_unreachable(OperationalError("no cause"))
    assert not database_unreachable(ValueError("a bug"))


# --- /metrics ------------------------------------------------------------------------


def test_metrics_say_the_database_is_up_when_it_is():
    response = Client().get("/metrics")

    assert response.status_code == 200
    text = response.content.decode()
    assert _value(text, "boxoffice_database_up") == 1
    assert _value(text, "boxoffice_sagas", state="PENDING") == 0


def test_metrics_without_the_database_serve_the_counters_and_database_up_0(database_down, caplog):
    # given: this process counted something before the database went away
    metrics.ALERTS.labels(kind="webhook_failed").inc()
    counted = REGISTRY.get_sample_value("boxoffice_alerts_total", {"kind": "webhook_failed"})
    assert counted is not None and counted >= 1

    # when
    with caplog.at_level(logging.INFO):
        response = Client().get("/metrics")

    # then: a page Prometheus can scrape, with what the process knows
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert _value(text, "boxoffice_database_up") == 0
    assert _value(text, "boxoffice_alerts_total", kind="webhook_failed") == counted
    assert "boxoffice_metrics_scrape_seconds" in text
    # and nothing read from the database: no state gauge claims a level
    assert "boxoffice_sagas{" not in text and "boxoffice_outbox_backlog" not in text
    assert PASSWORD not in text
    # one warning naming the database, no 500 logged by Django
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.name, r.levelno) for r in warnings] == [("purchases.ops.metrics", logging.WARNING)]
    message = warnings[0].getMessage()
    assert f"127.0.0.1:{database_down}" in message and PASSWORD not in message


def test_metrics_recover_when_the_database_comes_back(database_down, monkeypatch):
    assert _value(Client().get("/metrics").content.decode(), "boxoffice_database_up") == 0
    monkeypatch.undo()  # the database is back
    connection.close()

    text = Client().get("/metrics").content.decode()

    assert _value(text, "boxoffice_database_up") == 1
    assert "boxoffice_sagas{" in text


def test_metrics_with_a_query_canceled_answer_500_not_database_up_0(statement_timeout):
    # A statement_timeout is a bug or an overload to see as one, not
    # "PostgreSQL is down" (BoxofficeDatabaseDown would page for it).
    response = Client(raise_request_exception=False).get("/metrics")

    assert response.status_code == 500
    assert b"boxoffice_database_up 0" not in response.content


# --- audit_sagas -----------------------------------------------------------------------


def test_audit_sagas_with_a_query_canceled_raises_it_not_exit_2(statement_timeout):
    with pytest.raises(OperationalError) as failed:
        call_command("audit_sagas", stdout=StringIO())

    assert isinstance(failed.value.__cause__, psycopg.errors.QueryCanceled)


def test_audit_sagas_without_the_database_exits_2_naming_it(database_down):
    out = StringIO()

    with pytest.raises(CommandError) as failed:
        call_command("audit_sagas", stdout=out)

    assert failed.value.returncode == 2, "could not audit is not a violation (exit 1)"
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("could not audit: the database at 127.0.0.1:")
    assert f":{database_down}/{connection.settings_dict['NAME']}" in message
    assert PASSWORD not in message


def test_audit_sagas_as_a_process_without_the_database_exits_2_with_one_line():
    db = connection.settings_dict
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}:{PASSWORD}@127.0.0.1:{port}/{db['NAME']}",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)

    done = subprocess.run(
        [sys.executable, "manage.py", "audit_sagas"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"the database at 127.0.0.1:{port}/{db['NAME']}" in lines[0]
    assert PASSWORD not in done.stderr + done.stdout
