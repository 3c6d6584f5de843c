"""Sweeping a topic: the first delivery of its rows without a message each.

A topic listed in ``OUTBOX_SWEPT_TOPICS`` (the webhooks') is not handed to
Celery row by row on commit (``outbox.handover``). The commit that writes a
row sets the topic's wake flag in the shared cache, and publishes one
``outbox.sweep`` task only if the flag was clear; rows written while it is
set ride that task. The sweep waits ``OUTBOX_SWEEP_GATHER_SECONDS`` for more
rows to gather, clears the flag, then claims the rows due and never fired,
up to ``OUTBOX_SWEEP_BATCH`` at a time (:func:`outbox.delivery.claim_unfired`),
and delivers them as a task of its own would each, but with one closing
transaction for the claim's rows (:func:`outbox.delivery.messages_deliver_claimed`).
The rows are delivered one after another, so a row is started only while
its longest delivery (``OUTBOX_SWEEP_ROW_SECONDS``) still ends within the
claim's lease; behind slow receivers the rest are given back unfired
(:func:`outbox.delivery.unclaim`) and claimed again at once. It stops at a
claim that comes back short with nothing given back.

Why no row is left behind:

- the flag is cleared *before* the first claim, and a writer sets it only
  *after* its commit. A row committed before the clear is seen by the claim;
  a row committed after it finds the flag clear (or set by another writer
  who came after the clear) and so has a sweep of its own to come;
- a claim that comes back full, or that gave rows back, is followed by
  another, so the last claim of a sweep saw every row it could take;
- a row is given back only if it is still the claim's (its lease as the
  claim set it) and was never started: it is as it was before the claim;
- the flag expires (``WAKE_SECONDS``): a sweep task lost with the flag still
  set holds the topic's wake-ups back that long at most, after which the
  next commit publishes a sweep that takes every row still unfired;
- anything else (no broker, no cache, a worker that dies mid-sweep) leaves
  rows unfired or leased, and those are the relay's at the end of their
  grace (``OUTBOX_HAND_OVER_GRACE_SECONDS``), as any row handed over on
  commit whose task never ran.

A sweep fires a row once: if its delivery fails, the row is the relay's at
its due time, with the redelivery schedule and the dead-letter verdict of
any other row.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from .delivery import claim_unfired, messages_deliver_claimed, unclaim

logger = logging.getLogger(__name__)

# How long a wake flag outlives a sweep task that never ran.
WAKE_SECONDS = 5


def wake_key(topic: str) -> str:
    return f"outbox:sweep-owed:{topic}"


def swept(topic: str) -> bool:
    return topic in settings.OUTBOX_SWEPT_TOPICS


def wake(topic: str) -> bool:
    """Set the topic's wake flag; True if it was clear (the caller publishes
    a sweep). Raises what the cache raises."""
    return bool(cache.add(wake_key(topic), 1, timeout=WAKE_SECONDS))


def unwake(topic: str) -> None:
    """Clear the flag: a sweep before its first claim, or a wake whose sweep
    could not be published (so that the next commit tries again). Never
    raises: a flag that could not be cleared expires on its own."""
    try:
        cache.delete(wake_key(topic))
    except Exception:
        logger.exception("outbox sweep: the wake flag could not be cleared", extra={"topic": topic})


def outbox_sweep(*, topic: str, gather: float | None = None) -> str:
    """Deliver the topic's rows due and never fired (see the module's
    docstring); returns a verdict with the counts."""
    gather = settings.OUTBOX_SWEEP_GATHER_SECONDS if gather is None else gather
    if gather > 0:
        time.sleep(gather)
    unwake(topic)  # before the first claim (see the module's docstring)
    limit = settings.OUTBOX_SWEEP_BATCH
    delivered = failed = 0
    while True:
        # Read before the claim: its lease ends later than this.
        until = time.monotonic() + settings.OUTBOX_CLAIM_LEASE_SECONDS
        claimed = claim_unfired(topic=topic, limit=limit, now=timezone.now())
        # One closing transaction for the claim's rows; a row that fails is
        # said on the row and logged by the delivery, and is the relay's at
        # its due time. Rows that no longer fit in the lease are given back.
        done, lost, left = messages_deliver_claimed(
            claimed, until=until, row_seconds=settings.OUTBOX_SWEEP_ROW_SECONDS
        )
        delivered, failed = delivered + done, failed + lost
        if left:
            given = unclaim(left)  # the next claim takes them first
            logger.info(
                "outbox sweep: %s of %s claimed rows given back, their lease too short"
                " after slow deliveries",
                given,
                len(claimed),
                extra={"topic": topic, "message_ids": [m.pk for m in left]},
            )
        elif len(claimed) < limit:
            return f"delivered={delivered} failed={failed}"
