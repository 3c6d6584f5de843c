"""Reads. Views and serializers ask here; nothing here writes."""

from __future__ import annotations

from django.db.models import Count, Exists, F, OuterRef, Prefetch, Q, QuerySet

from ledger.models import EntryKind, LedgerEntry

from .models import Event, PurchaseSaga, ReservationSeat, SagaHistory, Seat, SeatStatus
from .saga.states import SagaState


def event_list() -> QuerySet[Event]:
    return Event.objects.annotate(
        seats_available=Count("seats", filter=Q(seats__status=SeatStatus.AVAILABLE))
    ).order_by("starts_at", "id")


def event_seats(*, event_id: int) -> QuerySet[Seat] | None:
    if not Event.objects.filter(pk=event_id).exists():
        return None
    return Seat.objects.filter(event_id=event_id).order_by("row", "number")


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
                LedgerEntry.objects.filter(intent_id=OuterRef("intent_id"),
                                           kind=EntryKind.REFUND)
            )
        )
        .prefetch_related(
            Prefetch(
                "history",
                queryset=SagaHistory.objects.exclude(from_state=F("to_state"))
                .order_by("at", "id"),
                to_attr="moves",
            )
        )
        .first()
    )


def saga_seat_refs(saga: PurchaseSaga) -> list[str]:
    links = getattr(saga.reservation, "links", None)
    if links is None:
        links = saga.reservation.seat_links.select_related("seat").order_by("id")
    return [link.seat.ref for link in links]


def saga_payment_status(saga: PurchaseSaga) -> str:
    kinds = set(LedgerEntry.objects.filter(intent_id=saga.intent_id).values_list("kind", flat=True))
    if EntryKind.REFUND in kinds:
        return "refunded"
    if EntryKind.CHARGE in kinds:
        return "captured"
    return {
        SagaState.PENDING: "not_started",
        SagaState.CHARGING: "processing",
        SagaState.UNKNOWN: "unknown",
        SagaState.UNKNOWN_EXPIRED: "unknown",
    }.get(SagaState(saga.state), "not_captured")
