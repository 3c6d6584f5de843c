"""The catalog's two answers, one body for the API and the buyer pages
(docs/api.md, "Catalog" and "Pages for buyers").

Built from the selectors by the API's serializers and served from the
availability cache (``purchases/availability.py``): both readers share one
cache entry per event, so they must build exactly the same bytes, and they
build them here.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Collection
from typing import NamedTuple

from django.db import connection
from rest_framework.renderers import JSONRenderer

from . import availability, selectors
from .models import Event, EventStatus, Seat
from .serializers import EventSerializer, SeatSerializer


def event_list_body() -> bytes:
    return JSONRenderer().render(EventSerializer(selectors.event_list(), many=True).data)


# The seat map's fields, in the answer's order (``SeatSerializer``'s, which
# the schema is made of; tests/test_catalog_cache.py holds the two equal).
_SEAT_COLUMNS = ("ref", "section", "row", "number", "category", "x", "y", "accessible", "status")
# Each seat's id, what its answer is made of but its status (the price's two
# columns last), and the status; none unless the event is on sale (its
# status read once, not per seat). ``{order}``: the map's order, or none (a
# build whose seats read as at the last one orders them as it did, by id,
# and spares PostgreSQL the sort: three quarters of the statement's time).
_SEATS_SQL = (
    'SELECT id, ref, section, "row", number, category, x, y, accessible, price_amount,'
    " currency, status FROM {seat} WHERE event_id = %s"
    " AND EXISTS (SELECT FROM {event} WHERE id = %s AND status = %s){order}"
)
_MAP_ORDER = ' ORDER BY section, "row", number'
# A status no seat can have (PostgreSQL's text holds no NUL): the map is
# rendered once with it in every seat's place, and the body cut around it.
_NO_STATUS = "\x00status\x00"
# The seats whose cut bodies a process keeps, over all events (about 0.4 kB
# each): the events read last are kept.
FRAGMENT_SEATS_MAX = 100_000


class _Cut(NamedTuple):
    """An event's seat map as last built: each seat's values but its status
    by id, the ids in the map's order, and the body rendered then, cut
    around each seat's status."""

    seats: dict[int, tuple]
    order: list[int]
    pieces: list[bytes]


# Event id -> its _Cut, oldest read first.
_cut: dict[int, _Cut] = {}
_cutting = threading.Lock()  # a web process's threads share _cut


def event_seats_body(event_id: int) -> bytes | None:
    """The seat map's body, built each time the availability moves (at every
    hold in an on-sale: docs/performance.md). Rendered once, through the
    same renderer, with a placeholder for each seat's status, and kept cut
    around them; a build reads the seats in one statement, unordered, and
    while they read as before but for their statuses, splices the statuses
    into the cut body in the order kept instead of rendering a thousand
    seats again: the same bytes (tests/test_catalog_cache.py). Otherwise
    (the first build, a seat added or changed) a second statement reads
    them in the map's order, and the body is rendered. The statement says
    whether the event is on sale; only when it finds no seat does another
    one ask."""
    found = _read_seats(event_id, ordered=False)
    seats = {row[0]: row[1:-1] for row in found}
    with _cutting:
        cut = _cut.get(event_id)
    if cut is None or cut.seats != seats:
        if found:
            found = _read_seats(event_id, ordered=True)
        cut = _Cut(
            seats={row[0]: row[1:-1] for row in found},
            order=[row[0] for row in found],
            pieces=_cut_body([row[1:-1] for row in found]),
        )
    if not found and not selectors.event_on_sale(event_id):
        return None  # not on sale (on sale, it may have no seat yet)
    _keep(event_id, cut)
    status_of = {row[0]: row[-1] for row in found}
    statuses = [_status(status_of[seat_id]) for seat_id in cut.order]
    return b"".join(
        part for pair in zip(cut.pieces, [*statuses, b""], strict=True) for part in pair
    )


def _read_seats(event_id: int, *, ordered: bool) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(_seats_sql(ordered), [event_id, event_id, EventStatus.ON_SALE])
        return cursor.fetchall()


@functools.cache
def _seats_sql(ordered: bool) -> str:
    return _SEATS_SQL.format(
        seat=Seat._meta.db_table,
        event=Event._meta.db_table,
        order=_MAP_ORDER if ordered else "",
    )


def _cut_body(seats: list[tuple]) -> list[bytes]:
    body = [
        {
            **dict(zip(_SEAT_COLUMNS[:-1], row[:-2], strict=True)),
            "status": _NO_STATUS,
            "price": {"amount": row[-2], "currency": row[-1]},
        }
        for row in seats
    ]
    return JSONRenderer().render(body).split(_status(_NO_STATUS))


@functools.cache
def _status(status: str) -> bytes:
    return JSONRenderer().render(status)


def _keep(event_id: int, cut: _Cut) -> None:
    """Keep the event's cut body as the last read, and forget the oldest
    while more than ``FRAGMENT_SEATS_MAX`` seats are kept."""
    with _cutting:
        _cut.pop(event_id, None)
        _cut[event_id] = cut
        kept = sum(len(c.order) for c in _cut.values())
        for oldest in list(_cut):
            if kept <= FRAGMENT_SEATS_MAX or oldest == event_id:
                break
            kept -= len(_cut.pop(oldest).order)


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
