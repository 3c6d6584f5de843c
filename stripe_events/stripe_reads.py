"""Reading from Stripe the object an event names, before acting on it
(docs/stripe.md, "Stripe's events": the body is only a trigger).

The official library's public API: a ``stripe.StripeClient`` on
``STRIPE_API_BASE`` with ``STRIPE_SECRET_KEY``, ``STRIPE_TIMEOUT_SECONDS``
per request and no retries of its own (the outbox delivers the event again:
:class:`StripeUnanswered`). Never inside a transaction
(``payments.guards.assert_no_transaction``).

The PaymentIntents' own reads are the gateway adapter's (payments/stripe/,
through the port); a dispute is not a thing the port knows, so it is read
here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import stripe
from django.conf import settings

from payments.guards import assert_no_transaction
from purchases.disputes import DisputeFacts


class StripeUnanswered(Exception):
    """No usable answer from Stripe (timeout, connection, 5xx, rate limit, a
    refused key): the consumer lets it out, and the outbox delivers the event
    again on its schedule."""


@dataclass(frozen=True)
class DisputeRead:
    facts: DisputeFacts
    payment_intent: str  # the disputed PaymentIntent's pi_… ("" if it names none)
    # The PaymentIntent's metadata.purchase_id: the saga that made it ("" if none).
    purchase_id: str


@functools.lru_cache(maxsize=4)
def _client(api_key: str, api_base: str, timeout: float) -> stripe.StripeClient:
    # One per configuration, kept: its HTTP session keeps its connections.
    return stripe.StripeClient(
        api_key,
        base_addresses={"api": api_base},
        max_network_retries=0,
        http_client=stripe.RequestsClient(timeout=timeout),
    )


def client() -> stripe.StripeClient:
    return _client(
        settings.STRIPE_SECRET_KEY, settings.STRIPE_API_BASE, settings.STRIPE_TIMEOUT_SECONDS
    )


def dispute_retrieve(dispute_id: str) -> DisputeRead | None:
    """The dispute as Stripe has it now, with its PaymentIntent (expanded: one
    request); None if Stripe has no such dispute."""
    assert_no_transaction("Stripe's dispute retrieve")
    try:
        found = client().v1.disputes.retrieve(dispute_id, params={"expand": ["payment_intent"]})
    except stripe.InvalidRequestError as exc:
        if exc.http_status == 404:
            return None
        raise StripeUnanswered(f"dispute {dispute_id}: {_said(exc)}") from exc
    except stripe.StripeError as exc:
        raise StripeUnanswered(f"dispute {dispute_id}: {_said(exc)}") from exc
    return dispute_read(found.to_dict())


def _said(exc: stripe.StripeError) -> str:
    return f"{type(exc).__name__} (HTTP {exc.http_status or 'none'}): {exc.user_message or exc}"


def dispute_read(dispute: dict[str, Any]) -> DisputeRead:
    """Stripe's documented Dispute object (API reference, "The Dispute
    object") as our facts. ``balance_transactions`` lists zero, one or two
    balance transactions: the withdrawal (negative ``amount``) and, for a
    dispute won, the reinstatement (positive). Amounts are taken from the
    dispute itself, in the charge's currency: a balance transaction is in the
    account's settlement currency and its ``net`` includes Stripe's fee."""
    moves = [t.get("amount") or 0 for t in dispute.get("balance_transactions") or []]
    intent = dispute.get("payment_intent")
    if isinstance(intent, dict):
        intent_id = intent.get("id") or ""
        purchase_id = (intent.get("metadata") or {}).get("purchase_id") or ""
    else:
        intent_id, purchase_id = intent or "", ""
    return DisputeRead(
        facts=DisputeFacts(
            processor_ref=dispute["id"],
            status=dispute["status"],
            amount=int(dispute["amount"]),
            currency=str(dispute["currency"]).upper(),
            reason=dispute.get("reason") or "",
            funds_withdrawn=any(amount < 0 for amount in moves),
            funds_reinstated=any(amount > 0 for amount in moves),
        ),
        payment_intent=intent_id,
        purchase_id=purchase_id,
    )
