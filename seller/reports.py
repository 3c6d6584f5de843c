"""What a seller reads about one event's sales (docs/api.md, "Sales and
reports"): its purchases (paged, filtered, searched; every row for the CSV
export), its seats by status, and its report: money from the ledger, sold
seats by price category.

Reads only. The caller has found the event in the organizer's scope
(``seller.selectors.event_of``); nothing here looks at who asks. What the
report's money means, exactly, and the auditor's invariant that holds it to
the ledger (``report_equals_ledger``, purchases/ops/audit/event_reports.py):

- ``gross``: the sum of the ledger's CHARGE entries of the event's purchases
  (the entries whose intent is one of the event's sagas' and that carry the
  event's id: the auditor checks the two name the same entries);
- ``refunded``: the sum of their REFUND entries, as a positive amount: a
  compensation's refund, and one entry per refund row that succeeded (a
  purchase may have several: docs/refunds.md, "The rows"); a refund still
  pending or one that failed gave nothing back and counts nothing;
- ``net``: ``gross - refunded``, the money the event keeps;
- ``by_category``: the seats sold now (status ``sold``) per price category,
  each with the sum of its seats' ``price_amount`` (a sold seat's price is
  the one it was sold at: a price change never rewrites a held or sold
  seat). Seats of no category are reported under the code ``""``.

For an event whose purchases have no refund row, the sum of
``by_category``'s ``gross`` equals ``net``: the seats sold are those of the
confirmed purchases, at the prices they paid, and a purchase undone keeps
nothing. A refund row breaks the equality by what it gives back beside the
seats it releases (the auditor leaves such purchases out of it): an amount,
or seats refunded and kept (they stay sold), makes ``net`` smaller than that
sum; a cancellation's fee, kept while its seats go back on sale, and a
refund still pending or failed whose seats were released make it larger.

A purchase's row answers what the ledger says of its money too: what it
gave back (``refunded_amount``) and the payment's status
(``purchases.selectors.payment_status``: ``partially_refunded`` while its
refunds are less than its charge, ``refunded`` when they reach it), since a
refund does not move the saga: a purchase refunded in full stays CONFIRMED.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

from django.db.models import (
    BigIntegerField,
    Count,
    F,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce

from ledger.models import EntryKind, LedgerEntry
from purchases.models import (
    Event,
    PriceCategory,
    PurchaseSaga,
    ReservationSeat,
    Seat,
    SeatStatus,
)
from purchases.saga.states import SagaState

# The states a purchase may be filtered by: the saga's (purchases/saga/states.py).
PURCHASE_STATES = tuple(state.value for state in SagaState)
# A search longer than any username, email, id or reference finds nothing.
SEARCH_MAX_CHARS = 254
# Rows per query when every row is read (the CSV export).
BATCH_SIZE = 500


class InvalidFilter(Exception):
    """A filter of the purchases that names nothing (``400 invalid``, the
    offending query parameter in ``field``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# --- purchases ----------------------------------------------------------------------------


def _ledger_sum(kind: EntryKind) -> Subquery:
    """The sum of the purchase's ledger entries of ``kind`` (refunds are
    negative), null when it has none: by intent and event (the ledger's
    index, and its shard), however many entries (one per refund row)."""
    entries = (
        LedgerEntry.objects.filter(
            intent_id=OuterRef("intent_id"), event_id=OuterRef("event_id"), kind=kind
        )
        .order_by()
        .values("intent_id")
        .annotate(total=Sum("amount"))
        .values("total")
    )
    return Subquery(entries, output_field=BigIntegerField())


def _ledger_money() -> dict:
    """Annotations of a purchase row: ``ledger_charged`` and
    ``ledger_refunded`` (what ``purchases.selectors.payment_status`` reads,
    named as ``purchases.selectors.ledger_sums`` names them) and
    ``refunded_amount``, the refunds as a positive amount, 0 when none."""
    return {
        "ledger_charged": _ledger_sum(EntryKind.CHARGE),
        "ledger_refunded": _ledger_sum(EntryKind.REFUND),
        "refunded_amount": Coalesce(-F("ledger_refunded"), 0, output_field=BigIntegerField()),
    }


def _search(text: str) -> Q:
    """Buyer username or email (case-insensitive contains), or exactly a
    purchase id or a reservation ref."""
    found = Q(buyer__username__icontains=text) | Q(buyer__email__icontains=text)
    # Refs are upper-case (purchases/saga/start.py, ``reservation_ref``).
    found |= Q(reservation__ref__in={text, text.upper()})
    try:
        found |= Q(pk=uuid.UUID(text))
    except ValueError:
        pass  # not an id: the other fields still match
    return found


def event_purchases(
    *, event: Event, status: str | None = None, search: str | None = None
) -> QuerySet[PurchaseSaga]:
    """The event's purchases, newest first, each with its ledger money
    annotated (``_ledger_money``), its buyer, and its seat refs read with it
    (``purchases.selectors.saga_seat_refs``): one query for the rows and one
    for their seats, however many rows. :class:`InvalidFilter` for a status
    that is not a saga state or a search no row could match."""
    purchases = PurchaseSaga.objects.filter(event=event)
    if status:  # an empty one (a form's "any status") filters nothing
        if status not in PURCHASE_STATES:
            raise InvalidFilter(
                "status", f"not a purchase status: one of {', '.join(PURCHASE_STATES)}"
            )
        purchases = purchases.filter(state=status)
    if search is not None and search.strip():
        text = search.strip()
        if len(text) > SEARCH_MAX_CHARS or "\x00" in text:
            # PostgreSQL cannot even compare a NUL byte: refused, not a 500.
            raise InvalidFilter(
                "search", f"at most {SEARCH_MAX_CHARS} characters, without NUL bytes"
            )
        purchases = purchases.filter(_search(text))
    return (
        purchases.select_related("buyer", "reservation")
        .prefetch_related(
            Prefetch(
                "reservation__seat_links",
                queryset=ReservationSeat.objects.select_related("seat").order_by("id"),
                to_attr="links",
            )
        )
        .annotate(**_ledger_money())
        .order_by("-created_at", "-id")
    )


def every_purchase(purchases: QuerySet[PurchaseSaga]) -> Iterator[PurchaseSaga]:
    """Every row of :func:`event_purchases`, in its order, ``BATCH_SIZE`` at
    a time: each batch is its own short query (by keyset, newest first), so
    that an export of any length holds neither a cursor nor the whole list."""
    after: PurchaseSaga | None = None
    while True:
        batch = purchases
        if after is not None:
            batch = batch.filter(
                Q(created_at__lt=after.created_at) | Q(created_at=after.created_at, pk__lt=after.pk)
            )
        rows = list(batch[:BATCH_SIZE])
        yield from rows
        if len(rows) < BATCH_SIZE:
            return
        after = rows[-1]


# --- seats and the report -----------------------------------------------------------------


def seat_status_counts(*, event: Event) -> dict[str, int]:
    """The event's seats by status, every status named (0 when none)."""
    counts = dict.fromkeys(SeatStatus.values, 0)
    for status, n in (
        Seat.objects.filter(event=event)
        .order_by()
        .values("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    ):
        counts[status] = n
    return counts


def _money(amount: int, event: Event) -> dict:
    return {"amount": amount, "currency": event.currency}


def _ledger_sums(event: Event) -> tuple[int, int]:
    """(charges, refunds) of the event's purchases in the ledger, refunds as
    a positive amount."""
    sums = LedgerEntry.objects.filter(
        event_id=event.pk,
        intent_id__in=PurchaseSaga.objects.filter(event_id=event.pk).values("intent_id"),
    ).aggregate(
        charges=Coalesce(Sum("amount", filter=Q(kind=EntryKind.CHARGE)), 0),
        refunds=Coalesce(Sum("amount", filter=Q(kind=EntryKind.REFUND)), 0),
    )
    return sums["charges"], -sums["refunds"]


def _by_category(event: Event, sold: dict[str, tuple[int, int]]) -> list[dict]:
    """Every category of the event (its price categories in their order,
    then codes only seats name, ``""`` last), with its sold seats."""
    names = dict(
        PriceCategory.objects.filter(event=event).order_by("id").values_list("code", "name")
    )
    codes = list(names) + sorted(set(sold) - set(names), key=lambda code: (code == "", code))
    return [
        {
            "code": code,
            "name": names.get(code, ""),
            "sold": sold.get(code, (0, 0))[0],
            "gross": _money(sold.get(code, (0, 0))[1], event),
        }
        for code in codes
    ]


def event_report(*, event: Event) -> dict:
    """The event's report, in the API's shape (docs/api.md, "Sales and
    reports"): seats by status, the ledger's money for its purchases, sold
    seats by category (what each figure means: this module's docstring).
    Three queries."""
    seats = dict.fromkeys(SeatStatus.values, 0)
    sold: dict[str, tuple[int, int]] = {}
    for category, status, n, prices in (
        Seat.objects.filter(event=event)
        .order_by()
        .values("category", "status")
        .annotate(n=Count("id"), prices=Sum("price_amount"))
        .values_list("category", "status", "n", "prices")
    ):
        seats[status] += n
        if status == SeatStatus.SOLD:
            sold[category] = (n, prices)
        else:
            sold.setdefault(category, (0, 0))
    gross, refunded = _ledger_sums(event)
    return {
        "currency": event.currency,
        "seats": seats,
        "gross": _money(gross, event),
        "refunded": _money(refunded, event),
        "net": _money(gross - refunded, event),
        "by_category": _by_category(event, sold),
    }
