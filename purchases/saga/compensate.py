"""Compensation: undo a purchase in reverse order, idempotent by state
(docs/design.md, "The saga").

Refund (only if the ledger holds a charge; a remote call with its own
idempotency key, ``refund:<intent_id>``) -> free the seats -> announce
``purchase.cancelled`` -> the email is its consumer's, after the commit.
Nothing is released before the money is back: a refund the gateway does not
confirm leaves the saga COMPENSATION_PENDING with a retry timer, and one the
gateway says has nothing to refund waits for an operator.

With a processor whose intents are its own objects (Stripe), an intent that
holds no charge is canceled before the seats are released: a declined or
unauthenticated PaymentIntent could otherwise still be confirmed by a
browser holding its client secret (docs/stripe.md, "The charge"). One found
charged after all is written to the ledger and refunded.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction

from ledger.models import EntryKind, LedgerEntry
from ledger.services import ledger_has_charge, ledger_record
from outbox.services import outbox_publish, timer_cancel, timer_schedule
from payments.interface import CancelOutcome, PaymentGateway, RefundOutcome
from webhooks.services import WebhookEvent

from .. import lock_objects
from ..availability import availability_changed
from ..models import (
    Actor,
    GatewayAnswer,
    PurchaseSaga,
    Reservation,
    ReservationSeat,
    ReservationStatus,
)
from .alerts import raise_operator_alert
from .confirm import Link, announce, purchase_facts, reservation_links
from .states import SagaState
from .step import Ask, Next, gateway_or_default, gateway_step
from .topics import Topic
from .transition import SYSTEM, Backoff, By, clock, log_extra, move

logger = logging.getLogger(__name__)

S = SagaState

# Where a compensation starts by itself. CONFIRMED (a refund asked for) and
# UNKNOWN_EXPIRED (an operator who cancelled the intent) are passed by the
# callers who vouch for them (``may_start_from``).
COMPENSABLE = frozenset({S.PAYMENT_FAILED, S.EXPIRED, S.COMPENSATION_PENDING})


def saga_compensate(
    *,
    saga_id,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
    by: By = SYSTEM,
    reason: str = "compensating",
    may_start_from: frozenset[SagaState] = frozenset(),
) -> PurchaseSaga:
    """Undo a purchase: refund (if charged) -> free seats -> event -> email.

    Idempotent by state: COMPENSATED is a no-op, COMPENSATING resumes where it
    stopped. ``may_start_from`` adds source states the caller vouches for
    (CONFIRMED for a refund, UNKNOWN_EXPIRED for an operator's verdict).
    """
    gateway = gateway_or_default(gateway)
    return gateway_step(
        step="compensate",
        saga_id=saga_id,
        decide=_compensate_decide(
            saga_id=saga_id, now=now, by=by, reason=reason, may_start_from=may_start_from
        ),
        call=lambda saga, ask: (
            gateway.cancel(saga.gateway_ref)
            if ask.asked == "cancel"
            else gateway.refund(saga.gateway_ref, idempotency_key=f"refund:{saga.intent_id}")
        ),
        record=_compensate_record(saga_id=saga_id, now=now, by=by),
        now=now,
    )


def _compensate_decide(
    *,
    saga_id,
    now: datetime | None,
    by: By,
    reason: str,
    may_start_from: frozenset[SagaState],
):
    def decide(saga: PurchaseSaga, at: datetime) -> Ask | Next:
        if saga.awaiting_operator_since is not None and by.actor != Actor.OPERATOR:
            # The gateway contradicted the ledger: only an operator's verdict
            # moves this saga (a late retry timer or the resumer must not).
            logger.info("compensation skipped: waiting for an operator", **log_extra(saga))
            return None
        state = SagaState(saga.state)
        if state in COMPENSABLE or state in may_start_from:
            move(saga, S.COMPENSATING, reason=reason, at=at, by=by)
        elif state != S.COMPENSATING:
            logger.info("compensation skipped in %s", state, **log_extra(saga))
            return None
        if ledger_has_charge(intent_id=saga.intent_id) and not refunded(saga):
            return Ask("refund", saga.version)
        if saga.processor_ref and not _voided(saga):
            return Ask("cancel", saga.version, ref=saga.gateway_ref)
        return lambda: _finish(saga_id=saga_id, refund_reference="", now=now, by=by)

    return decide


def _compensate_record(*, saga_id, now: datetime | None, by: By):
    def record(saga: PurchaseSaga, ask: Ask, result, at: datetime) -> Next:
        if saga.version != ask.version or saga.state != S.COMPENSATING:
            return None
        if ask.asked == "cancel":
            return _voided_or_not(saga, result, saga_id=saga_id, at=at, now=now, by=by)
        if result.outcome == RefundOutcome.NOT_CHARGED:
            _wait_for_an_operator(saga, at=at, by=by)
            return None
        if result.outcome != RefundOutcome.REFUNDED:
            move(
                saga,
                S.COMPENSATION_PENDING,
                at=at,
                by=by,
                reason=f"refund not confirmed ({result.outcome.value}); will retry",
            )
            _arm_refund_retry(saga, at=at)
            return None
        reference = f"refund:{saga.intent_id}"
        return lambda: _finish(saga_id=saga_id, refund_reference=reference, now=now, by=by)

    return record


def _voided(saga: PurchaseSaga) -> bool:
    """Whether the processor already said this saga's intent is canceled
    (the hold's expiry asks first; a compensation asks only once)."""
    return GatewayAnswer.objects.filter(saga=saga, asked="cancel", answer="canceled").exists()


def _voided_or_not(saga: PurchaseSaga, result, *, saga_id, at: datetime, now, by: By) -> Next:
    """The cancel of an intent with no charge in the ledger."""
    if result.outcome == CancelOutcome.CANCELED:
        return lambda: _finish(saga_id=saga_id, refund_reference="", now=now, by=by)
    if result.outcome == CancelOutcome.ALREADY_CHARGED:
        # Charged after all (a browser confirmed it while we released):
        # the money is real. Write it, alert once, and refund it.
        ledger_record(
            intent_id=saga.intent_id,
            kind=EntryKind.CHARGE,
            amount=saga.amount,
            currency=saga.currency,
            saga_id=saga.pk,
            event_id=saga.event_id,
            now=at,
            gateway_reference=result.charge_id or "",
            note="charged while the purchase was being undone; refunded by its compensation",
        )
        raise_operator_alert(
            saga,
            why="a charge landed while the purchase was undone",
            now=at,
            once_per="late_charge",
        )
        return lambda: saga_compensate(saga_id=saga_id, now=now, by=by)
    move(
        saga,
        S.COMPENSATION_PENDING,
        at=at,
        by=by,
        reason=f"intent not canceled yet ({result.detail or result.label}); will retry",
    )
    _arm_refund_retry(saga, at=at)
    return None


def _wait_for_an_operator(saga: PurchaseSaga, *, at: datetime, by: By) -> None:
    """A refund answered "not charged": definitive, and a contradiction (our
    ledger says charged, the gateway says not). Asking again cannot change
    that: the saga waits, and one alert names it, for an operator to compare
    the two (docs/operations.md, "Runbook")."""
    move(
        saga,
        S.COMPENSATION_PENDING,
        at=at,
        by=by,
        reason="refund refused: the gateway has no charge; waiting for an operator",
    )
    PurchaseSaga.objects.filter(pk=saga.pk).update(awaiting_operator_since=at)
    saga.awaiting_operator_since = at
    raise_operator_alert(saga, why="the gateway has no charge for a refund the ledger owes", now=at)


def _finish(*, saga_id, refund_reference: str, now: datetime | None, by: By) -> PurchaseSaga:
    at = clock(now)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        if saga.state != S.COMPENSATING:
            return saga
        if refund_reference:
            record_refund(saga, at=at, reference=refund_reference)
        finish_compensation(saga, at=at, by=by, refunded=bool(refund_reference) or refunded(saga))
    return saga


def record_refund(
    saga: PurchaseSaga, *, at: datetime, reference: str, note: str = "", override: bool = False
) -> None:
    """The refund's ledger entry (the charge's inverse), inside the caller's
    transaction: the gateway's refund (``reference`` its idempotency key) or
    one an operator saw at the processor (``note`` says so; ``override``
    when the gateway could not be asked)."""
    ledger_record(
        intent_id=saga.intent_id,
        kind=EntryKind.REFUND,
        amount=-saga.amount,
        currency=saga.currency,
        saga_id=saga.pk,
        event_id=saga.event_id,
        now=at,
        gateway_reference=reference,
        note=note,
        override=override,
    )


def finish_compensation(
    saga: PurchaseSaga,
    *,
    at: datetime,
    by: By,
    refunded: bool,
    reason: str = "compensated",
) -> None:
    """The last commit of a compensation (the caller's): seats, reservation,
    hold timer, ``purchase.cancelled``, state. The email is the consumer's,
    after this commits."""
    was_confirmed = Reservation.objects.filter(
        pk=saga.reservation_id, event_id=saga.event_id, status=ReservationStatus.CONFIRMED
    ).exists()
    links = reservation_links(saga)
    _release_seats(saga, links, at=at)
    Reservation.objects.filter(pk=saga.reservation_id, event_id=saga.event_id).update(
        status=ReservationStatus.CANCELLED
    )
    timer_cancel(key=saga.hold_timer_key, now=at)
    facts = purchase_facts(saga, links=links)
    outbox_publish(
        topic=Topic.CANCELLED,
        payload={**facts, "was_confirmed": was_confirmed, "refunded": refunded},
        key=f"cancelled:{saga.pk}",
        event_id=saga.event_id,
        saga_id=saga.pk,
        now=at,
    )
    move(saga, S.COMPENSATED, reason=reason, at=at, by=by)
    announce(saga, WebhookEvent.REFUNDED if refunded else WebhookEvent.FAILED, at=at, facts=facts)


def refunded(saga: PurchaseSaga) -> bool:
    return LedgerEntry.objects.filter(intent_id=saga.intent_id, kind=EntryKind.REFUND).exists()


def _arm_refund_retry(saga: PurchaseSaga, *, at: datetime) -> None:
    # The n-th refund (or cancel) answer arms the n-th retry.
    n = GatewayAnswer.objects.filter(saga=saga, asked__in=("refund", "cancel")).count()
    timer_schedule(
        key=f"refund:{saga.pk}:{n}",
        topic=Topic.REFUND_RETRY,
        payload={"saga_id": str(saga.pk)},
        due_at=at + timedelta(seconds=Backoff().delay(n)),
        event_id=saga.event_id,
        saga_id=saga.pk,
        now=at,
    )


def _release_seats(saga: PurchaseSaga, links: list[Link], *, at: datetime) -> None:
    live = [link for link in links if not link.released]
    seat_ids = [link.seat_id for link in live]
    # Lock order: saga (held by the caller) -> seats.
    lock_objects.seats_for_update(event_id=saga.event_id, seat_ids=seat_ids)
    # On offer again at its category's price today, not the price it was
    # held at (docs/api.md, "Events, seat maps and prices").
    lock_objects.seats_release_at_current_price(event_id=saga.event_id, seat_ids=seat_ids)
    availability_changed(saga.event_id)
    ReservationSeat.objects.filter(
        event_id=saga.event_id, id__in=[link.id for link in live]
    ).update(released_at=at)
