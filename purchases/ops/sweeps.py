"""Sweeps: the resumer and the chaser (docs/operations.md).

They are what keeps a saga from ever being silently stuck when a message is
lost (an on-commit enqueue that failed, a worker killed mid-step, Redis
restarted empty). Each run leaves a heartbeat (``heartbeats``); a sweep that
has not succeeded within twice its interval is itself an alert.

The candidate queries only touch live sagas (``saga_live_idx`` is partial on
the non-terminal states), so their cost does not grow with finished sagas.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from outbox.models import OutboxMessage
from payments.interface import PaymentGateway

from .. import lock_objects, services
from ..models import PurchaseSaga, Refund, RefundStatus
from ..saga.states import SagaState
from ..saga.topics import DRIVING
from .heartbeats import heartbeat

logger = logging.getLogger(__name__)

S = SagaState

COMPENSATION_UNFINISHED = (S.COMPENSATING, S.COMPENSATION_PENDING)


# --- the resumer --------------------------------------------------------------------


def _driving_timer(*, overdue_before: datetime):
    # A timer overdue by more than the resume threshold is not driving
    # anything any more (its deliveries keep failing, or the relay is down).
    return OutboxMessage.objects.filter(
        saga_id=OuterRef("pk"),
        topic__in=DRIVING,
        completed_at__isnull=True,
        cancelled_at__isnull=True,
        available_at__gte=overdue_before,
    )


def stale_sagas(*, older_than: int, now: datetime, limit: int | None = None):
    """Live sagas not moved for ``older_than`` seconds and not on a timer."""
    cutoff = now - timedelta(seconds=older_than)
    qs = (
        PurchaseSaga.objects.filter(
            state__in=list(services.DRIVES),
            updated_at__lt=cutoff,
            awaiting_operator_since__isnull=True,
        )
        .exclude(Exists(_driving_timer(overdue_before=cutoff)))
        .order_by("updated_at")
    )
    return qs[:limit] if limit else qs


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
        candidates = list(
            stale_sagas(older_than=older_than, now=now, limit=limit).values_list("pk", "state")
        )
        pulse.seen = len(candidates)
        for saga_id, state in candidates:
            line = ResumeLine(str(saga_id), state, services.DRIVES[SagaState(state)].why)
            report.lines.append(line)
            if dry_run:
                line.result = "dry run: nothing done"
                continue
            if not _claim(saga_id, state):
                line.result = "skipped: someone else holds it or it moved on"
                continue
            logger.warning(
                "resuming saga: %s", line.why, extra={"saga_id": line.saga_id, "state": state}
            )
            try:
                line.result = services.saga_drive(saga_id=saga_id, gateway=gateway).state
                pulse.acted += 1
            except Exception as exc:  # one saga's failure must not stop the sweep
                logger.exception("resume failed", extra={"saga_id": line.saga_id})
                line.result = f"failed: {type(exc).__name__}: {exc}"
    return report


def _claim(saga_id, state: str) -> bool:
    """A saga locked by someone else (a worker on it right now) is theirs."""
    with transaction.atomic(durable=True):
        return (
            lock_objects.saga_for_update_skip_locked(saga_ids=[saga_id])
            .filter(state=state)
            .exists()
        )


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
    version that escalated), not on every run. So does a refund row still
    pending past ``REFUND_CHASE_SECONDS`` (docs/refunds.md): its own timer
    (``refund.chase``) alerts first; this is the same alert, raised once
    whichever comes first, should that timer never be delivered.
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
                        saga, why="charge outcome unknown", now=now
                    )
                elif saga.state in COMPENSATION_UNFINISHED:
                    started = saga.compensation_started_at
                    assert started is not None  # set on entering compensation, kept after
                    alerted = services.raise_operator_alert(
                        saga,
                        now=now,
                        once_per="compensation_deadline",
                        why=f"compensation unfinished past its deadline (started "
                        f"{started.isoformat()})",
                    )
                else:
                    continue
            pulse.acted += int(alerted)
            lines.append(ChaseLine(str(saga_id), saga.state, alerted))
        lines += _chase_refunds(now=now, pulse=pulse)
    return lines


def _chase_refunds(*, now: datetime, pulse) -> list[ChaseLine]:
    """The refund rows past their deadline, each alerted once (the refund's
    own chaser step: ``services.refund_chase``)."""
    late = Refund.objects.filter(
        status=RefundStatus.PENDING,
        created_at__lt=now - timedelta(seconds=settings.REFUND_CHASE_SECONDS),
    ).values_list("pk", "event_id", "saga_id")
    lines = []
    for refund_id, event_id, saga_id in late:
        alerted = services.refund_chase(refund_id=refund_id, event_id=event_id, now=now)
        pulse.seen += 1
        pulse.acted += int(alerted)
        lines.append(ChaseLine(str(saga_id), S.CONFIRMED, alerted))
    return lines
