"""Disputes (chargebacks) on a purchase (docs/stripe.md, "Disputes").

A dispute is the processor's: the caller has just read it from the
processor (stripe_events/, never from an event's body) and hands over what
it says as :class:`DisputeFacts`. :func:`dispute_record` writes, in one
commit under the saga's lock (purchases/lock_objects.py, so that two
consumers of the same dispute queue instead of interleaving):

- the :class:`~purchases.models.Dispute` row, created or brought up to date.
  A closed dispute is never reopened: two consumers may read the dispute at
  different moments and commit in the other order, and the older read must
  not win;
- the ledger: a ``dispute`` entry (negative, like a refund) once the funds
  are withdrawn, a ``dispute_reversal`` (positive, the same amount) once
  they are reinstated, each at most once per intent (the ledger's unique
  (intent, kind) constraint; looked for first, under the lock, so the commit
  does not fail on it). No reversal without its withdrawal;
- one operator alert per dispute (``raise_operator_alert``, keyed by it);
- the organizer's ``purchase.disputed`` webhook, in the commit that first
  records the dispute (each type at most once per saga per endpoint:
  docs/api.md, "Webhooks").

The saga does not move: a dispute is about money already taken, weeks
later; whether to refund or fight it is the operator's call, in the
processor's dashboard.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from common.money import format_money
from door.models import RevocationReason
from door.revocations import revoke_purchase
from ledger.models import EntryKind, LedgerEntry
from ledger.services import ledger_record
from webhooks.services import WebhookEvent, purchase_data, webhook_publish

from .lock_objects import saga_for_update
from .models import Dispute, PurchaseSaga
from .selectors import saga_seat_refs
from .services import raise_operator_alert

logger = logging.getLogger(__name__)

# Stripe's dispute statuses after which nothing changes (the model stores
# Stripe's status as it is): an inquiry closed, won, lost, or prevented.
CLOSED_STATUSES = frozenset({"warning_closed", "won", "lost", "prevented"})


@dataclass(frozen=True)
class DisputeFacts:
    """A dispute as the processor has just said it is."""

    processor_ref: str  # Stripe's dp_…
    status: str
    amount: int  # minor units, in the charge's currency
    currency: str  # ISO 4217, upper case
    reason: str
    # The processor took the disputed amount from our balance / gave it back.
    funds_withdrawn: bool
    funds_reinstated: bool


@dataclass(frozen=True)
class DisputeRecorded:
    dispute: Dispute
    created: bool
    status_changed: bool
    # The ledger kinds written by this call (none when they were already there).
    entries: tuple[str, ...]


def dispute_record(
    *, saga_id, facts: DisputeFacts, why: str, now: datetime | None = None
) -> DisputeRecorded:
    """Record what the processor says of a dispute on the saga's charge
    (idempotent: the same facts again write nothing)."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        saga = saga_for_update(saga_id=saga_id)
        dispute, created, was = _dispute_upsert(saga, facts, now=now)
        entries = _ledger(saga, dispute, facts, now=now)
        if dispute.status == "lost":
            # The bank took the money back: the seats stay sold, the tickets
            # no longer admit (docs/door.md, "Revocations"); once per ticket.
            revoke_purchase(
                event_id=saga.event_id,
                reservation_id=saga.reservation_id,
                reason=RevocationReason.DISPUTE,
                at=now,
            )
        if created:
            raise_operator_alert(
                saga, why=_alert_why(dispute), now=now, once_per=f"dispute:{dispute.processor_ref}"
            )
            webhook_publish(
                event_type=WebhookEvent.DISPUTED,
                saga_id=saga.pk,
                event_id=saga.event_id,
                data=lambda: _webhook_data(saga, dispute),
                now=now,
            )
    changed = not created and was != dispute.status
    if created or changed or entries:
        logger.warning(
            "dispute %s %s: %s%s (%s)",
            dispute.processor_ref,
            "opened" if created else "updated",
            dispute.status,
            f", ledger {', '.join(entries)}" if entries else "",
            why,
            extra={"saga_id": str(saga.pk), "dispute": dispute.processor_ref},
        )
    return DisputeRecorded(dispute, created, changed, entries)


