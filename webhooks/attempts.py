"""A webhook's attempts (docs/design.md, "The edges"): armed, made and
recorded.

- :func:`webhook_attempt_send` (the consumer's) makes one attempt: re-read
  the delivery, check the URL again, POST outside any transaction with the
  Standard Webhooks headers. It returns the record of the attempt and its
  outcome (delivered; the next attempt armed after
  ``WEBHOOK_RETRY_SECONDS[n-1]``; or failed, with one alert), which the
  outbox delivery runs in its closing commit: one commit for the attempt
  and the outbox row's completion. (:func:`webhook_attempt` runs both
  halves with a commit of its own.) Every attempt of a delivery carries its
  ``webhook-id``.
- :func:`record_attempts` writes the records of the attempts a sweep closes
  together (docs/performance.md, "The webhooks' sweep").
- :func:`attempt_arm` arms an attempt: its outbox timer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from standardwebhooks import Webhook

from common import rows as rows_sql
from config import metrics, tracing
from outbox.services import timer_schedule

from . import lock_objects
from .models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from .sending import Answer, post
from .topics import DELIVERY
from .url_safety import UnsafeURL, check_url

logger = logging.getLogger(__name__)

PENDING = DeliveryStatus.PENDING
DELIVERED = DeliveryStatus.DELIVERED
FAILED = DeliveryStatus.FAILED


def attempt_arm(
    delivery: WebhookDelivery,
    *,
    attempt: int,
    due_at: datetime,
    now: datetime,
    resend: bool = False,
    if_absent: bool = False,
) -> None:
    """Arm attempt ``attempt`` of ``delivery``: its outbox timer,
    ``webhook:<delivery id>:<attempt>``, due at ``due_at`` (inside the
    caller's transaction, which holds the delivery's lock or wrote it)."""
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
        _trace_attributes(delivery, attempt)
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


def _trace_attributes(delivery: WebhookDelivery, attempt: int) -> None:
    tracing.set_attributes(
        {
            "webhook.delivery_id": delivery.pk,
            "webhook.attempt": attempt,
            "webhook.event_type": delivery.event_type,
            "webhook.endpoint_id": delivery.endpoint_id,
            "saga.id": delivery.saga_id,
        }
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
    attempt_arm(delivery, attempt=attempt + 1, due_at=due, now=done_at, if_absent=True)
    return "retry", False


def _record_attempts_once(rows: list[WebhookAttempt]) -> set[tuple[int, int]]:
    """Write the attempts' rows but those recorded already; the (delivery,
    number) of those this call wrote. One statement, ``INSERT … ON CONFLICT
    DO NOTHING RETURNING`` (written once: docs/performance.md, "Statements
    written once"); the deliveries' locks, held by the caller, order two
    recorders of the same attempt anyway."""
    written = rows_sql.insert_returning(rows, ignore_conflicts=True)
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
