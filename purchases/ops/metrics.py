"""The state metrics, read from the database at scrape time, and the
``/metrics`` view that adds them to the event counters (``config.metrics``;
docs/operations.md, "Metrics").

Without the database the page still answers ``200``: the process's own
counters and ``boxoffice_database_up 0``, so the counters are not lost
exactly when an outage makes them matter, and Prometheus keeps scraping.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

import psycopg
from django.conf import settings
from django.db import InterfaceError, OperationalError, connections
from django.db.models import Count, Min, OuterRef, Subquery, Sum
from django.http import HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from outbox.models import OutboxMessage
from outbox.relay import dead_letters
from webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint

from ..models import AuditRun, PurchaseSaga, SweepHeartbeat
from ..saga.states import SagaState
from ..saga.topics import Topic
from .health import error_reason
from .sweeps import COMPENSATION_UNFINISHED

logger = logging.getLogger(__name__)

# The webhook deliveries the gauge counts: those an operator may have to act on.
OPEN_DELIVERIES = (DeliveryStatus.PENDING, DeliveryStatus.FAILED)

# The SQLSTATEs of a server that is going away or not taking connections yet
# (admin shutdown, crash shutdown, cannot connect now); class 08 is the
# connection exceptions.
_SHUTTING_DOWN = frozenset({"57P01", "57P02", "57P03"})


def database_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached (refused, reset,
    gone in the middle of a query, shutting down), not that a query failed.

    Django wraps the driver's errors in its own (the driver's is
    ``__cause__``); psycopg's are judged too for a connection opened outside
    Django's wrapper. A client-side failure has no SQLSTATE. The server's
    own OperationalErrors (QueryCanceled by a statement_timeout, a deadlock,
    a lock not available, a serialization failure) are not an outage: like
    any other error they propagate, and are seen as what they are.
    """
    if isinstance(exc, (InterfaceError, psycopg.InterfaceError)):
        return True
    cause = exc.__cause__ if isinstance(exc, OperationalError) else exc
    if not isinstance(cause, psycopg.OperationalError):
        return False
    sqlstate = cause.sqlstate
    return sqlstate is None or sqlstate.startswith("08") or sqlstate in _SHUTTING_DOWN


def database_named(alias: str = "default") -> str:
    """Where the database is, for a message: ``host:port/name`` (the name
    alone over a Unix socket), never the user or the password."""
    db = connections.settings[alias]
    if not db.get("HOST"):
        return str(db.get("NAME"))
    return f"{db['HOST']}:{db.get('PORT') or 5432}/{db.get('NAME')}"


def _deliveries_of_endpoint(status: DeliveryStatus) -> Subquery:
    return Subquery(
        WebhookDelivery.objects.filter(endpoint=OuterRef("pk"), status=status)
        .order_by()
        .values("endpoint")
        .annotate(n=Count("*"))
        .values("n")
    )


def _sagas_by_state() -> GaugeMetricFamily:
    sagas = GaugeMetricFamily("boxoffice_sagas", "Sagas by state", labels=["state"])
    counts = dict(PurchaseSaga.objects.values_list("state").annotate(n=Count("pk")))
    for state in SagaState:
        sagas.add_metric([state.value], counts.get(state.value, 0))
    return sagas


def _compensations_overdue(now: datetime) -> GaugeMetricFamily:
    # What the chaser escalates (sweep_chase's filter), as a level rather
    # than a once-only event: it stays up until an operator settles the
    # compensation. Live states only, so it reads saga_live_idx.
    cutoff = now - timedelta(seconds=settings.COMPENSATION_DEADLINE_SECONDS)
    overdue = PurchaseSaga.objects.filter(
        state__in=COMPENSATION_UNFINISHED, compensation_started_at__lt=cutoff
    ).count()
    return GaugeMetricFamily(
        "boxoffice_compensations_overdue",
        "Compensations still unfinished COMPENSATION_DEADLINE_SECONDS after they started",
        value=overdue,
    )


def _outbox_backlog(now: datetime) -> Iterator[GaugeMetricFamily]:
    """The due backlog and the age of its oldest row, from one aggregate."""
    due = OutboxMessage.objects.filter(
        completed_at__isnull=True, cancelled_at__isnull=True, available_at__lte=now
    )
    agg = due.aggregate(n=Count("pk"), oldest=Min("available_at"))
    yield GaugeMetricFamily(
        "boxoffice_outbox_backlog", "Due outbox rows not yet completed", value=agg["n"]
    )
    oldest = (now - agg["oldest"]).total_seconds() if agg["oldest"] else 0.0
    yield GaugeMetricFamily(
        "boxoffice_outbox_oldest_due_age_seconds",
        "Age of the oldest due, unfinished outbox row",
        value=oldest,
    )


