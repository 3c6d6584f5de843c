"""Money back to a confirmed purchase (docs/refunds.md): its refund rows, the
ledger's refund entries and the processor's refunds agree.

- ``refund_entry_mismatch``: a CONFIRMED saga's refund entries each name
  (``refund_id``) one of its succeeded refund rows, for that row's amount,
  and every succeeded row has exactly one entry; a saga that never was
  CONFIRMED has no refund row, and no entry naming one (its compensation's
  refund is the saga's own entry, ``refund:<intent_id>``);
- ``refund_exceeds_charge``: the rows that give money back or still owe it
  (pending, succeeded) add up to at most the purchase's amount, and its
  ledger never nets below zero;
- ``refund_twice_at_processor``: the processor holds at most one refund per
  refund id of ours (a second one is money given back twice);
- the processor's succeeded refunds add up to the ledger's refund entries
  (``ledger_equals_gateway``, beside the net it already compares);
- a refund still pending past its deadline (``REFUND_CHASE_SECONDS``) is
  named by an alert (``no_silent_stuck``): the chaser raises it.

Set-based per chunk of sagas: their refund rows (one statement, read before
the ledger: a refund's entry is written in the commit that marks its row
succeeded) and, once the gateway has been asked, their fingerprints again
(one statement): a saga whose refunds moved meanwhile is left to the next
run, as one whose version moved. A refund never moves its saga, so the
version alone would not say it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings

from ledger.models import EntryKind, LedgerEntry
from outbox.models import OutboxMessage
from payments.interface import GatewayRefund

from ...models import PurchaseSaga, Refund, RefundSource, RefundStatus
from ...saga.states import SagaState
from ...saga.topics import Topic
from .context import AuditContext
from .report import (
    LEDGER_EQUALS_GATEWAY,
    NO_SILENT_STUCK,
    REFUND_ENTRY_MISMATCH,
    REFUND_EXCEEDS_CHARGE,
    REFUND_TWICE_AT_PROCESSOR,
)

S = SagaState
R = RefundStatus


@dataclass(frozen=True)
class RefundRow:
    id: str
    amount: int
    status: str
    source: str
    seats: tuple[str, ...]
    released: bool
    created_at: datetime
    updated_at: datetime
    settled_at: datetime | None


@dataclass
class SagaRefunds:
    """One saga's refund rows and its ledger's refund entries."""

    rows: list[RefundRow] = field(default_factory=list)
    # (refund id or None for the saga's own refund, amount) per entry
    entries: list[tuple[str | None, int]] = field(default_factory=list)

    def total(self, *statuses: str) -> int:
        return sum(r.amount for r in self.rows if r.status in statuses)

    @property
    def pending(self) -> list[RefundRow]:
        return [r for r in self.rows if r.status == R.PENDING]

    def succeeded_in_order(self) -> list[RefundRow]:
        done = [r for r in self.rows if r.status == R.SUCCEEDED and r.settled_at is not None]
        return sorted(done, key=lambda r: (r.settled_at, r.id))

    def has_buyer_refund(self) -> bool:
        return any(r.source == RefundSource.BUYER for r in self.rows)


_FIELDS = (
    "saga_id",
    "id",
    "amount",
    "status",
    "source",
    "seats",
    "released",
    "created_at",
    "updated_at",
    "settled_at",
)


def refunds_for(chunk: list[PurchaseSaga]) -> dict:
    """saga id -> :class:`SagaRefunds`, its rows only (read before the ledger)."""
    out: dict = defaultdict(SagaRefunds)
    for saga_id, pk, amount, status, source, seats, released, created, updated, settled in (
        Refund.objects.filter(saga_id__in=[s.pk for s in chunk]).order_by().values_list(*_FIELDS)
    ):
        out[saga_id].rows.append(
            RefundRow(
                str(pk),
                amount,
                status,
                source,
                tuple(seats or ()),
                released,
                created,
                updated,
                settled,
            )
        )
    return out


def read_refund_entries(chunk: list[PurchaseSaga], refunds: dict) -> None:
    """The chunk's refund entries, one statement, into ``refunds``."""
    by_intent = {s.intent_id: s.pk for s in chunk}
    for intent_id, refund_id, amount in (
        LedgerEntry.objects.filter(intent_id__in=list(by_intent), kind=EntryKind.REFUND)
        .order_by()
        .values_list("intent_id", "refund_id", "amount")
    ):
        refunds[by_intent[intent_id]].entries.append(
            (str(refund_id) if refund_id else None, -amount)
        )


def refund_fingerprints(saga_ids: list) -> dict:
    """saga id -> its refund rows' (id, status, updated_at), to tell whether
    they moved while the gateway was asked."""
    out: dict = defaultdict(set)
    for saga_id, pk, status, updated in (
        Refund.objects.filter(saga_id__in=saga_ids)
        .order_by()
        .values_list("saga_id", "id", "status", "updated_at")
    ):
        out[saga_id].add((str(pk), status, updated))
    return out


def fingerprint(refunds: SagaRefunds) -> set:
    return {(r.id, r.status, r.updated_at) for r in refunds.rows}


