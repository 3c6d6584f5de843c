"""Writing to the outbox, arming and cancelling durable timers; replaying
dead letters and backfilling consumers.

``prepared_keep`` / ``prepared`` keep what a consumer's ``prepare`` read for
several claimed messages on each message, for its delivery to use while
fresh.

``outbox_publish``, ``timer_schedule`` and ``timer_cancel`` never open a
transaction of their own: an outbox row only means something when it commits
together with the change it announces, so they must be called inside the
caller's ``atomic`` block (and say so loudly when they are not).
``outbox_replay`` is an operator's action (``manage.py outbox_replay``, the
admin's "Replay"): it owns its transactions.
"""

from __future__ import annotations

import enum
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache, partial
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from common import rows as rows_sql
from config import tracing
from config.distribution import NO_EVENT
from config.transactions import in_transaction

from .delivery import consumers_owed
from .handover import delivers_here, hand_over_on_commit, notify_relays, owe_here
from .models import InboxEntry, OutboxMessage

logger = logging.getLogger(__name__)


class OutboxOutsideTransaction(RuntimeError):
    pass


def prepared_keep(message: OutboxMessage, name: str, value: Any, *, at: float) -> None:
    """What a consumer's ``prepare`` (called by the delivery of several
    claimed rows, outbox/delivery.py) read for ``message``, kept on the
    message for its consumer under ``name``; ``at`` is the
    ``time.monotonic()`` taken before the read, so that its age counts from
    its start."""
    setattr(message, f"prepared_{name}", (at, value))


def prepared(message: OutboxMessage, name: str, *, within: float) -> Any:
    """What :func:`prepared_keep` kept on ``message`` under ``name``, while
    it is at most ``within`` seconds old; None when nothing was kept or it is
    older (a slow call held the claim's rows up): the consumer then reads for
    itself, as for a row alone."""
    kept = getattr(message, f"prepared_{name}", None)
    if kept is None or time.monotonic() - kept[0] > within:
        return None
    return kept[1]


def _require_atomic(what: str) -> None:
    if not in_transaction():
        raise OutboxOutsideTransaction(f"{what} must run inside the transaction it belongs to")


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
    """Record a message to be delivered after commit (or at ``available_at``).

    A message due now is handed to Celery by this process right after the
    commit (``OUTBOX_HAND_OVER_ON_COMMIT``), and is the relay's only if its
    consumers have not all run a grace later (``outbox.handover``): the relay
    is the safety net, not a step every message waits for. Inside a
    ``delivered_here`` block, a row for the default queue is leased to its
    writer instead, which delivers it when the block ends. A message due
    later is a timer, the relay's (woken by NOTIFY when it is due now and
    not handed over on commit). The row keeps the context of the span that
    wrote it (empty with tracing off): its delivery continues that trace.
    """
    _require_atomic("outbox_publish")
    message, how = _message(
        topic=topic,
        payload=payload,
        key=key,
        available_at=available_at,
        event_id=event_id,
        saga_id=saga_id,
        now=now or timezone.now(),
    )
    # Written once (docs/performance.md, "Statements written once"): every
    # purchase writes several of these rows.
    rows_sql.create(message)
    if how is _HowSent.IN_PLACE:
        transaction.on_commit(partial(owe_here, message), robust=True)
    else:
        _hand_over([message.pk], topic, how)
    return message


def outbox_publish_many(
    *, topic: str, messages: list[dict], now: datetime | None = None
) -> list[OutboxMessage]:
    """:func:`outbox_publish` of several messages of one topic due now (each
    a dict of its ``payload``, ``key``, ``event_id``, ``saga_id``), in one
    statement: the rows as it writes them, sent on as it sends them (a
    charge burst's confirmations). The rows written, in ``messages``'
    order."""
    _require_atomic("outbox_publish_many")
    if not messages:
        return []
    now = now or timezone.now()
    built = [_message(topic=topic, available_at=None, now=now, **m) for m in messages]
    (how,) = {how for _, how in built}  # one topic, all due now: sent one way
    written = rows_sql.insert_returning([message for message, _ in built])
    if how is _HowSent.IN_PLACE:
        for message in written:
            transaction.on_commit(partial(owe_here, message), robust=True)
    else:
        _hand_over([message.pk for message in written], topic, how)
    return written