def _sweep_heartbeats(now: datetime) -> Iterator[GaugeMetricFamily]:
    """Each sweep's age since it last succeeded, and whether it stalled."""
    age = GaugeMetricFamily(
        "boxoffice_sweep_last_success_age_seconds",
        "Seconds since the sweep last succeeded",
        labels=["sweep"],
    )
    stalled = GaugeMetricFamily(
        "boxoffice_sweep_stalled",
        "1 when a sweep has not succeeded within twice its interval",
        labels=["sweep"],
    )
    for beat in SweepHeartbeat.objects.all():
        since = (
            (now - beat.last_succeeded_at).total_seconds()
            if beat.last_succeeded_at
            else float("inf")
        )
        age.add_metric([beat.name], since)
        stalled.add_metric([beat.name], 1.0 if since > 2 * beat.interval_seconds else 0.0)
    yield age
    yield stalled


def _last_audit() -> Iterator[GaugeMetricFamily]:
    """The last finished invariant audit's verdict, or nothing before one."""
    last = AuditRun.objects.filter(finished_at__isnull=False).first()
    if last is not None and last.finished_at is not None:  # (always, by the filter)
        # Before the first audit there is no verdict: no series at all
        # (alert on its absence), never a reassuring 0.
        yield GaugeMetricFamily(
            "boxoffice_audit_violations",
            "Violations found by the last invariant audit",
            value=last.violations,
        )
        yield GaugeMetricFamily(
            "boxoffice_audit_unverified_intents",
            "Intents the last audit could not verify (gateway gave no "
            "answer): the run was incomplete",
            value=last.unverified,
        )
        yield GaugeMetricFamily(
            "boxoffice_audit_last_run_timestamp_seconds",
            "When the last invariant audit finished",
            value=last.finished_at.timestamp(),
        )


def _outbox_dead_letters() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "boxoffice_outbox_dead_letters",
        "Outbox rows whose redelivery schedule ran out, not replayed yet (an operator's)",
        value=dead_letters().count(),
    )


def _open_webhook_deliveries() -> GaugeMetricFamily:
    # Pending and failed only, counted per endpoint: each count is a seek
    # into the (endpoint, status) index that reads no table row, so the
    # cost follows the endpoints and the open deliveries. Delivered ones
    # are nearly every row: counting them would scan the index at every
    # scrape (about 0.25 s at a million deliveries).
    deliveries = GaugeMetricFamily(
        "boxoffice_webhook_deliveries",
        "Outgoing webhook deliveries by status, pending (an "
        "attempt is owed) and failed (the schedule ran out) only",
        labels=["status"],
    )
    per_endpoint = WebhookEndpoint.objects.order_by().annotate(
        **{f"n_{status.value}": _deliveries_of_endpoint(status) for status in OPEN_DELIVERIES}
    )
    totals = per_endpoint.aggregate(
        **{status.value: Sum(f"n_{status.value}") for status in OPEN_DELIVERIES}
    )
    for status in OPEN_DELIVERIES:
        deliveries.add_metric([status.value], totals[status.value] or 0)
    return deliveries


def _operator_alerts_raised() -> GaugeMetricFamily:
    needs = OutboxMessage.objects.filter(topic=Topic.NEEDS_OPERATOR).count()
    return GaugeMetricFamily(
        "boxoffice_operator_alerts_raised",
        "purchase.needs_operator alerts ever raised (from the outbox)",
        value=needs,
    )


class DatabaseCollector:
    """State metrics, read from the database at scrape time."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        # One generator, as before the split: each helper reads the database
        # only when the scrape gets to its families, in this order, all with
        # the same ``now``.
        now = timezone.now()
        yield _sagas_by_state()
        yield _compensations_overdue(now)
        yield from _outbox_backlog(now)
        yield from _sweep_heartbeats(now)
        yield from _last_audit()
        yield _outbox_dead_letters()
        yield _open_webhook_deliveries()
        yield _operator_alerts_raised()


class _Collected:
    """Metric families read already, for a registry to write out."""

    def __init__(self, families: Iterable[Metric]):
        self.families = list(families)

    def collect(self):
        return self.families


def state_metrics() -> list[Metric]:
    """The state gauges and ``boxoffice_database_up``: 1 with the gauges, 0
    and none of them when the database cannot be reached (one warning)."""
    up = GaugeMetricFamily(
        "boxoffice_database_up",
        "1 when this scrape read the state gauges from the database, 0 when it could not reach it",
    )
    try:
        # Read in full before anything is written: a database lost halfway
        # leaves no half set of gauges on the page.
        families = list(DatabaseCollector().collect())
    except Exception as exc:
        if not database_unreachable(exc):
            raise
        logger.warning(
            "metrics: the database at %s is unreachable; serving this process's counters only (%s)",
            database_named(),
            error_reason(exc),
            extra={"database": database_named()},
        )
        up.add_metric([], 0)
        return [up]
    up.add_metric([], 1)
    return [*families, up]


def metrics_view(request):
    started = time.perf_counter()
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    output = generate_latest(registry)
    db = CollectorRegistry()
    db.register(_Collected(state_metrics()))
    output += generate_latest(db)
    output += (
        b"# HELP boxoffice_metrics_scrape_seconds Time spent producing this page\n"
        b"# TYPE boxoffice_metrics_scrape_seconds gauge\n"
        + f"boxoffice_metrics_scrape_seconds {time.perf_counter() - started:.6f}\n".encode()
    )
    return HttpResponse(output, content_type=CONTENT_TYPE_LATEST)
