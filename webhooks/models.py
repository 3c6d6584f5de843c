"""Endpoints, deliveries and attempts (docs/design.md, "The edges").

An endpoint is a URL of the seller's, the event types it subscribed to and
the secret its deliveries are signed with. A delivery is one message for one
endpoint: written in the saga's commit, at most one per (endpoint, saga,
type), with the exact body that is signed and sent and the ``webhook-id``
that every attempt of it carries. An attempt is one POST (or one refusal to
POST) and what came back: the delivery log is a query over these rows.
"""

from django.db import models

from config.distribution import NO_EVENT


class WebhookEvent(models.TextChoices):
    """The event types a seller may subscribe to (docs/api.md)."""

    CONFIRMED = "purchase.confirmed", "the purchase is confirmed"
    FAILED = "purchase.failed", "the purchase failed; nothing was charged"
    REFUNDED = "purchase.refunded", "the purchase was undone and refunded"
    NEEDS_ATTENTION = "purchase.needs_attention", "an operator was asked to step in"
    DISPUTED = "purchase.disputed", "the buyer's bank disputes the charge"
    CANCELLED = "purchase.cancelled", "the buyer cancelled seats (a refund follows)"
    PARTIALLY_REFUNDED = "purchase.partially_refunded", "a part of the purchase was refunded"
    EVENT_CANCELLED = "event.cancelled", "the organizer cancelled the event"


class WebhookEndpoint(models.Model):
    # The seller whose endpoint it is: sent its events' deliveries only. None:
    # a platform-wide endpoint, made by staff, sent every event's
    # (webhooks/lock_objects.py, for_the_event_sql).
    organizer = models.ForeignKey(
        "organizers.Organizer",
        on_delete=models.CASCADE,
        related_name="webhook_endpoints",
        null=True,
        blank=True,
    )
    url = models.CharField(max_length=2000)
    # Event types (WebhookEvent values), in the order given, without repeats.
    events = models.JSONField(default=list)
    description = models.CharField(max_length=300, blank=True, default="")
    enabled = models.BooleanField(default=True)
    # "whsec_<base64>": the HMAC key, shown once (at creation and at each
    # rotation); never shown by the admin.
    secret = models.CharField(max_length=100)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.url


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # an attempt is owed (an outbox row is armed for it)
    DELIVERED = "delivered"  # the latest attempt got a 2xx
    FAILED = "failed"  # no attempt owed any more, and the latest did not get a 2xx


class WebhookDelivery(models.Model):
    # No index of its own: the indexes below lead with it (docs/performance.md,
    # "The webhooks' sweep": every index is written again by the delivered
    # update).
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries", db_index=False
    )
    # The webhook-id header: the same for every attempt of this delivery.
    # Unique per event in the database (``Meta``); a random UUID's hex, so
    # unique everywhere.
    message_id = models.CharField(max_length=40)
    event_type = models.CharField(max_length=40, choices=WebhookEvent.choices)
    # Read by the once-per-type constraint, which leads with it (a saga's page).
    saga_id = models.UUIDField()
    # The purchase's event (the catalog's), like the outbox rows: the shard key,
    # never NULL (NO_EVENT for a delivery of no event).
    event_id = models.BigIntegerField(default=NO_EVENT)
    # Compact JSON, exactly the bytes signed and sent (not a JSONField: the
    # database would normalise it).
    body = models.TextField()
    status = models.CharField(
        max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    # The number of the latest attempt armed (its outbox row's key is
    # "webhook:<id>:<n>"), and when it is due while the delivery is pending.
    armed_attempt = models.PositiveIntegerField(default=1)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # Each type is sent at most once per saga per endpoint, whatever
            # the redeliveries (docs/api.md).
            models.UniqueConstraint(
                fields=["saga_id", "endpoint", "event_type", "event_id"],
                name="webhook_once_per_saga_endpoint_type",
            ),
            models.UniqueConstraint(
                fields=["message_id", "event_id"], name="webhook_message_id_once_per_event"
            ),
        ]
        indexes = [
            # An endpoint's deliveries, newest first (the API's list).
            models.Index(
                fields=["endpoint", "-created_at", "-id"], name="webhook_delivery_by_endpoint"
            ),
            # An endpoint's deliveries counted by status (its list, the admin).
            models.Index(fields=["endpoint", "status"], name="webhook_delivery_by_status"),
        ]
        permissions = [
            ("resend_webhookdelivery", "Can resend a webhook delivery"),
        ]
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.event_type} {self.message_id}"


class WebhookAttempt(models.Model):
    # The database's key is (event_id, delivery_id) -> the delivery's
    # (event_id, id) (webhooks/migrations/0003_citus_distribution.py).
    # No index of its own: webhook_attempt_once leads with it.
    delivery = models.ForeignKey(
        WebhookDelivery,
        on_delete=models.CASCADE,
        related_name="attempts",
        db_constraint=False,
        db_index=False,
    )
    # The delivery's event: the attempt lives on the delivery's shard.
    event_id = models.BigIntegerField()
    number = models.PositiveIntegerField()  # 1-based; a resend continues the count
    resend = models.BooleanField(default=False)  # asked for by staff
    at = models.DateTimeField()  # when it started: its webhook-timestamp
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)  # null: no answer
    latency_ms = models.FloatField(null=True, blank=True)  # null: nothing was sent
    error = models.CharField(max_length=500, blank=True, default="")  # "" on a 2xx
    response_excerpt = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["number"]
        constraints = [
            models.UniqueConstraint(
                fields=["delivery", "number", "event_id"], name="webhook_attempt_once"
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}"

    def save(self, *args, **kwargs):
        # An attempt written without its event (by hand) takes its delivery's.
        if self.event_id is None and self.delivery_id is not None:
            self.event_id = self.delivery.event_id
        super().save(*args, **kwargs)
