"""Catalog writes for the demo and the tests: an event with its price
categories and seats, created together, on sale.

Sellers build their events through their own API (``seller.services``:
drafts, seat maps validated whole, publishing); this is the short road for
``seed_demo`` and for tests that need an event on sale in one call. It
trusts its caller (the input is code, not a request) and checks only what
would otherwise leave the event inconsistent: every seat's category exists
and one currency for the whole event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from organizers.models import Organizer

from .availability import availability_changed
from .models import Event, EventStatus, PriceCategory, Seat

# Rows per INSERT: a few statements even for a large hall.
_SEATS_PER_INSERT = 5000


@dataclass(frozen=True)
class CategoryInput:
    """A price category to create: its seats cost ``price_amount`` (minor
    units of the event's currency)."""

    code: str
    name: str
    price_amount: int


@dataclass(frozen=True)
class SeatInput:
    """A seat to create, in the seat map's words (docs/api.md, "Events, seat
    maps and prices"): ``category`` names a :class:`CategoryInput` code."""

    ref: str
    row: str
    number: int
    category: str
    section: str = ""
    x: float = 0
    y: float = 0
    accessible: bool = False


def seat_grid(
    *,
    section: str,
    rows: str,
    seats_per_row: int,
    category: str,
    top: float = 0,
    accessible: Sequence[str] = (),
) -> list[SeatInput]:
    """A rectangular block of seats: rows named by the letters of ``rows``,
    seats numbered from 1, ref ``<row><number>``; x is the seat's place in its
    row, y the row's, from ``top`` (one unit apart each)."""
    return [
        SeatInput(
            ref=f"{row}{n}",
            row=row,
            number=n,
            category=category,
            section=section,
            x=float(n - 1),
            y=top + i,
            accessible=f"{row}{n}" in accessible,
        )
        for i, row in enumerate(rows)
        for n in range(1, seats_per_row + 1)
    ]


def _seat_rows(
    event: Event, seats: Sequence[SeatInput], prices: dict[str, int] | None, price_amount: int
) -> list[Seat]:
    return [
        Seat(
            event=event,
            ref=s.ref,
            section=s.section,
            row=s.row,
            number=s.number,
            category=s.category,
            x=s.x,
            y=s.y,
            accessible=s.accessible,
            # A seat carries its category's price (docs/api.md); a seat
            # outside any category is priced on its own.
            price_amount=price_amount if prices is None else prices[s.category],
            currency=event.currency,
        )
        for s in seats
    ]


def _planned(
    rows: str,
    seats_per_row: int,
    categories: Sequence[CategoryInput],
    seats: Sequence[SeatInput] | None,
) -> tuple[Sequence[SeatInput], dict[str, int] | None]:
    """The seats to create and their categories' prices (None: no categories,
    the legacy grid); refused before anything is written."""
    if seats is None:
        if categories:
            raise ValueError("categories need seats that name them")
        grid = [
            SeatInput(ref=f"{row}{n}", row=row, number=n, category="")
            for row in rows
            for n in range(1, seats_per_row + 1)
        ]
        return grid, None
    prices = {c.code: c.price_amount for c in categories}
    if len(prices) != len(categories):
        raise ValueError("category codes repeat")
    unknown = sorted({s.category for s in seats} - prices.keys())
    if unknown:
        raise ValueError(f"seats name unknown categories: {', '.join(unknown)}")
    return seats, prices


def event_create_with_seats(
    *,
    organizer: Organizer,
    name: str,
    starts_at: datetime,
    rows: str = "ABCDE",
    seats_per_row: int = 10,
    price_amount: int = 5000,
    currency: str = "EUR",
    categories: Sequence[CategoryInput] = (),
    seats: Sequence[SeatInput] | None = None,
) -> Event:
    """An event on sale (published now) with its categories and seats, in
    one commit of a few bulk statements.

    With ``seats``, those seats, each at its category's price (every category
    a seat names must be among ``categories``). Without, a grid of ``rows`` ×
    ``seats_per_row`` seats at ``price_amount`` outside any category, as
    events were before categories (and then no ``categories``).
    """
    seats, prices = _planned(rows, seats_per_row, categories, seats)
    with transaction.atomic(durable=True):
        event = Event.objects.create(
            organizer=organizer,
            name=name,
            starts_at=starts_at,
            status=EventStatus.ON_SALE,
            currency=currency,
            published_at=timezone.now(),
        )
        PriceCategory.objects.bulk_create(
            [
                PriceCategory(
                    event=event,
                    code=c.code,
                    name=c.name,
                    price_amount=c.price_amount,
                    currency=currency,
                )
                for c in categories
            ]
        )
        Seat.objects.bulk_create(
            _seat_rows(event, seats, prices, price_amount), batch_size=_SEATS_PER_INSERT
        )
        # The events list shows it once this commits, not after the TTL.
        availability_changed(event.pk)
    return event