class _HowSent(enum.Enum):
    IN_PLACE = "delivered in place by its writer"
    ON_COMMIT = "handed over on commit"
    TIMER = "a timer, the relay's"
    DUE_NOW = "due now, the relay's"


def _message(
    *,
    topic: str,
    payload: dict | None,
    key: str | None,
    available_at: datetime | None,
    event_id: int | None,
    saga_id,
    now: datetime,
) -> tuple[OutboxMessage, _HowSent]:
    """The row :func:`outbox_publish` writes, not saved, and how it is sent."""
    available_at = available_at or now
    on_commit = settings.OUTBOX_HAND_OVER_ON_COMMIT and available_at <= now
    in_place = on_commit and delivers_here(topic)
    due_at = available_at
    leased: dict = {}
    if in_place:
        # Leased to this writer by this very commit; the relay's when the
        # lease runs out undelivered (outbox.handover, "in place").
        due_at += timedelta(seconds=settings.OUTBOX_CLAIM_LEASE_SECONDS)
        leased = {"processing_until": due_at, "fired_at": now}
        how = _HowSent.IN_PLACE
    elif on_commit:
        due_at += timedelta(seconds=settings.OUTBOX_HAND_OVER_GRACE_SECONDS)
        how = _HowSent.ON_COMMIT
    else:
        how = _HowSent.DUE_NOW if available_at <= now else _HowSent.TIMER
    message = OutboxMessage(
        topic=topic,
        payload=payload,
        key=key,
        # Never NULL, the shard key (config/distribution.py); the product
        # always names the event (tests/test_citus_rules.py).
        event_id=NO_EVENT if event_id is None else event_id,
        saga_id=saga_id,
        created_at=now,
        available_at=available_at,
        due_at=due_at,
        trace_context=tracing.traceparent(),
        **leased,
    )
    return message, how


def _hand_over(ids: list[int], topic: str, how: _HowSent) -> None:
    if how is _HowSent.ON_COMMIT:
        for message_id in ids:
            transaction.on_commit(partial(hand_over_on_commit, message_id, topic), robust=True)
    elif how is _HowSent.DUE_NOW and ids:
        notify_relays()


# The columns of a source of messages (:func:`outbox_publish_from`), named
# as the arguments of outbox_publish that differ from message to message.
MESSAGE_SOURCE_COLUMNS = ("key", "payload", "event_id", "saga_id")


@dataclass(frozen=True)
class MessagesFrom:
    """The outbox's part of another app's statement: ``sql``, an ``INSERT …
    RETURNING`` for a CTE of it, whose one output column is ``id`` (the new
    rows' ids), and its ``params``; ``hand_over``, to call in the same
    transaction with the ids it returned, sends them on after the commit as
    :func:`outbox_publish` does."""

    sql: str
    params: list
    hand_over: Callable[[list[int]], None]


