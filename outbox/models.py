"""The transactional outbox, durable timers and the consumers' inbox.

One table serves both purposes: an *event* is a row due now, a *timer* is a
row due later (``available_at`` in the future) with a unique ``key`` so that
it can be cancelled. Rows are never deleted by the relay: ``fired_at`` and
``cancelled_at`` stay, so a cancel can answer ``already_fired`` (and when)
instead of an ambiguous "not pending".
"""

from django.db import models
from django.db.models import Q


class OutboxMessage(models.Model):
    topic = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    # Unique when set: a timer's name ("hold:<saga>"), or a once-only event.
    key = models.CharField(max_length=200, null=True, blank=True, unique=True)
    # The event id this row belongs to, so that the row lives on the same
    # shard as the purchase that wrote it (see DESIGN.md, Running).
    event_id = models.BigIntegerField(null=True, blank=True)
    saga_id = models.UUIDField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField()
    available_at = models.DateTimeField()
    # A relay that claimed the row owns it until then (hand-off to Celery
    # happens outside the claiming transaction).
    claimed_until = models.DateTimeField(null=True, blank=True)
    # First hand-off to Celery ("fired"), and the latest one (redeliveries).
    fired_at = models.DateTimeField(null=True, blank=True)
    handed_over_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    # Set when every consumer of the topic has processed the row; a fired row
    # without it is handed over again after OUTBOX_REDELIVER_AFTER_SECONDS.
    completed_at = models.DateTimeField(null=True, blank=True)
    # A delivery in progress: a worker processing the row owns it until then.
    processing_until = models.DateTimeField(null=True, blank=True)
    deliveries = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [
            # The relay's claim query only ever looks at rows not yet done.
            models.Index(
                fields=["available_at"],
                name="outbox_due_idx",
                condition=Q(completed_at__isnull=True, cancelled_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.topic}#{self.pk}"



class InboxEntry(models.Model):
    """What a consumer has processed: redelivery of a message is harmless."""

    consumer = models.CharField(max_length=100)
    message = models.ForeignKey(OutboxMessage, on_delete=models.PROTECT, related_name="inbox")
    processed_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["consumer", "message"], name="inbox_once_per_consumer"),
        ]
