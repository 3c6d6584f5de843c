"""Delivering one outbox row to its consumers (what ``outbox.deliver`` runs).

Consumers are listed per topic in ``settings.OUTBOX_CONSUMERS`` (one visible
routing table instead of registrations hidden in signals). Each consumer is a
function ``handle(message)`` that must be idempotent; the inbox records that
it ran, so redelivery skips it.

Two kinds of consumer:

- ordinary ones may call out (a mail server, a webhook receiver, the gateway
  through a service that owns its transactions); they run first, outside any
  transaction, and their inbox entries are written in the delivery's closing
  transaction (a crash in between runs them again: at least once). One may
  return a function: the rest of its work, which only touches the database
  and runs *inside* the closing transaction (a webhook attempt's record), so
  that what it did, its inbox entry and the message's completion commit
  together;
- :func:`transactional` ones only touch the database; they run *inside* the
  closing transaction, so their effect, their inbox entry and the message's
  completion commit together: exactly once. One may say how to run for
  several messages in one go (its ``together``, given the messages: the
  daily sales' count of a charge burst's confirmations).

A delivery is two commits whatever the consumers: one statement that takes
the lease and reads the message with what already ran (and stamps
``fired_at`` on a row handed over on commit, which no relay marked), and the
closing transaction. A row delivered in place by its writer was leased in
the commit that wrote it: its delivery is the closing transaction alone. The
rows a sweep claimed together (``outbox.sweeping``) share one closing
transaction (:func:`messages_deliver_claimed`); an inside half may say how to
run with others of its kind in one go (its ``together``: a webhook attempt's
record).
A delivery that fails says why on the row (``last_error``), in the commit
that gives the row back; the relay hands it over again when it is due
(``outbox.handover``, ``OUTBOX_REDELIVER_SECONDS``). A dead letter is not
delivered (an operator replays it first), and a row reopened for a backfill
runs only the consumers it names (``only_consumers``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.module_loading import import_string
from opentelemetry.trace import SpanKind

from common import rows
from config import tracing

from .models import LAST_ERROR_MAX_CHARS, InboxEntry, OutboxMessage

logger = logging.getLogger(__name__)


def transactional(handle: Callable) -> Callable:
    """Mark a consumer that only touches the database: it runs inside the
    delivery's closing transaction (and must not open a durable one)."""
    handle.runs_in_delivery_transaction = True  # type: ignore[attr-defined]  # read by getattr
    return handle


def _is_transactional(handle) -> bool:
    return getattr(handle, "runs_in_delivery_transaction", False)


def consumers_owed(topic: str, *, already_ran, only=None) -> list[str]:
    """The consumers a delivery runs: the topic's, in routing order, but those
    that already ran, and only those in ``only`` (a row reopened for a
    backfill names them in ``only_consumers``)."""
    names = settings.OUTBOX_CONSUMERS.get(topic, [])
    return [n for n in names if n not in already_ran and (only is None or n in only)]


def inbox_claim(*, consumer: str, message: OutboxMessage, now: datetime | None = None) -> bool:
    """Inside the consumer's transaction: True the first time, False after.

    One ``INSERT … ON CONFLICT DO NOTHING`` (``common.rows.insert``; a
    concurrent claim of the same entry is waited for, then found taken),
    with no savepoint around it."""
    entry = InboxEntry(
        consumer=consumer,
        message=message,
        event_id=message.event_id,
        processed_at=now or timezone.now(),
    )
    return rows.insert([entry], ignore_conflicts=True) == 1


def inbox_claim_many(
    *, consumer: str, messages: list[OutboxMessage], now: datetime | None = None
) -> list[OutboxMessage]:
    """:func:`inbox_claim` for several messages in one statement: those
    claimed now, the first time (the others ran already). The entries are
    written in the order of the messages' keys, so that two claims of
    overlapping messages wait on each other in one order."""
    at = now or timezone.now()
    written = rows.insert_returning(
        [
            InboxEntry(consumer=consumer, message=m, event_id=m.event_id, processed_at=at)
            for m in sorted(messages, key=lambda m: m.pk)
        ],
        ignore_conflicts=True,
    )
    claimed = {entry.message_id for entry in written}
    return [m for m in messages if m.pk in claimed]


# "Not done" is written num_nulls(...) = 3, not as three IS NULL: those are
# the predicate of the partial index of rows owed (outbox_due_idx), and with
# them a planner without statistics read that index (every hold running) and
# filtered it for the id, instead of the key (docs/performance.md,
# "Plans that do not depend on statistics").
_LEASE_SQL = """
UPDATE {outbox} SET processing_until = %s, fired_at = COALESCE(fired_at, %s)
 WHERE id = %s AND num_nulls(completed_at, cancelled_at, dead_at) = 3
   AND (processing_until IS NULL OR processing_until < %s)
RETURNING {columns}, ARRAY(SELECT consumer FROM {inbox} WHERE message_id = {outbox}.id)
"""


