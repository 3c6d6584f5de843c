"""Reads. Views and serializers ask here; nothing here writes."""

from __future__ import annotations

import functools

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import (
    BigIntegerField,
    Count,
    Exists,
    F,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
)

from common import rows
from common.money import format_money
from ledger.models import EntryKind, LedgerEntry

from .models import (
    Dispute,
    Event,
    EventStatus,
    PurchaseSaga,
    Refund,
    RefundStatus,
    Reservation,
    ReservationSeat,
    SagaHistory,
    Seat,
    SeatStatus,
)
from .saga.states import SagaState


def event_list() -> QuerySet[Event]:
    """The public catalog: every organizer's events on sale (a draft is its
    seller's alone, a cancelled one sells nothing)."""
    return (
        Event.objects.filter(status=EventStatus.ON_SALE)
        .select_related("organizer")
        .annotate(seats_available=Count("seats", filter=Q(seats__status=SeatStatus.AVAILABLE)))
        .order_by("starts_at", "id")
    )


def event_seats(*, event_id: int) -> QuerySet[Seat] | None:
    """The seat map of an event on sale, by section, row and number; None
    for a draft, a cancelled or a missing event (the same 404)."""
    if not event_on_sale(event_id):
        return None
    return Seat.objects.filter(event_id=event_id).order_by("section", "row", "number")


def event_on_sale(event_id: int) -> bool:
    """Whether the event is on sale: its seat map is shown (a draft, a
    cancelled or a missing event is the same 404)."""
    return Event.objects.filter(pk=event_id, status=EventStatus.ON_SALE).exists()


def _with_seats(qs: QuerySet[PurchaseSaga]) -> QuerySet[PurchaseSaga]:
    return qs.select_related("reservation").prefetch_related(
        Prefetch(
            "reservation__seat_links",
            queryset=ReservationSeat.objects.select_related("seat").order_by("id"),
            to_attr="links",
        )
    )


def purchase_list(*, user) -> QuerySet[PurchaseSaga]:
    return _with_seats(PurchaseSaga.objects.filter(buyer=user).order_by("-created_at", "-id"))


def purchase_get(*, user, saga_id) -> PurchaseSaga | None:
    """The caller's purchase, or None (another user's is as missing as a missing one).

    With what its answer needs, in the same queries whatever its length: the
    buyer's history (``buyer_history``: the moves only, ``moves``, a note,
    from == to, being no move and staying in the admin; whether the ledger
    has a refund, ``has_refund``), the ledger's word on the payment
    (``ledger_charged``, ``ledger_refunded``: :func:`ledger_sums`), its
    event (the cancellation policy) and its refund rows (``refund_rows``,
    oldest first).
    """
    return (
        _with_seats(PurchaseSaga.objects.filter(buyer=user, pk=saga_id))
        .select_related("event")
        .annotate(
            has_refund=Exists(
                LedgerEntry.objects.filter(intent_id=OuterRef("intent_id"), kind=EntryKind.REFUND)
            ),
            **ledger_sums(),
        )
        .prefetch_related(
            Prefetch(
                "history",
                queryset=SagaHistory.objects.exclude(from_state=F("to_state")).order_by("at", "id"),
                to_attr="moves",
            ),
            Prefetch(
                "refunds",
                queryset=Refund.objects.order_by("created_at", "id"),
                to_attr="refund_rows",
            ),
        )
        .first()
    )


def purchase_version(*, user, saga_id) -> tuple[int, str] | None:
    """The version and state of the caller's purchase, or None (another
    user's is as missing as a missing one). One indexed query: what the
    purchase page's poll compares its ETag with before anything is rendered
    (docs/api.md, "Pages for buyers")."""
    return (
        PurchaseSaga.objects.filter(buyer=user, pk=saga_id).values_list("version", "state").first()
    )


def saga_dispute(saga: PurchaseSaga) -> Dispute | None:
    """The purchase's latest dispute (a chargeback), or None: one indexed
    read, by the saga and its event (its shard)."""
    return (
        Dispute.objects.filter(saga_id=saga.pk, event_id=saga.event_id)
        .order_by("-created_at", "-id")
        .first()
    )


def saga_seat_refs(saga: PurchaseSaga) -> list[str]:
    links = getattr(saga.reservation, "links", None)
    if links is None:
        links = saga.reservation.seat_links.select_related("seat").order_by("id")
    return [link.seat.ref for link in links]


# The payment statuses a purchase shows (the API's PaymentStatus enum).
PAYMENT_STATUSES = [
    ("captured", "the ledger holds the charge"),
    ("partially_refunded", "the ledger holds the charge and refunds of part of it"),
    ("refunded", "the ledger holds the charge and refunds of all of it"),
    ("not_started", "PENDING: no charge attempted yet"),
    ("processing", "CHARGING: the charge is on its way"),
    ("requires_action", "REQUIRES_ACTION: waiting for the buyer's authentication; nothing charged"),
    ("unknown", "UNKNOWN, UNKNOWN_EXPIRED: we are finding out whether the charge landed"),
    (
        "not_captured",
        "any other state without a charge in the ledger (declined, expired, "
        "cancelled before any charge)",
    ),
]
# Before the ledger has a word on it, the state tells.
_BEFORE_THE_LEDGER = {
    SagaState.PENDING: "not_started",
    SagaState.CHARGING: "processing",
    SagaState.REQUIRES_ACTION: "requires_action",
    SagaState.UNKNOWN: "unknown",
    SagaState.UNKNOWN_EXPIRED: "unknown",
}


