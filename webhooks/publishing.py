"""A move's webhooks, written in the saga's commit (docs/design.md, "The
edges").

:func:`webhook_publish` refuses to run outside a transaction (like
``outbox_publish``): for every enabled endpoint subscribed to the type and
sent the event's webhooks (the platform-wide ones and those of the event's
organizer: ``lock_objects.for_the_event_sql``), a :class:`WebhookDelivery`
(skipped when the (endpoint, saga, type) row exists: at most one per type
per saga per endpoint) and an outbox timer row ``webhook:<delivery id>:1``
due now. So a webhook is decided with the move it
announces and never sent before it commits, and the purchase's request never
waits on one.

With the move's data in hand that is one statement (:func:`_publish_at_once`),
assembled here, by the app whose rows it announces: the endpoints' read and
the deliveries are this app's SQL; the first attempts' outbox rows are the
outbox's (``outbox.services.outbox_publish_from``), which it writes from a
source this statement gives it, one row per message with the message's
columns (key, payload, event id, saga id) and nothing of the outbox's table.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable
from datetime import datetime

from django.db import connection
from django.utils import timezone

from common import rows as rows_sql
from common.time import iso_z
from config.distribution import NO_EVENT
from config.transactions import in_transaction
from outbox.services import MESSAGE_SOURCE_COLUMNS, outbox_publish_from

from . import lock_objects
from .attempts import attempt_arm
from .endpoints import EVENT_TYPES
from .errors import WebhookOutsideTransaction
from .models import DeliveryStatus, WebhookDelivery
from .topics import DELIVERY


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def purchase_data(facts: dict, *, status: str, version: int) -> dict:
    """A purchase webhook's ``data`` (docs/api.md), from the facts the saga's
    own events carry (``purchase_facts``): the purchase as the API shows it,
    and the saga's version after the move (a receiver orders by it)."""
    return {
        "purchase": {
            "id": facts["saga_id"],
            "status": str(status),
            "event": facts["event_id"],
            "seats": list(facts["seats"]),
            "total": {"amount": facts["amount"], "currency": facts["currency"]},
            "reservation": facts["reservation"],
        },
        "version": version,
    }


def _refuse(event_type: str) -> None:
    """What a publish refuses: to run outside a transaction, a type that is
    not one."""
    if not in_transaction():
        raise WebhookOutsideTransaction(
            "webhook_publish must run inside the commit of the move it announces"
        )
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown webhook event type {event_type!r}")


def webhook_publish(
    *,
    event_type: str,
    saga_id,
    event_id: int | None,
    data: dict | Callable[[], dict],
    now: datetime | None,
) -> list[WebhookDelivery]:
    """Inside the caller's transaction: a delivery and its first attempt's
    outbox row for every enabled endpoint subscribed to ``event_type`` and
    sent ``event_id``'s webhooks (the platform's and its organizer's); the
    deliveries written now (none for an endpoint that already has this type
    for this saga).

    ``data`` may be a function that returns it: it is called only when an
    endpoint is subscribed, so that a saga's commit pays one query when no
    one listens. Given as a dict, the endpoints' read, the deliveries and
    their first attempts' rows are one statement (:func:`_publish_at_once`)."""
    _refuse(event_type)
    now = now or timezone.now()
    # Never NULL, the shard key (config/distribution.py); the product always
    # names the event (tests/test_citus_rules.py).
    event_id = NO_EVENT if event_id is None else event_id
    if not callable(data):
        at_once = _publish_at_once(
            event_type=event_type,
            event_id=event_id,
            bodies={saga_id: _body(event_type, data, now)},
            now=now,
        )
        if at_once is not None:
            return at_once
    return _publish_statement_by_statement(
        event_type=event_type, saga_id=saga_id, event_id=event_id, data=data, now=now
    )


def webhook_publish_many(
    *, event_type: str, event_id: int, data: dict, now: datetime | None
) -> list[WebhookDelivery]:
    """:func:`webhook_publish` of one type for several sagas of one event
    (``data``: each saga's id and its data), in the caller's transaction:
    one statement for them all (a charge burst's confirmations), each saga's
    deliveries and first attempts as :func:`webhook_publish` writes them."""
    _refuse(event_type)
    now = now or timezone.now()
    at_once = _publish_at_once(
        event_type=event_type,
        event_id=event_id,
        bodies={saga_id: _body(event_type, one, now) for saga_id, one in data.items()},
        now=now,
    )
    if at_once is not None:
        return at_once
    return [
        delivery
        for saga_id, one in data.items()
        for delivery in _publish_statement_by_statement(
            event_type=event_type, saga_id=saga_id, event_id=event_id, data=one, now=now
        )
    ]


