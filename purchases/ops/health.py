"""Liveness and readiness: ``GET /healthz``, ``GET /readyz`` and
``manage.py probe`` (docs/operations.md, "Health checks").

Liveness is the process answering, nothing more: no database, cache or
broker, so a probe that restarts dead processes never restarts a healthy one
because a dependency is down.

Readiness runs up to five checks: ``database`` (a connection of its own and
``SELECT 1``), ``broker`` (a connection of its own to Celery's broker, which
must answer), ``relay`` (the relay's pulse, recorded by ``outbox.pulse``
through ``relay_pulse_record``), ``beat`` (its most frequent sweep
started recently) and ``cache`` (a connection of its own to the cache's
Redis, which must answer a PING). The database, the broker and the cache are
asked at the same time, each in a thread with a deadline
(``HEALTH_CHECK_TIMEOUT_SECONDS``), so a probe answers within that time
whatever hangs. The heartbeats are read on the database check's connection.

The cache only saves work (``purchases/cache_outage.py``): without it every
request still answers, from the database. A cache that does not answer is
``degraded``, not ``failed``: ``/readyz`` stays ``200`` (taking every web
process out of the load balancer would not bring the cache back) and says so.
"""

from __future__ import annotations

import copy
import functools
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.redis import RedisCache
from django.db import connections
from django.db.utils import load_backend
from django.http import JsonResponse
from django.utils import timezone
from django.utils.log import log_response
from django.utils.module_loading import import_string
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from kombu.exceptions import ChannelError

from config.celery import app

from ..models import SweepHeartbeat

CHECKS = ("database", "broker", "relay", "beat", "cache")
# Checks that degrade, not fail, readiness: what they watch only saves work.
SOFT_CHECKS = ("cache",)
# The relay's row in SweepHeartbeat (its pulse, beside the sweeps' rows).
RELAY = "relay"
_DATABASE_ALIAS = "default"
_REASON_CHARS = 200
# user:password@ in a URL that an error message might quote.
_CREDENTIALS = re.compile(r"(//)[^/@\s]*@")


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str


@dataclass(frozen=True)
class Readiness:
    checks: dict[str, Check]

    @property
    def failed(self) -> list[str]:
        return [
            name for name, check in self.checks.items() if not check.ok and name not in SOFT_CHECKS
        ]

    @property
    def degraded(self) -> list[str]:
        return [name for name, check in self.checks.items() if not check.ok and name in SOFT_CHECKS]

    @property
    def ok(self) -> bool:
        return not self.failed

    def as_dict(self) -> dict:
        """The body of ``/readyz`` and the output of ``manage.py probe``."""
        return {
            "status": "ok" if self.ok else "fail",
            "failed": self.failed,
            "degraded": self.degraded,
            "checks": {name: {"ok": c.ok, "detail": c.detail} for name, c in self.checks.items()},
        }


def beat_sweep() -> str:
    """The sweep beat runs most often: beat is judged by its heartbeat."""
    return min(settings.SWEEP_INTERVALS, key=settings.SWEEP_INTERVALS.__getitem__)


def readiness(checks: Iterable[str] = CHECKS, *, now: datetime | None = None) -> Readiness:
    """Run the named checks (reported in ``CHECKS`` order)."""
    wanted = [name for name in CHECKS if name in set(checks)]
    timeout = settings.HEALTH_CHECK_TIMEOUT_SECONDS
    # The SweepHeartbeat rows the heartbeat checks read.
    row_of = {RELAY: RELAY, "beat": beat_sweep()}
    rows = [row_of[name] for name in (RELAY, "beat") if name in wanted]
    calls: dict[str, Callable[[], Any]] = {}
    if "database" in wanted or rows:
        calls["database"] = functools.partial(_database_probe, rows=rows, timeout=timeout)
    if "broker" in wanted:
        calls["broker"] = functools.partial(_broker_probe, timeout=timeout)
    if "cache" in wanted:
        calls["cache"] = functools.partial(_cache_probe, timeout=timeout)
    answers = _run_with_deadline(calls, timeout=timeout)

    results: dict[str, Check] = {}
    database_ok, database = answers.get("database", (False, None))
    if "database" in wanted:
        results["database"] = Check(True, database[0]) if database_ok else Check(False, database)
    if "broker" in wanted:
        results["broker"] = Check(*answers["broker"])
    found = database[1] if database_ok else "not checked: the database did not answer"
    now = now or timezone.now()
    if RELAY in wanted:
        results[RELAY] = _relay_check(found, now=now)
    if "beat" in wanted:
        results["beat"] = _beat_check(found, now=now)
    if "cache" in wanted:
        results["cache"] = Check(*answers["cache"])
    return Readiness({name: results[name] for name in wanted})


