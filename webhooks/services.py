"""Outgoing webhooks: endpoints, publishing, attempts, resends
(docs/design.md, "The edges"; the contract is docs/api.md).

- :func:`webhook_publish` runs **inside the saga's commit** (it refuses to run
  outside a transaction, like ``outbox_publish``): for every enabled endpoint
  subscribed to the type, a :class:`WebhookDelivery` (skipped when the
  (endpoint, saga, type) row exists: at most one per type per saga per
  endpoint) and an outbox timer row ``webhook:<delivery id>:1`` due now. So a
  webhook is decided with the move it announces and never sent before it
  commits, and the purchase's request never waits on one.
- :func:`webhook_attempt_send` (the consumer's) makes one attempt: re-read
  the delivery, check the URL again, POST outside any transaction with the
  Standard Webhooks headers. It returns the record of the attempt and its
  outcome (delivered; the next attempt armed after
  ``WEBHOOK_RETRY_SECONDS[n-1]``; or failed, with one alert), which the
  outbox delivery runs in its closing commit: one commit for the attempt
  and the outbox row's completion. (:func:`webhook_attempt` runs both
  halves with a commit of its own.) Every attempt of a delivery carries its
  ``webhook-id``.
- :func:`webhook_resend`: one more attempt of a delivered or failed delivery,
  same ``webhook-id``.
- Endpoints are created, changed, re-keyed and deleted through
  ``webhook_endpoint_*``, which check the URL (``url_safety``) and the event
  types and raise :class:`WebhookInvalid` naming the field.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import secrets
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Field
from django.utils import timezone
from standardwebhooks import Webhook

from common import rows as rows_sql
from common.time import iso_z
from config import metrics, tracing
from config.distribution import NO_EVENT
from config.transactions import in_transaction
from outbox.services import outbox_publish_from, timer_schedule

from . import lock_objects
from .errors import (
    WebhookInvalid,
    WebhookNotFound,
    WebhookOutsideTransaction,
    WebhookResendRefused,
)
from .models import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from .sending import Answer, post
from .topics import DELIVERY
from .url_safety import UnsafeURL, check_url

__all__ = [
    "EVENT_TYPES",
    "WebhookEvent",
    "WebhookInvalid",
    "WebhookNotFound",
    "WebhookOutsideTransaction",
    "WebhookResendRefused",
    "purchase_data",
    "webhook_attempt",
    "webhook_attempt_send",
    "webhook_endpoint_create",
    "webhook_endpoint_delete",
    "webhook_endpoint_rotate_secret",
    "webhook_endpoint_update",
    "webhook_publish",
    "webhook_resend",
]

logger = logging.getLogger(__name__)

EVENT_TYPES: tuple[str, ...] = tuple(WebhookEvent.values)
SECRET_BYTES = 32  # the HMAC-SHA256 key: 256 random bits


def _max_length(field: Field) -> int:
    assert field.max_length is not None  # both are CharFields with one
    return field.max_length


URL_MAX_CHARS = _max_length(WebhookEndpoint._meta.get_field("url"))
DESCRIPTION_MAX_CHARS = _max_length(WebhookEndpoint._meta.get_field("description"))
PENDING = DeliveryStatus.PENDING
DELIVERED = DeliveryStatus.DELIVERED
FAILED = DeliveryStatus.FAILED


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


# --- endpoints ------------------------------------------------------------------------


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
    *, url: str, events: Iterable[str], description: str = "", now: datetime | None = None
) -> WebhookEndpoint:
    """A new endpoint, enabled, with a new secret (``endpoint.secret``: show
    it to the person who created it; nothing shows it again)."""
    url, events = _clean_url(url), _clean_events(events)
    description = _clean_description(description)
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        endpoint = WebhookEndpoint.objects.create(
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
        extra={"endpoint_id": endpoint.pk, "endpoint": url, "events": ",".join(events)},
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


# --- publishing, in the saga's commit --------------------------------------------------


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


def webhook_publish(
    *,
    event_type: str,
    saga_id,
    event_id: int | None,
    data: dict | Callable[[], dict],
    now: datetime | None,
) -> list[WebhookDelivery]:
    """Inside the caller's transaction: a delivery and its first attempt's
    outbox row for every enabled endpoint subscribed to ``event_type``; the
    deliveries written now (none for an endpoint that already has this type
    for this saga).

    ``data`` may be a function that returns it: it is called only when an
    endpoint is subscribed, so that a saga's commit pays one query when no
    one listens. Given as a dict on PostgreSQL, the endpoints' read, the
    deliveries and their first attempts' rows are one statement
    (:func:`_publish_at_once`)."""
    if not in_transaction():
        raise WebhookOutsideTransaction(
            "webhook_publish must run inside the commit of the move it announces"
        )
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown webhook event type {event_type!r}")
    now = now or timezone.now()
    # Never NULL, the shard key (config/distribution.py); the product always
    # names the event (tests/test_citus_rules.py).
    event_id = NO_EVENT if event_id is None else event_id
    if connection.vendor == "postgresql" and not callable(data):
        at_once = _publish_at_once(
            event_type=event_type,
            saga_id=saga_id,
            event_id=event_id,
            body=_body(event_type, data, now),
            now=now,
        )
        if at_once is not None:
            return at_once
    return _publish_statement_by_statement(
        event_type=event_type, saga_id=saga_id, event_id=event_id, data=data, now=now
    )


def _publish_statement_by_statement(
    *,
    event_type: str,
    saga_id,
    event_id: int,
    data: dict | Callable[[], dict],
    now: datetime,
) -> list[WebhookDelivery]:
    """:func:`webhook_publish` as separate statements (SQLite, ``data`` given
    as a function, or the attempts' rows delivered in place): the endpoints'
    read, then the deliveries, then their first attempts' outbox rows."""
    # A handful of endpoints: filtered here, so that SQLite (the embedded
    # mode, no JSON containment) reads them the same way.
    endpoint_ids = [
        pk for pk, events in lock_objects.enabled_endpoints_key_share() if event_type in events
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
    # endpoint stays as it is, and the saga's commit goes on.
    written = _write_new(rows)
    for delivery in written:
        _arm(delivery, attempt=1, due_at=now, now=now)
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
        status=PENDING,
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
    *, event_type: str, saga_id, event_id: int, body: str, now: datetime
) -> list[WebhookDelivery] | None:
    """:func:`webhook_publish` in one statement (PostgreSQL): the enabled
    endpoints subscribed to the type, key-share locked
    (``webhooks.lock_objects``); a delivery for each but those that have
    this type for this saga already; the first attempt's outbox row of each
    delivery written, as ``_arm`` writes it. Every saga's commit that
    announces a move runs it, endpoints or none: as three statements they
    were half of what an endpoint cost the saga's worker (docs/performance.md,
    "The webhooks' sweep"). None, having done nothing, when the attempts'
    rows are delivered in place here (``outbox_publish_from``)."""
    # Its endpoint and message id are the statement's (exprs below).
    template = _new_delivery(
        0, "", event_type=event_type, saga_id=saga_id, event_id=event_id, body=body, now=now
    )
    deliveries, delivery_params = rows_sql.insert_select(
        template,
        source="e",
        exprs={
            "endpoint_id": "e.id",
            # new_message_id()'s form: "msg_" and a random UUID's hex.
            "message_id": "'msg_' || replace(gen_random_uuid()::text, '-', '')",
        },
    )
    outbox = outbox_publish_from(
        source="d",
        topic=DELIVERY,
        exprs={
            "payload": "jsonb_build_object('delivery_id', d.id, 'attempt', 1)",
            "key": "'webhook:' || d.id || ':1'",  # _arm's key
            "event_id": "d.event_id",
            "saga_id": "d.saga_id",
        },
        now=now,
    )
    if outbox is None:
        return None
    first_attempts, attempt_params, hand_over = outbox
    sql = (
        f"WITH e AS ({lock_objects.SUBSCRIBED_ENDPOINTS_KEY_SHARE_SQL}),"
        f" d AS ({deliveries} ON CONFLICT DO NOTHING"
        f" RETURNING {_delivery_columns()}),"
        f' o AS ({first_attempts} RETURNING "id")'
        ' SELECT d.*, (SELECT array_agg(o."id") FROM o) FROM d ORDER BY d."id"'
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [json.dumps([str(event_type)]), *delivery_params, *attempt_params])
        found = cursor.fetchall()
    if not found:
        return []
    hand_over(sorted(found[0][-1]))
    return [rows_sql.instance(WebhookDelivery, row[:-1], connection.alias) for row in found]


@functools.cache
def _delivery_columns() -> str:
    return ", ".join(rows_sql.columns(WebhookDelivery, WebhookDelivery._meta.db_table))


def _write_new(rows: list[WebhookDelivery]) -> list[WebhookDelivery]:
    """Insert the deliveries but those whose type this saga has for that
    endpoint already; the ones written, in order. On PostgreSQL one
    statement (``INSERT … ON CONFLICT DO NOTHING RETURNING``, written once:
    docs/performance.md, "Statements written once")."""
    if connection.vendor == "postgresql":
        return rows_sql.insert_returning(rows, ignore_conflicts=True)
    WebhookDelivery.objects.bulk_create(rows, ignore_conflicts=True)
    return list(
        WebhookDelivery.objects.filter(message_id__in=[r.message_id for r in rows]).order_by("pk")
    )


def _arm(
    delivery: WebhookDelivery,
    *,
    attempt: int,
    due_at: datetime,
    now: datetime,
    resend: bool = False,
    if_absent: bool = False,
) -> None:
    payload = {"delivery_id": delivery.pk, "attempt": attempt}
    if resend:
        payload["resend"] = True
    timer_schedule(
        key=f"webhook:{delivery.pk}:{attempt}",
        topic=DELIVERY,
        payload=payload,
        due_at=due_at,
        event_id=delivery.event_id,
        saga_id=delivery.saga_id,
        now=now,
        if_absent=if_absent,
    )


# --- attempts ---------------------------------------------------------------------------


def webhook_attempt(
    *, delivery_id: int, attempt: int, resend: bool = False, now: datetime | None = None
) -> str:
    """Make attempt ``attempt`` of a delivery, if it is still owed, and record
    it in a commit of its own; returns ``delivered``, ``retry``, ``failed``
    or ``skipped: <why>``."""
    outcome = webhook_attempt_send(delivery_id=delivery_id, attempt=attempt, resend=resend, now=now)
    if isinstance(outcome, str):
        return outcome
    with transaction.atomic(durable=True):
        return outcome()


def webhook_attempt_send(
    *,
    delivery_id: int,
    attempt: int,
    resend: bool = False,
    now: datetime | None = None,
    found: tuple[WebhookDelivery, bool] | None = None,
) -> str | Callable[[], str]:
    """The half of an attempt that calls out: read the delivery, POST it
    (outside any transaction). Returns the other half, the record of the
    attempt and of what the delivery owes next, to run inside a transaction
    (the outbox delivery's closing one: one commit for both); or a verdict
    (``skipped: <why>``) when nothing is owed.

    At least once: a worker that dies between the POST and the commit of its
    record sends the attempt again when the outbox redelivers it (same
    ``webhook-id``). Once recorded, a redelivered attempt sends nothing and
    arms nothing.

    ``found``: the delivery and whether the attempt was made, when the
    caller read them a moment ago (``webhooks.consumers.prepare``).
    """
    if found is None:
        found = lock_objects.delivery_with_attempt_made(delivery_id=delivery_id, attempt=attempt)
    if found is None:
        return "skipped: no such delivery (its endpoint was deleted)"
    delivery, attempt_made = found
    if attempt_made:
        return "skipped: this attempt was made already"
    if delivery.status != PENDING or delivery.armed_attempt != attempt:
        return f"skipped: the delivery is {delivery.status}, attempt {delivery.armed_attempt}"
    if tracing.enabled():
        tracing.set_attributes(
            {
                "webhook.delivery_id": delivery.pk,
                "webhook.attempt": attempt,
                "webhook.event_type": delivery.event_type,
                "webhook.endpoint_id": delivery.endpoint_id,
                "saga.id": delivery.saga_id,
            }
        )
    at = now or timezone.now()
    endpoint = delivery.endpoint
    if endpoint.enabled:
        answer, final = _send(delivery, endpoint, at=at), resend
    else:
        # Disabling an endpoint is an operator's decision: nothing more goes
        # to it, and a delivery left owing fails now (no alert; a resend once
        # it is enabled again), rather than waiting with nothing to wake it.
        answer, final = Answer(error="endpoint disabled: not sent"), True
    return AttemptRecord(
        delivery_id=delivery_id,
        attempt=attempt,
        resend=resend,
        at=at,
        answer=answer,
        final=final,
        now=now,
    )


def _send(delivery: WebhookDelivery, endpoint: WebhookEndpoint, *, at: datetime) -> Answer:
    try:
        target = check_url(endpoint.url)  # again: the name may resolve elsewhere now
    except UnsafeURL as exc:
        return Answer(error=f"refused: {exc}")
    seconds = int(at.timestamp())
    signature = Webhook(endpoint.secret).sign(
        delivery.message_id, datetime.fromtimestamp(seconds, tz=UTC), delivery.body
    )
    headers = {
        "webhook-id": delivery.message_id,
        "webhook-timestamp": str(seconds),
        "webhook-signature": signature,
        "content-type": "application/json",
    }
    return post(
        target,
        headers=headers,
        body=delivery.body.encode(),
        timeout=settings.WEBHOOK_TIMEOUT_SECONDS,
    )


@dataclass(frozen=True)
class AttemptRecord:
    """The half of an attempt that runs inside a transaction: the attempt's
    row and what its delivery owes next. Called alone, or with others
    (``together``: the attempts a sweep closes in one transaction,
    ``outbox.delivery``)."""

    delivery_id: int
    attempt: int
    resend: bool
    at: datetime
    answer: Answer
    final: bool
    now: datetime | None

    def __call__(self) -> str:
        return record_attempts([self])[0]

    @staticmethod
    def together(records: list[AttemptRecord]) -> list[str]:
        return record_attempts(records)


def record_attempts(records: list[AttemptRecord]) -> list[str]:
    """Inside the caller's transaction: each attempt, and what its delivery
    owes next; a verdict per record. The deliveries are locked in one
    statement, the attempts written in one (``ON CONFLICT DO NOTHING``: one
    recorded already is not written again, and its record says so) and the
    deliveries updated in one (docs/performance.md, "The webhooks' sweep").
    Records of one delivery are taken in the order given. The log lines (and
    any alert) are the last thing before the commit, so only a commit that
    then fails repeats them, when the attempt is made again."""
    schedule = settings.WEBHOOK_RETRY_SECONDS
    deliveries = lock_objects.deliveries_for_update(
        delivery_ids=[record.delivery_id for record in records]
    )
    written = _record_attempts_once(_attempt_rows(records, deliveries))
    verdicts: list[str] = []
    changed: dict[int, WebhookDelivery] = {}
    logged: list[tuple[WebhookDelivery, AttemptRecord, str, bool]] = []
    for record in records:
        delivery = deliveries.get(record.delivery_id)
        if delivery is None:
            verdicts.append("skipped: no such delivery (its endpoint was deleted)")
            continue
        if (delivery.pk, record.attempt) not in written:
            verdicts.append("skipped: this attempt was recorded by another worker")
            continue
        written.discard((delivery.pk, record.attempt))  # a second record of it here: taken
        verdict, alert = _owe_next(delivery, record, schedule=schedule)
        changed[delivery.pk] = delivery
        verdicts.append(verdict)
        logged.append((delivery, record, verdict, alert))
    # Written once (docs/performance.md, "Statements written once"): the
    # ORM's save(update_fields=...) was a tenth of the webhook pool's time.
    rows_sql.update_fields_many(
        list(changed.values()),
        ["status", "delivered_at", "failed_at", "armed_attempt", "next_attempt_at"],
    )
    for delivery, record, verdict, alert in logged:
        _log_attempt(
            delivery, attempt=record.attempt, verdict=verdict, answer=record.answer, alert=alert
        )
    return verdicts


def _attempt_rows(
    records: list[AttemptRecord], deliveries: dict[int, WebhookDelivery]
) -> list[WebhookAttempt]:
    """The attempts' rows to write, in the records' order: one per (delivery,
    number), the first record's; none for a delivery that is gone."""
    rows: dict[tuple[int, int], WebhookAttempt] = {}
    for record in records:
        delivery = deliveries.get(record.delivery_id)
        if delivery is not None:
            answer = record.answer
            rows.setdefault(
                (delivery.pk, record.attempt),
                WebhookAttempt(
                    delivery_id=delivery.pk,
                    event_id=delivery.event_id,
                    number=record.attempt,
                    resend=record.resend,
                    at=record.at,
                    status_code=answer.status_code,
                    latency_ms=answer.latency_ms,
                    error=answer.error[:500],
                    response_excerpt=answer.excerpt[:500],
                ),
            )
    return list(rows.values())


def _owe_next(
    delivery: WebhookDelivery, record: AttemptRecord, *, schedule: list[int]
) -> tuple[str, bool]:
    """What a recorded attempt leaves its (locked) delivery owing: the
    verdict, and whether to alert. Changes ``delivery`` in memory (the
    caller writes it) and, for a retry, arms the next attempt."""
    done_at = record.now or timezone.now()
    attempt, answer = record.attempt, record.answer
    if delivery.status != PENDING or delivery.armed_attempt != attempt:
        return "recorded", False  # evidence only: the delivery moved meanwhile
    if answer.ok:
        delivery.status, delivery.delivered_at = DELIVERED, done_at
        delivery.next_attempt_at = None
        return "delivered", False
    if record.final or attempt > len(schedule):
        delivery.status, delivery.failed_at = FAILED, done_at
        delivery.next_attempt_at = None
        return "failed", not record.final  # the schedule ran out: someone must look
    due = done_at + timedelta(seconds=schedule[attempt - 1])
    delivery.armed_attempt, delivery.next_attempt_at = attempt + 1, due
    # if_absent: a second arming of the same attempt is the same row.
    _arm(delivery, attempt=attempt + 1, due_at=due, now=done_at, if_absent=True)
    return "retry", False


def _record_attempts_once(rows: list[WebhookAttempt]) -> set[tuple[int, int]]:
    """Write the attempts' rows but those recorded already; the (delivery,
    number) of those this call wrote. One statement on PostgreSQL,
    ``INSERT … ON CONFLICT DO NOTHING RETURNING`` (written once:
    docs/performance.md, "Statements written once"); the deliveries' locks,
    held by the caller, order two recorders of the same attempt anyway."""
    if connection.vendor == "postgresql":
        written = rows_sql.insert_returning(rows, ignore_conflicts=True)
    else:
        written = [row for row in rows if rows_sql.insert([row], ignore_conflicts=True) == 1]
    return {(row.delivery_id, row.number) for row in written}


def _log_attempt(
    delivery: WebhookDelivery, *, attempt: int, verdict: str, answer: Answer, alert: bool
) -> None:
    extra = {
        "delivery_id": delivery.pk,
        "endpoint_id": delivery.endpoint_id,
        "endpoint": delivery.endpoint.url,
        "saga_id": str(delivery.saga_id),
        "type": delivery.event_type,
        "message_id": delivery.message_id,
        "attempt": attempt,
        "status_code": answer.status_code,
        "latency_ms": answer.latency_ms,
    }
    logger.info(
        "webhook attempt %s: %s%s",
        attempt,
        verdict,
        f" ({answer.error})" if answer.error else "",
        extra=extra,
    )
    if alert:
        logger.error(
            "webhook failed after %s attempts: %s",
            attempt,
            answer.error,
            extra={**extra, "alert": "webhook_failed"},
        )
        metrics.ALERTS.labels(kind="webhook_failed").inc()


def webhook_resend(
    delivery_id: int, *, now: datetime | None = None, by: str = "", reason: str = ""
) -> int:
    """Arm one more attempt of a delivered or failed delivery, due now, with
    the same ``webhook-id``; returns its number (the count goes on). A resend
    is one attempt: no retries follow it and its failure raises no alert
    (whoever asked reads the outcome in the attempts)."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        delivery = lock_objects.delivery_for_update(delivery_id=delivery_id)
        if delivery is None:
            raise WebhookNotFound(f"no webhook delivery {delivery_id}")
        if delivery.status == PENDING:
            due = iso_z(delivery.next_attempt_at) if delivery.next_attempt_at else "now"
            raise WebhookResendRefused(
                f"attempt {delivery.armed_attempt} is already owed (due {due})"
            )
        if not delivery.endpoint.enabled:
            raise WebhookResendRefused("the endpoint is disabled: enable it first")
        attempt = delivery.armed_attempt + 1
        delivery.status, delivery.armed_attempt, delivery.next_attempt_at = PENDING, attempt, now
        delivery.save(update_fields=["status", "armed_attempt", "next_attempt_at"])
        _arm(delivery, attempt=attempt, due_at=now, now=now, resend=True)
    logger.info(
        "webhook resend: attempt %s armed",
        attempt,
        extra={
            "delivery_id": delivery.pk,
            "saga_id": str(delivery.saga_id),
            "type": delivery.event_type,
            "operator": by,
            "reason": reason,
        },
    )
    return attempt
