"""Every row lock the seller's services take (docs/design.md, "House
rules"; the purchases' own are purchases/lock_objects.py).

The order is the purchases' (event -> reservation -> saga -> seats, each
by primary key): a seller's change locks its event first, then the seats it
touches in id order. Two changes of one event follow one another, and a
change that meets a purchase's seats waits for it; a purchase never waits
for a seat the change has locked (it passes over it: ``SKIP LOCKED``), so
the two cannot deadlock.

A price change locks its event, then every price category of the event by
primary key (``categories_for_update``), then the seats on offer: a seat
release reads the categories of its seats ``FOR SHARE`` in the same order
(``purchases.lock_objects.seats_release_at_current_price``), so the two
never take two categories in opposite orders.

The event is locked ``FOR NO KEY UPDATE``: the foreign-key checks of the
rows a purchase writes for the event (``FOR KEY SHARE``) do not wait for it.
"""

from __future__ import annotations

from django.db import connection

from purchases.models import Event, PriceCategory, Seat, SeatStatus


def event_for_update(*, organizer_id: int, event_id: int) -> Event | None:
    """The organizer's event ``event_id``, locked; None when it has none by
    that id (another organizer's event included)."""
    return (
        Event.objects.select_for_update(of=("self",), no_key=True)
        .filter(pk=event_id, organizer_id=organizer_id)
        .first()
    )


def categories_for_update(*, event: Event) -> dict[str, PriceCategory]:
    """Every price category of ``event``, locked by primary key, by code."""
    locked = PriceCategory.objects.select_for_update(of=("self",)).filter(event=event)
    return {c.code: c for c in locked.order_by("id")}


_SEATS_SQL = """
SELECT id, ref, status FROM {seat}
 WHERE event_id = %s AND ref = ANY(%s::text[])
 ORDER BY id FOR UPDATE
"""


def seats_for_update(*, event_id: int, refs: list[str]) -> list[tuple[int, str, str]]:
    """The seats of ``event_id`` named by ``refs`` that exist, locked in id
    order: (id, ref, status) each. One array parameter, however many refs
    (an ``IN`` list would take one parameter per ref, and a statement takes
    at most 65,535)."""
    with connection.cursor() as cursor:
        cursor.execute(_SEATS_SQL.format(seat=Seat._meta.db_table), [event_id, refs])
        return [(row[0], row[1], row[2]) for row in cursor.fetchall()]


_REPRICE_SQL = """
UPDATE {seat} SET price_amount = %s, currency = %s
  FROM (SELECT id FROM {seat}
         WHERE event_id = %s AND category = %s AND status = ANY(%s::text[])
         ORDER BY id FOR UPDATE) AS locked
 WHERE {seat}.id = locked.id AND {seat}.event_id = %s AND {seat}.status = ANY(%s::text[])
"""

# The seats a price change reaches: not held, not sold (a purchase keeps
# the price its seats were held at; docs/api.md, "Events, seat maps and prices").
REPRICED = [SeatStatus.AVAILABLE.value, SeatStatus.UNAVAILABLE.value]


def seats_reprice(*, event_id: int, category: str, price_amount: int, currency: str) -> int:
    """Give the seats of ``category`` that are available or blocked the
    price ``price_amount``, locking them in id order as a purchase does;
    returns how many.

    A purchase that holds one of them meanwhile is waited for, and the row
    then re-checked on its committed version (READ COMMITTED): a seat it
    held is no longer available and keeps its price. A seat held after this
    commits is held at the new price."""
    with connection.cursor() as cursor:
        cursor.execute(
            _REPRICE_SQL.format(seat=Seat._meta.db_table),
            [price_amount, currency, event_id, category, REPRICED, event_id, REPRICED],
        )
        return cursor.rowcount
