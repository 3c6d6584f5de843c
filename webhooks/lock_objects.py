"""Every row lock of the webhooks app (docs/design.md, "House rules").

A delivery is locked alone (its attempt's record, a resend), and an endpoint
alone (a change, a rotation, a delete): never both, and never with a saga's
lock. The saga's commit that writes deliveries reads the enabled endpoints
sent its event's webhooks (with the saga's data in hand, only those
subscribed to the type) under
``FOR KEY SHARE`` (after the saga's own lock): sagas never block one
another there, a change or a rotation (``FOR NO KEY UPDATE``) never waits
for them, and a delete (``FOR UPDATE``) waits for the commits in flight, so
it cannot remove an endpoint under a delivery about to commit (PostgreSQL
checks that foreign key only at COMMIT).
"""

from __future__ import annotations

import functools
import json

from django.apps import apps
from django.db import connection

from common import rows
from config.distribution import NO_EVENT

from .models import WebhookAttempt, WebhookDelivery, WebhookEndpoint


def enabled_endpoints_key_share(*, event_id: int = NO_EVENT) -> list[tuple[int, list[str]]]:
    """(id, event types) of every enabled endpoint sent the event
    ``event_id``'s webhooks (:func:`for_the_event_sql`), key-share locked
    until the caller's commit.

    Every saga's commit that may announce a move with its data still to
    read runs it, endpoints or none: it is written once (docs/performance.md,
    "Statements written once"); building it with the ORM was 4 % of the
    worker's time."""
    with connection.cursor() as cursor:
        cursor.execute(_enabled_endpoints_sql(), [event_id])
        return [
            (pk, json.loads(events) if isinstance(events, str) else events)
            for pk, events in cursor.fetchall()
        ]


@functools.cache
def for_the_event_sql() -> str:
    """The condition that an endpoint is sent the webhooks of an event (its
    parameter: the event's id): a platform-wide endpoint (no organizer) is
    sent every event's, an organizer's endpoint its own events' only
    (docs/api.md, "Organizers and roles"); a message of no event
    (``NO_EVENT``) goes to the platform-wide ones.

    The event's organizer is read in the statement that reads the endpoints
    (one primary-key probe), so that a move's webhooks stay one statement
    (docs/performance.md, "The webhooks' sweep"). The catalog's table is
    named through Django's registry: the webhooks app sits below the
    purchases app and imports nothing of it (pyproject.toml)."""
    event_table = apps.get_model("purchases", "Event")._meta.db_table
    return (
        '("organizer_id" IS NULL OR "organizer_id" = '
        f'(SELECT "organizer_id" FROM {event_table} WHERE "id" = %s))'
    )


@functools.cache
def subscribed_endpoints_key_share_sql() -> str:
    """The enabled endpoints subscribed to a type and sent the event's
    webhooks (its parameters: the type in a JSON list, the event's id),
    key-share locked as above: the first step of the one statement that
    writes a move's deliveries (webhooks.publishing._publish_at_once)."""
    return (
        f'SELECT "id" FROM {WebhookEndpoint._meta.db_table}'
        f' WHERE "enabled" AND "events" @> %s::jsonb AND {for_the_event_sql()}'
        ' ORDER BY "id" FOR KEY SHARE'
    )


@functools.cache
def _enabled_endpoints_sql() -> str:
    table = WebhookEndpoint._meta.db_table
    return (
        f'SELECT "id", "events" FROM {table} WHERE "enabled" AND {for_the_event_sql()}'
        ' ORDER BY "id" FOR KEY SHARE'
    )


def delivery_for_update(*, delivery_id: int) -> WebhookDelivery | None:
    """The delivery, locked, with its endpoint (not locked)."""
    return deliveries_for_update(delivery_ids=[delivery_id]).get(delivery_id)


