"""An event's cancellation: a durable bulk run (docs/refunds.md, "Event
cancellation").

:func:`event_cancel` stops the sales in its commit (the event's status; the
start of a purchase reads it in its own transaction) and writes the run's
row, ``event.cancelled`` and the first tick. Each tick (:func:`cancellation_tick`,
a timer the relay delivers, re-armed by the tick's own commit) does, under
the run's lock:

1. settle the purchases in flight: each PENDING/CHARGING/REQUIRES_ACTION/
   UNKNOWN saga of the event gets, once, the hold expiry's question (cancel
   the intent at the processor first: canceled -> compensated; charged ->
   confirmed, and then refunded below), so no charge can land after the
   cancellation and stay;
2. open the next refunds: one full refund (all that is left, fees included)
   per confirmed purchase, its seats released, as many as the pace allows:
   ``rate`` per second since the run started, counted from the refund rows
   themselves, and in one tick never more than the time since the previous
   tick allows (at most five seconds' worth): after a crash or a stall the
   run resumes at its pace, never faster to catch up;
3. finish when nothing is in flight, no purchase waits for its refund and
   no refund of the event is pending.

Everything the run knows is in its rows (the run, the sagas, the refunds):
killed anywhere, the next tick carries on, and the unique constraint of one
cancellation refund per purchase makes a second one impossible.
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from outbox.models import OutboxMessage
from outbox.services import timer_schedule
from webhooks.services import WebhookEvent, webhook_publish

from .. import lock_objects
from ..availability import availability_changed
from ..models import (
    CancellationStatus,
    EventCancellation,
    EventStatus,
    PurchaseSaga,
    Refund,
    RefundSource,
    RefundStatus,
)
from ..saga.expiry import NEEDS_DEFINITIVE_ANSWER
from ..saga.states import NON_TERMINAL, SagaState
from ..saga.topics import Topic
from ..saga.transition import clock
from .errors import InvalidRefund
from .opening import RefundAsk, refunds_open_in_full

TICK_SECONDS = 1.0
# A run with nothing left to open waits for its refunds' answers and its
# purchases in flight: it looks again less often.
IDLE_TICK_SECONDS = 5.0
# A tick opens at most what the time since the previous tick allows at the
# pace, and never more than this long's worth: a run that fell behind (a
# crash, a stall) goes on at its pace, never faster to catch up. Longer than
# a tick's usual lateness: a tick waits in the refunds' queue behind the
# refunds it opened (2.7 s apart at p90, 4.5 s at p99 in figure 15's run at
# 10,000), and with 2 s here the rest was lost: 17.6 refunds/s at a pace of
# 20 (docs/performance.md, "Figure 15 measured again").
BURST_SECONDS = 5.0
# And never more than this many in one tick (one transaction holding their
# sagas and seats): a pace above what a tick opens in a second is the
# machine's limit anyway (docs/performance.md, "Cancelling an event").
MAX_PER_TICK = 200
SETTLE_BATCH = 200
PUBLIC_REASON = "The event was cancelled: everything you paid is refunded."
# The webhook's once-per-type key for an event (deliveries are keyed by saga).
_EVENT_NAMESPACE = uuid.UUID("6d1c3f0e-7f7b-4e55-9a43-1f7b8c2f5a10")


def event_cancel(
    *, organizer, event_id: int, reason: str, user, now: datetime | None = None
) -> EventCancellation:
    """Cancel an organizer's event: sales stop in this commit, and the run
    starts. Idempotent: a cancelled event answers its run. No such event of
    the organizer: ``EventCancellation.DoesNotExist``."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidRefund("reason", "a reason is required")
    if len(reason) > 500:
        raise InvalidRefund("reason", "at most 500 characters")
    at = clock(now)
    with transaction.atomic(durable=True):
        event = lock_objects.organizer_event_for_update(
            organizer_id=organizer.pk, event_id=event_id
        )
        if event is None:
            raise EventCancellation.DoesNotExist(f"no event {event_id}")
        existing = EventCancellation.objects.filter(event_id=event.pk).first()
        if existing is not None:
            return existing
        event.status = EventStatus.CANCELLED
        event.save(update_fields=["status"])
        run = EventCancellation.objects.create(
            event=event,
            reason=reason.strip(),
            requested_by=user,
            rate=float(settings.REFUND_RATE_PER_SECOND),
            tick_due=at,
            created_at=at,
            updated_at=at,
        )
        availability_changed(event.pk)
        webhook_publish(
            event_type=WebhookEvent.EVENT_CANCELLED,
            saga_id=uuid.uuid5(_EVENT_NAMESPACE, str(event.pk)),
            event_id=event.pk,
            data={
                "event": {
                    "id": event.pk,
                    "name": event.name,
                    "reason": run.reason,
                    "cancelled_at": at.isoformat().replace("+00:00", "Z"),
                }
            },
            now=at,
        )
        _arm_tick(event.pk, due=at, at=at)
    return run


