"""The outbox consumer of Stripe's events (``stripe.event``, routed in
purchases/saga/topics.py). Its dotted path is its name in the inbox: keep it.

An event is a trigger, never a fact (docs/stripe.md, "Stripe's events"):

- ``payment_intent.*`` and ``charge.refunded``: the saga is found from the
  event's ids (its PaymentIntent's ``metadata.purchase_id``, else the
  ``pi_…`` the saga recorded) and probed
  (``purchases.services.purchase_processor_event``), which re-reads the
  intent through the gateway port and moves the saga only on that answer;
- ``charge.dispute.*``: the dispute is read from Stripe with its
  PaymentIntent (``stripe_reads``), then recorded
  (``purchases.disputes.dispute_record``).

An ordinary consumer (it calls Stripe, outside any transaction): an
unanswered read raises, the delivery fails and the outbox hands the event
over again on its schedule. Idempotent: the event's row is written once
(one outbox row per event id), the inbox records that this consumer ran,
and what it calls is idempotent itself (a probe of a settled saga learns
nothing; a dispute recorded again writes nothing). The event's own row
says when it was acted on and how, in the delivery's closing commit.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from outbox.models import OutboxMessage
from purchases import services
from purchases.disputes import dispute_record

from . import selectors, stripe_reads
from .services import stripe_event_acted

logger = logging.getLogger(__name__)


def stripe_event_act(message: OutboxMessage) -> Callable[[], None]:
    p = message.payload
    if p["type"].startswith("charge.dispute."):
        outcome = _dispute(p)
    else:
        outcome = _payment(p)
    return functools.partial(stripe_event_acted, stripe_id=p["stripe_event"], outcome=outcome)


def _why(p: dict) -> str:
    return f"stripe event {p['stripe_event']} {p['type']}"


def _payment(p: dict) -> str:
    saga_id = selectors.saga_id_for(
        purchase_id=p["purchase_id"], payment_intent=p["payment_intent"]
    )
    if saga_id is None:
        logger.info("%s: no purchase of ours", _why(p), extra={"stripe_event": p["stripe_event"]})
        return f"no purchase for {p['payment_intent'] or p['object_id']}"
    services.purchase_processor_event(saga_id=saga_id, why=_why(p))
    return f"purchase {saga_id} probed"


def _dispute(p: dict) -> str:
    read = stripe_reads.dispute_retrieve(p["object_id"])
    if read is None:
        logger.warning(
            "%s: Stripe has no dispute %s",
            _why(p),
            p["object_id"],
            extra={"stripe_event": p["stripe_event"]},
        )
        return f"no dispute {p['object_id']} at Stripe"
    saga_id = selectors.saga_id_for(
        purchase_id=read.purchase_id, payment_intent=read.payment_intent
    )
    if saga_id is None:
        logger.warning(
            "%s: dispute %s is on no purchase of ours (%s)",
            _why(p),
            read.facts.processor_ref,
            read.payment_intent or "no PaymentIntent",
            extra={"stripe_event": p["stripe_event"]},
        )
        return f"dispute {read.facts.processor_ref}: no purchase for {read.payment_intent or '-'}"
    recorded = dispute_record(saga_id=saga_id, facts=read.facts, why=_why(p))
    return (
        f"dispute {read.facts.processor_ref} {recorded.dispute.status} on purchase {saga_id}"
        f"{' (opened)' if recorded.created else ''}"
        f"{'; ledger ' + ', '.join(recorded.entries) if recorded.entries else ''}"
    )
