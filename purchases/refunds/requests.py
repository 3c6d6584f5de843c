"""The refunds people ask for: a buyer's cancellation within the event's
policy, an organizer's refund, the runbook's (customer service) refund
(docs/refunds.md). Each owns its transaction, locks the saga, and opens the
refund row there (``opening.refund_open``); the processor is asked after
the commit, by the row's ``refund.execute`` message.

A request's ``Idempotency-Key`` makes one refund: the same key again
returns that refund, whatever happened to it since; the same key with
another request is refused (``RefundKeyReused``).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from django.db import transaction

from common.money import format_money
from webhooks.services import WebhookEvent

from .. import lock_objects
from ..models import Event, EventStatus, PurchaseSaga, Refund, RefundSource
from ..saga.confirm import announce
from ..saga.transition import AN_OPERATOR, By, clock, note_decision
from .errors import CancellationNotAllowed, InvalidRefund, RefundKeyReused
from .opening import RefundAsk, refund_open, seat_links, seats_refunded


def request_hash(**asked) -> str:
    """What a request asked, normalised (seats in order; absent is None)."""
    if asked.get("seats") is not None:
        asked["seats"] = sorted(asked["seats"])
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()


def _replayed(saga: PurchaseSaga, *, source: str, key: str, asked: str) -> Refund | None:
    """The refund this key made already, or None; the same key with
    another request (``asked``: its hash) is refused."""
    if not key:
        return None
    existing = Refund.objects.filter(
        saga_id=saga.pk, event_id=saga.event_id, source=source, request_key=key
    ).first()
    if existing is not None and existing.request_hash != asked:
        raise RefundKeyReused("this Idempotency-Key was used for another refund")
    return existing


def purchase_cancel(
    *,
    saga_id,
    user,
    seats: list[str] | None,
    request_key: str,
    now: datetime | None = None,
) -> Refund:
    """The buyer cancels seats of their confirmed purchase (all that are
    left when ``seats`` is None) while the event's policy allows: they are
    released for sale at once, and the refund is their prices less the
    policy's fee. Another user's purchase: ``PurchaseSaga.DoesNotExist``."""
    at = clock(now)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        if saga.buyer_id != user.pk:
            raise PurchaseSaga.DoesNotExist(f"no saga {saga_id}")
        asked = request_hash(seats=seats)
        replay = _replayed(saga, source=RefundSource.BUYER, key=request_key, asked=asked)
        if replay is not None:
            return replay
        event = Event.objects.only("status", "buyer_can_cancel_until", "cancel_fee_percent").get(
            pk=saga.event_id
        )
        _may_cancel(event, at=at)
        if seats is None:
            taken = seats_refunded(saga)
            seats = [link.ref for link in seat_links(saga) if not link.released]
            seats = [ref for ref in seats if ref not in taken]
            if not seats:
                raise CancellationNotAllowed("every seat of this purchase is cancelled already")
        fee = event.cancel_fee_percent
        refund = refund_open(
            saga,
            ask=RefundAsk(
                source=RefundSource.BUYER,
                seats=seats,
                release=True,
                fee_percent=fee,
                public_reason=_cancelled_sentence(seats, fee),
                requested_by_id=user.pk,
                request_key=request_key,
                request_hash=asked,
            ),
            at=at,
        )
        announce(saga, WebhookEvent.CANCELLED, at=at)
    return refund


def _may_cancel(event: Event, *, at: datetime) -> None:
    if event.status == EventStatus.CANCELLED:
        raise CancellationNotAllowed(
            "the event is cancelled: every purchase is refunded in full without asking"
        )
    until = event.buyer_can_cancel_until
    if until is None:
        raise CancellationNotAllowed("this event's tickets cannot be cancelled")
    if at >= until:
        raise CancellationNotAllowed("the time to cancel for this event has passed")
    if event.cancel_fee_percent >= 100:
        raise CancellationNotAllowed("the cancellation fee is the whole price: nothing to refund")


def _cancelled_sentence(seats: list[str], fee_percent: int) -> str:
    seats_text = ", ".join(seats)
    if fee_percent:
        return (
            f"You cancelled {seats_text}. The refund is their price less the "
            f"organizer's {fee_percent}% cancellation fee."
        )
    return f"You cancelled {seats_text}. The refund is their full price."


def organizer_refund(
    *,
    organizer,
    saga_id,
    user,
    reason: str,
    amount: int | None = None,
    seats: list[str] | None = None,
    release_seats: bool = False,
    request_key: str = "",
    now: datetime | None = None,
) -> Refund:
    """An organizer (finance, owner) refunds a purchase of one of its
    events: an amount, or seats (their prices when no amount is given), or
    everything left when neither is named; the seats go back on sale only
    when ``release_seats``. A purchase of another organizer's event:
    ``PurchaseSaga.DoesNotExist``."""
    if not reason or not reason.strip():
        raise InvalidRefund("reason", "a reason is required")
    at = clock(now)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        if not Event.objects.filter(pk=saga.event_id, organizer=organizer).exists():
            raise PurchaseSaga.DoesNotExist(f"no saga {saga_id}")
        asked = request_hash(
            amount=amount, seats=seats, release=bool(release_seats), reason=reason.strip()
        )
        replay = _replayed(saga, source=RefundSource.ORGANIZER, key=request_key, asked=asked)
        if replay is not None:
            return replay
        refund = refund_open(
            saga,
            ask=RefundAsk(
                source=RefundSource.ORGANIZER,
                amount=amount,
                seats=seats,
                release=release_seats,
                reason=reason.strip(),
                public_reason=_organizer_sentence(seats),
                requested_by_id=user.pk,
                request_key=request_key,
                request_hash=asked,
            ),
            at=at,
        )
    return refund


def _organizer_sentence(seats: list[str] | None) -> str:
    if seats:
        return f"The organizer refunded {', '.join(seats)}."
    return "The organizer gave back part or all of what you paid."


def purchase_refund(
    *,
    saga_id,
    reason: str,
    by: By = AN_OPERATOR,
    gateway=None,
    now: datetime | None = None,
) -> PurchaseSaga:
    """The runbook's refund (customer service): everything left of a
    confirmed purchase, its seats back on sale, as one refund row like any
    other. ``gateway`` is not used here: the row's message asks it."""
    del gateway  # the refund's own step asks the processor, after this commit
    at = clock(now)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        refund = refund_open(
            saga,
            ask=RefundAsk(
                source=RefundSource.OPERATOR,
                release=True,
                reason=reason,
                public_reason="Our customer service refunded your purchase.",
            ),
            at=at,
        )
        note_decision(
            saga,
            reason=f"refund of {format_money(refund.amount, refund.currency)} requested: {reason}",
            at=at,
            by=by,
        )
    return saga