def _arm_tick(event_id: int, *, due: datetime, at: datetime) -> None:
    timer_schedule(
        key=f"cancellation-tick:{event_id}:{due.timestamp():.6f}",
        topic=Topic.CANCELLATION_TICK,
        payload={"event_id": event_id, "due": due.isoformat()},
        due_at=due,
        event_id=event_id,
        now=at,
        if_absent=True,
    )


def cancellation_tick(
    *, event_id: int, due: datetime | None = None, now: datetime | None = None
) -> str:
    """One tick of the run (the module docstring): ``"busy"`` when another
    tick holds the run, ``"stale"`` when this tick (due at ``due``) is not
    the run's live one, else the run's status after this tick. ``due=None``
    (an operator's or a test's nudge) ticks whatever is due."""
    at = clock(now)
    with transaction.atomic(durable=True):
        run = lock_objects.cancellation_for_update_skip_locked(event_id=event_id)
        if run is None:
            return "busy"
        if run.status == CancellationStatus.DONE:
            return run.status
        if due is not None and due != run.tick_due:
            return "stale"
        _settle_in_flight(event_id, at=at)
        allowed, opened = _refund_next(run, at=at)
        run.updated_at = at
        if _finished(event_id):
            run.status = CancellationStatus.DONE
            run.finished_at = at
        else:
            idle = allowed > 0 and opened == 0
            run.tick_due = at + timedelta(seconds=IDLE_TICK_SECONDS if idle else TICK_SECONDS)
            _arm_tick(event_id, due=run.tick_due, at=at)
        run.save(update_fields=["status", "finished_at", "updated_at", "tick_due"])
    return run.status


# The event's sagas in flight that have not been asked yet (no settle timer
# of theirs): a batch at a time, so that ones the processor cannot settle
# yet never keep the others waiting.
_UNSETTLED_SQL = """
SELECT s.id FROM {saga} s
 WHERE s.event_id = %s AND s.state = ANY(%s)
   AND NOT EXISTS (SELECT 1 FROM {outbox} o
                    WHERE o.event_id = s.event_id AND o.key = 'cancel-settle:' || s.id::text)
 ORDER BY s.id LIMIT %s
"""


def _settle_in_flight(event_id: int, *, at: datetime) -> None:
    """The hold expiry's question, once per saga in flight (its own re-asks
    follow its own schedule)."""
    sql = _UNSETTLED_SQL.format(
        saga=PurchaseSaga._meta.db_table, outbox=OutboxMessage._meta.db_table
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [event_id, [s.value for s in NEEDS_DEFINITIVE_ANSWER], SETTLE_BATCH])
        in_flight = [row[0] for row in cursor.fetchall()]
    for saga_id in in_flight:
        timer_schedule(
            key=f"cancel-settle:{saga_id}",
            topic=Topic.HOLD_RECHECK,
            payload={"saga_id": str(saga_id), "attempt": 0, "why": "event cancelled"},
            due_at=at,
            event_id=event_id,
            saga_id=saga_id,
            now=at,
            if_absent=True,
        )


