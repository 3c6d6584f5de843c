"""Reads of endpoints, deliveries and their attempts (the admin, the saga's
admin page, the staff API, and the organizers' API: given the organizer,
they read its endpoints only)."""

from __future__ import annotations

from django.db.models import Count, Prefetch, Q, QuerySet

from organizers.models import Organizer

from .models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint

_ATTEMPTS = Prefetch("attempts", queryset=WebhookAttempt.objects.order_by("number"))


def endpoint_list(*, organizer: Organizer | None = None) -> QuerySet[WebhookEndpoint]:
    """The endpoints of ``organizer``, or every endpoint without one (the
    staff's), oldest first, with their deliveries counted by status
    (``pending_count``, ``delivered_count``, ``failed_count``)."""
    endpoints = WebhookEndpoint.objects.all()
    if organizer is not None:
        endpoints = endpoints.filter(organizer=organizer)
    return endpoints.order_by("id").annotate(
        **{
            f"{status}_count": Count("deliveries", filter=Q(deliveries__status=status))
            for status in DeliveryStatus.values
        }
    )


def endpoint_in_scope(*, endpoint_id: int, organizer: Organizer | None) -> bool:
    """Whether the endpoint is ``organizer``'s; any endpoint is the staff's
    (``organizer`` None: no query)."""
    if organizer is None:
        return True
    return WebhookEndpoint.objects.filter(pk=endpoint_id, organizer=organizer).exists()


def endpoint_deliveries(
    *, endpoint_id: int, organizer: Organizer | None = None
) -> QuerySet[WebhookDelivery]:
    """An endpoint's deliveries, newest first, each with its attempts; none
    when ``organizer`` is given and the endpoint is not its own."""
    deliveries = WebhookDelivery.objects.filter(endpoint_id=endpoint_id)
    if organizer is not None:
        deliveries = deliveries.filter(endpoint__organizer=organizer)
    return deliveries.order_by("-created_at", "-id").prefetch_related(_ATTEMPTS)


def deliveries_for_saga(*, saga_id) -> list[WebhookDelivery]:
    """A saga's deliveries, oldest first, with their endpoints and attempts."""
    return list(
        WebhookDelivery.objects.filter(saga_id=saga_id)
        .select_related("endpoint")
        .order_by("created_at", "id")
        .prefetch_related(_ATTEMPTS)
    )