def deliveries_for_update(*, delivery_ids: list[int]) -> dict[int, WebhookDelivery]:
    """The deliveries found of ``delivery_ids``, locked in the order of their
    ids (two workers locking overlapping sets wait for one another, never in
    a cycle), each with its endpoint (not locked), by id: the records of the
    attempts a sweep closes together, or of one attempt."""
    ids = sorted(set(delivery_ids))
    with connection.cursor() as cursor:
        cursor.execute(_lock_sql(), [ids])
        return {delivery.pk: delivery for delivery in map(_with_endpoint, cursor.fetchall())}


def delivery_with_attempt_made(
    *, delivery_id: int, attempt: int
) -> tuple[WebhookDelivery, bool] | None:
    """The delivery with its endpoint, and whether attempt ``attempt`` was
    recorded already, in one statement and no lock (an attempt's read before
    its POST)."""
    return deliveries_with_attempt_made([(delivery_id, attempt)]).get((delivery_id, attempt))


def deliveries_with_attempt_made(
    attempts: list[tuple[int, int]],
) -> dict[tuple[int, int], tuple[WebhookDelivery, bool]]:
    """:func:`delivery_with_attempt_made` of several (delivery, attempt)
    pairs (a sweep's claim), by pair; a delivery not found is not among
    them. One statement."""
    with connection.cursor() as cursor:
        cursor.execute(_read_sql(), [[d for d, _ in attempts], [a for _, a in attempts]])
        found = [(_with_endpoint(row), row) for row in cursor.fetchall()]
    # After the two models' columns: whether the attempt was made, its number.
    return {(delivery.pk, row[-1]): (delivery, bool(row[-2])) for delivery, row in found}


# Both written once (docs/performance.md, "Statements written once"): each
# webhook attempt reads its delivery before the POST and locks it after.
# The endpoint is a reference table, joined by its key. The read takes the
# (delivery, attempt) pairs as two arrays, each delivery by its key.
#
# Whether an attempt was made is a LATERAL probe of its unique key, not an
# EXISTS: on an attempts table never analyzed, the planner made the EXISTS
# a hashed subplan over every attempt (tests/test_purchase_plans.py;
# docs/performance.md, "Plans that do not depend on statistics").
_READ_SQL = (
    "SELECT {columns}, m.made IS NOT NULL, w.number"
    " FROM unnest(%s::bigint[], %s::integer[]) AS w (id, number)"
    " JOIN {delivery} d ON d.id = w.id JOIN {endpoint} e ON e.id = d.endpoint_id"
    " LEFT JOIN LATERAL (SELECT 1 AS made FROM {attempt} a WHERE a.delivery_id = d.id"
    " AND a.number = w.number AND a.event_id = d.event_id LIMIT 1) m ON true"
)
_LOCK_SQL = (
    "SELECT {columns} FROM {delivery} d JOIN {endpoint} e ON e.id = d.endpoint_id"
    " WHERE d.id = ANY(%s) ORDER BY d.id FOR UPDATE OF d"
)


@functools.cache
def _read_sql() -> str:
    return _written(_READ_SQL)


@functools.cache
def _lock_sql() -> str:
    return _written(_LOCK_SQL)


def _written(template: str) -> str:
    return template.format(
        columns=", ".join(rows.columns(WebhookDelivery, "d") + rows.columns(WebhookEndpoint, "e")),
        delivery=WebhookDelivery._meta.db_table,
        endpoint=WebhookEndpoint._meta.db_table,
        attempt=WebhookAttempt._meta.db_table,
    )


def _with_endpoint(row) -> WebhookDelivery:
    """The delivery of a row that reads the delivery's then the endpoint's
    columns, with its endpoint."""
    delivery, delivery.endpoint = rows.split(
        row, WebhookDelivery, WebhookEndpoint, db=connection.alias
    )
    return delivery


def endpoint_for_update(*, endpoint_id: int, delete: bool = False) -> WebhookEndpoint | None:
    """``FOR NO KEY UPDATE`` for a change, ``FOR UPDATE`` for a delete."""
    return (
        WebhookEndpoint.objects.select_for_update(of=("self",), no_key=not delete)
        .filter(pk=endpoint_id)
        .first()
    )
