"""Delivering one outbox row to its consumers (what ``outbox.deliver`` runs).

Consumers are listed per topic in ``settings.OUTBOX_CONSUMERS`` (one visible
routing table instead of registrations hidden in signals). Each consumer is a
function ``handle(message) -> None`` that must be idempotent; the inbox
records that it ran, so redelivery skips it. A consumer whose effect must be
exactly once (a counter) claims its inbox entry inside its own transaction
with :func:`inbox_claim`.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from .models import InboxEntry, OutboxMessage

logger = logging.getLogger(__name__)


def consumers_for(topic: str) -> list[tuple[str, object]]:
    return [(path, import_string(path)) for path in settings.OUTBOX_CONSUMERS.get(topic, [])]


def inbox_claim(*, consumer: str, message: OutboxMessage, now: datetime | None = None) -> bool:
    """Inside the consumer's transaction: True the first time, False after."""
    try:
        with transaction.atomic():
            InboxEntry.objects.create(
                consumer=consumer, message=message, processed_at=now or timezone.now()
            )
    except IntegrityError:
        return False
    return True


def message_deliver(*, message_id: int, now: datetime | None = None) -> str:
    """Run every consumer of the message that has not run yet; returns a verdict."""
    now = now or timezone.now()
    lease = now + timedelta(seconds=settings.OUTBOX_CLAIM_LEASE_SECONDS)
    # Own the delivery for a lease, without holding a transaction open while
    # consumers call out (gateway, mail server). Two copies of the same task
    # cannot both run consumers.
    owned = (
        OutboxMessage.objects.filter(
            pk=message_id, completed_at__isnull=True, cancelled_at__isnull=True
        )
        .filter(_free_of_processing(now))
        .update(processing_until=lease)
    )
    if not owned:
        return "skipped"
    message = OutboxMessage.objects.get(pk=message_id)
    done = set(InboxEntry.objects.filter(message=message).values_list("consumer", flat=True))
    try:
        for name, handle in consumers_for(message.topic):
            if name in done:
                continue
            handle(message)
            InboxEntry.objects.get_or_create(
                consumer=name, message=message, defaults={"processed_at": timezone.now()}
            )
    except Exception:
        OutboxMessage.objects.filter(pk=message_id).update(processing_until=None)
        raise
    OutboxMessage.objects.filter(pk=message_id).update(
        completed_at=timezone.now(), processing_until=None
    )
    return "delivered"


def _free_of_processing(now: datetime):
    from django.db.models import Q

    return Q(processing_until__isnull=True) | Q(processing_until__lt=now)
