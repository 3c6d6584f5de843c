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

import functools
import json

from django.db import connection
from django.db.models import Exists, OuterRef

from common import rows

from .models import WebhookAttempt, WebhookDelivery, WebhookEndpoint


def enabled_endpoints_key_share() -> list[tuple[int, list[str]]]:
    """(id, event types) of every enabled endpoint, key-share locked until
    the caller's commit (PostgreSQL; SQLite's writers are serialised anyway).

    Every saga's commit that may announce a move runs it, endpoints or none:
    on PostgreSQL it is written once (docs/performance.md, "Statements
    written once"); building it with the ORM was 4 % of the worker's time."""
    if connection.vendor != "postgresql":
        return list(WebhookEndpoint.objects.filter(enabled=True).values_list("pk", "events"))
    with connection.cursor() as cursor:
        cursor.execute(_enabled_endpoints_sql())
        return [
            (pk, json.loads(events) if isinstance(events, str) else events)
            for pk, events in cursor.fetchall()
        ]


@functools.cache
def _enabled_endpoints_sql() -> str:
    table = WebhookEndpoint._meta.db_table
    return f'SELECT "id", "events" FROM {table} WHERE "enabled" ORDER BY "id" FOR KEY SHARE'


def delivery_for_update(*, delivery_id: int) -> WebhookDelivery | None:
    """The delivery, locked, with its endpoint (not locked)."""
    if connection.vendor != "postgresql":
        return (
            WebhookDelivery.objects.select_related("endpoint")
            .select_for_update(of=("self",))
            .filter(pk=delivery_id)
            .first()
        )
    found = _delivery_with_endpoint(delivery_id, lock=True)
    return found[0] if found else None


def deliveries_for_update(*, delivery_ids: list[int]) -> dict[int, WebhookDelivery]:
    """The deliveries found of ``delivery_ids``, locked in the order of their
    ids (two workers locking overlapping sets wait for one another, never in
    a cycle), each with its endpoint (not locked), by id: the records of the
    attempts a sweep closes together."""
    ids = sorted(set(delivery_ids))
    if connection.vendor != "postgresql":
        return {
            delivery.pk: delivery
            for delivery in WebhookDelivery.objects.select_related("endpoint")
            .select_for_update(of=("self",))
            .filter(pk__in=ids)
            .order_by("pk")
        }
    with connection.cursor() as cursor:
        cursor.execute(_delivery_sql(lock=True, made=False, many=True), [ids])
        found = cursor.fetchall()
    out = {}
    for row in found:
        delivery, delivery.endpoint = rows.split(
            row, WebhookDelivery, WebhookEndpoint, db=connection.alias
        )
        out[delivery.pk] = delivery
    return out


def delivery_with_attempt_made(
    *, delivery_id: int, attempt: int
) -> tuple[WebhookDelivery, bool] | None:
    """The delivery with its endpoint, and whether attempt ``attempt`` was
    recorded already, in one statement and no lock (an attempt's read before
    its POST)."""
    if connection.vendor != "postgresql":
        made = WebhookAttempt.objects.filter(delivery_id=OuterRef("pk"), number=attempt)
        delivery = (
            WebhookDelivery.objects.select_related("endpoint")
            .annotate(attempt_made=Exists(made))
            .filter(pk=delivery_id)
            .first()
        )
        return None if delivery is None else (delivery, delivery.attempt_made)
    return _delivery_with_endpoint(delivery_id, attempt=attempt)


# Both written once (docs/performance.md, "Statements written once"): each
# webhook attempt reads its delivery before the POST and locks it after.
# The endpoint is a reference table, joined by its key.
#
# Whether an attempt was made is a LATERAL probe of its unique key, not an
# EXISTS: on an attempts table never analyzed, the planner made the EXISTS
# a hashed subplan over every attempt (tests/test_purchase_plans.py;
# docs/performance.md, "Plans that do not depend on statistics").
_DELIVERY_SQL = (
    "SELECT {columns}{made} FROM {delivery} d JOIN {endpoint} e ON e.id = d.endpoint_id"
    "{probe} WHERE {where}{lock}"
)
_ATTEMPT_PROBE_SQL = (
    " LEFT JOIN LATERAL (SELECT 1 AS made FROM {attempt} a WHERE a.delivery_id = d.id"
    " AND a.number = {number} AND a.event_id = d.event_id LIMIT 1) m ON true"
)


