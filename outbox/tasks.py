"""Celery entry points for outbox delivery: ids in, one service call each."""

import logging
import random

from celery import shared_task

from .delivery import message_deliver
from .sweeping import outbox_sweep

logger = logging.getLogger(__name__)


@shared_task(
    bind=True,
    name="outbox.deliver",
    acks_late=True,
    autoretry_for=(Exception,),
    retry_backoff=2,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=8,
)
def deliver(self, message_id: int) -> str:
    # If every retry fails the row stays incomplete and the relay hands it
    # over again on the OUTBOX_REDELIVER_SECONDS schedule (then it is a dead
    # letter): the row is the obligation, the retry only a shortcut.
    return message_deliver(message_id=message_id)


@shared_task(bind=True, name="outbox.deliver_many", acks_late=True, max_retries=8)
def deliver_many(self, message_ids: list[int]) -> str:
    """Several rows in one task (the relay's hand-over of a large batch).

    Each row is delivered on its own; one that fails does not hold up the
    others, and only the failed ones are retried (same backoff as
    ``outbox.deliver``). The rows remain the obligation either way.
    """
    verdicts = {"delivered": 0, "skipped": 0}
    failed = []
    for message_id in message_ids:
        try:
            verdicts[message_deliver(message_id=message_id)] += 1
        except Exception:
            logger.exception("outbox delivery failed", extra={"message_id": message_id})
            failed.append(message_id)
    if failed:
        countdown = min(300, 2 ** (self.request.retries + 1)) * random.uniform(0.5, 1.0)
        raise self.retry(args=[failed], countdown=countdown)
    return f"delivered={verdicts['delivered']} skipped={verdicts['skipped']}"


@shared_task(name="outbox.sweep", acks_late=True)
def sweep(topic: str) -> str:
    """The first delivery of a swept topic's rows (``outbox.sweeping``). Not
    retried: a sweep that fails leaves its rows to the next sweep or to the
    relay."""
    return outbox_sweep(topic=topic)
