"""Outbox consumers of the purchase saga (routed in purchases/saga/topics.py).

Their dotted paths are their names in the inbox: keep them where they are.

Each is idempotent: the timers' consumers re-read the saga under its lock and
decide from its state, not from the fact that a message arrived; the email
consumers are recorded in the inbox so a redelivery sends nothing.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from email.utils import parseaddr

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction
from django.template.loader import render_to_string

from common.money import format_money
from door.tickets import REVOKED, purchase_tickets, purchases_tickets
from outbox.models import OutboxMessage
from outbox.services import prepared, prepared_keep

from . import selectors, services

logger = logging.getLogger(__name__)


def hold_expired(message: OutboxMessage) -> None:
    with transaction.atomic():
        # A cancel that won the race after the relay handed the row over:
        # nothing to do (and the saga would refuse anyway).
        if OutboxMessage.objects.filter(pk=message.pk, cancelled_at__isnull=False).exists():
            return
    services.saga_expire_hold(
        saga_id=message.payload["saga_id"],
        attempt=message.payload.get("attempt", 0),
        why=message.payload.get("why", "hold expired"),
    )


def reconcile_due(message: OutboxMessage) -> None:
    services.saga_reconcile(
        saga_id=message.payload["saga_id"],
        attempt=message.payload["attempt"],
        expected_version=message.payload.get("version"),
    )


def refund_retry_due(message: OutboxMessage) -> None:
    services.saga_compensate(saga_id=message.payload["saga_id"], reason="refund retry")


def refund_execute_due(message: OutboxMessage) -> None:
    """Ask the processor for the refund, or look it up (idempotent by the
    refund row's state: purchases/refunds/step.py)."""
    services.refund_execute(
        refund_id=message.payload["refund_id"],
        event_id=message.payload["event_id"],
        lookup=message.payload.get("lookup"),
    )


def refund_chase_due(message: OutboxMessage) -> None:
    services.refund_chase(
        refund_id=message.payload["refund_id"], event_id=message.payload["event_id"]
    )


def cancellation_tick_due(message: OutboxMessage) -> None:
    due = message.payload.get("due")
    services.cancellation_tick(
        event_id=message.payload["event_id"],
        due=datetime.fromisoformat(due) if due else None,
    )


def refund_email(message: OutboxMessage) -> None:
    """One email per refund, once it is done: what was refunded, and why in
    the buyer's words."""
    facts = selectors.refund_email_facts(
        refund_id=message.payload["refund_id"], event_id=message.payload["event_id"]
    )
    buyer = facts["buyer"]
    EmailMessage(
        subject=f"Refund of {facts['amount_display']}: reservation {facts['reservation']}",
        body=render_to_string("emails/refund_succeeded.txt", facts),
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[buyer["email"] or f"{buyer['username']}@example.invalid"],
        headers={"Message-ID": message_id(f"refund-{facts['refund_id']}", facts["saga_id"])},
    ).send()
    logger.info("email sent: refund", extra={"saga_id": facts["saga_id"]})


def message_id(kind: str, saga_id: str) -> str:
    """The email's Message-ID: one per saga and kind, the same on every send.

    Sending is at least once (the inbox entry is written after the mail
    server took the message; a crash between the two sends it again), so a
    resend carries the same Message-ID as the first: mail servers and clients
    treat the two as one message, and the auditor counts messages, not sends.
    """
    domain = parseaddr(settings.DEFAULT_FROM_EMAIL)[1].rpartition("@")[2] or "boxoffice.local"
    return f"<{kind}.{saga_id}@{domain}>"


def _send(kind: str, template: str, subject: str, message: OutboxMessage, **more: object) -> None:
    facts = message.payload
    buyer = facts["buyer"]
    # In the currency's own decimals: "5,000 JPY", "1.234 KWD" (never amount / 100).
    amount_display = format_money(facts["amount"], facts["currency"])
    context = {**facts, "buyer": buyer, "amount_display": amount_display, **more}
    EmailMessage(
        subject=subject,
        body=render_to_string(template, context),
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[buyer["email"] or f"{buyer['username']}@example.invalid"],
        headers={"Message-ID": message_id(kind, facts["saga_id"])},
    ).send()
    logger.info("email sent: %s", template, extra={"saga_id": facts["saga_id"]})


def confirmation_email(message: OutboxMessage) -> None:
    """The receipt, with each seat's ticket code signed now with the event's
    current key (door/tickets.py): the same code the purchase page shows,
    and the same again if a crash sends the email twice (signatures are
    deterministic). A purchase no longer confirmed when it is sent (taken
    back meanwhile) has no code to carry."""
    tickets = prepared(message, "tickets", within=TICKETS_FRESH_SECONDS)
    if tickets is None:
        tickets = purchase_tickets(
            saga_id=message.payload["saga_id"], event_id=message.payload.get("event_id")
        )
    _send(
        "confirmed",
        "emails/purchase_confirmed.txt",
        f"Your tickets: reservation {message.payload['reservation']}",
        message,
        tickets=[ticket for ticket in tickets if ticket.status != REVOKED],
    )


# How long the tickets :func:`confirmation_email_prepare` read stay good for
# an email: past it (a slow mail server held the burst up), the email reads
# its purchase's tickets again, as it does alone.
TICKETS_FRESH_SECONDS = 1.0


def confirmation_email_prepare(messages: list[OutboxMessage]) -> None:
    """Read the tickets of several confirmations' purchases in one statement
    (and each event's key once), and keep each one's on its message for
    :func:`confirmation_email` (a charge burst's emails, closing together)."""
    named = [m for m in messages if m.payload.get("event_id") is not None]
    at = time.monotonic()  # before the read: its age counts from its start
    found = purchases_tickets([(m.payload["saga_id"], m.payload["event_id"]) for m in named])
    for message in named:
        # None found: not confirmed now (taken back meanwhile): no code to carry.
        prepared_keep(message, "tickets", found.get(str(message.payload["saga_id"]), []), at=at)


confirmation_email.prepare = confirmation_email_prepare  # type: ignore[attr-defined]  # read by outbox.delivery


def cancellation_email(message: OutboxMessage) -> None:
    if message.payload.get("was_confirmed"):
        # The confirmation cannot be unsent: over-correct with a new message.
        _send(
            "corrected",
            "emails/purchase_corrected.txt",
            f"Correction: reservation {message.payload['reservation']} was refunded",
            message,
        )
    else:
        _send(
            "failed",
            "emails/purchase_failed.txt",
            f"Your purchase did not go through: reservation {message.payload['reservation']}",
            message,
        )


def operator_alert(message: OutboxMessage) -> None:
    logger.error(
        "ALERT saga needs an operator: %s",
        message.payload.get("why"),
        extra={"saga_id": message.payload["saga_id"], "alert": "saga_needs_operator"},
    )
