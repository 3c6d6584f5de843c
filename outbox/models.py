"""The transactional outbox, durable timers and the consumers' inbox.

One table serves both purposes: an *event* is a row due now, a *timer* is a
row due later (``available_at`` in the future) with a unique ``key`` so that
it can be cancelled. Rows are never deleted by the relay: ``fired_at`` and
``cancelled_at`` stay, so a cancel can answer ``already_fired`` (and when)
instead of an ambiguous "not pending".

A row handed over whose consumers do not all finish is handed over again on
the ``OUTBOX_REDELIVER_SECONDS`` schedule; when the schedule is spent it is a
*dead letter* (``dead_at``): one alert, no more hand-overs, an operator's to
replay (``outbox.services.outbox_replay``).
"""

from django.db import models
from django.db.models import Q

from config.distribution import NO_EVENT

LAST_ERROR_MAX_CHARS = 1000


class OutboxMessage(models.Model):
    topic = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    # Unique when set: a timer's name ("hold:<saga>"), or a once-only event.
    # Unique per event in the database (``Meta``); the product's keys name
    # their saga (or delivery), so they are unique everywhere.
    key = models.CharField(max_length=200, null=True, blank=True)
    # The event id this row belongs to, so that the row lives on the same
    # shard as the purchase that wrote it (docs/design.md, "Running"). Never
    # NULL (a distribution column): NO_EVENT for a row of no event.
    event_id = models.BigIntegerField(default=NO_EVENT)
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
    # without it is handed over again at ``due_at``.
    completed_at = models.DateTimeField(null=True, blank=True)
    # A delivery in progress: a worker processing the row owns it until then.
    processing_until = models.DateTimeField(null=True, blank=True)
    # When the relay must look at the row next: ``available_at`` until the
    # first hand-over; then, written by each hand-over, when it is handed over
    # again if it has not completed by then (or, once the schedule is spent,
    # when it is a dead letter). NULL once the row is settled (completed,
    # cancelled, dead), so the column's statistics describe the pending rows
    # only and the claim's estimate is right (see ``outbox_claim_idx``).
    due_at = models.DateTimeField(null=True, blank=True)
    # Hand-overs in all, and since the redelivery schedule (re)started (a
    # replay restarts it). (The db default keeps raw INSERTs valid.)
    deliveries = models.PositiveIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0, db_default=0)
    # Why the last delivery failed: "<consumer>: <Type>: <message>", truncated.
    last_error = models.TextField(blank=True, default="", db_default="")
    last_error_at = models.DateTimeField(null=True, blank=True)
    # The schedule ran out without completing: no more hand-overs, one alert.
    dead_at = models.DateTimeField(null=True, blank=True)
    # The last replay by an operator, and, for a backfill, the only consumers
    # the replay runs (null: every consumer of the topic that has not run).
    replayed_at = models.DateTimeField(null=True, blank=True)
    only_consumers = models.JSONField(null=True, blank=True)
    # The W3C traceparent of the span that wrote the row (empty when tracing
    # is off): its delivery continues that trace, or links to it when the row
    # was armed for much later (config/tracing.py).
    trace_context = models.CharField(max_length=128, blank=True, default="", db_default="")
    # Not a column: the consumers that already ran, as the delivery's lease
    # reads them with the row (outbox/delivery.py).
    already_ran: list[str]

    class Meta:
        indexes = [
            # Rows not yet done, by due time: the backlog metric, the relay's
            # look-ahead for the next timer.
            models.Index(
                fields=["available_at"],
                name="outbox_due_idx",
                condition=Q(completed_at__isnull=True, cancelled_at__isnull=True),
            ),
            # The relay's claim: rows owed a hand-over (or a dead-letter
            # verdict), in the order they are due. A row waiting for its
            # redelivery sits at its redelivery time, not at the head of the
            # range; a settled row leaves the index.
            models.Index(
                fields=["due_at", "id"],
                name="outbox_claim_idx",
                condition=Q(due_at__isnull=False),
            ),
            # A sweep's claim (outbox/sweeping.py): the rows of a topic never
            # fired, by due time. A row leaves it when it is fired, so the
            # claim reads only what it may take, not every row in flight.
            models.Index(
                fields=["topic", "due_at", "id"],
                name="outbox_unfired_idx",
                condition=Q(fired_at__isnull=True, due_at__isnull=False),
            ),
            # Dead letters (the gauge, the admin's filter, the replay), by age.
            models.Index(
                fields=["created_at", "id"],
                name="outbox_dead_idx",
                condition=Q(
                    dead_at__isnull=False, completed_at__isnull=True, cancelled_at__isnull=True
                ),
            ),
        ]
        constraints = [
            models.UniqueConstraint(fields=["key", "event_id"], name="outbox_key_once_per_event"),
        ]
        permissions = [
            ("replay_outboxmessage", "Can replay dead letters and backfill a consumer"),
        ]

    def __str__(self) -> str:
        return f"{self.topic}#{self.pk}"

    def save(self, *args, **kwargs):
        # A row written without its due time (outbox_publish sets it) is due
        # at available_at, like any new row, unless it is already settled.
        if (
            self._state.adding
            and self.due_at is None
            and not (self.completed_at or self.cancelled_at or self.dead_at)
        ):
            self.due_at = self.available_at
        super().save(*args, **kwargs)


class InboxEntry(models.Model):
    """What a consumer has processed: redelivery of a message is harmless."""

    consumer = models.CharField(max_length=100)
    # The database's key is (event_id, message_id) -> the message's
    # (event_id, id) (outbox/migrations/0004_citus_distribution.py).
    message = models.ForeignKey(
        OutboxMessage, on_delete=models.PROTECT, related_name="inbox", db_constraint=False
    )
    # The message's event: the entry lives on the message's shard.
    event_id = models.BigIntegerField()
    processed_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["consumer", "message", "event_id"], name="inbox_once_per_consumer"
            ),
        ]

    def save(self, *args, **kwargs):
        # An entry written without its event (by hand) takes its message's.
        if self.event_id is None and self.message_id is not None:
            self.event_id = self.message.event_id
        super().save(*args, **kwargs)
