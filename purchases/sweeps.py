"""Sweeps: the resumer, the chaser and the watchdog over both.

They are what keeps a saga from ever being silently stuck when a message is
lost (an on-commit enqueue that failed, a worker killed mid-step, Redis
restarted empty). Each run leaves a heartbeat; a sweep that has not succeeded
within twice its interval is itself an alert.

The candidate queries only touch live sagas (``saga_live_idx`` is partial on
the non-terminal states), so their cost does not grow with finished sagas.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from config import metrics
from outbox.models import OutboxMessage
from payments.interface import PaymentGateway

from . import lock_objects, services
from .models import Actor, PurchaseSaga, ReconciliationProbe, SweepHeartbeat
from .states import SagaState

logger = logging.getLogger(__name__)

S = SagaState

# Topics of timers that are themselves driving a saga: a saga waiting on one
# of these is not stale, it is on schedule.
DRIVING_TOPICS = (services.TOPIC_RECONCILE, services.TOPIC_REFUND_RETRY,
                  services.TOPIC_HOLD_RECHECK)
COMPENSATION_UNFINISHED = (S.COMPENSATING, S.COMPENSATION_PENDING)
RESUMABLE = (S.PENDING, S.CHARGING, S.UNKNOWN, S.PAYMENT_FAILED, S.EXPIRED, S.COMPENSATING,
             S.COMPENSATION_PENDING)


def sweep_interval(name: str) -> float:
    """Seconds between runs of a sweep (settings.SWEEP_INTERVALS)."""
    return settings.SWEEP_INTERVALS.get(name, 300)


# --- heartbeats -----------------------------------------------------------------


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
        last_succeeded_at=timezone.now(), rows_seen=pulse.seen, rows_acted=pulse.acted,
        stall_alerted_at=None, last_error="",
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
            logger.error("sweep stalled: %s has not succeeded since %s", beat.name, last,
                         extra={"alert": "sweep_stalled", "sweep": beat.name})
            metrics.ALERTS.labels(kind="sweep_stalled").inc()
    return stalled


# --- the resumer --------------------------------------------------------------------


def _driving_timer(*, overdue_before: datetime):
    # A timer overdue by more than the resume threshold is not driving
    # anything any more (its deliveries keep failing, or the relay is down).
    return OutboxMessage.objects.filter(
        saga_id=OuterRef("pk"), topic__in=DRIVING_TOPICS,
        completed_at__isnull=True, cancelled_at__isnull=True,
        available_at__gte=overdue_before,
    )


def stale_sagas(*, older_than: int, now: datetime, limit: int | None = None):
    """Live sagas not moved for ``older_than`` seconds and not on a timer."""
    cutoff = now - timedelta(seconds=older_than)
    qs = (
        PurchaseSaga.objects.filter(state__in=RESUMABLE, updated_at__lt=cutoff,
                                    awaiting_operator_since__isnull=True)
        .exclude(Exists(_driving_timer(overdue_before=cutoff)))
        .order_by("updated_at")
    )
    return qs[:limit] if limit else qs


_WHY = {
    S.PENDING: "never charged (the enqueue was lost?): charge with its intent id",
    S.CHARGING: "charge answer never recorded (worker died?): look the intent up",
    S.UNKNOWN: "reconcile probe not scheduled: look the intent up",
    S.PAYMENT_FAILED: "declined, compensation never ran: compensate",
    S.EXPIRED: "expired, compensation never ran: compensate",
    S.COMPENSATING: "compensation interrupted: resume it",
    S.COMPENSATION_PENDING: "refund retry not scheduled: retry the refund",
}


def saga_resume(
    *,
    saga_id,
    actor: str = Actor.RESUMER,
    actor_name: str = "",
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
) -> PurchaseSaga:
    """Drive one saga again from its current state, with its own intent id.

    No double charge by construction: PENDING charges with the saga's intent
    id (the gateway replays a charge that already landed); CHARGING and
    UNKNOWN look the intent up before anything else.
    """
    saga = PurchaseSaga.objects.get(pk=saga_id)
    state = SagaState(saga.state)
    if state == S.PENDING:
        return services.saga_charge(
            saga_id=saga_id, gateway=gateway, now=now, actor=actor, actor_name=actor_name
        )
    if state in (S.CHARGING, S.UNKNOWN):
        probes = ReconciliationProbe.objects.filter(saga_id=saga_id, asked="retrieve").count()
        return services.saga_reconcile(saga_id=saga_id, attempt=probes + 1, gateway=gateway,
                                       now=now, actor=actor, actor_name=actor_name)
    if state in (S.PAYMENT_FAILED, S.EXPIRED, S.COMPENSATING, S.COMPENSATION_PENDING):
        return services.saga_compensate(saga_id=saga_id, gateway=gateway, now=now, actor=actor,
                                        actor_name=actor_name, reason="resumed: compensating")
    return saga


@dataclass
class ResumeLine:
    saga_id: str
    state: str
    why: str
    result: str = ""


@dataclass
class ResumeReport:
    lines: list[ResumeLine] = field(default_factory=list)
    dry_run: bool = False


def sweep_resume(
    *,
    older_than: int | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
) -> ResumeReport:
    """``manage.py resume_sagas``: re-drive every stale live saga."""
    now = now or timezone.now()
    older_than = settings.RESUME_AFTER_SECONDS if older_than is None else older_than
    report = ResumeReport(dry_run=dry_run)
    with heartbeat("resume_sagas", now=now) as pulse:
        candidates = list(stale_sagas(older_than=older_than, now=now, limit=limit)
                          .values_list("pk", "state"))
        pulse.seen = len(candidates)
        for saga_id, state in candidates:
            line = ResumeLine(str(saga_id), state, _WHY[SagaState(state)])
            report.lines.append(line)
            if dry_run:
                line.result = "dry run: nothing done"
                continue
            if not _claim(saga_id, state):
                line.result = "skipped: someone else holds it or it moved on"
                continue
            logger.warning("resuming saga: %s", line.why,
                           extra={"saga_id": line.saga_id, "state": state})
            try:
                line.result = saga_resume(saga_id=saga_id, gateway=gateway).state
                pulse.acted += 1
            except Exception as exc:  # one saga's failure must not stop the sweep
                logger.exception("resume failed", extra={"saga_id": line.saga_id})
                line.result = f"failed: {type(exc).__name__}: {exc}"
    return report


def _claim(saga_id, state: str) -> bool:
    """A saga locked by someone else (a worker on it right now) is theirs."""
    with transaction.atomic(durable=True):
        return lock_objects.saga_for_update_skip_locked(saga_ids=[saga_id]).filter(
            state=state
        ).exists()


# --- the chaser ---------------------------------------------------------------------


@dataclass
class ChaseLine:
    saga_id: str
    state: str
    alerted: bool


def sweep_chase(*, deadline: int | None = None, now: datetime | None = None) -> list[ChaseLine]:
    """``manage.py chase_compensations``: escalate what waits too long.

    A compensation still unfinished ``deadline`` seconds after it *started*
    (not after its last move: each refund retry moves the saga), and every
    UNKNOWN_EXPIRED saga, raise an alert each, once: the alert is an outbox
    row whose key names the escalation (the compensation's deadline, or the
    version that escalated), not on every run.
    """
    now = now or timezone.now()
    deadline = settings.COMPENSATION_DEADLINE_SECONDS if deadline is None else deadline
    lines = []
    with heartbeat("chase_compensations", now=now) as pulse:
        overdue = list(
            PurchaseSaga.objects.filter(
                state__in=COMPENSATION_UNFINISHED,
                compensation_started_at__lt=now - timedelta(seconds=deadline),
            ).values_list("pk", flat=True)
        ) + list(PurchaseSaga.objects.filter(state=S.UNKNOWN_EXPIRED).values_list("pk", flat=True))
        pulse.seen = len(overdue)
        for saga_id in overdue:
            with transaction.atomic(durable=True):
                saga = lock_objects.saga_for_update_skip_locked(saga_ids=[saga_id]).first()
                if saga is None:
                    continue  # someone is driving it right now; the next run looks again
                if saga.state == S.UNKNOWN_EXPIRED:
                    alerted = services.raise_operator_alert(
                        saga, why="charge outcome unknown", now=now)
                elif saga.state in COMPENSATION_UNFINISHED:
                    alerted = services.raise_operator_alert(
                        saga, now=now, once_per="compensation_deadline",
                        why=f"compensation unfinished past its deadline (started "
                            f"{saga.compensation_started_at.isoformat()})")
                else:
                    continue
            pulse.acted += int(alerted)
            lines.append(ChaseLine(str(saga_id), saga.state, alerted))
    return lines
