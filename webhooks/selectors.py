"""Reads of endpoints, deliveries and their attempts (the admin, the saga's
admin page, the staff API)."""

from __future__ import annotations

from django.db.models import Count, Prefetch, Q, QuerySet

from .models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint

_ATTEMPTS = Prefetch("attempts", queryset=WebhookAttempt.objects.order_by("number"))


def endpoint_list() -> QuerySet[WebhookEndpoint]:
    """Every endpoint, oldest first, with its deliveries counted by status
    (``pending_count``, ``delivered_count``, ``failed_count``)."""
    return WebhookEndpoint.objects.order_by("id").annotate(
        **{
            f"{status}_count": Count("deliveries", filter=Q(deliveries__status=status))
            for status in DeliveryStatus.values
        }
    )


def endpoint_deliveries(*, endpoint_id: int) -> QuerySet[WebhookDelivery]:
    """An endpoint's deliveries, newest first, each with its attempts."""
    return (
        WebhookDelivery.objects.filter(endpoint_id=endpoint_id)
        .order_by("-created_at", "-id")
        .prefetch_related(_ATTEMPTS)
    )


def deliveries_for_saga(*, saga_id) -> list[WebhookDelivery]:
    """A saga's deliveries, oldest first, with their endpoints and attempts."""
    return list(
        WebhookDelivery.objects.filter(saga_id=saga_id)
        .select_related("endpoint")
        .order_by("created_at", "id")
        .prefetch_related(_ATTEMPTS)
    )
