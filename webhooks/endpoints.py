"""Webhook endpoints: created, changed, re-keyed and deleted, each in a
transaction of its own (docs/design.md, "The edges"; the contract is
docs/api.md). Every value is checked first (the URL by ``url_safety``, the
event types, the description), and a bad one raises :class:`WebhookInvalid`
naming its field. An endpoint's secret is made here and shown once.
"""

from __future__ import annotations

import base64
import logging
import secrets
from collections.abc import Iterable
from datetime import datetime

from django.db import transaction
from django.db.models import Field
from django.utils import timezone

from organizers.models import Organizer

from . import lock_objects
from .errors import WebhookInvalid, WebhookNotFound
from .models import WebhookEndpoint, WebhookEvent
from .url_safety import UnsafeURL, check_url

logger = logging.getLogger(__name__)

EVENT_TYPES: tuple[str, ...] = tuple(WebhookEvent.values)
SECRET_BYTES = 32  # the HMAC-SHA256 key: 256 random bits


def _max_length(field: Field) -> int:
    assert field.max_length is not None  # both are CharFields with one
    return field.max_length


URL_MAX_CHARS = _max_length(WebhookEndpoint._meta.get_field("url"))
DESCRIPTION_MAX_CHARS = _max_length(WebhookEndpoint._meta.get_field("description"))


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def _clean_url(url) -> str:
    """Checked before any transaction opens: the check resolves the host."""
    if not isinstance(url, str) or not url.strip():
        raise WebhookInvalid("url", "a URL is required")
    url = url.strip()
    if len(url) > URL_MAX_CHARS:
        raise WebhookInvalid("url", f"at most {URL_MAX_CHARS} characters")
    try:
        check_url(url)
    except UnsafeURL as exc:
        raise WebhookInvalid("url", str(exc)) from exc
    return url


def _clean_events(events) -> list[str]:
    known = ", ".join(EVENT_TYPES)
    if (
        not isinstance(events, list | tuple)
        or not events
        or not all(isinstance(e, str) for e in events)
    ):
        raise WebhookInvalid("events", f"a non-empty list of event types among: {known}")
    unknown = [e for e in events if e not in EVENT_TYPES]
    if unknown:
        raise WebhookInvalid(
            "events", f"unknown event type {', '.join(map(repr, unknown))}; the types are: {known}"
        )
    return list(dict.fromkeys(events))


def _clean_description(description) -> str:
    if not isinstance(description, str) or len(description) > DESCRIPTION_MAX_CHARS:
        raise WebhookInvalid("description", f"a text of at most {DESCRIPTION_MAX_CHARS} characters")
    return description


def webhook_endpoint_create(
    *,
    url: str,
    events: Iterable[str],
    description: str = "",
    organizer: Organizer | None = None,
    now: datetime | None = None,
) -> WebhookEndpoint:
    """A new endpoint, enabled, with a new secret (``endpoint.secret``: show
    it to the person who created it; nothing shows it again): ``organizer``'s,
    sent its events' webhooks only, or, without one, a platform-wide
    endpoint, sent every event's."""
    url, events = _clean_url(url), _clean_events(events)
    description = _clean_description(description)
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        endpoint = WebhookEndpoint.objects.create(
            organizer=organizer,
            url=url,
            events=events,
            description=description,
            enabled=True,
            secret=new_secret(),
            created_at=now,
            updated_at=now,
        )
    logger.info(
        "webhook endpoint created",
        extra={
            "endpoint_id": endpoint.pk,
            "endpoint": url,
            "events": ",".join(events),
            "organizer": organizer.slug if organizer is not None else "",
        },
    )
    return endpoint


def webhook_endpoint_update(
    *,
    endpoint_id: int,
    url: str | None = None,
    events: Iterable[str] | None = None,
    description: str | None = None,
    enabled: bool | None = None,
    now: datetime | None = None,
) -> WebhookEndpoint:
    """Change what is given (``None``: unchanged). A disabled endpoint is
    sent nothing new: no delivery is written for it, and an attempt that
    comes due while it is disabled fails without sending (resend it once it
    is enabled again)."""
    changes: dict = {}
    if url is not None:
        changes["url"] = _clean_url(url)
    if events is not None:
        changes["events"] = _clean_events(events)
    if description is not None:
        changes["description"] = _clean_description(description)
    if enabled is not None:
        if not isinstance(enabled, bool):
            raise WebhookInvalid("enabled", "true or false")
        changes["enabled"] = enabled
    with transaction.atomic(durable=True):
        endpoint = lock_objects.endpoint_for_update(endpoint_id=endpoint_id)
        if endpoint is None:
            raise WebhookNotFound(f"no webhook endpoint {endpoint_id}")
        for name, value in changes.items():
            setattr(endpoint, name, value)
        endpoint.updated_at = now or timezone.now()
        endpoint.save()
    if changes:
        logger.info(
            "webhook endpoint changed: %s",
            ", ".join(sorted(changes)),
            extra={
                "endpoint_id": endpoint.pk,
                "endpoint": endpoint.url,
                "enabled": endpoint.enabled,
            },
        )
    return endpoint


def webhook_endpoint_rotate_secret(*, endpoint_id: int, now: datetime | None = None) -> str:
    """A new secret, returned (the only time it is shown). Every attempt
    from now on is signed with it alone, retries of older deliveries too."""
    with transaction.atomic(durable=True):
        endpoint = lock_objects.endpoint_for_update(endpoint_id=endpoint_id)
        if endpoint is None:
            raise WebhookNotFound(f"no webhook endpoint {endpoint_id}")
        endpoint.secret = new_secret()
        endpoint.updated_at = now or timezone.now()
        endpoint.save(update_fields=["secret", "updated_at"])
    logger.info("webhook endpoint secret rotated", extra={"endpoint_id": endpoint.pk})
    return endpoint.secret


def webhook_endpoint_delete(*, endpoint_id: int) -> None:
    """Delete an endpoint with its deliveries and their attempts. An attempt
    still armed in the outbox finds no delivery and does nothing."""
    with transaction.atomic(durable=True):
        endpoint = lock_objects.endpoint_for_update(endpoint_id=endpoint_id, delete=True)
        if endpoint is None:
            raise WebhookNotFound(f"no webhook endpoint {endpoint_id}")
        endpoint.delete()
    logger.info("webhook endpoint deleted", extra={"endpoint_id": endpoint_id})