def _ledger_sum(kind: EntryKind) -> Subquery:
    entries = (
        LedgerEntry.objects.filter(intent_id=OuterRef("intent_id"), kind=kind)
        .order_by()
        .values("intent_id")
        .annotate(n=Sum("amount"))
        .values("n")
    )
    return Subquery(entries, output_field=BigIntegerField())


def ledger_sums() -> dict[str, Subquery]:
    """Annotations of a saga queryset: the ledger's charge of the purchase
    (``ledger_charged``) and its refunds, negative (``ledger_refunded``),
    each null when there is no such entry. What :func:`payment_status` and
    the ``refunded`` amount read, in the page's one query (the admin's list,
    ``purchase_get``)."""
    return {
        "ledger_charged": _ledger_sum(EntryKind.CHARGE),
        "ledger_refunded": _ledger_sum(EntryKind.REFUND),
    }


def payment_status(*, state: str, charged: int | None, refunded: int | None) -> str:
    """The payment status from the ledger's sums (``charged``: its charge
    entries, ``refunded``: its refund entries, negative; None when there is
    none) and the saga's state. Refunds of less than the charge:
    ``partially_refunded``."""
    if refunded is not None:
        if charged is not None and -refunded < charged:
            return "partially_refunded"
        return "refunded"
    if charged is not None:
        return "captured"
    return _BEFORE_THE_LEDGER.get(SagaState(state), "not_captured")


def _ledger_of(saga: PurchaseSaga) -> tuple[int | None, int | None]:
    """(charged, refunded) of :func:`ledger_sums`: the annotations when the
    queryset has them, else read here."""
    if hasattr(saga, "ledger_charged"):
        return saga.ledger_charged, saga.ledger_refunded  # type: ignore[attr-defined]
    sums = LedgerEntry.objects.filter(intent_id=saga.intent_id).aggregate(
        charged=Sum("amount", filter=Q(kind=EntryKind.CHARGE)),
        refunded=Sum("amount", filter=Q(kind=EntryKind.REFUND)),
    )
    return sums["charged"], sums["refunded"]


def saga_payment_status(saga: PurchaseSaga) -> str:
    charged, refunded = _ledger_of(saga)
    return payment_status(state=saga.state, charged=charged, refunded=refunded)


def saga_refunded(saga: PurchaseSaga) -> int:
    """What the ledger holds as given back to the buyer (refunds, whatever
    made them: a refund row that succeeded, or a compensation), positive."""
    return -(_ledger_of(saga)[1] or 0)


def saga_refund_rows(saga: PurchaseSaga) -> list[Refund]:
    """The purchase's refunds, oldest first (``purchase_get`` prefetches
    them; else read here, by the saga and its event)."""
    prefetched = getattr(saga, "refund_rows", None)
    if prefetched is not None:
        return prefetched
    return list(
        Refund.objects.filter(saga_id=saga.pk, event_id=saga.event_id).order_by("created_at", "id")
    )


def saga_seats_left(saga: PurchaseSaga) -> list[str]:
    """The refs of the purchase's seats that no refund (but a failed one)
    names, none released, while something is left to refund: what a buyer
    could still cancel. Read from what ``purchase_get`` prefetches."""
    live = [r for r in saga_refund_rows(saga) if r.status != RefundStatus.FAILED]
    if sum(r.amount for r in live) >= saga.amount:
        return []
    taken = {ref for r in live for ref in r.seats}
    links = getattr(saga.reservation, "links", None)
    if links is None:
        links = saga.reservation.seat_links.select_related("seat").order_by("id")
    return [
        link.seat.ref for link in links if link.released_at is None and link.seat.ref not in taken
    ]


@functools.cache
def _refund_email_sql() -> str:
    """The refund with its purchase's id, reservation ref and buyer, in one
    statement: every refund's email reads it, on the refunds' pool, where
    building the two ORM queries it replaces cost a tenth of the pool's CPU
    (docs/performance.md, "Statements written once")."""
    return (
        f"SELECT {', '.join(rows.columns(Refund, 'r'))}, s.id, res.ref, u.username, u.email"
        f" FROM {Refund._meta.db_table} r"
        f" JOIN {PurchaseSaga._meta.db_table} s ON s.id = r.saga_id AND s.event_id = r.event_id"
        f" JOIN {Reservation._meta.db_table} res"
        " ON res.id = s.reservation_id AND res.event_id = s.event_id"
        f" JOIN {get_user_model()._meta.db_table} u ON u.id = s.buyer_id"
        " WHERE r.id = %s AND r.event_id = %s"
    )


def refund_email_facts(*, refund_id, event_id: int) -> dict:
    """What a refund's email says: the amount, the seats, the buyer's
    sentence, the reservation, to whom (one read)."""
    with connection.cursor() as cursor:
        cursor.execute(_refund_email_sql(), [Refund._meta.pk.to_python(refund_id), event_id])
        row = cursor.fetchone()
    if row is None:
        raise Refund.DoesNotExist(f"no refund {refund_id} of event {event_id}")
    cut = rows.width(Refund)
    refund = rows.instance(Refund, row[:cut], db=connection.alias)
    saga_id, reservation, username, email = row[cut:]
    return {
        "refund_id": str(refund.pk),
        "saga_id": str(saga_id),
        "reservation": reservation,
        "buyer": {"username": username, "email": email},
        "amount_display": format_money(refund.amount, refund.currency),
        "seats": list(refund.seats),
        "public_reason": refund.public_reason,
    }
