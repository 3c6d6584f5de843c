"""Catalog writes: an event and its seats, created together."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from organizers.models import Organizer

from .availability import availability_changed
from .models import Event, EventStatus, Seat


def event_create_with_seats(
    *,
    organizer: Organizer,
    name: str,
    starts_at: datetime,
    rows: str = "ABCDE",
    seats_per_row: int = 10,
    price_amount: int = 5000,
    currency: str = "EUR",
) -> Event:
    with transaction.atomic(durable=True):
        event = Event.objects.create(
            organizer=organizer,
            name=name,
            starts_at=starts_at,
            status=EventStatus.ON_SALE,
            currency=currency,
            published_at=timezone.now(),
        )
        Seat.objects.bulk_create(
            [
                Seat(
                    event=event,
                    ref=f"{row}{n}",
                    row=row,
                    number=n,
                    price_amount=price_amount,
                    currency=currency,
                )
                for row in rows
                for n in range(1, seats_per_row + 1)
            ]
        )
        # The events list shows it once this commits, not after the TTL.
        availability_changed(event.pk)
    return event
