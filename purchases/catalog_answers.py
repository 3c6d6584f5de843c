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


# The seat map's fields, in the answer's order (``SeatSerializer``'s, which
# the schema is made of; tests/test_catalog_cache.py holds the two equal).
_SEAT_COLUMNS = ("ref", "section", "row", "number", "category", "x", "y", "accessible", "status")


def event_seats_body(event_id: int) -> bytes | None:
    """The seat map's body, built from the rows' values rather than through
    ``SeatSerializer`` one seat at a time: for a 20,000-seat map the
    serializer was 0.6 s of the 0.8 s a build took (docs/performance.md),
    and a build runs each time the availability moves."""
    seats = selectors.event_seats(event_id=event_id)
    if seats is None:
        return None
    rows = seats.values_list(*_SEAT_COLUMNS, "price_amount", "currency")
    body = []
    for row in rows:
        seat = dict(zip(_SEAT_COLUMNS, row[:-2], strict=True))
        seat["price"] = {"amount": row[-2], "currency": row[-1]}
        body.append(seat)
    return JSONRenderer().render(body)


def event_seats_serialized(event_id: int) -> bytes | None:
    """The same body through ``SeatSerializer`` (what the schema says), for
    the test that holds the two equal."""
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
