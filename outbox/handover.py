"""Handing outbox rows to Celery: the relay's way, and on commit.

Two paths put a row's id on a queue (its topic's, ``OUTBOX_TOPIC_QUEUES``):

- **on commit** (:func:`hand_over_on_commit`): a row due when it is written
  is published by the process that wrote it, right after its commit, with no
  transaction of its own (Celery's ``apply_async``: :func:`publish`). The
  row was written due a grace later (``OUTBOX_HAND_OVER_GRACE_SECONDS``):
  if its consumers have not all run by then (the process died between the
  commit and the publish, the broker refused it, the worker lost it), the
  relay hands it over as it would any due row. A publish that fails makes
  the row due now, so the relay does not wait out the grace;
- **by the relay** (:func:`celery_hand_over`): the rows a pass claimed, a few
  as one task each, a burst spread over at most ``OUTBOX_DISPATCH_TASKS``
  tasks, all on one broker connection.

Either way a row may reach a worker twice; the delivery's lease and the
consumers' inbox make the second one harmless (``outbox.delivery``).

A topic listed in ``OUTBOX_SWEPT_TOPICS`` (the webhooks') is not published
row by row on commit: the commit wakes the topic's sweep, one task for the
rows that gather meanwhile (``outbox.sweeping``). Its grace and the relay
are the same.

A third way needs no queue at all: **in place** (:func:`delivered_here`). A
Celery task of the default queue that writes rows for that same queue (the
charge writing ``purchase.confirmed``) would hand them to a pool it belongs
to; instead it delivers them itself once its step is done. Such a row is
written already leased to its writer (``processing_until``) and due when the
lease ends, in the commit that writes it: no lease statement, no publish,
no second task. Several rows written by one block (a charge burst's
confirmations) are delivered as a sweep delivers its claim: each row's
consumers in turn, one closing transaction for them all. A writer that dies
before delivering leaves a row whose lease runs out, and the relay hands it
over then, as any row due.

With tracing on, a row the relay hands over alone is published inside the
trace stored on it (unless it was armed for much later: its delivery starts
a trace of its own), so the worker's task continues the purchase's trace;
the delivery reads the row's context in any case (``config/tracing.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from celery import Task
from django.conf import settings
from django.db import connection
from django.utils import timezone

from config import tracing
from config.celery import app

from . import sweeping
from .delivery import message_deliver_leased, messages_deliver_claimed
from .models import OutboxMessage
from .tasks import deliver, deliver_many, sweep

logger = logging.getLogger(__name__)

NOTIFY_CHANNEL = "boxoffice_outbox"


def notify_relays() -> None:
    """Wake the relays: NOTIFY is transactional, so relays listening hear
    it when (and only if) the transaction commits (at once in autocommit),
    and PostgreSQL folds identical notifications of one transaction into
    one."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [NOTIFY_CHANNEL])


def chunks(ids: list[int], tasks: int) -> list[list[int]]:
    """``ids`` in order, spread evenly over at most ``tasks`` chunks."""
    n = max(1, min(tasks, len(ids)))
    size, extra = divmod(len(ids), n)
    out, at = [], 0
    for i in range(n):
        step = size + (1 if i < extra else 0)
        out.append(ids[at : at + step])
        at += step
    return [c for c in out if c]


def queue_of(topic: str) -> str | None:
    """The queue a topic's rows go to (None: the default queue)."""
    return settings.OUTBOX_TOPIC_QUEUES.get(topic)


def routing(queue: str | None) -> dict[str, Any]:
    """Celery's publish options for a queue (None: the default queue)."""
    return {"queue": queue} if queue else {}


def publish(task: Task, args: tuple, *, queue: str | None = None) -> None:
    """Send ``task(*args)`` to ``queue`` through Celery's own publish, which
    raises when the broker cannot take it (after Celery's publish retries);
    its publish signals carry the trace (config/tracing.py)."""
    task.apply_async(args=args, **routing(queue))


def _by_queue(ids: list[int], topics: dict[int, str]) -> dict[str | None, list[int]]:
    """``ids`` grouped by the queue their topic goes to, each group in order."""
    groups: dict[str | None, list[int]] = {}
    for message_id in ids:
        groups.setdefault(queue_of(topics.get(message_id, "")), []).append(message_id)
    return groups


def celery_hand_over(ids: list[int], topics: dict[int, str]) -> tuple[list[int], list[int]]:
    """Publish the rows, each to its topic's queue; returns (handed, failed)."""
    handed: list[int] = []
    failed: list[int] = []
    groups = [
        (queue, chunk)
        for queue, group in _by_queue(ids, topics).items()
        for chunk in chunks(group, settings.OUTBOX_DISPATCH_TASKS)
    ]
    parents = _trace_parents([c[0] for _, c in groups if len(c) == 1])
    try:
        with app.producer_or_acquire() as producer:
            for queue, chunk in groups:
                options = routing(queue)
                try:
                    if len(chunk) == 1:
                        with tracing.use_context(parents.get(chunk[0], "")):
                            deliver.apply_async(args=(chunk[0],), producer=producer, **options)
                    else:
                        deliver_many.apply_async(args=(chunk,), producer=producer, **options)
                except Exception:
                    logger.exception("outbox hand-off failed", extra={"count": len(chunk)})
                    failed.extend(chunk)
                else:
                    handed.extend(chunk)
    except Exception:  # no broker connection at all
        logger.exception("outbox hand-off failed: no broker connection")
    done = set(handed) | set(failed)
    failed.extend(i for i in ids if i not in done)
    return handed, failed


