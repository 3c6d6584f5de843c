"""Celery entry point for outbox delivery: an id in, one service call."""

from celery import shared_task

from .delivery import message_deliver


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
    # over again after OUTBOX_REDELIVER_AFTER_SECONDS: the row is the
    # obligation, the retry only a shortcut.
    return message_deliver(message_id=message_id)
