"""Recording Stripe's events (docs/stripe.md, "Stripe's events").

:func:`stripe_event_receive` is the endpoint's one write: the event stored
once by its id and, in the same commit, the obligation to act on it (an
outbox row, ``stripe.event``, whose consumer is
``stripe_events.consumers.stripe_event_act``). Idempotency is the unique
``stripe_id`` (``INSERT … ON CONFLICT DO NOTHING``): Stripe sends an event
again until it gets a 2xx, and a replay writes nothing and owes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from django.utils import timezone

from common import rows
from config.distribution import NO_EVENT
from config.transactions import in_transaction
from outbox.services import outbox_publish
from purchases.saga.topics import Topic

from .models import StripeEvent

# The types acted on (docs/stripe.md, "Stripe's events"); any other is
# recorded as ignored. Each dispute type re-reads the whole dispute, so the
# two cover its life: its funds moves show in the dispute read at its close.
ACTED_ON = frozenset(
    {
        "payment_intent.succeeded",
        "payment_intent.payment_failed",
        "payment_intent.canceled",
        "charge.refunded",
        "charge.dispute.created",
        "charge.dispute.closed",
    }
)


class NotAnEvent(ValueError):
    """A signed body that is JSON but not a Stripe event (its message says what is missing)."""


@dataclass(frozen=True)
class Received:
    stripe_id: str
    type: str
    new: bool  # first time this id arrived
    ignored: bool  # a type not acted on


def stripe_event_receive(*, event: dict, now: datetime | None = None) -> Received:
    """Store a verified event once by its id and, the first time, owe its
    consumer a look (an outbox row in the same commit)."""
    row = _row(event, now=now or timezone.now())
    with transaction.atomic(durable=True):
        new = rows.insert([row], ignore_conflicts=True) == 1
        if new and not row.ignored:
            outbox_publish(
                topic=Topic.STRIPE_EVENT,
                payload=_pointers(event),
                key=f"stripe_event:{row.stripe_id}",
                # Not an event's (the inbox is the coordinator's:
                # config/distribution.py); the consumer finds the saga.
                event_id=NO_EVENT,
                now=row.received_at,
            )
    return Received(stripe_id=row.stripe_id, type=row.type, new=new, ignored=row.ignored)


def _row(event: dict, *, now: datetime) -> StripeEvent:
    obj = _object(event)
    try:
        stripe_id, kind = str(event["id"]), str(event["type"])
        created = datetime.fromtimestamp(int(event["created"]), tz=UTC)
    except (KeyError, TypeError, ValueError, OverflowError, OSError) as exc:
        raise NotAnEvent(f"not a Stripe event: id, type and created are required ({exc})") from exc
    if not (0 < len(stripe_id) <= 255 and 0 < len(kind) <= 100):
        raise NotAnEvent("not a Stripe event: its id or type is empty or too long")
    return StripeEvent(
        stripe_id=stripe_id,
        type=kind,
        object_id=str(obj.get("id") or "")[:255],
        livemode=bool(event.get("livemode")),
        created=created,
        received_at=now,
        ignored=kind not in ACTED_ON,
    )


def _object(event: dict) -> dict:
    data = event.get("data")
    obj = data.get("object") if isinstance(data, dict) else None
    if not isinstance(obj, dict):
        raise NotAnEvent("not a Stripe event: data.object is missing")
    return obj


def _pointers(event: dict) -> dict:
    """What the consumer needs to find what the event is about, and nothing
    it would take as a fact: ids only (it re-reads the object from Stripe)."""
    obj = _object(event)
    metadata = obj.get("metadata")
    intent = obj.get("payment_intent") if obj.get("object") != "payment_intent" else obj.get("id")
    return {
        "stripe_event": str(event["id"]),
        "type": str(event["type"]),
        "object_id": str(obj.get("id") or ""),
        "payment_intent": intent if isinstance(intent, str) else "",
        "purchase_id": str(metadata.get("purchase_id") or "") if isinstance(metadata, dict) else "",
    }


def stripe_event_acted(*, stripe_id: str, outcome: str, now: datetime | None = None) -> None:
    """Inside the consumer's closing transaction (with its inbox entry):
    when the event was acted on, and what came of it."""
    if not in_transaction():
        raise RuntimeError("stripe_event_acted belongs inside the delivery's closing transaction")
    StripeEvent.objects.filter(stripe_id=stripe_id).update(
        acted_at=now or timezone.now(), outcome=outcome[:300]
    )
