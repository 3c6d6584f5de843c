"""The catalog's two answers, one body for the API and the buyer pages
(docs/api.md, "Catalog" and "Pages for buyers").

Built from the selectors by the API's serializers and served from the
availability cache (``purchases/availability.py``): both readers share one
cache entry per event, so they must build exactly the same bytes, and they
build them here.
"""

from __future__ import annotations

from collections.abc import Collection

from rest_framework.renderers import JSONRenderer

from . import availability, selectors
from .serializers import EventSerializer, SeatSerializer


def event_list_body() -> bytes:
    return JSONRenderer().render(EventSerializer(selectors.event_list(), many=True).data)


def event_seats_body(event_id: int) -> bytes | None:
    seats = selectors.event_seats(event_id=event_id)
    return None if seats is None else JSONRenderer().render(SeatSerializer(seats, many=True).data)


def event_list(*, held: Collection[str] = ()) -> availability.Catalog:
    """Every event with its seats available; ``held``: the client's ETags."""
    return availability.cached_event_list(build=event_list_body, held=held)


def event_seats(*, event_id: int, held: Collection[str] = ()) -> availability.Catalog | None:
    """The seats of ``event_id`` (None: no such event)."""
    return availability.cached_event_seats(
        event_id=event_id, build=lambda: event_seats_body(event_id), held=held
    )
