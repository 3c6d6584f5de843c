"""Writing to the outbox, arming and cancelling durable timers.

These functions never open a transaction of their own: an outbox row only
means something when it commits together with the change it announces, so
they must be called inside the caller's ``atomic`` block (and say so loudly
when they are not).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.utils import timezone

from config.transactions import in_transaction

from .models import OutboxMessage

logger = logging.getLogger(__name__)

NOTIFY_CHANNEL = "boxoffice_outbox"


class OutboxOutsideTransaction(RuntimeError):
    pass


def _require_atomic(what: str) -> None:
    if not in_transaction():
        raise OutboxOutsideTransaction(f"{what} must run inside the transaction it belongs to")


def _notify() -> None:
    # NOTIFY is transactional: relays listening hear it when (and only if) the
    # transaction commits, and PostgreSQL folds identical notifications of one
    # transaction into one.
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [NOTIFY_CHANNEL])


def outbox_publish(
    *,
    topic: str,
    payload: dict,
    key: str | None = None,
    available_at: datetime | None = None,
    event_id: int | None = None,
    saga_id=None,
    now: datetime | None = None,
) -> OutboxMessage:
    """Record a message to be delivered after commit (or at ``available_at``)."""
    _require_atomic("outbox_publish")
    now = now or timezone.now()
    message = OutboxMessage.objects.create(
        topic=topic,
        payload=payload,
        key=key,
        event_id=event_id,
        saga_id=saga_id,
        created_at=now,
        available_at=available_at or now,
    )
    if message.available_at <= now:
        _notify()
    return message


def timer_schedule(
    *,
    key: str,
    topic: str,
    payload: dict,
    due_at: datetime,
    event_id: int | None = None,
    saga_id=None,
    now: datetime | None = None,
    if_absent: bool = False,
) -> OutboxMessage:
    """Arm a durable timer: a row the relay hands over at ``due_at``.

    The key is unique: arming the same timer twice is an IntegrityError, which
    is what a caller that thinks it is arming a fresh timer wants to hear.
    With ``if_absent`` an existing row of that key is returned instead (the
    caller holds the lock of the thing the timer belongs to, so no one else
    arms it meanwhile).
    """
    if if_absent:
        existing = OutboxMessage.objects.filter(key=key).first()
        if existing is not None:
            return existing
    return outbox_publish(
        topic=topic,
        payload=payload,
        key=key,
        available_at=due_at,
        event_id=event_id,
        saga_id=saga_id,
        now=now,
    )


class TimerCancelStatus(enum.StrEnum):
    CANCELLED = "cancelled"
    ALREADY_FIRED = "already_fired"
    ABSENT = "absent"


@dataclass(frozen=True)
class TimerCancelResult:
    status: TimerCancelStatus
    at: datetime | None = None  # when it was cancelled / first fired


def timer_cancel(*, key: str, now: datetime | None = None) -> TimerCancelResult:
    """Cancel the timer named ``key``; the answer is never ambiguous.

    A conditional update, so it needs no lock and cannot lose a row to a
    concurrent relay: if the relay marked it fired first, we answer
    ``already_fired``; if we cancel first, the relay will not mark it fired and
    the delivery task skips it. Cancelling twice answers ``cancelled`` again.
    """
    _require_atomic("timer_cancel")
    now = now or timezone.now()
    updated = OutboxMessage.objects.filter(
        key=key, fired_at__isnull=True, cancelled_at__isnull=True
    ).update(cancelled_at=now)
    if updated:
        return TimerCancelResult(TimerCancelStatus.CANCELLED, now)
    row = OutboxMessage.objects.filter(key=key).values("fired_at", "cancelled_at").first()
    if row is None:
        return TimerCancelResult(TimerCancelStatus.ABSENT)
    if row["cancelled_at"] is not None:
        return TimerCancelResult(TimerCancelStatus.CANCELLED, row["cancelled_at"])
    return TimerCancelResult(TimerCancelStatus.ALREADY_FIRED, row["fired_at"])
