"""Reads. Views and serializers ask here; nothing here writes."""

from __future__ import annotations

from django.db.models import Count, Exists, F, OuterRef, Prefetch, Q, QuerySet

from ledger.models import EntryKind, LedgerEntry

from .models import (
    Dispute,
    Event,
    EventStatus,
    PurchaseSaga,
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
    if not Event.objects.filter(pk=event_id, status=EventStatus.ON_SALE).exists():
        return None
    return Seat.objects.filter(event_id=event_id).order_by("section", "row", "number")


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

    With what the buyer's history needs (``buyer_history``), in the same
    queries whatever its length: the moves only (``moves``; a note, from ==
    to, is not a move and stays in the admin) and whether the ledger has a
    refund (``has_refund``).
    """
    return (
        _with_seats(PurchaseSaga.objects.filter(buyer=user, pk=saga_id))
        .annotate(
            has_refund=Exists(
                LedgerEntry.objects.filter(intent_id=OuterRef("intent_id"), kind=EntryKind.REFUND)
            )
        )
        .prefetch_related(
            Prefetch(
                "history",
                queryset=SagaHistory.objects.exclude(from_state=F("to_state")).order_by("at", "id"),
                to_attr="moves",
            )
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
    ("refunded", "the ledger holds the charge and its refund"),
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


def payment_status(*, state: str, has_charge: bool, has_refund: bool) -> str:
    """The payment status from the ledger's entries and the saga's state
    (the admin's list passes annotations; ``saga_payment_status`` reads)."""
    if has_refund:
        return "refunded"
    if has_charge:
        return "captured"
    return _BEFORE_THE_LEDGER.get(SagaState(state), "not_captured")


def saga_payment_status(saga: PurchaseSaga) -> str:
    kinds = set(LedgerEntry.objects.filter(intent_id=saga.intent_id).values_list("kind", flat=True))
    return payment_status(
        state=saga.state, has_charge=EntryKind.CHARGE in kinds, has_refund=EntryKind.REFUND in kinds
    )
