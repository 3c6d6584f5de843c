"""The seller's report of an event equals the ledger (docs/api.md, "Sales
and reports"; the report is seller/reports.py): ``report_equals_ledger``.

The report's ``gross``, ``refunded`` and ``net`` are the ledger's entries of
the event's purchases; its ``by_category`` is the event's sold seats at
their prices, and adds up to ``net``. That holds when, per event:

1. the ledger's entries carrying the event's id are exactly those of its
   purchases' intents (an entry of one event's purchase that carries another
   event's id moves money between two reports; the entries of an intent no
   saga has are ``ledger_equals_gateway``'s);
2. they are in the event's currency (the report states one);
3. the purchases whose seats are sold (their reservation CONFIRMED) and that
   no refund touched keep in the ledger exactly the prices of those seats
   (each sold seat's ``price_amount``, the price it was sold at);
4. the other purchases keep nothing, but for the COMPENSATED ones, which
   net zero (``confirmed_has_one_charge_entry``), the CONFIRMED ones whose
   reservation is not (``seat_sold_once``), and the ones being undone
   (COMPENSATING, COMPENSATION_PENDING: a charge that landed while the
   purchase was released, its refund owed and chased, ``no_silent_stuck``
   past its deadline): each fault is named once.

A confirmed purchase with a refund (docs/refunds.md: a part of its money,
some of its seats, or both, and a fee kept) is left out of (3), both its
money and its seats: what it keeps is its charge less its succeeded refunds,
which the refund checks hold to its refund rows (refunds.py). With
``seat_sold_once`` (a seat is sold exactly when a confirmed reservation
holds it), ``net`` = Σ (3) = Σ ``by_category.gross`` for an event without
refunds; with refunds they differ by what the refunds gave back beside the
seats they released.

Set-based, like the seat checks: a few statements over the whole tables,
whatever the number of events. Every commit that moves money, sells or
releases a seat moves a saga of the event too (its version), or a refund of
it (a refund never moves its saga: it is made, releasing seats, or settled,
writing its entry), so the event's sagas and refunds are fingerprinted
(their numbers, the sagas' versions, the refunds' statuses) before and
after the reads; an event whose fingerprint changed meanwhile is left to the
next run rather than judged on a mix of before and after.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from django.db.models import Count, Exists, OuterRef, Q, Subquery, Sum

from ledger.models import EntryKind, LedgerEntry

from ...models import (
    Event,
    PurchaseSaga,
    Refund,
    RefundStatus,
    ReservationSeat,
    ReservationStatus,
)
from ...saga.states import SagaState
from .context import AuditContext
from .report import REPORT_EQUALS_LEDGER

logger = logging.getLogger(__name__)

S = SagaState
# Money these keep is another invariant's to name (4. above).
_NAMED_ELSEWHERE = (S.CONFIRMED, S.COMPENSATED, S.COMPENSATING, S.COMPENSATION_PENDING)


@dataclass
class EventMoney:
    """One event's money, each side read its own way."""

    # kind -> the sum of the entries carrying the event's id (of some saga's intent)
    by_column: dict = field(default_factory=lambda: defaultdict(int))
    # kind -> the sum of the entries of the event's sagas' intents
    by_intent: dict = field(default_factory=lambda: defaultdict(int))
    # currency -> the sum of the entries of the event's sagas' intents in it
    currencies: dict = field(default_factory=lambda: defaultdict(int))
    # The ledger net of the purchases whose seats are sold, no refund theirs (3.)
    selling: int = 0
    # The prices of the seats they hold
    seat_prices: int = 0
    # The ledger net of the purchases that should keep none (4.)
    idle: int = 0


def check_event_reports(ctx: AuditContext) -> None:
    before = _fingerprints()
    money: dict[int, EventMoney] = defaultdict(EventMoney)
    _read_ledger(money)
    _read_seats(money)
    after = _fingerprints()
    moved = {pk for pk in money if before.get(pk) != after.get(pk)}
    if moved:
        logger.info(
            "audit: %d event(s) moved during the report check, left to the next run",
            len(moved),
            extra={"events": sorted(moved)},
        )
    currencies = dict(
        Event.objects.filter(pk__in=list(money)).values_list("pk", "currency").order_by()
    )
    for pk in sorted(set(money) - moved):
        _check_event(ctx, pk, currencies.get(pk, ""), money[pk])