def _publish_statement_by_statement(
    *,
    event_type: str,
    saga_id,
    event_id: int,
    data: dict | Callable[[], dict],
    now: datetime,
) -> list[WebhookDelivery]:
    """:func:`webhook_publish` as separate statements (``data`` given as a
    function, read only if an endpoint listens, or the attempts' rows
    delivered in place by their writer): the endpoints' read, then the
    deliveries, then their first attempts' outbox rows."""
    # A handful of endpoints, each with its few types: filtered here.
    endpoint_ids = [
        pk
        for pk, events in lock_objects.enabled_endpoints_key_share(event_id=event_id)
        if event_type in events
    ]
    if not endpoint_ids:
        return []
    body = _body(event_type, data() if callable(data) else data, now)
    rows = [
        _new_delivery(
            pk,
            new_message_id(),
            event_type=event_type,
            saga_id=saga_id,
            event_id=event_id,
            body=body,
            now=now,
        )
        for pk in endpoint_ids
    ]
    # ON CONFLICT DO NOTHING: a type already written for this saga and
    # endpoint stays as it is, and the saga's commit goes on. Written once
    # (docs/performance.md, "Statements written once"), the rows written
    # returned in order.
    written = rows_sql.insert_returning(rows, ignore_conflicts=True)
    for delivery in written:
        attempt_arm(delivery, attempt=1, due_at=now, now=now)
    return written


def _new_delivery(
    endpoint_id: int,
    message_id: str,
    *,
    event_type: str,
    saga_id,
    event_id: int,
    body: str,
    now: datetime,
) -> WebhookDelivery:
    """A delivery as a move writes it: pending, its first attempt due now."""
    return WebhookDelivery(
        endpoint_id=endpoint_id,
        message_id=message_id,
        event_type=event_type,
        saga_id=saga_id,
        event_id=event_id,
        body=body,
        status=DeliveryStatus.PENDING,
        armed_attempt=1,
        next_attempt_at=now,
        created_at=now,
    )


def _body(event_type: str, data: dict, now: datetime) -> str:
    return json.dumps(
        {"type": str(event_type), "timestamp": iso_z(now), "data": data},
        separators=(",", ":"),
    )


def _publish_at_once(
    *, event_type: str, event_id: int, bodies: dict, now: datetime
) -> list[WebhookDelivery] | None:
    """:func:`webhook_publish` in one statement, for one saga or several of
    one event (``bodies``: each saga's id and its webhook's body): the
    enabled endpoints subscribed to the type, key-share locked
    (``webhooks.lock_objects``); a delivery for each endpoint and saga but
    those that have this type for this saga already; the first attempt's
    outbox row of each delivery written, as ``attempt_arm`` writes it. Every
    saga's commit that announces a move runs it, endpoints or none: as three
    statements they were half of what an endpoint cost the saga's worker
    (docs/performance.md, "The webhooks' sweep"). None, having done nothing,
    when the attempts' rows are delivered in place here
    (``outbox_publish_from``)."""
    first_attempts = outbox_publish_from(source="m", topic=DELIVERY, now=now)
    if first_attempts is None:
        return None
    # Its endpoint, message id, saga and body are the statement's (below).
    template = _new_delivery(
        0, "", event_type=event_type, saga_id=None, event_id=event_id, body="", now=now
    )
    deliveries, delivery_params = rows_sql.insert_select(
        template, source="e CROSS JOIN s", exprs=_PER_ROW
    )
    sql = (
        f"WITH e AS ({lock_objects.subscribed_endpoints_key_share_sql()}),"
        " s AS (SELECT * FROM unnest(%s::uuid[], %s::text[]) AS s(saga_id, body)),"
        f" d AS ({deliveries} ON CONFLICT DO NOTHING RETURNING {_delivery_columns()}),"
        f" m AS ({_first_attempts_sql()}),"
        f" o AS ({first_attempts.sql})"
        ' SELECT d.*, (SELECT array_agg(o.id) FROM o) FROM d ORDER BY d."id"'
    )
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            [
                json.dumps([str(event_type)]),
                event_id,
                list(bodies),
                list(bodies.values()),
                *delivery_params,
                *first_attempts.params,
            ],
        )
        found = cursor.fetchall()
    if not found:
        return []
    first_attempts.hand_over(sorted(found[0][-1]))
    return [rows_sql.instance(WebhookDelivery, row[:-1], connection.alias) for row in found]


# A delivery's columns the one statement fills in: per endpoint (``e``) and
# per saga (``s``).
_PER_ROW = {
    "endpoint_id": "e.id",
    # new_message_id()'s form: "msg_" and a random UUID's hex.
    "message_id": "'msg_' || replace(gen_random_uuid()::text, '-', '')",
    "saga_id": "s.saga_id",
    "body": "s.body",
}


# The first attempt of each delivery the statement writes (``d``), as
# attempt_arm arms it: the outbox's source of messages (``m``), one column
# for each of outbox.services.MESSAGE_SOURCE_COLUMNS.
_FIRST_ATTEMPT = {
    "key": "'webhook:' || d.id || ':1'",
    "payload": "jsonb_build_object('delivery_id', d.id, 'attempt', 1)",
    "event_id": "d.event_id",
    "saga_id": "d.saga_id",
}


@functools.cache
def _first_attempts_sql() -> str:
    columns = ", ".join(f'{_FIRST_ATTEMPT[name]} AS "{name}"' for name in MESSAGE_SOURCE_COLUMNS)
    return f"SELECT {columns} FROM d"


@functools.cache
def _delivery_columns() -> str:
    return ", ".join(rows_sql.columns(WebhookDelivery, WebhookDelivery._meta.db_table))