# --- the relay's pulse ---------------------------------------------------------


def relay_pulse_record(*, now: datetime) -> None:
    """Record that a relay loop completed a pass (``outbox.pulse``, which calls
    this through ``settings.OUTBOX_RELAY_PULSE``: the outbox knows nothing of
    the purchases app).

    Its row in ``SweepHeartbeat`` carries half of ``HEALTH_RELAY_MAX_AGE_SECONDS``
    as its interval, so the stalled-sweep alert and gauge (twice the interval)
    say "stalled" exactly when readiness says "stale". One UPDATE; the INSERT
    only the first time.
    """
    fields = {
        "interval_seconds": max(1, math.ceil(settings.HEALTH_RELAY_MAX_AGE_SECONDS / 2)),
        "last_started_at": now,
        "last_succeeded_at": now,
        "stall_alerted_at": None,
        "last_error": "",
    }
    if not SweepHeartbeat.objects.filter(name=RELAY).update(**fields):
        SweepHeartbeat.objects.update_or_create(name=RELAY, defaults=fields)


# --- the checks ------------------------------------------------------------------


def error_reason(exc: BaseException) -> str:
    """A short reason for a body or a log line: the error's type and first
    line (the driver's second is a hint), without credentials, capped."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return _CREDENTIALS.sub(r"\1***@", text)[:_REASON_CHARS]


def _run_with_deadline(
    calls: dict[str, Callable[[], Any]], *, timeout: float
) -> dict[str, tuple[bool, Any]]:
    """Run each call in a daemon thread, all at once; (True, result) or
    (False, reason) each, within ``timeout`` seconds in all. A call still
    running then is abandoned: daemon threads keep no process from exiting,
    and each probe's own timeouts end it soon after."""
    answers: dict[str, tuple[bool, Any]] = {}

    def run(name: str, call: Callable[[], Any]) -> None:
        try:
            answers[name] = (True, call())
        except Exception as exc:
            answers[name] = (False, error_reason(exc))

    threads = [
        threading.Thread(target=run, args=(name, call), name=f"readiness-{name}", daemon=True)
        for name, call in calls.items()
    ]
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return {name: answers.get(name, (False, f"no answer within {timeout:g} s")) for name in calls}


def _database_probe(*, rows: list[str], timeout: float) -> tuple[str, dict | str]:
    """``SELECT 1`` on a connection of its own, then the heartbeat rows asked
    for; returns (what it took, {name: row}, or why they could not be read:
    the database answered, the heartbeats are what failed). Runs in its own
    thread: the connection is this thread's, and closed before it ends."""
    settings_dict = copy.deepcopy(connections.settings[_DATABASE_ALIAS])
    probe = load_backend(settings_dict["ENGINE"]).DatabaseWrapper(settings_dict, _DATABASE_ALIAS)
    # libpq's own limit (whole seconds, at least 2), so that a thread the
    # probe gave up on does not wait for the system's TCP timeout.
    settings_dict["OPTIONS"]["connect_timeout"] = max(2, math.ceil(timeout))
    # This thread's connection for the alias, so that the ORM below uses it.
    connections[_DATABASE_ALIAS] = probe
    try:
        started = time.perf_counter()
        with probe.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        detail = f"SELECT 1 answered in {(time.perf_counter() - started) * 1000:.0f} ms"
        found: dict[str, SweepHeartbeat] | str
        try:
            found = (
                {
                    beat.name: beat
                    for beat in SweepHeartbeat.objects.using(_DATABASE_ALIAS).filter(name__in=rows)
                }
                if rows
                else {}
            )
        except Exception as exc:  # a missing table: the migrations have not run
            found = f"heartbeats unreadable: {error_reason(exc)}"
        return detail, found
    finally:
        probe.close()
        del connections[_DATABASE_ALIAS]