def outbox_publish_from(*, source: str, topic: str, now: datetime) -> MessagesFrom | None:
    """:func:`outbox_publish` of a message of ``topic`` due now for each row
    of ``source``, inside the caller's statement and transaction.

    The contract is narrow on purpose (docs/design.md, "The edges"): the
    caller owns ``source``, a relation of its statement (a CTE name) with
    the columns of ``MESSAGE_SOURCE_COLUMNS``: ``key`` (text), ``payload``
    (jsonb), ``event_id`` (bigint), ``saga_id`` (uuid); the outbox owns all
    the SQL about its table (its name, its other columns and their values,
    the same as :func:`outbox_publish` writes). None for a topic delivered
    in place by its writer here (inside ``delivered_here``, for the default
    queue): its writer keeps each row, so it publishes them one by one."""
    _require_atomic("outbox_publish_from")
    if not source.isidentifier():
        raise ValueError(f"a message source is a relation's name, not {source!r}")
    template, how = _message(
        topic=topic,
        payload=None,
        key=None,
        available_at=now,
        event_id=None,
        saga_id=None,
        now=now,
    )
    if how is _HowSent.IN_PLACE:
        return None
    exprs = {column: f'{source}."{column}"' for column in MESSAGE_SOURCE_COLUMNS}
    sql, params = rows_sql.insert_select(template, source=source, exprs=exprs)
    returning = f' RETURNING "{OutboxMessage._meta.pk.column}" AS id'
    return MessagesFrom(
        sql=sql + returning, params=params, hand_over=partial(_hand_over, topic=topic, how=how)
    )


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

    The key is unique (per event, the shard key: the product's keys name
    their saga, so everywhere): arming the same timer twice is an
    IntegrityError, which is what a caller that thinks it is arming a fresh
    timer wants to hear. With ``if_absent`` an existing row of that key is
    returned instead (the caller holds the lock of the thing the timer
    belongs to, so no one else arms it meanwhile).
    """
    if if_absent:
        existing = OutboxMessage.objects.filter(
            key=key, event_id=NO_EVENT if event_id is None else event_id
        ).first()
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


_CANCEL_SQL = (
    "UPDATE {outbox} SET cancelled_at = %s, due_at = NULL"
    " WHERE key = %s AND fired_at IS NULL AND cancelled_at IS NULL"
)


@cache
def _cancel_sql() -> str:
    return _CANCEL_SQL.format(outbox=OutboxMessage._meta.db_table)


def timer_cancels(*, keys: list[str], now: datetime) -> dict[str, TimerCancelResult]:
    """:func:`timer_cancel` of several timers: the cancels in one statement,
    and each one not cancelled by it answered as :func:`timer_cancel`
    answers it; by key."""
    _require_atomic("timer_cancel")
    with connection.cursor() as cursor:
        cursor.execute(_cancels_sql(), [now, list(keys)])
        cancelled = {key for (key,) in cursor.fetchall()}
    return {
        key: (
            TimerCancelResult(TimerCancelStatus.CANCELLED, now)
            if key in cancelled
            else timer_cancel(key=key, now=now)
        )
        for key in keys
    }


_CANCELS_SQL = (
    "UPDATE {outbox} SET cancelled_at = %s, due_at = NULL"
    " WHERE key = ANY(%s) AND fired_at IS NULL AND cancelled_at IS NULL RETURNING key"
)


@cache
def _cancels_sql() -> str:
    return _CANCELS_SQL.format(outbox=OutboxMessage._meta.db_table)


def timer_cancel(*, key: str, now: datetime | None = None) -> TimerCancelResult:
    """Cancel the timer named ``key``; the answer is never ambiguous.

    A conditional update, so it needs no lock and cannot lose a row to a
    concurrent relay: if the relay marked it fired first, we answer
    ``already_fired``; if we cancel first, the relay will not mark it fired and
    the delivery task skips it. Cancelling twice answers ``cancelled`` again.
    """
    _require_atomic("timer_cancel")
    now = now or timezone.now()
    # Written once (docs/performance.md, "Statements written once"): every
    # confirmation cancels its hold timer.
    with connection.cursor() as cursor:
        cursor.execute(_cancel_sql(), [now, key])
        updated = cursor.rowcount
    if updated:
        return TimerCancelResult(TimerCancelStatus.CANCELLED, now)
    row = OutboxMessage.objects.filter(key=key).values("fired_at", "cancelled_at").first()
    if row is None:
        return TimerCancelResult(TimerCancelStatus.ABSENT)
    if row["cancelled_at"] is not None:
        return TimerCancelResult(TimerCancelStatus.CANCELLED, row["cancelled_at"])
    return TimerCancelResult(TimerCancelStatus.ALREADY_FIRED, row["fired_at"])


# --- replaying dead letters, backfilling consumers --------------------------------

REPLAY_BATCH = 500  # rows per transaction (and per look-up of the inbox)


class ReplayRefused(ValueError):
    """The selection asked for cannot be honoured (nothing was changed)."""


@dataclass(frozen=True)
class ReplayLine:
    message_id: int
    topic: str
    created_at: datetime | None
    saga_id: uuid.UUID | None = None
    key: str | None = None
    kind: str = ""  # "dead letter" | "backfill" (a completed message reopened)
    runs: tuple[str, ...] = ()  # the consumers the replay will run, in order
    skips: tuple[str, ...] = ()  # those that already ran (the inbox says so)
    refused: str = ""  # why a message named by id is not replayed


@dataclass
class ReplayResult:
    dry_run: bool
    lines: list[ReplayLine] = field(default_factory=list)

    @property
    def replayed(self) -> list[ReplayLine]:
        return [line for line in self.lines if not line.refused]

    @property
    def refused(self) -> list[ReplayLine]:
        return [line for line in self.lines if line.refused]


def routed_topics(consumer: str) -> list[str]:
    return [topic for topic, names in settings.OUTBOX_CONSUMERS.items() if consumer in names]


def outbox_replay(
    *,
    ids: Iterable[int] | None = None,
    topic: str | None = None,
    consumer: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    dry_run: bool = False,
    operator: str = "",
    reason: str = "",
    now: datetime | None = None,
) -> ReplayResult:
    """Replay dead letters through the inbox; backfill a consumer.

    Selects the dead letters matching the filters (``ids``; ``topic``;
    ``created_at`` in ``[since, until)``). With ``consumer``, the dead letters
    of the topics it is routed to that it has not processed, and the
    *completed* messages of those topics that it has not processed: a
    consumer routed later catches up with history. A replayed row is made due
    now with its redelivery schedule restarted (``dead_at`` cleared,
    ``attempts`` 0; ``fired_at`` and ``deliveries`` stay), so the relay hands
    it over and the delivery runs what the inbox says has not run: a dead
    letter every consumer it still owes, a backfilled message only
    ``consumer``. A cancelled row is never replayed. With ``dry_run`` nothing
    is written; the lines say what would run.
    """
    ids = sorted(set(ids)) if ids is not None else None
    _replay_check(consumer=consumer, since=since, until=until)
    now = now or timezone.now()
    selection = _replay_selection(ids=ids, topic=topic, consumer=consumer, since=since, until=until)
    result = ReplayResult(dry_run=dry_run)
    result.lines += _replay_batches(
        selection, consumer=consumer, dry_run=dry_run, operator=operator, reason=reason, now=now
    )
    if ids:
        result.lines += _refused_lines(
            ids,
            selected={line.message_id for line in result.lines},
            consumer=consumer,
            topic=topic,
            since=since,
            until=until,
        )
        result.lines.sort(key=lambda line: line.message_id)
    return result


def _replay_check(*, consumer: str | None, since: datetime | None, until: datetime | None) -> None:
    """Refuse filters that make no sense: a consumer routed nowhere, an empty window."""
    if consumer is not None and not routed_topics(consumer):
        raise ReplayRefused(
            f"{consumer} is not routed to any topic in OUTBOX_CONSUMERS; routed consumers: "
            + ", ".join(sorted({n for names in settings.OUTBOX_CONSUMERS.values() for n in names}))
        )
    if since and until and since >= until:
        raise ReplayRefused(
            f"since ({since.isoformat()}) is not before until ({until.isoformat()})"
        )


def _replay_batches(
    selection: QuerySet[OutboxMessage],
    *,
    consumer: str | None,
    dry_run: bool,
    operator: str,
    reason: str,
    now: datetime,
) -> list[ReplayLine]:
    """Replay ``selection`` in batches of ``REPLAY_BATCH`` by pk, a transaction each."""
    replayed: list[ReplayLine] = []
    after = 0
    while True:
        batch = selection.filter(pk__gt=after).order_by("pk")
        if dry_run:
            rows = list(batch[:REPLAY_BATCH])
            replayed += _replay_lines(rows, consumer=consumer)
        else:
            with transaction.atomic(durable=True):
                # Locked and read again under the lock: a line says what the
                # replay did, not what was true a moment before.
                rows = list(batch.select_for_update(of=("self",))[:REPLAY_BATCH])
                lines = _replay_lines(rows, consumer=consumer)
                _replay_rows(lines, consumer=consumer, now=now)
            replayed += lines
            _log_replay(lines, consumer=consumer, operator=operator, reason=reason)
        if len(rows) < REPLAY_BATCH:
            break
        after = rows[-1].pk
    return replayed


def _log_replay(lines: list[ReplayLine], *, consumer, operator: str, reason: str) -> None:
    # A line per dead letter (they are few, and each had its alert); a
    # backfill of history is one line per batch.
    for line in lines:
        if line.kind == "dead letter":
            logger.info(
                "outbox dead letter replayed: %s #%s runs %s",
                line.topic,
                line.message_id,
                ", ".join(line.runs) or "nothing",
                extra={
                    "message_id": line.message_id,
                    "topic": line.topic,
                    "saga_id": str(line.saga_id) if line.saga_id else None,
                    "operator": operator,
                    "reason": reason,
                },
            )
    backfill = [line.message_id for line in lines if line.kind == "backfill"]
    if backfill:
        logger.info(
            "outbox backfill of %s: %s message(s), #%s..#%s",
            consumer,
            len(backfill),
            backfill[0],
            backfill[-1],
            extra={
                "consumer": consumer,
                "count": len(backfill),
                "operator": operator,
                "reason": reason,
            },
        )


def _replay_selection(*, ids, topic, consumer, since, until) -> QuerySet[OutboxMessage]:
    rows = OutboxMessage.objects.filter(cancelled_at__isnull=True)
    if ids is not None:
        rows = rows.filter(pk__in=ids)
    if topic:
        rows = rows.filter(topic=topic)
    if since:
        rows = rows.filter(created_at__gte=since)
    if until:
        rows = rows.filter(created_at__lt=until)
    dead = Q(dead_at__isnull=False, completed_at__isnull=True)
    if consumer is None:
        return rows.filter(dead)
    ran = InboxEntry.objects.filter(consumer=consumer, message=OuterRef("pk"))
    return (
        rows.filter(topic__in=routed_topics(consumer))
        .filter(dead | Q(completed_at__isnull=False))
        .exclude(Exists(ran))
    )


def _replay_lines(rows: list[OutboxMessage], *, consumer: str | None) -> list[ReplayLine]:
    ran: dict[int, set[str]] = defaultdict(set)
    for message_id, name in InboxEntry.objects.filter(
        message_id__in=[m.pk for m in rows]
    ).values_list("message_id", "consumer"):
        ran[message_id].add(name)
    lines = []
    for m in rows:
        backfill = m.completed_at is not None
        only = [consumer] if backfill else m.only_consumers
        routing = settings.OUTBOX_CONSUMERS.get(m.topic, [])
        lines.append(
            ReplayLine(
                message_id=m.pk,
                topic=m.topic,
                created_at=m.created_at,
                saga_id=m.saga_id,
                key=m.key,
                kind="backfill" if backfill else "dead letter",
                runs=tuple(consumers_owed(m.topic, already_ran=ran[m.pk], only=only)),
                skips=tuple(n for n in routing if n in ran[m.pk]),
            )
        )
    return lines


def _replay_rows(lines: list[ReplayLine], *, consumer: str | None, now: datetime) -> None:
    """Inside the transaction that locked the rows: make them due now, with
    the schedule restarted. ``fired_at`` (the first hand-off) stays."""
    restart = {"attempts": 0, "due_at": now, "claimed_until": None, "replayed_at": now}
    dead = [line.message_id for line in lines if line.kind == "dead letter"]
    backfill = [line.message_id for line in lines if line.kind == "backfill"]
    if dead:
        OutboxMessage.objects.filter(pk__in=dead, dead_at__isnull=False).update(
            dead_at=None, **restart
        )
    if backfill:
        OutboxMessage.objects.filter(pk__in=backfill, completed_at__isnull=False).update(
            completed_at=None, only_consumers=[consumer], **restart
        )
    if dead or backfill:
        notify_relays()  # the relays hear it on commit


def _refused_lines(ids, *, selected, consumer, topic, since, until) -> list[ReplayLine]:
    """Why each message named by id is not in the selection."""
    found = {m.pk: m for m in OutboxMessage.objects.filter(pk__in=ids).exclude(pk__in=selected)}
    lines = []
    for message_id in ids:
        if message_id in selected:
            continue
        m = found.get(message_id)
        if m is None:
            lines.append(ReplayLine(message_id, "", None, refused="no such message"))
            continue
        if m.cancelled_at:
            why = "cancelled"
        elif (
            (topic and m.topic != topic)
            or (since and m.created_at < since)
            or (until and m.created_at >= until)
        ):
            why = "outside the filters"
        elif consumer and m.topic not in routed_topics(consumer):
            why = f"{consumer} is not routed for {m.topic}"
        elif consumer and InboxEntry.objects.filter(message=m, consumer=consumer).exists():
            why = f"{consumer} already ran"
        elif m.completed_at:
            why = "completed (not a dead letter)"
        elif m.fired_at:
            why = "not a dead letter: its redeliveries go on"
        else:
            why = "not a dead letter: not handed over yet"
        lines.append(
            ReplayLine(m.pk, m.topic, m.created_at, saga_id=m.saga_id, key=m.key, refused=why)
        )
    return lines
