"""Money: per intent, at most one charge at the gateway, the gateway's net
captured equals the ledger's net, a CONFIRMED saga has exactly one charge
entry and a COMPENSATED one nets zero, and an operator's override agrees with
the gateway once it can be asked.

The gateway's net is its charges (``succeeded``, or ``refunded`` once every
cent of one went back) less its succeeded refunds (``list_refunds``): a
charge partly refunded stays ``succeeded``, so its status alone does not say
what the processor kept. A confirmed purchase's refunds (rows of their own)
are judged in ``refunds``.

A dispute's entries (``dispute``, ``dispute_reversal``: purchases/disputes.py)
are the bank's money, not the processor's capture: they are kept apart
(``disputed``) and judged by none of these rules."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count, Q, Sum

from ledger.models import EntryKind, LedgerEntry
from payments.interface import GatewayCharge, GatewayRefund

from ...models import PurchaseSaga
from ...saga.states import SagaState
from .report import (
    CONFIRMED_HAS_ONE_CHARGE_ENTRY,
    LEDGER_EQUALS_GATEWAY,
    ONE_CHARGE_PER_INTENT,
    OVERRIDE_AGREES_WITH_GATEWAY,
)

S = SagaState
_DISPUTE_KINDS = (EntryKind.DISPUTE, EntryKind.DISPUTE_REVERSAL)


@dataclass
class Ledger:
    net: int = 0
    charges: int = 0
    refunds: int = 0
    others: int = 0
    overrides: int = 0
    # The net of the dispute entries (withdrawn, and reinstated if won).
    disputed: int = 0


def ledger_for(intent_ids: list[str]) -> dict[str, Ledger]:
    ledger: dict[str, Ledger] = defaultdict(Ledger)
    for intent_id, kind, n, total, overrides in (
        LedgerEntry.objects.filter(intent_id__in=intent_ids)
        .values("intent_id", "kind")
        .annotate(
            n=Count("id"), total=Sum("amount"), overrides=Count("id", filter=Q(override=True))
        )
        .values_list("intent_id", "kind", "n", "total", "overrides")
    ):
        entry = ledger[intent_id]
        if kind in _DISPUTE_KINDS:
            entry.disputed += total or 0
            continue
        entry.net += total or 0
        entry.overrides += overrides
        if kind == EntryKind.CHARGE:
            entry.charges += n
        elif kind == EntryKind.REFUND:
            entry.refunds += n
        else:
            entry.others += n
    return dict(ledger)


# A charge that holds money, or held it and went back in full (the refunds say how much).
_CAPTURED = ("succeeded", "refunded")


def charged(charges: list[GatewayCharge]) -> int:
    """What the processor captured on the intent, refunded since or not."""
    return sum(c.amount for c in charges if c.status in _CAPTURED)


def gateway_net(charges: list[GatewayCharge], refunds: list[GatewayRefund]) -> int:
    """What the processor keeps: its captures less its succeeded refunds."""
    return charged(charges) - sum(r.amount for r in refunds if r.status == "succeeded")


def check_money(
    ctx,
    saga: PurchaseSaga,
    entries: Ledger,
    charges: list[GatewayCharge] | None,
    refunds: list[GatewayRefund] | None,
    *,
    settled: bool,
) -> None:
    """``settled``: not moving (a finished saga with no refund in flight, or
    an old one): a live one may disagree for a moment (charged, answer not
    yet recorded)."""
    if charges is None or refunds is None:
        ctx.unverified(saga.pk, saga.intent_id, override=bool(entries.overrides))
        return
    captured = gateway_net(charges, refunds)
    if entries.overrides and settled and captured != entries.net:
        # Named for what it is (not a plain ledger mismatch): money an
        # operator wrote on their own word, which the gateway contradicts.
        ctx.flag(
            OVERRIDE_AGREES_WITH_GATEWAY,
            saga.pk,
            saga.intent_id,
            f"an operator's override wrote ledger net {entries.net}; the gateway's "
            f"net captured is {captured} (saga {saga.state})",
        )
        return
    if len(charges) > 1:
        ctx.flag(
            ONE_CHARGE_PER_INTENT,
            saga.pk,
            saga.intent_id,
            f"{len(charges)} charges at the gateway: "
            + ", ".join(f"{c.id} {c.amount} {c.status}" for c in charges),
        )
    if settled and captured != entries.net:
        ctx.flag(
            LEDGER_EQUALS_GATEWAY,
            saga.pk,
            saga.intent_id,
            f"ledger net {entries.net} != gateway net captured {captured} (saga {saga.state})",
        )


def check_entries(ctx, saga: PurchaseSaga, entries: Ledger) -> None:
    # Its refund entries are its refund rows' (refunds.check_refund_entries).
    if saga.state == S.CONFIRMED and (entries.charges != 1 or entries.others):
        ctx.flag(
            CONFIRMED_HAS_ONE_CHARGE_ENTRY,
            saga.pk,
            saga.intent_id,
            f"CONFIRMED with {entries.charges} charge and {entries.others} other ledger entries",
        )
    elif saga.state == S.COMPENSATED and entries.net != 0:
        ctx.flag(
            CONFIRMED_HAS_ONE_CHARGE_ENTRY,
            saga.pk,
            saga.intent_id,
            f"COMPENSATED but the ledger nets {entries.net}",
        )


def check_ledger_without_saga(ctx) -> None:
    orphans: dict[str, dict] = {}
    for intent_id, saga_id, total in (
        LedgerEntry.objects.exclude(intent_id__in=PurchaseSaga.objects.values("intent_id"))
        .values("intent_id", "saga_id")
        .annotate(total=Sum("amount"))
        .values_list("intent_id", "saga_id", "total")
    ):
        row = orphans.setdefault(intent_id, {"saga_id": saga_id, "net": 0})
        row["net"] += total or 0
    for intent_id, row in orphans.items():
        charges = ctx.list_charges(intent_id)
        refunds = ctx.list_refunds(intent_id) if charges and charged(charges) else []
        if charges is None or refunds is None:
            ctx.unverified(row["saga_id"], intent_id)
            continue
        if len(charges) > 1:
            ctx.flag(
                ONE_CHARGE_PER_INTENT,
                row["saga_id"],
                intent_id,
                f"{len(charges)} charges at the gateway",
            )
        captured = gateway_net(charges, refunds)
        if captured != row["net"]:
            ctx.flag(
                LEDGER_EQUALS_GATEWAY,
                row["saga_id"],
                intent_id,
                f"ledger net {row['net']} != gateway net captured {captured} "
                "(ledger entries of an intent no saga has)",
            )