def _broker_probe(*, timeout: float) -> str:
    """A connection of its own to the broker the process publishes to, and one
    question (is the default queue there, and how long): returns what it took.
    Redis answers a PING when the channel opens; the filesystem transport
    lists its folder."""
    started = time.perf_counter()
    options = {"socket_timeout": timeout, "socket_connect_timeout": timeout, "max_retries": 0}
    with app.connection_for_write(connect_timeout=timeout, transport_options=options) as conn:
        conn.ensure_connection(max_retries=0)
        try:
            conn.default_channel.queue_declare(  # type: ignore[attr-defined]  # channels have it
                queue=settings.CELERY_TASK_DEFAULT_QUEUE, passive=True
            )
        except ChannelError:
            pass  # "no such queue": an empty one, or none declared yet; it answered
    return f"answered in {(time.perf_counter() - started) * 1000:.0f} ms"


def _cache_probe(*, timeout: float) -> str:
    """A connection of its own to the default cache's Redis (the server it
    writes to) and a PING: returns what it took. A cache that is not Redis
    (files, memory: this machine's) answers a read."""
    config = settings.CACHES[DEFAULT_CACHE_ALIAS]
    started = time.perf_counter()
    if issubclass(import_string(config["BACKEND"]), RedisCache):
        location = config["LOCATION"]
        # Django's Redis cache writes to the first server it is given.
        server = re.split("[;,]", location)[0] if isinstance(location, str) else location[0]
        import redis  # on first use, as Django's cache (purchases/cache_outage.py says why)

        client = redis.Redis.from_url(
            server, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        try:
            client.ping()
        finally:
            client.close()
    else:
        caches[DEFAULT_CACHE_ALIAS].get("readyz:probe")
    return f"answered in {(time.perf_counter() - started) * 1000:.0f} ms"


def _age(at: datetime | None, now: datetime) -> float | None:
    return None if at is None else max(0.0, (now - at).total_seconds())


def _relay_check(found: dict | str, *, now: datetime) -> Check:
    if isinstance(found, str):
        return Check(False, found)
    limit = settings.HEALTH_RELAY_MAX_AGE_SECONDS
    row = found.get(RELAY)
    age = _age(row.last_succeeded_at if row else None, now)
    if age is None:
        return Check(False, "no pulse recorded yet: is a relay running?")
    if age > limit:
        return Check(False, f"last pulse {age:.0f} s ago (limit {limit:g} s)")
    return Check(True, f"last pulse {age:.0f} s ago (limit {limit:g} s)")


def _beat_check(found: dict | str, *, now: datetime) -> Check:
    if isinstance(found, str):
        return Check(False, found)
    limit = settings.HEALTH_BEAT_MAX_AGE_SECONDS
    sweep = beat_sweep()
    row = found.get(sweep)
    age = _age(row.last_started_at if row else None, now)
    if age is None:
        return Check(False, f"{sweep} has never run: are beat and a worker running?")
    if age > limit:
        return Check(False, f"{sweep} last started {age:.0f} s ago (limit {limit:g} s)")
    return Check(True, f"{sweep} last started {age:.0f} s ago (limit {limit:g} s)")


# --- the views -------------------------------------------------------------------


@never_cache
@require_safe
def healthz_view(request):
    """Liveness: the process answers. No I/O of any kind."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_safe
def readyz_view(request):
    """Readiness: every check, or all but those named by ``?exclude=<check>``
    (repeatable, as Kubernetes' own ``/readyz``). 200 when all pass or only
    the cache does not (``"degraded": ["cache"]``), 503 otherwise; the same
    body either way."""
    excluded = request.GET.getlist("exclude")
    unknown = sorted(set(excluded) - set(CHECKS))
    if unknown:
        return JsonResponse(
            {
                "code": "invalid",
                "detail": f"unknown check {', '.join(unknown)}; the checks are {', '.join(CHECKS)}",
            },
            status=400,
        )
    result = readiness([name for name in CHECKS if name not in excluded])
    response = JsonResponse(result.as_dict(), status=200 if result.ok else 503)
    if not result.ok:
        # One WARNING line, not django.request's ERROR for a 5xx: "not ready"
        # is this endpoint's answer, and what failed is alerted on its own.
        log_response(
            "Not ready: %s",
            "; ".join(f"{name}: {result.checks[name].detail}" for name in result.failed),
            response=response,
            request=request,
            level="warning",
        )
    return response
