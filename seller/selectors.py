"""Reads of a seller's events (docs/api.md, "Events, seat maps and prices").

Every read takes the organizer: an event is found among the organizer's
own, so another organizer's event is answered exactly as a missing one
(:class:`~seller.errors.EventNotFound`).
"""

from __future__ import annotations

from django.db.models import Count, IntegerField, OuterRef, Prefetch, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce

from organizers.models import Organizer
from purchases.models import Event, PriceCategory, Seat

from .errors import EventNotFound


def _seat_count() -> Coalesce:
    # A subquery per event answered (a page), not a join grouped over every
    # seat of every event of the organizer.
    per_event = (
        Seat.objects.filter(event=OuterRef("pk"))
        .order_by()
        .values("event")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(per_event, output_field=IntegerField()), Value(0))


def events_of(*, organizer: Organizer) -> QuerySet[Event]:
    """The organizer's events, newest first (the last created on top: a
    draft just made is where its seller looks), each with ``seat_count``
    and its price categories (prefetched, in their order)."""
    return (
        Event.objects.filter(organizer=organizer)
        .annotate(seat_count=_seat_count())
        .prefetch_related(
            Prefetch("price_categories", queryset=PriceCategory.objects.order_by("id"))
        )
        .order_by("-id")
    )


def event_of(*, organizer: Organizer, event_id: int) -> Event:
    """The organizer's event ``event_id`` as :func:`events_of` has it;
    :class:`EventNotFound` when it has none by that id."""
    event = events_of(organizer=organizer).filter(pk=event_id).first()
    if event is None:
        raise EventNotFound()
    return event


def categories_of(*, event: Event) -> list[PriceCategory]:
    """The event's price categories, in the order they were given."""
    return list(PriceCategory.objects.filter(event=event).order_by("id"))


def seat_map_of(*, event: Event) -> QuerySet[Seat]:
    """The event's seats in the order the seat map gave them (their ids
    follow it: seller/services.py writes them in that order)."""
    return Seat.objects.filter(event=event).order_by("id")
