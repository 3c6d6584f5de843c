"""A resend (docs/design.md, "The edges"): staff ask for one more attempt of
a delivered or failed delivery, with the same ``webhook-id`` (the admin's
Resend action, the staff API)."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from common.time import iso_z

from . import lock_objects
from .attempts import attempt_arm
from .errors import WebhookNotFound, WebhookResendRefused
from .models import DeliveryStatus

logger = logging.getLogger(__name__)

PENDING = DeliveryStatus.PENDING


def webhook_resend(
    delivery_id: int, *, now: datetime | None = None, by: str = "", reason: str = ""
) -> int:
    """Arm one more attempt of a delivered or failed delivery, due now, with
    the same ``webhook-id``; returns its number (the count goes on). A resend
    is one attempt: no retries follow it and its failure raises no alert
    (whoever asked reads the outcome in the attempts)."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        delivery = lock_objects.delivery_for_update(delivery_id=delivery_id)
        if delivery is None:
            raise WebhookNotFound(f"no webhook delivery {delivery_id}")
        if delivery.status == PENDING:
            due = iso_z(delivery.next_attempt_at) if delivery.next_attempt_at else "now"
            raise WebhookResendRefused(
                f"attempt {delivery.armed_attempt} is already owed (due {due})"
            )
        if not delivery.endpoint.enabled:
            raise WebhookResendRefused("the endpoint is disabled: enable it first")
        attempt = delivery.armed_attempt + 1
        delivery.status, delivery.armed_attempt, delivery.next_attempt_at = PENDING, attempt, now
        delivery.save(update_fields=["status", "armed_attempt", "next_attempt_at"])
        attempt_arm(delivery, attempt=attempt, due_at=now, now=now, resend=True)
    logger.info(
        "webhook resend: attempt %s armed",
        attempt,
        extra={
            "delivery_id": delivery.pk,
            "saga_id": str(delivery.saga_id),
            "type": delivery.event_type,
            "operator": by,
            "reason": reason,
        },
    )
    return attempt