def _trace_parents(ids: list[int]) -> dict[int, str]:
    """The stored trace of each row to be published alone, when its delivery
    continues it (one query, only with tracing on)."""
    if not ids or not tracing.enabled():
        return {}
    rows = (
        OutboxMessage.objects.filter(pk__in=ids)
        .exclude(trace_context="")
        .values_list("pk", "trace_context", "created_at", "available_at")
    )
    return {
        pk: context
        for pk, context, created_at, available_at in rows
        if not tracing.is_late(created_at, available_at)
    }


def hand_over_on_commit(message_id: int, topic: str) -> None:
    """After the commit that wrote the row: publish it, or wake its topic's
    sweep (see the module's docstring). Never raises: the row is the
    obligation, this is the fast way to it."""
    if sweeping.swept(topic):
        _wake_sweep(message_id, topic)
        return
    try:
        publish(deliver, (message_id,), queue=queue_of(topic))
    except Exception:
        logger.exception(
            "outbox hand-off on commit failed; the relay takes the row",
            extra={"message_id": message_id, "topic": topic},
        )
        _due_now(message_id)


def _wake_sweep(message_id: int, topic: str) -> None:
    """Publish a sweep of the topic unless one is owed already (its wake
    flag set), which takes this row too (``outbox.sweeping``)."""
    woke = False
    try:
        woke = sweeping.wake(topic)
        if woke:
            publish(sweep, (topic,), queue=queue_of(topic))
    except Exception:
        logger.exception(
            "outbox sweep wake-up failed; the relay takes the row",
            extra={"message_id": message_id, "topic": topic},
        )
        if woke:
            sweeping.unwake(topic)
        _due_now(message_id)


def _due_now(message_id: int) -> None:
    """The relay's at once: one statement, in autocommit (this runs after
    the commit that wrote the row). If even this fails the row stays due at
    the end of its grace, and the relay takes it then."""
    try:
        OutboxMessage.objects.filter(
            pk=message_id,
            completed_at__isnull=True,
            fired_at__isnull=True,
            due_at__isnull=False,
        ).update(due_at=timezone.now())
        notify_relays()
    except Exception:
        logger.exception(
            "outbox row left to the end of its grace", extra={"message_id": message_id}
        )


class _Here:
    """The rows a :func:`delivered_here` block owes, once their commit ran."""

    def __init__(self) -> None:
        self.open = True
        self.owed: list[OutboxMessage] = []


_HERE: ContextVar[_Here | None] = ContextVar("outbox_delivered_here", default=None)


def delivers_here(topic: str) -> bool:
    """Whether a row of ``topic`` written now is delivered by its writer:
    inside a :func:`delivered_here` block, and only for the default queue
    (a webhook's row goes to its own pool, whatever writes it)."""
    return _HERE.get() is not None and queue_of(topic) is None


def owe_here(message: OutboxMessage) -> None:
    """After the commit that wrote ``message`` (leased to us): the block
    delivers it when it ends; a block already closed (an outer transaction
    committed later) hands it over as any row written due."""
    here = _HERE.get()
    if here is not None and here.open:
        here.owed.append(message)
    else:
        hand_over_on_commit(message.pk, message.topic)


@contextmanager
def delivered_here() -> Iterator[None]:
    """Deliver, when the block ends, the default queue's rows its commits
    wrote (see the module's docstring). A delivery that fails is logged and
    left to the relay at its lease's end; it never fails the block."""
    here = _Here()
    token = _HERE.set(here)
    try:
        yield
    finally:
        here.open = False
        _HERE.reset(token)
        _deliver_owed(here.owed)


def _deliver_owed(owed: list[OutboxMessage]) -> None:
    """The rows a block wrote for its own delivery: one alone, as its own
    task would deliver it; several (a charge burst's confirmations) as a
    sweep's claim, with one closing transaction for them all."""
    if len(owed) > 1:
        for message in owed:
            message.already_ran = []  # leased by the commit that wrote it
        try:
            messages_deliver_claimed(owed)  # never raises for a row
        except Exception:
            logger.exception(
                "outbox delivery in place failed; the relay takes the rows at their lease's end",
                extra={"message_ids": [message.pk for message in owed]},
            )
        return
    for message in owed:
        try:
            message_deliver_leased(message)
        except Exception:
            logger.exception(
                "outbox delivery in place failed; the relay takes the row at its lease's end",
                extra={"message_id": message.pk, "topic": message.topic},
            )
