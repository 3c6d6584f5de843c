"""The relay: hands due outbox rows to Celery.

A tick claims due rows with ``FOR UPDATE SKIP LOCKED`` (several relays may
run; each row goes to exactly one of them), commits the claim, publishes the
rows to Celery *outside* the transaction (a broker that hangs must not hold
row locks that confirming transactions need to cancel timers), then marks the
rows fired. A few rows go one per task (``outbox.deliver``); a large batch is
spread over at most ``OUTBOX_DISPATCH_TASKS`` tasks (``outbox.deliver_many``),
all published on one broker connection, so a burst of due timers costs tens
of publishes, not thousands, and still keeps every worker process busy.

A relay that dies between claim and mark leaves a lease that expires; the row
is claimed again and delivered again, which the consumers' inbox makes
harmless.

Marking a row fired also writes when it is due again (``due_at``, from
``OUTBOX_REDELIVER_SECONDS``) should its consumers not all finish. A row due
again once the schedule is spent is a dead letter: the pass that finds it
marks it (``dead_at``) and raises the alert in the claim's own transaction,
so a relay that dies before that commit leaves the row for the next pass
(the alert is never lost), and two relays cannot both mark it (the claim's
``SKIP LOCKED``, and ``dead_at IS NULL`` in the update).

The loop wakes on ``LISTEN/NOTIFY`` and also polls, so a lost
notification costs at most one poll interval.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, DateTimeField, F, Min, Q, Value, When
from django.db.models.functions import Coalesce, Least
from django.utils import timezone

from config.metrics import ALERTS, TIMER_FIRE_LAG

from .handover import NOTIFY_CHANNEL
from .handover import celery_hand_over as _celery_hand_over
from .models import OutboxMessage
from .pulse import relay_pulse

logger = logging.getLogger(__name__)

Dispatch = Callable[[int], object]  # what it returns is not read


def redeliver_schedule() -> list[int]:
    """Seconds before each redelivery; the last one is also how long the last
    hand-over has to complete before the row is a dead letter."""
    return list(settings.OUTBOX_REDELIVER_SECONDS)


def due_rows(now: datetime):
    """Rows owed a hand-over (or a dead-letter verdict) at ``now``, in the
    order they are due: one range of ``outbox_claim_idx``.

    Nothing but ``due_at`` decides, on purpose: a settled row has none, and a
    condition on ``completed_at`` would let the planner prefer a scan of every
    pending row through ``outbox_due_idx``. (``_claim`` still looks at the
    settled columns of what it locked.)
    """
    return (
        OutboxMessage.objects.filter(due_at__lte=now)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .order_by("due_at", "id")
    )


def dead_letters():
    """Rows whose redelivery schedule ran out without completing (until an
    operator replays them)."""
    return OutboxMessage.objects.filter(
        dead_at__isnull=False,
        completed_at__isnull=True,
        cancelled_at__isnull=True,
    )


@dataclass(frozen=True)
class _Claimed:
    ids: list[int]
    first_due: dict[int, datetime]  # rows never fired before -> their due time
    next_due_in: float | None  # seconds until the next row not claimed here
    topics: dict[int, str]  # claimed row -> its topic (which queue it goes to)


def _claim(*, now: datetime, limit: int, look_ahead: bool) -> _Claimed:
    """Claim due rows, mark the dead letters among them, and, in the same
    transaction (one commit for the whole pass's bookkeeping), read when the
    next unclaimed row is due."""
    lease = now + timedelta(seconds=settings.OUTBOX_CLAIM_LEASE_SECONDS)
    spent = len(redeliver_schedule())
    with transaction.atomic(durable=True):
        rows = list(
            due_rows(now)
            .select_for_update(skip_locked=True, of=("self",))
            .values_list(
                "id",
                "available_at",
                "fired_at",
                "attempts",
                "processing_until",
                "completed_at",
                "cancelled_at",
                "dead_at",
                "topic",
            )[:limit]
        )
        ids, dead, settled = [], [], []
        for message_id, _, _, attempts, processing, *ends, _ in rows:
            if any(ends):  # settled by a write that left due_at: nothing owed
                settled.append(message_id)
            elif attempts <= spent:
                ids.append(message_id)
            elif processing is None or processing < now:
                dead.append(message_id)
            # else: the last delivery is still running; look again next pass
        if ids:
            OutboxMessage.objects.filter(id__in=ids).update(claimed_until=lease)
        if settled:
            OutboxMessage.objects.filter(id__in=settled).update(due_at=None)
        due = next_due_in(now=now) if look_ahead else None
        if dead:
            _mark_dead(ids=dead, now=now)
    # (Dead letters were all fired: first_due holds claimed rows only.)
    return _Claimed(
        ids=ids,
        first_due={row[0]: row[1] for row in rows if row[2] is None and not any(row[5:8])},
        next_due_in=due,
        topics={row[0]: row[8] for row in rows},
    )


def _mark_dead(*, ids: list[int], now: datetime) -> None:
    """Inside the claim's transaction, which holds these rows' locks: mark
    them dead and raise one alert each.

    The alert is the last thing before the commit: a relay that dies earlier
    has marked nothing, and the next pass marks and alerts (never lost); only
    a commit that fails after the line was written repeats it, with the same
    ``message_id``.
    """
    marked = list(
        OutboxMessage.objects.filter(id__in=ids, dead_at__isnull=True)
        .order_by("id")
        .values("id", "topic", "saga_id", "deliveries", "last_error")
    )
    OutboxMessage.objects.filter(id__in=[m["id"] for m in marked]).update(
        dead_at=now, due_at=None, claimed_until=None
    )
    for m in marked:
        logger.error(
            "outbox dead letter: %s #%s not completed after %s deliveries",
            m["topic"],
            m["id"],
            m["deliveries"],
            extra={
                "alert": "outbox_dead_letter",
                "message_id": m["id"],
                "topic": m["topic"],
                "saga_id": str(m["saga_id"]) if m["saga_id"] else None,
                "deliveries": m["deliveries"],
                "last_error": m["last_error"],
            },
        )
        ALERTS.labels(kind="outbox_dead_letter").inc()


def relay_claim(*, now: datetime, limit: int) -> list[int]:
    """Claim up to ``limit`` due rows for this relay; returns their ids."""
    return _claim(now=now, limit=limit, look_ahead=False).ids


def relay_mark_fired(
    *, ids: Iterable[int], now: datetime, first_due: dict[int, datetime] | None = None
) -> int:
    """Mark handed-over rows fired; ``first_due`` (from the claim) feeds the
    fire-lag metric without another read."""
    ids = list(ids)
    if not ids:
        return 0
    schedule = redeliver_schedule()
    # After hand-over n (``attempts`` was n - 1) the next step is due after
    # schedule[n - 1]; the hand-over after the last redelivery gets the last
    # delay again, at the end of which the row is a dead letter. One UPDATE
    # for the batch: the CASE picks each row's delay from its own attempts.
    # A worker may have completed the row already (it can beat this commit):
    # it is still marked fired, and stays settled (no due_at).
    due_at = Case(
        When(completed_at__isnull=False, then=Value(None)),
        *(
            When(attempts=step, then=Value(now + timedelta(seconds=delay)))
            for step, delay in enumerate(schedule)
        ),
        default=Value(now + timedelta(seconds=schedule[-1])),
        output_field=DateTimeField(),
    )
    with transaction.atomic(durable=True):
        # A timer cancelled while we were handing it over stays cancelled and
        # is not marked fired; the delivery task skips it.
        marked = OutboxMessage.objects.filter(id__in=ids, cancelled_at__isnull=True).update(
            # The earliest hand-over: a worker's lease may have stamped the
            # row (outbox.delivery) between this relay's publish and now.
            fired_at=Least(Coalesce(F("fired_at"), Value(now)), Value(now)),
            handed_over_at=now,
            claimed_until=None,
            deliveries=F("deliveries") + 1,
            attempts=F("attempts") + 1,
            due_at=due_at,
        )
    for message_id in ids:
        if first_due and message_id in first_due:
            TIMER_FIRE_LAG.observe(max(0.0, (now - first_due[message_id]).total_seconds()))
    return marked


def relay_release(*, ids: Iterable[int]) -> None:
    ids = list(ids)
    if ids:
        with transaction.atomic(durable=True):
            OutboxMessage.objects.filter(id__in=ids).update(claimed_until=None)


def relay_tick(
    *,
    now: datetime | None = None,
    dispatch: Dispatch | None = None,
    limit: int | None = None,
) -> int:
    """One pass: claim due rows, hand them over, mark them fired; returns how
    many were handed over.

    ``dispatch`` (tests) hands rows over one by one instead of to Celery.
    """
    return _pass(now=now or timezone.now(), dispatch=dispatch, limit=limit, look_ahead=False)[0]


def _pass(
    *, now: datetime, dispatch: Dispatch | None, limit: int | None, look_ahead: bool
) -> tuple[int, float | None]:
    claimed = _claim(now=now, limit=limit or settings.OUTBOX_BATCH_SIZE, look_ahead=look_ahead)
    ids = claimed.ids
    if dispatch is None:
        handed, failed = _celery_hand_over(ids, claimed.topics) if ids else ([], [])
    else:
        handed, failed = [], []
        for message_id in ids:
            try:
                dispatch(message_id)
            except Exception:
                logger.exception("outbox hand-off failed", extra={"message_id": message_id})
                failed.append(message_id)
            else:
                handed.append(message_id)
    relay_mark_fired(ids=handed, now=now, first_due=claimed.first_due)
    relay_release(ids=failed)
    if handed:
        logger.info("outbox relayed", extra={"count": len(handed), "failed": len(failed)})
    return len(handed), claimed.next_due_in


def next_due_in(*, now: datetime) -> float | None:
    """Seconds until the next row is due (None when nothing waits).

    Only rows due *after* ``now``: a row due already that a pass did not
    claim (another relay holds it, or its last delivery is still running)
    waits for the next poll instead of waking the loop at once, over and
    over. One step into ``outbox_claim_idx``.
    """
    nxt = OutboxMessage.objects.filter(due_at__gt=now).aggregate(at=Min("due_at"))["at"]
    if nxt is None:
        return None
    return max(0.0, (nxt - now).total_seconds())


class _Listener:
    """A dedicated autocommit connection that LISTENs."""

    def __init__(self) -> None:
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        params.pop("prepare_threshold", None)
        self.conn = psycopg.connect(autocommit=True, **params)
        self.conn.execute(f"LISTEN {NOTIFY_CHANNEL}")

    def wait(self, timeout: float) -> None:
        for _ in self.conn.notifies(timeout=timeout, stop_after=1):
            pass

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # already broken: nothing more to release
            pass


def relay_run(*, stop: Callable[[], bool] = lambda: False, poll: float | None = None) -> None:
    """The relay loop (``manage.py run_relay``).

    It survives its database going away (restart, failover): a failed tick or
    a broken LISTEN connection is logged, both connections are dropped, and the
    loop sleeps one poll interval before it connects again. Nothing is lost
    meanwhile: due rows wait in the table.
    """
    poll = settings.OUTBOX_POLL_SECONDS if poll is None else poll
    listener: _Listener | None = None
    logger.info("outbox relay started", extra={"poll_seconds": poll})
    try:
        while not stop():
            try:
                if listener is None:
                    listener = _Listener()
                handed, due = _pass(now=timezone.now(), dispatch=None, limit=None, look_ahead=True)
                # What readiness judges a relay by (/readyz; one UPDATE
                # every OUTBOX_RELAY_PULSE_SECONDS at most).
                relay_pulse()
                if handed >= settings.OUTBOX_BATCH_SIZE:
                    continue  # more are due: no waiting
                listener.wait(poll if due is None else min(poll, due))
            except Exception:
                logger.exception("outbox relay tick failed; reconnecting after %ss", poll)
                connection.close()
                if listener is not None:
                    listener.close()
                    listener = None
                time.sleep(poll)
    finally:
        if listener is not None:
            listener.close()
