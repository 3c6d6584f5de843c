"""The gateway step, written once (docs/design.md, "The saga").

Every step that talks to the gateway has the same shape, because no row lock
may be held across network I/O:

1. lock the saga, decide (and possibly move it, e.g. PENDING -> CHARGING),
   commit;
2. call the gateway outside any transaction (the adapters assert it);
3. lock the saga again, keep the answer as evidence (a ``GatewayAnswer``
   row, whatever the saga makes of it), record what it means, commit.

A step may lead to another one (a decline to the compensation, "no charge
found" to a second charge): that is a *next* callable, run after the second
commit, so each commit stays short and takes its own instant.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from opentelemetry.trace import SpanKind

from common import rows
from config import metrics, tracing
from payments.interface import PaymentGateway
from payments.registry import get_gateway

from .. import breaker, lock_objects
from ..models import GatewayAnswer, PurchaseSaga
from .transition import clock, log_extra, step_span

logger = logging.getLogger(__name__)

# What to do after the second commit (None: the step is done).
Next = Callable[[], PurchaseSaga] | None


@dataclass(frozen=True)
class Ask:
    """What a step asks the gateway, decided under the saga's lock."""

    asked: str  # "create" | "charge" | "retrieve" | "cancel" | "refund"
    version: int  # the saga's version when it was decided
    attempt: int = 0  # 1-based position in a backoff schedule (0: none)
    # The intent's reference the call names (PurchaseSaga.gateway_ref), for
    # a step whose answer is about that intent only.
    ref: str = ""


def gateway_or_default(gateway: PaymentGateway | None) -> PaymentGateway:
    return gateway if gateway is not None else get_gateway()


def gateway_step(
    *,
    saga_id,
    decide: Callable[[PurchaseSaga, datetime], Ask | Next],
    call: Callable[[PurchaseSaga, Ask], Any] | None = None,
    record: Callable[[PurchaseSaga, Ask, Any, datetime], Next] | None = None,
    now: datetime | None = None,
    step: str,
) -> PurchaseSaga:
    """Run one gateway step on a saga (see the module docstring).

    ``step`` names its span (``saga.<step>``), in the purchase's trace.
    ``decide(saga, at)`` runs under the lock and returns an :class:`Ask`, or
    instead of asking, what to do next (or None: nothing to do).
    ``call(saga, ask)`` talks to the gateway. ``record(saga, ask, answer,
    at)`` runs under the lock after the evidence is stored, and returns what
    to do next. A step that never asks (an operator's verdict on what the
    runbook saw, a refund's check before its compensation) passes neither:
    its one commit is the first.
    """
    with step_span(f"saga.{step}", saga_id=saga_id):
        with transaction.atomic(durable=True):
            saga = lock_objects.saga_for_update(saga_id=saga_id)
            if tracing.enabled():
                tracing.set_attributes({"intent.id": saga.intent_id, "saga.state.from": saga.state})
            decided = decide(saga, clock(now))
        if not isinstance(decided, Ask):
            return decided() if decided is not None else saga
        if call is None or record is None:
            raise TypeError(f"saga.{step} asked the gateway without a call and a record")
        return ask_and_record(saga=saga, ask=decided, call=call, record=record, now=now)


def ask_and_record(
    *,
    saga: PurchaseSaga,
    ask: Ask,
    call: Callable[[PurchaseSaga, Ask], Any],
    record: Callable[[PurchaseSaga, Ask, Any, datetime], Next],
    now: datetime | None = None,
) -> PurchaseSaga:
    """Stages 2 and 3 of a gateway step whose decision another step already
    committed (a charge retried by the reconciliation's own commit)."""
    answer = call_gateway(saga, ask, call)
    return record_step(saga=saga, ask=ask, answer=answer, record=record, now=now)


def record_step(
    *,
    saga: PurchaseSaga,
    ask: Ask,
    answer: Any,
    record: Callable[[PurchaseSaga, Ask, Any, datetime], Next],
    now: datetime | None = None,
) -> PurchaseSaga:
    """Stage 3 alone: the answer kept and recorded under the saga's lock, in
    a commit of its own, then what follows it."""
    at = clock(now)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga.pk)
        record_answer(saga, asked=ask.asked, answer=answer, at=at, attempt=ask.attempt)
        then = record(saga, ask, answer, at)
    return then() if then is not None else saga


def call_gateway(saga: PurchaseSaga, ask: Ask, call: Callable[[PurchaseSaga, Ask], Any]):
    """The gateway call, as a CLIENT span with its outcome and latency (the
    HTTP adapter's request is a span inside it), its answer counted by the
    processor's breaker (purchases/breaker.py)."""
    answer = traced_call(saga, ask, call)
    breaker.observe(asked=ask.asked, label=answer.label, detail=answer.detail)
    return answer


def traced_call(saga: PurchaseSaga, ask: Ask, call: Callable[[PurchaseSaga, Ask], Any]):
    """The gateway call as :func:`call_gateway` makes it, its answer not
    counted by the breaker (a burst counts its answers together)."""
    if not tracing.enabled():
        return call(saga, ask)
    with tracing.span(
        f"gateway {ask.asked}",
        kind=SpanKind.CLIENT,
        attributes={
            "saga.id": saga.pk,
            "intent.id": saga.intent_id,
            "gateway.operation": ask.asked,
            "gateway.attempt": ask.attempt or None,
        },
    ) as span:
        answer = call(saga, ask)
        tracing.answered(
            span,
            outcome=answer.label,
            latency_ms=answer.latency_ms,
            failed=answer.label == "unknown",
            detail=answer.detail,
        )
    return answer


def record_answer(
    saga: PurchaseSaga, *, asked: str, answer, at: datetime, attempt: int = 0
) -> None:
    """Keep the gateway's answer as evidence beside the saga (and count it),
    inside the caller's transaction."""
    rows.create(_answered(saga, asked=asked, answer=answer, at=at, attempt=attempt))


def record_answers(answered: list[tuple[PurchaseSaga, Any]], *, asked: str, at: datetime) -> None:
    """:func:`record_answer` of several sagas' answers, in one statement."""
    rows.insert([_answered(saga, asked=asked, answer=a, at=at) for saga, a in answered])


def _answered(saga: PurchaseSaga, *, asked: str, answer, at: datetime, attempt: int = 0):
    """The answer's log line and metrics, and its evidence row (not saved)."""
    logger.info(
        "gateway %s answered %s",
        asked,
        answer.label,
        **log_extra(
            saga,
            intent_id=saga.intent_id,
            latency_ms=round(answer.latency_ms, 1),
            detail=answer.detail,
        ),
    )
    metrics.GATEWAY_REQUESTS.labels(method=asked, outcome=answer.label).inc()
    metrics.GATEWAY_LATENCY.labels(method=asked).observe(answer.latency_ms / 1000)
    if asked == "retrieve":
        metrics.RECONCILE_PROBES.labels(answer=answer.label).inc()
    return GatewayAnswer(
        saga=saga,
        event_id=saga.event_id,
        at=at,
        asked=asked,
        answer=answer.label,
        detail=answer.detail[:200],
        latency_ms=answer.latency_ms,
        attempt=attempt,
    )
