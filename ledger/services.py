"""Recording money movements. Called inside the saga's transition commit."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db.models import Sum

from common import rows
from config.transactions import in_transaction

from .models import EntryKind, LedgerEntry


def ledger_record(
    *,
    intent_id: str,
    kind: EntryKind,
    amount: int,
    currency: str,
    saga_id: uuid.UUID,
    event_id: int,
    now: datetime,
    gateway_reference: str = "",
    note: str = "",
    override: bool = False,
    refund_id: uuid.UUID | None = None,
) -> LedgerEntry:
    if not in_transaction():
        raise RuntimeError("ledger_record belongs inside the transition's transaction")
    if kind == EntryKind.REFUND and amount > 0:
        raise ValueError("a refund is an inverse entry: its amount must be negative")
    return rows.create(
        LedgerEntry(
            intent_id=intent_id,
            kind=kind,
            amount=amount,
            currency=currency,
            saga_id=saga_id,
            event_id=event_id,
            gateway_reference=gateway_reference,
            note=note,
            override=override,
            created_at=now,
            refund_id=refund_id,
        )
    )


def ledger_record_charges(entries: list[LedgerEntry]) -> int:
    """:func:`ledger_record` of charges (the ``CHARGE`` entries of a charge
    burst's confirmations), built by the caller, in one statement inside the
    transition's transaction; how many were written."""
    if not in_transaction():
        raise RuntimeError("ledger_record belongs inside the transition's transaction")
    if any(entry.kind != EntryKind.CHARGE or entry.amount < 0 for entry in entries):
        raise ValueError("ledger_record_charges writes charges, each of a positive amount")
    return rows.insert(entries)


def ledger_net(*, intent_id: str) -> int:
    return LedgerEntry.objects.filter(intent_id=intent_id).aggregate(n=Sum("amount"))["n"] or 0


def ledger_has_charge(*, intent_id: str) -> bool:
    return LedgerEntry.objects.filter(intent_id=intent_id, kind=EntryKind.CHARGE).exists()
