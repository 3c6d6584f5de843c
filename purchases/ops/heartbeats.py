"""Heartbeats of the sweeps (resumer, chaser, auditor): each run leaves its
pulse in ``SweepHeartbeat``, so a sweeper that stalls is itself visible, and
alerted once per silence (docs/operations.md, "Alerts")."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from config import metrics

from ..models import SweepHeartbeat

logger = logging.getLogger(__name__)


def sweep_interval(name: str) -> float:
    """Seconds between runs of a sweep (settings.SWEEP_INTERVALS)."""
    return settings.SWEEP_INTERVALS.get(name, 300)


@dataclass
class Pulse:
    seen: int = 0
    acted: int = 0


@contextmanager
def heartbeat(name: str, *, now: datetime | None = None):
    """Record a sweep run: start, then success (with counts) or failure."""
    now = now or timezone.now()
    interval = max(1, round(sweep_interval(name)))
    with transaction.atomic(durable=True):
        SweepHeartbeat.objects.update_or_create(
            name=name, defaults={"last_started_at": now, "interval_seconds": interval}
        )
    pulse = Pulse()
    try:
        yield pulse
    except Exception as exc:
        SweepHeartbeat.objects.filter(name=name).update(
            last_failed_at=timezone.now(), last_error=f"{type(exc).__name__}: {exc}"[:2000]
        )
        metrics.SWEEP_RUNS.labels(sweep=name, result="failed").inc()
        raise
    SweepHeartbeat.objects.filter(name=name).update(
        last_succeeded_at=timezone.now(),
        rows_seen=pulse.seen,
        rows_acted=pulse.acted,
        stall_alerted_at=None,
        last_error="",
    )
    metrics.SWEEP_RUNS.labels(sweep=name, result="succeeded").inc()


def sweeps_stalled(*, now: datetime | None = None) -> list[str]:
    """Sweeps that have not succeeded within twice their interval; each is
    alerted once per silence (ERROR log + metric)."""
    now = now or timezone.now()
    stalled = []
    for beat in SweepHeartbeat.objects.all():
        last = beat.last_succeeded_at or beat.last_started_at
        if last is None or now - last <= timedelta(seconds=2 * beat.interval_seconds):
            continue
        stalled.append(beat.name)
        if SweepHeartbeat.objects.filter(pk=beat.pk, stall_alerted_at__isnull=True).update(
            stall_alerted_at=now
        ):
            logger.error(
                "sweep stalled: %s has not succeeded since %s",
                beat.name,
                last,
                extra={"alert": "sweep_stalled", "sweep": beat.name},
            )
            metrics.ALERTS.labels(kind="sweep_stalled").inc()
    return stalled