# Confirmed purchases of the event that still wait for their cancellation
# refund: none made yet, and something left to give back (a buyer who
# cancelled everything before has nothing left).
_WAITING_SQL = """
SELECT s.id FROM {saga} s
 WHERE s.event_id = %s AND s.state = %s
   AND NOT EXISTS (SELECT 1 FROM {refund} r WHERE r.saga_id = s.id AND r.event_id = s.event_id
                      AND r.source = %s)
   AND s.amount > COALESCE((SELECT sum(r.amount) FROM {refund} r
                             WHERE r.saga_id = s.id AND r.event_id = s.event_id
                               AND r.status <> %s), 0)
"""


def _waiting_sql(tail: str) -> tuple[str, list]:
    sql = _WAITING_SQL.format(saga=PurchaseSaga._meta.db_table, refund=Refund._meta.db_table)
    return sql + tail, [
        SagaState.CONFIRMED.value,
        RefundSource.EVENT_CANCELLATION.value,
        RefundStatus.FAILED.value,
    ]


def _allowed(run: EventCancellation, *, at: datetime) -> int:
    """How many refunds the pace allows now (the module docstring)."""
    opened = Refund.objects.filter(
        event_id=run.event_id, source=RefundSource.EVENT_CANCELLATION
    ).count()
    elapsed = max((at - run.created_at).total_seconds(), 0.0)
    due = math.floor(run.rate * elapsed) + 1 - opened
    since_last = min(max((at - run.updated_at).total_seconds(), 0.0), BURST_SECONDS)
    return max(0, min(due, max(1, math.ceil(run.rate * since_last)), MAX_PER_TICK))


def _refund_next(run: EventCancellation, *, at: datetime) -> tuple[int, int]:
    """Open the refunds the pace allows now: (allowed, opened)."""
    allowed = _allowed(run, at=at)
    if allowed == 0:
        return 0, 0
    sql, params = _waiting_sql(" ORDER BY s.id LIMIT %s FOR UPDATE OF s SKIP LOCKED")
    with connection.cursor() as cursor:
        cursor.execute(sql, [run.event_id, *params, allowed])
        ids = [row[0] for row in cursor.fetchall()]
    sagas = list(PurchaseSaga.objects.filter(pk__in=ids, event_id=run.event_id).order_by("pk"))
    # One with nothing left (a buyer's or an organizer's refund of
    # everything committed after the statement's snapshot and before it
    # took the lock: a row only locked by them is not re-checked) is passed
    # over.
    opened = refunds_open_in_full(
        sagas,
        ask=RefundAsk(
            source=RefundSource.EVENT_CANCELLATION,
            release=True,
            reason=run.reason,
            public_reason=PUBLIC_REASON,
        ),
        at=at,
    )
    return allowed, opened


# Whether the run has anything left: a purchase in flight, a refund of the
# event pending, a confirmed purchase waiting for its refund. One statement,
# so one snapshot: a buyer's cancel committing between two separate reads
# could hide its purchase from both (not waiting any more, not yet pending).
_LEFT_SQL = """
SELECT EXISTS (SELECT 1 FROM {saga} s WHERE s.event_id = %s AND s.state = ANY(%s))
    OR EXISTS (SELECT 1 FROM {refund} r WHERE r.event_id = %s AND r.status = %s)
    OR EXISTS ({waiting} LIMIT 1)
"""


def _finished(event_id: int) -> bool:
    waiting, params = _waiting_sql("")
    sql = _LEFT_SQL.format(
        saga=PurchaseSaga._meta.db_table, refund=Refund._meta.db_table, waiting=waiting
    )
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            [event_id, NON_TERMINAL, event_id, RefundStatus.PENDING.value, event_id, *params],
        )
        return not cursor.fetchone()[0]
