"""``/healthz``, ``/readyz``, ``manage.py probe`` and the relay's pulse
(purchases/ops/health.py, outbox/pulse.py; docs/operations.md, "Health
checks"), on the real PostgreSQL and Redis of the test settings.

Failures are real ones: a database or broker URL pointing at a closed port,
a server that accepts and never answers, heartbeat rows that are old."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from devtools.processes import free_port
from outbox import pulse
from outbox.relay import relay_run
from purchases.models import SweepHeartbeat
from purchases.ops.health import (
    CHECKS,
    RELAY,
    beat_sweep,
    error_reason,
    readiness,
    relay_pulse_record,
)
from purchases.ops.heartbeats import heartbeat, sweeps_stalled

ROOT = Path(__file__).resolve().parent.parent


def _fresh_heartbeats(*, now=None) -> None:
    """What a running relay and a running beat (with a worker) leave."""
    now = now or timezone.now()
    relay_pulse_record(now=now)
    with heartbeat(beat_sweep(), now=now):
        pass


def _readyz(query: str = ""):
    response = Client().get(f"/readyz{query}")
    return response, response.json()


def _closed_port() -> int:
    return free_port()  # bound, read and released: nothing listens there


@contextlib.contextmanager
def _silent_server():
    """A TCP port that accepts connections (the kernel's backlog) and never
    answers a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def _database_at(port: int, **extra) -> dict:
    """The test database's settings, pointed at another port."""
    return {**connections.settings["default"], "HOST": "127.0.0.1", "PORT": str(port), **extra}


# --- /healthz ------------------------------------------------------------------------


@pytest.mark.django_db
def test_healthz_runs_no_query_and_sets_no_cookie(django_assert_num_queries):
    # given a browser's session cookie and an API token: nothing reads them
    client = Client(HTTP_AUTHORIZATION="Token 0123456789abcdef")
    client.cookies["sessionid"] = "a-session-that-does-not-exist"
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response.cookies == {}
    assert "no-cache" in response["Cache-Control"]


def test_healthz_touches_no_database_cache_or_broker(monkeypatch):
    # No database access is allowed in this test (pytest-django refuses any
    # connection), and no Python socket may connect, send or receive (a pooled
    # Redis connection too): no cache, no broker.
    def refuse(sock, *args, **kwargs):
        raise AssertionError("/healthz used the network")

    for method in ("connect", "connect_ex", "send", "sendall", "recv", "recv_into"):
        monkeypatch.setattr(socket.socket, method, refuse)
    responses = [Client().get("/healthz") for _ in range(50)]  # and no throttle
    assert {r.status_code for r in responses} == {200}
    assert Client().post("/healthz").status_code == 405


def test_probes_over_plain_http_are_not_redirected_to_https(settings):
    settings.SECURE_SSL_REDIRECT = True
    assert Client().get("/healthz").status_code == 200
    assert (
        Client()
        .get("/readyz?exclude=database&exclude=broker&exclude=relay&exclude=beat&exclude=cache")
        .status_code
        == 200
    )
    assert Client().get("/metrics").status_code == 301  # the rule still holds elsewhere


# --- /readyz -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_readyz_is_200_when_everything_answers():
    _fresh_heartbeats()
    response, body = _readyz()
    assert response.status_code == 200, body
    assert body["status"] == "ok" and body["failed"] == [] and body["degraded"] == []
    assert list(body["checks"]) == ["database", "broker", "relay", "beat", "cache"]
    assert all(check["ok"] for check in body["checks"].values()), body
    assert body["checks"]["database"]["detail"].startswith("SELECT 1 answered in ")
    assert body["checks"]["beat"]["detail"].startswith("resume_sagas last started ")
    assert body["checks"]["cache"]["detail"].startswith("answered in ")
    assert "no-cache" in response["Cache-Control"]


@pytest.mark.django_db(transaction=True)
def test_readyz_names_the_database_when_it_cannot_connect(monkeypatch):
    _fresh_heartbeats()
    monkeypatch.setitem(
        connections.settings, "default", _database_at(_closed_port(), PASSWORD="s3cret-db-password")
    )
    response, body = _readyz()
    assert response.status_code == 503
    assert body["status"] == "fail"
    assert body["failed"] == ["database", "relay", "beat"]
    database = body["checks"]["database"]
    assert not database["ok"] and database["detail"].startswith("OperationalError: ")
    assert "refused" in database["detail"].lower()
    assert body["checks"]["broker"]["ok"] is True
    assert body["checks"]["relay"]["detail"] == "not checked: the database did not answer"
    assert b"s3cret-db-password" not in response.content


@pytest.mark.django_db(transaction=True)
def test_readyz_names_the_broker_when_it_cannot_connect(monkeypatch):
    _fresh_heartbeats()
    # The variable Celery reads first, as an operator would set it.
    monkeypatch.setenv("CELERY_BROKER_URL", f"redis://:hunter2-pw@127.0.0.1:{_closed_port()}/0")
    response, body = _readyz()
    assert response.status_code == 503
    assert body["failed"] == ["broker"]
    broker = body["checks"]["broker"]
    assert not broker["ok"] and "refused" in broker["detail"].lower(), broker
    assert b"hunter2-pw" not in response.content


@pytest.mark.django_db(transaction=True)
def test_readyz_gives_up_on_a_database_that_never_answers(monkeypatch, settings):
    _fresh_heartbeats()
    settings.HEALTH_CHECK_TIMEOUT_SECONDS = 0.5
    with _silent_server() as port:
        monkeypatch.setitem(connections.settings, "default", _database_at(port))
        started = time.monotonic()
        response, body = _readyz()
        took = time.monotonic() - started
    assert response.status_code == 503
    assert body["checks"]["database"] == {"ok": False, "detail": "no answer within 0.5 s"}
    assert body["checks"]["broker"]["ok"] is True
    assert took < 1.5, f"the probe waited {took:.1f} s"


@pytest.mark.django_db(transaction=True)
def test_readyz_names_the_relay_when_its_pulse_is_stale(settings):
    now = timezone.now()
    _fresh_heartbeats(now=now)
    relay_pulse_record(now=now - timedelta(seconds=settings.HEALTH_RELAY_MAX_AGE_SECONDS + 5))
    response, body = _readyz()
    assert response.status_code == 503
    assert body["failed"] == ["relay"]
    detail = body["checks"]["relay"]["detail"]
    assert detail.startswith("last pulse 3") and "(limit 30 s)" in detail, detail


@pytest.mark.django_db(transaction=True)
def test_readyz_names_the_relay_that_never_pulsed_and_beat_when_its_sweep_is_late(settings):
    late = timedelta(seconds=settings.HEALTH_BEAT_MAX_AGE_SECONDS + 60)
    with heartbeat("resume_sagas", now=timezone.now() - late):
        pass
    response, body = _readyz()
    assert response.status_code == 503
    assert body["failed"] == ["relay", "beat"]
    assert body["checks"]["relay"]["detail"] == "no pulse recorded yet: is a relay running?"
    assert body["checks"]["beat"]["detail"].startswith("resume_sagas last started 24")


@pytest.mark.django_db(transaction=True)
def test_readyz_leaves_out_the_excluded_checks():
    # No heartbeat at all: web's own readiness (Compose's web healthcheck)
    # does not wait for the relay or beat, which start after it.
    response, body = _readyz("?exclude=relay&exclude=beat")
    assert response.status_code == 200, body
    assert list(body["checks"]) == ["database", "broker", "cache"]
    response = Client().get("/readyz?exclude=relay&exclude=etcd")
    assert response.status_code == 400
    assert response.json()["detail"].startswith("unknown check etcd;")


@pytest.mark.django_db(transaction=True)
def test_a_failed_readyz_is_one_warning_not_an_error(caplog):
    with caplog.at_level(logging.INFO, logger="django.request"):
        response, _ = _readyz()
    assert response.status_code == 503
    lines = [r for r in caplog.records if r.name == "django.request"]
    assert [r.levelno for r in lines] == [logging.WARNING]
    assert lines[0].getMessage().startswith("Not ready: relay: no pulse recorded yet")


def test_beat_is_judged_by_its_most_frequent_sweep(settings):
    assert beat_sweep() == "resume_sagas"
    settings.SWEEP_INTERVALS = {"resume_sagas": 600.0, "chase_compensations": 30.0}
    assert beat_sweep() == "chase_compensations"


def test_reasons_never_carry_credentials():
    reason = error_reason(
        ConnectionError(
            "Cannot connect to redis://admin:pa55word@cache:6379/0: refused\nsecond line"
        )
    )
    assert reason == "ConnectionError: Cannot connect to redis://***@cache:6379/0: refused"


# --- the relay's pulse -------------------------------------------------------------------


def _pulses(queries) -> list[str]:
    """The pulses recorded: each is one UPDATE (the first time, an INSERT
    follows it)."""
    return [q["sql"] for q in queries if q["sql"].startswith('UPDATE "purchases_sweepheartbeat"')]


def _run_relay(passes: int) -> None:
    calls = iter(range(passes + 1))
    relay_run(stop=lambda: next(calls) >= passes, poll=0.01)


@pytest.mark.django_db(transaction=True)
def test_the_relay_loop_records_its_pulse_at_most_once_per_interval(monkeypatch, settings, caplog):
    monkeypatch.setattr(pulse, "_last_pulse", None)  # whatever ran before in this process
    settings.OUTBOX_RELAY_PULSE_SECONDS = 3600
    before = timezone.now()
    with CaptureQueriesContext(connection) as queries, caplog.at_level(logging.ERROR):
        _run_relay(passes=3)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert len(_pulses(queries)) == 1  # the first pass; the next two read a clock
    row = SweepHeartbeat.objects.get(name=RELAY)
    assert row.last_succeeded_at is not None
    assert before <= row.last_succeeded_at <= timezone.now()
    assert row.interval_seconds == math.ceil(settings.HEALTH_RELAY_MAX_AGE_SECONDS / 2)

    # With a pulse due at every pass, every pass records one.
    settings.OUTBOX_RELAY_PULSE_SECONDS = 1e-9
    with CaptureQueriesContext(connection) as queries:
        _run_relay(passes=3)
    assert len(_pulses(queries)) == 3
    assert _readyz()[1]["checks"][RELAY]["ok"] is True


@pytest.mark.django_db(transaction=True)
def test_the_stalled_sweep_alert_and_readiness_agree_about_the_relay(settings):
    pulsed = timezone.now() - timedelta(hours=1)
    relay_pulse_record(now=pulsed)
    limit = timedelta(seconds=settings.HEALTH_RELAY_MAX_AGE_SECONDS)

    for offset, stale in (
        (limit - timedelta(seconds=1), False),
        (limit + timedelta(seconds=1), True),
    ):
        at = pulsed + offset
        assert (RELAY in sweeps_stalled(now=at)) is stale, offset
        assert readiness([RELAY], now=at).ok is not stale, offset


# --- manage.py probe -------------------------------------------------------------------


def _probe(*checks: str) -> subprocess.CompletedProcess:
    """``manage.py probe`` as Compose runs it: a process of its own, on the
    test database."""
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": (
            f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        ),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return subprocess.run(
        [sys.executable, "manage.py", "probe", *checks],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.django_db(transaction=True)
def test_the_probe_command_exits_0_when_ready_and_1_naming_what_is_not():
    # given no relay has ever pulsed
    ready = _probe("database", "broker")
    assert ready.returncode == 0, ready.stderr
    assert json.loads(ready.stdout)["failed"] == []

    not_ready = _probe("database", "broker", "relay")
    assert not_ready.returncode == 1
    assert json.loads(not_ready.stdout)["failed"] == ["relay"]
    assert "not ready: relay: no pulse recorded yet" in not_ready.stderr

    # when a relay pulses, the same probe passes
    relay_pulse_record(now=timezone.now())
    assert _probe("relay").returncode == 0

    unknown = _probe("relay", "etcd")
    assert unknown.returncode == 2 and "unknown check etcd" in unknown.stderr


@pytest.mark.django_db(transaction=True)
def test_the_probe_command_in_process(capsys):
    _fresh_heartbeats()
    call_command("probe")
    assert json.loads(capsys.readouterr().out)["status"] == "ok"
    SweepHeartbeat.objects.filter(name=RELAY).update(last_succeeded_at=None)
    with pytest.raises(CommandError) as raised:
        call_command("probe", *CHECKS)
    assert raised.value.returncode == 1
    assert str(raised.value).startswith("not ready: relay: ")
