"""Every row lock of the webhooks app (docs/design.md, "House rules").

A delivery is locked alone (its attempt's record, a resend), and an endpoint
alone (a change, a rotation, a delete): never both, and never with a saga's
lock. The saga's commit that writes deliveries reads the enabled endpoints
under ``FOR KEY SHARE`` (after the saga's own lock): sagas never block one
another there, a change or a rotation (``FOR NO KEY UPDATE``) never waits
for them, and a delete (``FOR UPDATE``) waits for the commits in flight, so
it cannot remove an endpoint under a delivery about to commit (PostgreSQL
checks that foreign key only at COMMIT).
"""

from __future__ import annotations

import json

from django.db import connection

from .models import WebhookDelivery, WebhookEndpoint


def enabled_endpoints_key_share() -> list[tuple[int, list[str]]]:
    """(id, event types) of every enabled endpoint, key-share locked until
    the caller's commit (PostgreSQL; SQLite's writers are serialised anyway)."""
    rows = WebhookEndpoint.objects.filter(enabled=True).values_list("pk", "events")
    if connection.vendor != "postgresql":
        return list(rows)
    sql, params = rows.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} FOR KEY SHARE", params)
        return [
            (pk, json.loads(events) if isinstance(events, str) else events)
            for pk, events in cursor.fetchall()
        ]


def delivery_for_update(*, delivery_id: int) -> WebhookDelivery | None:
    return (
        WebhookDelivery.objects.select_related("endpoint")
        .select_for_update(of=("self",))
        .filter(pk=delivery_id)
        .first()
    )


def endpoint_for_update(*, endpoint_id: int, delete: bool = False) -> WebhookEndpoint | None:
    """``FOR NO KEY UPDATE`` for a change, ``FOR UPDATE`` for a delete."""
    return (
        WebhookEndpoint.objects.select_for_update(of=("self",), no_key=not delete)
        .filter(pk=endpoint_id)
        .first()
    )