def _dispute_upsert(
    saga: PurchaseSaga, facts: DisputeFacts, *, now: datetime
) -> tuple[Dispute, bool, str]:
    """The dispute row brought up to date: (row, created, its status before)."""
    found = Dispute.objects.filter(processor_ref=facts.processor_ref, event_id=saga.event_id)
    dispute = found.first()
    if dispute is None:
        dispute = Dispute.objects.create(
            saga=saga,
            event_id=saga.event_id,
            processor_ref=facts.processor_ref,
            status=facts.status,
            amount=facts.amount,
            currency=facts.currency,
            reason=facts.reason,
            created_at=now,
            updated_at=now,
        )
        return dispute, True, ""
    was = dispute.status
    stale = was in CLOSED_STATUSES and facts.status not in CLOSED_STATUSES
    new = {
        "status": was if stale else facts.status,
        "amount": facts.amount,
        "currency": facts.currency,
        "reason": facts.reason,
    }
    if any(getattr(dispute, name) != value for name, value in new.items()):
        for name, value in {**new, "updated_at": now}.items():
            setattr(dispute, name, value)
        found.filter(pk=dispute.pk).update(**new, updated_at=now)
    return dispute, False, was


def _ledger(
    saga: PurchaseSaga, dispute: Dispute, facts: DisputeFacts, *, now: datetime
) -> tuple[str, ...]:
    """The dispute's ledger entries owed and not written yet, written."""
    have = {
        e.kind: e
        for e in LedgerEntry.objects.filter(
            intent_id=saga.intent_id,
            event_id=saga.event_id,
            kind__in=[EntryKind.DISPUTE, EntryKind.DISPUTE_REVERSAL],
        )
    }
    withdrawn = facts.funds_withdrawn or facts.status == "lost"
    # Won: Stripe gives the withdrawn funds back (docs/stripe.md, "Disputes").
    reinstated = facts.funds_reinstated or facts.status == "won"
    written: list[str] = []
    if withdrawn and EntryKind.DISPUTE not in have:
        have[EntryKind.DISPUTE] = _entry(
            saga, dispute, EntryKind.DISPUTE, -dispute.amount, "funds withdrawn", now=now
        )
        written.append(EntryKind.DISPUTE)
    taken = have.get(EntryKind.DISPUTE)
    if reinstated and taken is not None and EntryKind.DISPUTE_REVERSAL not in have:
        # The mirror of what was taken, whatever the dispute says now.
        _entry(
            saga, dispute, EntryKind.DISPUTE_REVERSAL, -taken.amount, "funds reinstated", now=now
        )
        written.append(EntryKind.DISPUTE_REVERSAL)
    return tuple(written)


def _entry(
    saga: PurchaseSaga, dispute: Dispute, kind: EntryKind, amount: int, what: str, *, now: datetime
) -> LedgerEntry:
    return ledger_record(
        intent_id=saga.intent_id,
        kind=kind,
        amount=amount,
        currency=dispute.currency,
        saga_id=saga.pk,
        event_id=saga.event_id,
        gateway_reference=dispute.processor_ref,
        note=f"dispute {dispute.processor_ref}: {what} ({dispute.status}, {dispute.reason})",
        now=now,
    )


def _alert_why(dispute: Dispute) -> str:
    money = format_money(dispute.amount, dispute.currency)
    return (
        f"the buyer's bank disputes the charge: dispute {dispute.processor_ref}, {money}, "
        f"reason {dispute.reason or 'not given'}, status {dispute.status}; answer it "
        "with evidence in the processor's dashboard"
    )


def dispute_answer(dispute: Dispute) -> dict:
    """The dispute as the purchase's answer and its webhook show it (docs/api.md)."""
    return {
        "status": dispute.status,
        "amount": {"amount": dispute.amount, "currency": dispute.currency},
        "reason": dispute.reason,
    }


def _webhook_data(saga: PurchaseSaga, dispute: Dispute) -> dict:
    facts = {
        "saga_id": str(saga.pk),
        "event_id": saga.event_id,
        "seats": saga_seat_refs(saga),
        "amount": saga.amount,
        "currency": saga.currency,
        "reservation": saga.reservation.ref,
    }
    data = purchase_data(facts, status=saga.state, version=saga.version)
    data["purchase"]["dispute"] = dispute_answer(dispute)
    return data
