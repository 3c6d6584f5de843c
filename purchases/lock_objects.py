"""The only module that takes row locks for purchases.

Lock order, everywhere: event -> reservation -> saga -> seats, each by primary
key. Two transactions that need the same rows take them in the same order, so
they queue instead of deadlocking. The start transaction takes seats only; the
saga steps take the saga, then its seats.
"""

from django.db.models import QuerySet

from .models import PurchaseSaga, Seat


def seats_for_update(*, event_id: int, seat_ids: list[int]) -> list[Seat]:
    return list(
        Seat.objects.select_for_update(of=("self",))
        .filter(event_id=event_id, id__in=seat_ids)
        .order_by("id")
    )


def saga_for_update(*, saga_id) -> PurchaseSaga:
    return PurchaseSaga.objects.select_for_update(of=("self",)).get(pk=saga_id)


def saga_for_update_skip_locked(*, saga_ids) -> QuerySet[PurchaseSaga]:
    """For sweepers: a saga someone else holds is someone else's to drive."""
    return PurchaseSaga.objects.select_for_update(of=("self",), skip_locked=True).filter(
        pk__in=saga_ids
    )
