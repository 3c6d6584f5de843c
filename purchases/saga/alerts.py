"""Raising an alert that names a saga (docs/operations.md, "Alerts").

An alert is an outbox row (``purchase.needs_operator``) written in the same
commit as the escalation it announces, plus an ERROR log line and a metric.
Its key makes it once-only: once per saga per escalation.
"""

from __future__ import annotations

import logging
from datetime import datetime

from config import metrics
from outbox.models import OutboxMessage
from outbox.services import outbox_publish
from webhooks.services import WebhookEvent

from ..models import PurchaseSaga
from .confirm import announce
from .topics import Topic
from .transition import log_extra

logger = logging.getLogger(__name__)


def raise_operator_alert(
    saga: PurchaseSaga, *, why: str, now: datetime, once_per: str | None = None
) -> bool:
    """Alert once per saga per escalation, inside the caller's transaction;
    True if raised now.

    An escalation is the saga's version by default (a move to an escalated
    state is one escalation). ``once_per`` names one that outlives versions,
    such as a compensation past its deadline, whose refund retries move the
    saga again and again: keyed by version it would be raised on every retry.
    """
    key = f"needs_operator:{saga.pk}:{once_per or saga.version}"
    if OutboxMessage.objects.filter(key=key).exists():
        return False
    logger.error("saga needs an operator: %s", why, **log_extra(saga, alert="saga_needs_operator"))
    metrics.ALERTS.labels(kind="saga_needs_operator").inc()
    outbox_publish(
        topic=Topic.NEEDS_OPERATOR,
        payload={"saga_id": str(saga.pk), "state": saga.state, "why": why},
        key=key,
        event_id=saga.event_id,
        saga_id=saga.pk,
        now=now,
    )
    announce(saga, WebhookEvent.NEEDS_ATTENTION, at=now)
    return True