def _fingerprints() -> dict[int, tuple]:
    """event id -> (its sagas, the sum of their versions, its refunds by
    status): every move bumps one version, every purchase adds a saga, every
    refund is made pending and settled once."""
    refunds = {
        pk: (n, done, failed)
        for pk, n, done, failed in Refund.objects.order_by()
        .values("event_id")
        .annotate(
            n=Count("pk"),
            done=Count("pk", filter=Q(status=RefundStatus.SUCCEEDED)),
            failed=Count("pk", filter=Q(status=RefundStatus.FAILED)),
        )
        .values_list("event_id", "n", "done", "failed")
    }
    return {
        pk: (n, versions, refunds.get(pk))
        for pk, n, versions in PurchaseSaga.objects.order_by()
        .values("event_id")
        .annotate(n=Count("pk"), versions=Sum("version"))
        .values_list("event_id", "n", "versions")
    }


def _read_ledger(money: dict[int, EventMoney]) -> None:
    """One statement: every ledger entry, grouped with what its intent's
    saga says (its event, its state, its reservation's status)."""
    # The intent id is unique everywhere by construction (it names its event:
    # purchases/saga/start.py), so one saga at most owns an entry.
    owner = PurchaseSaga.objects.filter(intent_id=OuterRef("intent_id"))
    rows = (
        LedgerEntry.objects.annotate(
            owner_event=Subquery(owner.values("event_id")[:1]),
            owner_state=Subquery(owner.values("state")[:1]),
            owner_reservation=Subquery(owner.values("reservation__status")[:1]),
            # The saga of an entry is its intent's (one saga per intent).
            owner_refunded=Exists(Refund.objects.filter(saga_id=OuterRef("saga_id"))),
        )
        .filter(owner_event__isnull=False)
        # A dispute's entries are the bank's money: the report (seller/reports.py)
        # shows charges and refunds, and the seats stay sold.
        .exclude(kind__in=[EntryKind.DISPUTE, EntryKind.DISPUTE_REVERSAL])
        .order_by()
        .values(
            "event_id",
            "owner_event",
            "owner_state",
            "owner_reservation",
            "owner_refunded",
            "kind",
            "currency",
        )
        .annotate(total=Sum("amount"))
    )
    for row in rows:
        total = row["total"] or 0
        money[row["event_id"]].by_column[row["kind"]] += total
        mine = money[row["owner_event"]]
        mine.by_intent[row["kind"]] += total
        mine.currencies[row["currency"]] += total
        if row["owner_reservation"] == ReservationStatus.CONFIRMED:
            if not row["owner_refunded"]:
                mine.selling += total
        elif row["owner_state"] not in _NAMED_ELSEWHERE:
            mine.idle += total


def _read_seats(money: dict[int, EventMoney]) -> None:
    """The prices of the seats the confirmed reservations hold, per event,
    but for the purchases a refund touched (3.)."""
    refunded = Refund.objects.filter(saga_id=OuterRef("reservation__saga__id"))
    for pk, prices in (
        ReservationSeat.objects.filter(
            released_at__isnull=True, reservation__status=ReservationStatus.CONFIRMED
        )
        .exclude(Exists(refunded))
        .order_by()
        .values("event_id")
        .annotate(prices=Sum("seat__price_amount"))
        .values_list("event_id", "prices")
    ):
        money[pk].seat_prices += prices or 0


def _check_event(ctx: AuditContext, pk: int, currency: str, money: EventMoney) -> None:
    def flag(detail: str) -> None:
        ctx.flag(REPORT_EQUALS_LEDGER, None, None, f"event {pk}: {detail}")

    for kind in (EntryKind.CHARGE, EntryKind.REFUND):
        column, intent = money.by_column[kind], money.by_intent[kind]
        if column != intent:
            flag(
                f"the ledger's {kind} entries carrying this event sum to {column}, those of "
                f"its purchases' intents to {intent}"
            )
    for other, amount in sorted(money.currencies.items()):
        if other != currency:
            flag(
                f"the ledger holds {amount} {other} for its purchases; the event and its "
                f"report are in {currency}"
            )
    if money.selling != money.seat_prices:
        flag(
            f"the ledger keeps {money.selling} for the purchases whose seats are sold, and "
            f"those seats are priced {money.seat_prices}: the report's net and its sales by "
            "category disagree"
        )
    if money.idle:
        flag(
            f"the ledger keeps {money.idle} for purchases that hold no sold seat and were "
            "neither confirmed nor undone"
        )
