"""Outbox consumers of the purchase saga (routed in settings.OUTBOX_CONSUMERS).

Each is idempotent: the timers' consumers re-read the saga under its lock and
decide from its state, not from the fact that a message arrived; the email
consumers are recorded in the inbox so a redelivery sends nothing.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction
from django.template.loader import render_to_string

from outbox.models import OutboxMessage

from . import services

logger = logging.getLogger(__name__)


def hold_expired(message: OutboxMessage) -> None:
    with transaction.atomic():
        # A cancel that won the race after the relay handed the row over:
        # nothing to do (and the saga would refuse anyway).
        if OutboxMessage.objects.filter(pk=message.pk, cancelled_at__isnull=False).exists():
            return
    services.saga_expire_hold(
        saga_id=message.payload["saga_id"], attempt=message.payload.get("attempt", 0)
    )


def reconcile_due(message: OutboxMessage) -> None:
    services.saga_reconcile(
        saga_id=message.payload["saga_id"],
        attempt=message.payload["attempt"],
        expected_version=message.payload.get("version"),
    )


def refund_retry_due(message: OutboxMessage) -> None:
    services.saga_compensate(saga_id=message.payload["saga_id"], reason="refund retry")


def _send(template: str, subject: str, message: OutboxMessage) -> None:
    facts = message.payload
    buyer = get_user_model().objects.get(pk=facts["buyer_id"])
    context = {**facts, "buyer": buyer, "amount_display": f"{facts['amount'] / 100:.2f}"}
    body = render_to_string(template, context)
    # Sent after the transaction that announced it committed; the inbox entry
    # is written right after. A crash between the two resends (at least once),
    # never loses it.
    send_mail(
        subject=subject,
        message=body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[buyer.email or f"{buyer.username}@example.invalid"],
    )
    logger.info("email sent: %s", template, extra={"saga_id": facts["saga_id"]})


def confirmation_email(message: OutboxMessage) -> None:
    _send(
        "emails/purchase_confirmed.txt",
        f"Your tickets: reservation {message.payload['reservation']}",
        message,
    )


def cancellation_email(message: OutboxMessage) -> None:
    if message.payload.get("was_confirmed"):
        # The confirmation cannot be unsent: over-correct with a new message.
        _send(
            "emails/purchase_corrected.txt",
            f"Correction: reservation {message.payload['reservation']} was refunded",
            message,
        )
    else:
        _send(
            "emails/purchase_failed.txt",
            f"Your purchase did not go through: reservation {message.payload['reservation']}",
            message,
        )


def operator_alert(message: OutboxMessage) -> None:
    logger.error(
        "ALERT saga needs an operator: %s",
        message.payload.get("why"),
        extra={"saga_id": message.payload["saga_id"], "alert": "saga_needs_operator"},
    )