def refund_alerts(ctx: AuditContext, refunds: dict) -> set[str]:
    """The ids of the pending refunds past their deadline that an alert names
    (the chaser's ``refund-late:<id>``); one statement, only when there are any."""
    late = {r.id: saga_id for saga_id, f in refunds.items() for r in f.pending if _late(ctx, r)}
    if not late:
        return set()
    keys = OutboxMessage.objects.filter(
        saga_id__in=set(late.values()), topic=Topic.NEEDS_OPERATOR, key__contains=":refund-"
    ).values_list("key", flat=True)
    return {key.rpartition(":")[2] for key in keys if key}


def _late(ctx: AuditContext, row: RefundRow) -> bool:
    deadline = row.created_at + timedelta(seconds=settings.REFUND_CHASE_SECONDS)
    # The usual grace: the chaser's timer may be a little behind.
    return deadline <= ctx.cutoff


def in_flight(ctx: AuditContext, refunds: SagaRefunds) -> bool:
    """A pending refund before its deadline: the processor may have settled
    it and our look-up not have come yet, so the money is still moving."""
    return any(not _late(ctx, r) for r in refunds.pending)


# --- the checks ---------------------------------------------------------------------


def check_refund_entries(ctx: AuditContext, saga: PurchaseSaga, refunds: SagaRefunds) -> None:
    def flag(invariant: str, detail: str) -> None:
        ctx.flag(invariant, saga.pk, saga.intent_id, detail)

    if saga.state != S.CONFIRMED:
        named = [refund_id for refund_id, _ in refunds.entries if refund_id]
        if refunds.rows or named:
            flag(
                REFUND_ENTRY_MISMATCH,
                f"{saga.state} (never confirmed) but {len(refunds.rows)} refund row(s) and "
                f"{len(named)} ledger entr(ies) naming one",
            )
        return
    for why in _entry_mismatches(refunds):
        flag(REFUND_ENTRY_MISMATCH, why)
    owed = refunds.total(R.PENDING, R.SUCCEEDED)
    if owed > saga.amount:
        flag(
            REFUND_EXCEEDS_CHARGE,
            f"refunds pending or succeeded add up to {owed}, more than the {saga.amount} paid",
        )


def _entry_mismatches(refunds: SagaRefunds) -> list[str]:
    succeeded = {r.id: r for r in refunds.rows if r.status == R.SUCCEEDED}
    entries = Counter(refund_id for refund_id, _ in refunds.entries)
    why = []
    for refund_id, amount in refunds.entries:
        row = succeeded.get(refund_id) if refund_id else None
        if refund_id is None:
            why.append(f"a refund entry of {amount} names no refund row")
        elif row is None:
            why.append(f"a refund entry of {amount} names refund {refund_id}, not a succeeded one")
        elif row.amount != amount:
            why.append(f"refund {refund_id} of {row.amount} has an entry of {amount}")
    for refund_id in succeeded:
        if entries[refund_id] != 1:
            why.append(f"succeeded refund {refund_id} has {entries[refund_id]} ledger entries")
    return why


def check_ledger_not_negative(ctx: AuditContext, saga: PurchaseSaga, net: int) -> None:
    if saga.state == S.CONFIRMED and net < 0:
        ctx.flag(
            REFUND_EXCEEDS_CHARGE,
            saga.pk,
            saga.intent_id,
            f"the ledger nets {net}: more refunded than charged",
        )


def check_refund_twice(
    ctx: AuditContext, saga: PurchaseSaga, at_gateway: list[GatewayRefund]
) -> None:
    """At most one refund at the processor per refund id of ours."""
    made = Counter(r.refund_id for r in at_gateway if r.refund_id)
    for refund_id in sorted(refund_id for refund_id, n in made.items() if n > 1):
        ctx.flag(
            REFUND_TWICE_AT_PROCESSOR,
            saga.pk,
            saga.intent_id,
            f"the processor holds {made[refund_id]} refunds under our refund id {refund_id}: "
            + ", ".join(
                f"{r.id} {r.amount} {r.status}" for r in at_gateway if r.refund_id == refund_id
            ),
        )


def check_refund_totals(
    ctx: AuditContext,
    saga: PurchaseSaga,
    refunds: SagaRefunds,
    at_gateway: list[GatewayRefund],
) -> bool:
    """The processor's succeeded refunds add up to the ledger's refund
    entries (a settled saga's); True when they do not (named: the net's
    comparison would repeat it)."""
    processor = sum(r.amount for r in at_gateway if r.status == R.SUCCEEDED)
    ledger = sum(amount for _, amount in refunds.entries)
    if processor == ledger:
        return False
    ctx.flag(
        LEDGER_EQUALS_GATEWAY,
        saga.pk,
        saga.intent_id,
        f"the ledger's refunds add up to {ledger}, the processor's succeeded refunds "
        f"to {processor} (saga {saga.state})",
    )
    return True


def check_refunds_alive(
    ctx: AuditContext, saga: PurchaseSaga, refunds: SagaRefunds, alerted: set[str]
) -> None:
    for row in refunds.pending:
        if _late(ctx, row) and row.id not in alerted:
            ctx.flag(
                NO_SILENT_STUCK,
                saga.pk,
                saga.intent_id,
                f"refund {row.id} of {row.amount} pending for {ctx.age(row.created_at)}, "
                "past its deadline, and no alert names it",
            )