@functools.cache
def _delivery_sql(*, lock: bool, made: bool, many: bool = False) -> str:
    return _DELIVERY_SQL.format(
        columns=", ".join(rows.columns(WebhookDelivery, "d") + rows.columns(WebhookEndpoint, "e")),
        made=", m.made IS NOT NULL" if made else "",
        probe=_attempt_probe("%s") if made else "",
        delivery=WebhookDelivery._meta.db_table,
        endpoint=WebhookEndpoint._meta.db_table,
        # Several: locked in the order of their ids.
        where="d.id = ANY(%s) ORDER BY d.id" if many else "d.id = %s",
        lock=" FOR UPDATE OF d" if lock else "",
    )


def _delivery_with_endpoint(
    delivery_id: int, *, lock: bool = False, attempt: int | None = None
) -> tuple[WebhookDelivery, bool] | None:
    sql = _delivery_sql(lock=lock, made=attempt is not None)
    params = [delivery_id] if attempt is None else [attempt, delivery_id]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    delivery, delivery.endpoint = rows.split(
        row, WebhookDelivery, WebhookEndpoint, db=connection.alias
    )
    # Whether the attempt was made, when asked, is the last column.
    return delivery, bool(row[-1]) if attempt is not None else False


def _attempt_probe(number: str) -> str:
    return _ATTEMPT_PROBE_SQL.format(attempt=WebhookAttempt._meta.db_table, number=number)


# Several attempts' reads in one statement (a sweep's claim): the pairs
# (delivery, attempt) as two arrays, each delivery by its key.
_DELIVERIES_MADE_SQL = (
    "SELECT {columns}, m.made IS NOT NULL, w.number"
    " FROM unnest(%s::bigint[], %s::integer[]) AS w (id, number)"
    " JOIN {delivery} d ON d.id = w.id JOIN {endpoint} e ON e.id = d.endpoint_id{probe}"
)


@functools.cache
def _deliveries_made_sql() -> str:
    return _DELIVERIES_MADE_SQL.format(
        columns=", ".join(rows.columns(WebhookDelivery, "d") + rows.columns(WebhookEndpoint, "e")),
        delivery=WebhookDelivery._meta.db_table,
        endpoint=WebhookEndpoint._meta.db_table,
        probe=_attempt_probe("w.number"),
    )


def deliveries_with_attempt_made(
    attempts: list[tuple[int, int]],
) -> dict[tuple[int, int], tuple[WebhookDelivery, bool]]:
    """:func:`delivery_with_attempt_made` of several (delivery, attempt)
    pairs, by pair; a delivery not found is not among them. One statement
    on PostgreSQL, one per pair elsewhere."""
    if connection.vendor != "postgresql":
        out = {}
        for delivery_id, attempt in attempts:
            found = delivery_with_attempt_made(delivery_id=delivery_id, attempt=attempt)
            if found is not None:
                out[(delivery_id, attempt)] = found
        return out
    with connection.cursor() as cursor:
        cursor.execute(_deliveries_made_sql(), [[d for d, _ in attempts], [a for _, a in attempts]])
        found = cursor.fetchall()
    out = {}
    for row in found:
        delivery, delivery.endpoint = rows.split(
            row, WebhookDelivery, WebhookEndpoint, db=connection.alias
        )
        out[(delivery.pk, row[-1])] = (delivery, bool(row[-2]))
    return out


def endpoint_for_update(*, endpoint_id: int, delete: bool = False) -> WebhookEndpoint | None:
    """``FOR NO KEY UPDATE`` for a change, ``FOR UPDATE`` for a delete."""
    return (
        WebhookEndpoint.objects.select_for_update(of=("self",), no_key=not delete)
        .filter(pk=endpoint_id)
        .first()
    )
