"""Asking the processor for a refund, once, and looking it up after
(docs/refunds.md, "A refund's life").

The same shape as the saga's gateway steps (``saga/step.py``), about the
refund row instead of the saga: lock the refund and decide, commit; call the
processor outside any transaction; lock it again, keep the answer as
evidence (a ``GatewayAnswer`` naming the refund), record what it means,
commit.

The first question is the refund itself, under the row's own idempotency
key (``refund:<id>``), and it is asked once: the row is marked ``asked`` in
the commit before the call, so a crash, a lost answer or a second delivery
of the message leads to a look-up, never to a second request sent blind.
Only a look-up that finds no refund under our id (the request never
reached the processor) asks again, under the same key. ``pending`` and
unknown answers are looked up on the reconciliation backoff (the last delay
repeats); the chaser alerts an operator if the refund is still not settled
at its deadline.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction

from common import rows
from config import metrics
from ledger.models import EntryKind
from ledger.services import ledger_record
from outbox.services import outbox_publish, timer_cancel, timer_schedule
from payments.interface import PaymentGateway, RefundAnswer, RefundRequest, RefundState
from webhooks.services import WebhookEvent

from .. import breaker, lock_objects
from ..models import GatewayAnswer, PurchaseSaga, Refund, RefundStatus
from ..saga.alerts import raise_operator_alert
from ..saga.confirm import announce
from ..saga.step import gateway_or_default
from ..saga.topics import Topic
from ..saga.transition import Backoff, clock
from .opening import chase_key
from .selectors import refunded_amount

logger = logging.getLogger(__name__)

CREATE, LOOK_UP = "refund_create", "refund_lookup"


def refund_execute(
    *,
    refund_id,
    event_id: int,
    lookup: int | None = None,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
) -> Refund:
    """Drive one refund a step: ask for it (first time) or look it up.
    Idempotent by the row's state: a settled refund is left alone, and a
    message for another step than the row's next (``lookup``: the look-ups
    made when it was written; None: whatever is next) does nothing, so a
    message delivered again never starts a second chain of look-ups."""
    gateway = gateway_or_default(gateway)
    with transaction.atomic(durable=True):
        refund = lock_objects.refund_for_update(refund_id=refund_id, event_id=event_id)
        if refund.status != RefundStatus.PENDING:
            return refund
        if lookup is not None and lookup != refund.lookups:
            return refund
        asked = LOOK_UP if refund.asked else CREATE
        if asked == CREATE:
            refund.asked = True
            refund.updated_at = clock(now)
            refund.save(update_fields=["asked", "updated_at"])
        saga = PurchaseSaga.objects.only("intent_id", "processor_ref").get(
            pk=refund.saga_id, event_id=event_id
        )
    request = RefundRequest(
        refund_id=str(refund.pk),
        intent_ref=saga.gateway_ref,
        intent_id=saga.intent_id,
        amount=refund.amount,
        currency=refund.currency,
        processor_ref=refund.processor_ref,
    )
    answer = gateway.create_refund(request) if asked == CREATE else gateway.retrieve_refund(request)
    breaker.observe(asked=asked, label=answer.label, detail=answer.detail)
    with transaction.atomic(durable=True):
        refund = lock_objects.refund_for_update(refund_id=refund_id, event_id=event_id)
        again = _record(refund, asked=asked, answer=answer, at=clock(now))
    if again:
        return refund_execute(refund_id=refund_id, event_id=event_id, gateway=gateway, now=now)
    return refund


def _record(refund: Refund, *, asked: str, answer: RefundAnswer, at: datetime) -> bool:
    """What the answer means for the refund (under its lock); True when the
    processor has no refund under our id, so it must be asked (again)."""
    _evidence(refund, asked=asked, answer=answer, at=at)
    if refund.status != RefundStatus.PENDING:
        return False  # settled meanwhile (another delivery): the answer stays as evidence
    if answer.processor_ref and not refund.processor_ref:
        refund.processor_ref = answer.processor_ref[:255]
    refund.updated_at = at
    if answer.state == RefundState.SUCCEEDED:
        refund_succeeded(refund, at=at)
        return False
    if answer.state == RefundState.FAILED:
        _failed(refund, detail=answer.detail or "refused", at=at)
        return False
    if answer.state == RefundState.NOT_FOUND and asked == LOOK_UP:
        refund.asked = False
        refund.save(update_fields=["asked", "processor_ref", "updated_at"])
        return True
    # PENDING, UNKNOWN (or a create answered NOT_FOUND: read as unknown).
    refund.lookups += 1
    refund.detail = (answer.detail or answer.state.value)[:200]
    refund.save(update_fields=["lookups", "detail", "processor_ref", "updated_at"])
    timer_schedule(
        key=f"refund-lookup:{refund.pk}:{refund.lookups}",
        topic=Topic.REFUND_EXECUTE,
        payload={
            "refund_id": str(refund.pk),
            "event_id": refund.event_id,
            "lookup": refund.lookups,
        },
        due_at=at + timedelta(seconds=Backoff().delay(refund.lookups)),
        event_id=refund.event_id,
        saga_id=refund.saga_id,
        now=at,
    )
    return False


def _evidence(refund: Refund, *, asked: str, answer: RefundAnswer, at: datetime) -> None:
    logger.info(
        "gateway %s answered %s",
        asked,
        answer.label,
        extra={
            "saga_id": str(refund.saga_id),
            "refund_id": str(refund.pk),
            "latency_ms": round(answer.latency_ms, 1),
            "detail": answer.detail,
        },
    )
    metrics.GATEWAY_REQUESTS.labels(method=asked, outcome=answer.label).inc()
    metrics.GATEWAY_LATENCY.labels(method=asked).observe(answer.latency_ms / 1000)
    rows.create(
        GatewayAnswer(
            saga_id=refund.saga_id,
            event_id=refund.event_id,
            at=at,
            asked=asked,
            answer=answer.label,
            detail=answer.detail[:200],
            latency_ms=answer.latency_ms,
            attempt=refund.lookups,
            refund_id=refund.pk,
        )
    )


def refund_succeeded(refund: Refund, *, at: datetime, note: str = "") -> None:
    """The refund is done at the processor: its ledger entry, the buyer's
    email, the webhook, the chaser stood down, in this commit."""
    refund.status = RefundStatus.SUCCEEDED
    refund.settled_at = at
    refund.detail = ""
    refund.save(
        update_fields=["status", "settled_at", "detail", "processor_ref", "updated_at", "asked"]
    )
    # Locked (refund -> saga: nothing locks them the other way round), so
    # that two refunds of one purchase settling at once read each other's
    # success, and the one that completes it says so (purchase.refunded).
    saga = lock_objects.saga_for_update(saga_id=refund.saga_id)
    ledger_record(
        intent_id=saga.intent_id,
        kind=EntryKind.REFUND,
        amount=-refund.amount,
        currency=refund.currency,
        saga_id=saga.pk,
        event_id=saga.event_id,
        now=at,
        gateway_reference=refund.processor_ref or refund.idempotency_key,
        note=note,
        refund_id=refund.pk,
    )
    timer_cancel(key=chase_key(refund), now=at)
    outbox_publish(
        topic=Topic.REFUND_SETTLED,
        payload={"refund_id": str(refund.pk), "event_id": refund.event_id},
        key=f"refund-settled:{refund.pk}",
        event_id=refund.event_id,
        saga_id=refund.saga_id,
        now=at,
    )
    whole = refunded_amount(saga) >= saga.amount
    announce(saga, WebhookEvent.REFUNDED if whole else WebhookEvent.PARTIALLY_REFUNDED, at=at)
    metrics.REFUNDS.labels(source=refund.source, status=refund.status).inc()


def _failed(refund: Refund, *, detail: str, at: datetime) -> None:
    """The processor refused: nothing was refunded. One alert; an operator
    decides (a new refund, or money sent another way)."""
    refund.status = RefundStatus.FAILED
    refund.settled_at = at
    refund.detail = detail[:200]
    refund.save(update_fields=["status", "settled_at", "detail", "processor_ref", "updated_at"])
    timer_cancel(key=chase_key(refund), now=at)
    saga = PurchaseSaga.objects.get(pk=refund.saga_id, event_id=refund.event_id)
    raise_operator_alert(
        saga,
        why=f"refund {refund.pk} of {refund.amount} {refund.currency} failed: {detail}",
        now=at,
        once_per=f"refund-failed:{refund.pk}",
    )
    metrics.REFUNDS.labels(source=refund.source, status=refund.status).inc()


def refund_chase(*, refund_id, event_id: int, now: datetime | None = None) -> bool:
    """The refund's deadline passed: if it is still pending, alert an
    operator once; True if alerted."""
    at = clock(now)
    with transaction.atomic(durable=True):
        refund = lock_objects.refund_for_update(refund_id=refund_id, event_id=event_id)
        if refund.status != RefundStatus.PENDING:
            return False
        saga = PurchaseSaga.objects.get(pk=refund.saga_id, event_id=event_id)
        return raise_operator_alert(
            saga,
            why=f"refund {refund.pk} still not settled past its deadline ({refund.detail})",
            now=at,
            once_per=f"refund-late:{refund.pk}",
        )