def _lease(*, message_id: int, now: datetime) -> OutboxMessage | None:
    """Own the delivery for a lease and read the message and the consumers
    that already ran, in one statement (and one commit). Two copies of the
    same task cannot both run consumers; no transaction is held open while
    consumers call out."""
    lease = now + timedelta(seconds=settings.OUTBOX_CLAIM_LEASE_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(_written(_LEASE_SQL), [lease, now, message_id, now])
        row = cursor.fetchone()
    return None if row is None else _leased(row)


@functools.cache
def _written(template: str) -> str:
    """A statement of this module with its tables and columns named (once)."""
    table = OutboxMessage._meta.db_table
    return template.format(
        outbox=table,
        inbox=InboxEntry._meta.db_table,
        columns=", ".join(rows.columns(OutboxMessage, table)),
    )


def _leased(row) -> OutboxMessage:
    """The message of a lease's or a claim's row, with the consumers that
    already ran (its last column)."""
    message = rows.instance(OutboxMessage, row[:-1], connection.alias)
    message.already_ran = list(row[-1])
    return message


# A sweep's claim (``outbox.sweeping``): the oldest rows of a topic
# due now that no one has fired yet, leased and read with what already ran,
# in one statement. SKIP LOCKED: two sweeps take different rows.
_CLAIM_UNFIRED_SQL = """
UPDATE {outbox} SET processing_until = %s, fired_at = %s
 WHERE id IN (
   SELECT id FROM {outbox}
    WHERE due_at IS NOT NULL AND due_at <= %s AND topic = %s AND available_at <= %s
      AND fired_at IS NULL AND num_nulls(completed_at, cancelled_at, dead_at) = 3
      AND (processing_until IS NULL OR processing_until < %s)
    ORDER BY due_at, id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING {columns}, ARRAY(SELECT consumer FROM {inbox} WHERE message_id = {outbox}.id)
"""


def claim_unfired(*, topic: str, limit: int, now: datetime) -> list[OutboxMessage]:
    """Lease up to ``limit`` rows of ``topic`` written due now and never fired
    (handed over on commit, waiting out their grace), oldest first, and stamp
    them fired: one statement and one commit. A row a sweep fired is never
    swept again; if its delivery fails, it is the relay's at its due time, as
    a row handed over on commit whose task failed."""
    lease = now + timedelta(seconds=settings.OUTBOX_CLAIM_LEASE_SECONDS)
    horizon = now + timedelta(seconds=settings.OUTBOX_HAND_OVER_GRACE_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(_written(_CLAIM_UNFIRED_SQL), [lease, now, horizon, topic, now, now, limit])
        found = cursor.fetchall()
    # UPDATE … RETURNING does not keep the subquery's order.
    return sorted((_leased(row) for row in found), key=lambda m: (m.due_at, m.pk))


_UNCLAIM_SQL = """
UPDATE {outbox} SET processing_until = NULL, fired_at = NULL
 WHERE id = ANY(%s) AND processing_until = %s AND completed_at IS NULL
"""


def unclaim(messages: list[OutboxMessage]) -> int:
    """Give rows of one claim that were never started back as they were
    before it (free, never fired): the next claim takes them, oldest first.
    Only rows still held by that claim's lease are touched (a row whose
    lease ran out may be someone else's by now); returns how many."""
    if not messages:
        return 0
    lease = messages[0].processing_until
    ids = [m.pk for m in messages]
    with connection.cursor() as cursor:
        cursor.execute(_written(_UNCLAIM_SQL), [ids, lease])
        return cursor.rowcount


def _record(entries: list[tuple[OutboxMessage, list[str]]]) -> None:
    """The inbox entries of the consumers that ran, of one message or of
    several (one statement; an entry a transactional consumer claimed
    itself is left as it is)."""
    at = timezone.now()
    rows.insert(
        [
            InboxEntry(consumer=name, message=message, event_id=message.event_id, processed_at=at)
            for message, names in entries
            for name in names
        ],
        ignore_conflicts=True,
    )


def _complete(messages: list[OutboxMessage]) -> None:
    """The rows settled, one message or several, in one ``UPDATE``."""
    at = timezone.now()
    for message in messages:
        message.completed_at, message.due_at, message.processing_until = at, None, None
    ids = [m.pk for m in messages]
    with connection.cursor() as cursor:
        cursor.execute(_written(_COMPLETE_SQL), [at, ids])


# Written once: built by the ORM, settling a sweep's claim was a twentieth
# of the webhook pool's time.
_COMPLETE_SQL = (
    "UPDATE {outbox} SET completed_at = %s, due_at = NULL, processing_until = NULL"
    " WHERE id = ANY(%s)"
)


def message_deliver(*, message_id: int, now: datetime | None = None) -> str:
    """Run every consumer of the message that has not run yet; returns a verdict."""
    now = now or timezone.now()
    message = _lease(message_id=message_id, now=now)
    if message is None:
        return "skipped"
    return message_deliver_claimed(message)


def message_deliver_leased(message: OutboxMessage) -> str:
    """Deliver a row its writer leased in the commit that wrote it (in place,
    ``outbox.handover``): the lease is held already and no consumer has run."""
    message.already_ran = []
    return message_deliver_claimed(message)


def message_deliver_claimed(message: OutboxMessage) -> str:
    """Deliver a row leased already, with the consumers that already ran
    (``already_ran``: read by the lease, or by a sweep's claim)."""
    # The trace of whoever wrote the row, from the row itself: a redelivery,
    # a relay's hand-over or a lost message's replacement continues it.
    with _delivery_span(message):
        opened = _open(message)
        _close_or_fail(opened)
    return "delivered"


def messages_deliver_claimed(
    messages: list[OutboxMessage], *, until: float | None = None, row_seconds: float = 0.0
) -> tuple[int, int, list[OutboxMessage]]:
    """Deliver rows leased already (a sweep's claim); returns how many were
    delivered, how many failed, and the rows not started. Never raises for
    a row.

    With ``until`` (a ``time.monotonic()`` no later than the claim's lease
    ends), a row after the first is started only if ``row_seconds`` (the
    longest one row's consumers may take) still fit before it: behind slow
    receivers, the rows left are returned for the caller to give back
    (:func:`unclaim`) rather than delivered after their lease ran out.

    Each row's ordinary consumers run in turn, as for a row alone; then one
    closing transaction settles every row that got that far: their inside
    halves (those of one kind together, when the kind says how:
    ``together``), their transactional consumers, their inbox entries and
    their completion, each in one statement where it can (docs/performance.md,
    "The webhooks' sweep"). If that transaction fails, each row is closed
    alone, as :func:`message_deliver_claimed` does, so that one row's fault
    is said on that row and the others still settle."""
    opened: list[_Opened] = []
    failed = 0
    left: list[OutboxMessage] = []
    _prepare(messages)
    for at, message in enumerate(messages):
        if at and until is not None and time.monotonic() + row_seconds > until:
            left = messages[at:]
            break
        try:
            with _delivery_span(message):
                opened.append(_open(message))
        except Exception:
            failed += 1  # said on the row and logged by _open
    if len(opened) > 1:
        try:
            _close(opened)
        except Exception:
            logger.warning(
                "outbox: closing %s deliveries together failed; closing each alone",
                len(opened),
                exc_info=True,
                extra={"message_ids": [o.message.pk for o in opened]},
            )
        else:
            return len(opened), failed, left
    delivered = 0
    for one in opened:
        try:
            _close_or_fail(one)
        except Exception:
            failed += 1
        else:
            delivered += 1
    return delivered, failed, left


def _prepare(messages: list[OutboxMessage]) -> None:
    """Let each consumer that says how (its ``prepare``) read what it needs
    for several of these messages in one go, before any of them is
    delivered (kept on each message with ``outbox.services.prepared_keep``,
    used while fresh with ``prepared``). A prepare that fails is logged:
    each delivery then reads for itself."""
    owed: dict[str, list[OutboxMessage]] = {}
    for message in messages:
        for name in consumers_owed(
            message.topic, already_ran=message.already_ran, only=message.only_consumers
        ):
            owed.setdefault(name, []).append(message)
    for name, its in owed.items():
        if len(its) < 2:
            continue
        try:
            prepare = getattr(import_string(name), "prepare", None)
            if prepare is not None:
                prepare(its)
        except Exception:
            logger.warning(
                "outbox: %s could not prepare %s deliveries; each reads for itself",
                name,
                len(its),
                exc_info=True,
            )


def _delivery_span(message: OutboxMessage):
    if not tracing.enabled():
        return tracing.NOOP
    return tracing.continue_from(
        message.trace_context,
        f"process {message.topic}",
        kind=SpanKind.CONSUMER,
        link=tracing.is_late(message.created_at, message.available_at),
        saga_id=message.saga_id,
        attributes={
            "messaging.system": "outbox",
            "messaging.operation.type": "process",
            "messaging.destination.name": message.topic,
            "messaging.message.id": message.pk,
            "saga.id": message.saga_id,
            "outbox.deliveries": message.deliveries,
        },
    )


@dataclass
class _Opened:
    """A message whose ordinary consumers ran: what its closing transaction
    owes (their inside halves, the transactional consumers), and who ran
    last, for ``last_error``."""

    message: OutboxMessage
    ran: list[str] = field(default_factory=list)
    finishing: list[tuple[str, Callable]] = field(default_factory=list)
    inside: list[tuple[str, Callable]] = field(default_factory=list)
    running: str = ""


def _open(message: OutboxMessage) -> _Opened:
    """Run the message's ordinary consumers that are owed, outside any
    transaction. One that fails: what ran is recorded, the row is given back
    with the reason (:func:`_fail`), and the error raised."""
    opened = _Opened(message)
    try:
        pending = []
        for opened.running in consumers_owed(
            message.topic, already_ran=message.already_ran, only=message.only_consumers
        ):
            # A routing typo fails here.
            pending.append((opened.running, import_string(opened.running)))
        opened.inside = [(name, handle) for name, handle in pending if _is_transactional(handle)]
        for name, handle in pending:
            if _is_transactional(handle):
                continue
            opened.running = name
            with tracing.span(name):
                rest = handle(message)
            opened.ran.append(name)
            if rest is not None:
                opened.finishing.append((name, rest))
    except Exception as exc:
        _fail(opened, exc)
        raise
    return opened


def _close(opened: list[_Opened]) -> None:
    """The closing transaction of one message or of several: the inside
    halves (grouped by their ``together``, when they have one), the
    transactional consumers, the inbox entries, the completions."""
    with transaction.atomic(durable=True):
        together: dict[Callable, list[Callable]] = {}
        for one in opened:
            for name, rest in one.finishing:
                one.running = name
                group = getattr(rest, "together", None)
                if group is None:
                    rest()
                else:
                    together.setdefault(group, []).append(rest)
        for group, rests in together.items():
            group(rests)
        _run_inside(opened)
        _record([(one.message, one.ran + [name for name, _ in one.inside]) for one in opened])
        _complete([one.message for one in opened])


def _run_inside(opened: list[_Opened]) -> None:
    """The transactional consumers of the messages closing together: each
    alone, but those that say how to run for several (their ``together``),
    once for all their messages when there are several."""
    several: dict[str, tuple[Callable, list[_Opened]]] = {}
    for one in opened:
        for name, handle in one.inside:
            group = getattr(handle, "together", None) if len(opened) > 1 else None
            if group is None:
                one.running = name
                with tracing.span(name):
                    handle(one.message)
            else:
                several.setdefault(name, (group, []))[1].append(one)
        one.running = "(closing the delivery)"
    for name, (group, ones) in several.items():
        for one in ones:
            one.running = name
        with tracing.span(name, attributes={"outbox.messages": len(ones)}):
            group([one.message for one in ones])
        for one in ones:
            one.running = "(closing the delivery)"


def _close_or_fail(opened: _Opened) -> None:
    try:
        _close([opened])
    except Exception as exc:
        _fail(opened, exc)
        raise


def _fail(opened: _Opened, exc: BaseException) -> None:
    """What ran did happen: record it, so a redelivery does not run it again
    (but a consumer whose inside half did not commit: it has not finished),
    say why the rest failed, and give the message back at once instead of at
    lease end."""
    message = opened.message
    error = _error_text(opened.running, exc)
    unfinished = {name for name, _ in opened.finishing}
    with transaction.atomic(durable=True):
        _record([(message, [name for name in opened.ran if name not in unfinished])])
        OutboxMessage.objects.filter(pk=message.pk).update(
            processing_until=None, last_error=error, last_error_at=timezone.now()
        )
    logger.warning(
        "outbox delivery failed: %s",
        error,
        extra={
            "message_id": message.pk,
            "topic": message.topic,
            "consumer": opened.running,
            "saga_id": str(message.saga_id) if message.saga_id else None,
        },
    )


def _error_text(consumer: str, exc: BaseException) -> str:
    text = f"{consumer}: {type(exc).__name__}: {exc}"
    if len(text) > LAST_ERROR_MAX_CHARS:
        text = text[: LAST_ERROR_MAX_CHARS - 1] + "…"
    return text


def _free_of_processing(now: datetime) -> Q:
    return Q(processing_until__isnull=True) | Q(processing_until__lt=now)
