"""The seller's writes on events (docs/api.md, "Events, seat maps and
prices"): create a draft with its categories and seat map, replace the seat
map, change the event and its prices, publish it, block and unblock seats.

Each service owns its transaction (``atomic(durable=True)``), finds the
event among the organizer's (:class:`~seller.errors.EventNotFound` for
another organizer's, as for a missing one), locks it before any seat
(seller/lock_objects.py: the purchases' lock order), and moves the
catalog's availability version when it commits
(``purchases.availability.availability_changed``). A spec is checked again
here, whoever built it (seller/seat_maps.py).

Seats are written in bulk: one ``COPY`` for the whole map, however large
(the timings are in the seller's design notes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from organizers.models import Organizer
from purchases.admission import default_for as waiting_room_default
from purchases.availability import availability_changed
from purchases.models import Event, EventStatus, PriceCategory, Seat, SeatStatus

from . import lock_objects
from .errors import (
    EventCancelled,
    EventHasNoSeats,
    EventInvalid,
    EventNotDraft,
    EventNotFound,
    SeatsNotBlockable,
    UnknownSeatRefs,
)
from .seat_maps import (
    API_FIELD,
    BLOCK_REASON_MAX,
    MAX_SEATS,
    PRICE_MAX,
    REF_MAX,
    CategorySpec,
    EventSpec,
    SeatSpec,
    check_categories,
    check_seats,
    event_changes_from_json,
    field_problem,
    int_problem,
    text_problem,
)

# What an event's own fields are called on the model (EventSpec's names).
EVENT_FIELDS = (
    "name",
    "starts_at",
    "currency",
    "sales_start",
    "sales_end",
    "hold_seconds",
    "max_seats_per_buyer",
    "buyer_can_cancel_until",
    "cancel_fee_percent",
)


# --- checks ----------------------------------------------------------------------------------


def _check_fields(fields: dict[str, Any]) -> None:
    for key, value in fields.items():
        if key == "categories":
            continue
        if problem := field_problem(key, value):
            raise EventInvalid(API_FIELD.get(key, key), problem)


def _check_window(start: Any, end: Any) -> None:
    if start is not None and end is not None and start >= end:
        raise EventInvalid("sales_end", "must be after sales_start")


def _event_locked(organizer: Organizer, event_id: int) -> Event:
    event = lock_objects.event_for_update(organizer_id=organizer.pk, event_id=event_id)
    if event is None:
        raise EventNotFound()
    return event


def _not_cancelled(event: Event) -> None:
    if event.status == EventStatus.CANCELLED:
        raise EventCancelled()


# --- seats and categories, inside a caller's transaction ---------------------------------------

_COPY_SQL = (
    'COPY {seat} (event_id, ref, section, "row", number, category, x, y, accessible,'
    " price_amount, currency, status, block_reason) FROM STDIN"
)


def _seats_insert(*, event: Event, seats: list[SeatSpec], prices: dict[str, int]) -> None:
    """Write ``seats`` in their order (their ids follow it), each at its
    category's price, in one ``COPY``: PostgreSQL's bulk load, which Citus
    routes by the event like any insert. Measured for 100,000 seats: about
    half the time of an ``INSERT ... SELECT FROM unnest(...)`` whose arrays
    are bound by the client (Django's psycopg default quotes each element in
    Python)."""
    available = SeatStatus.AVAILABLE.value
    with connection.cursor() as cursor:
        with cursor.copy(_COPY_SQL.format(seat=Seat._meta.db_table)) as copy:
            for s in seats:
                copy.write_row(
                    (
                        event.pk,
                        s.ref,
                        s.section,
                        s.row,
                        s.number,
                        s.category,
                        s.x,
                        s.y,
                        s.accessible,
                        prices[s.category],
                        event.currency,
                        available,
                        "",
                    )
                )


def _seats_delete(*, event: Event) -> None:
    # One statement: the ORM's delete would first read every seat to look
    # for rows that protect it, and a draft's seats have none (checked by
    # the caller: none is held or sold).
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {Seat._meta.db_table} WHERE event_id = %s", [event.pk])


def _categories_replace(*, event: Event, categories: list[CategorySpec]) -> None:
    PriceCategory.objects.filter(event=event).delete()
    PriceCategory.objects.bulk_create(
        [
            PriceCategory(
                event=event,
                code=c.code,
                name=c.name,
                price_amount=c.price_amount,
                currency=c.currency,
            )
            for c in categories
        ]
    )


def _reprice_all(*, event: Event, categories: Iterable[CategorySpec]) -> None:
    for category in categories:
        lock_objects.seats_reprice(
            event_id=event.pk,
            category=category.code,
            price_amount=category.price_amount,
            currency=category.currency,
        )


def _specs(categories: Iterable[PriceCategory]) -> list[CategorySpec]:
    return [CategorySpec(c.code, c.name, c.price_amount, c.currency) for c in categories]


# --- the services ------------------------------------------------------------------------------


def event_create(*, organizer: Organizer, spec: EventSpec) -> Event:
    """A new draft of ``organizer``'s, with its price categories and seats."""
    fields = {key: getattr(spec, key) for key in EVENT_FIELDS}
    _check_fields(fields)
    _check_window(spec.sales_start, spec.sales_end)
    check_categories(spec.categories, currency=spec.currency)
    check_seats(spec.seats, categories={c.code for c in spec.categories})
    with transaction.atomic(durable=True):
        event = Event.objects.create(organizer=organizer, status=EventStatus.DRAFT, **fields)
        _categories_replace(event=event, categories=spec.categories)
        prices = {c.code: c.price_amount for c in spec.categories}
        _seats_insert(event=event, seats=spec.seats, prices=prices)
        availability_changed(event.pk)
    return event


def seat_map_replace(
    *,
    organizer: Organizer,
    event_id: int,
    seats: list[SeatSpec],
    categories: list[CategorySpec] | None = None,
) -> int:
    """Replace a draft's whole seat map (and its price categories, unless
    None: the event's stay); returns how many seats it now has."""
    with transaction.atomic(durable=True):
        event = _event_locked(organizer, event_id)
        if event.status != EventStatus.DRAFT:
            raise EventNotDraft("the seat map changes only while the event is a draft")
        if categories is None:
            current = _specs(PriceCategory.objects.filter(event=event).order_by("id"))
        else:
            check_categories(categories, currency=event.currency)
            current = categories
        check_seats(seats, categories={c.code for c in current})
        taken = list(
            Seat.objects.filter(event=event, status__in=[SeatStatus.HELD, SeatStatus.SOLD])
            .order_by("id")
            .values_list("ref", flat=True)[:100]
        )
        if taken:
            raise SeatsNotBlockable(taken)
        if categories is not None:
            _categories_replace(event=event, categories=categories)
        _seats_delete(event=event)
        prices = {c.code: c.price_amount for c in current}
        _seats_insert(event=event, seats=seats, prices=prices)
        availability_changed(event.pk)
    return len(seats)


def event_update(*, organizer: Organizer, event_id: int, changes: dict[str, Any]) -> Event:
    """Change the event as a ``PATCH`` body says (``changes``: its JSON,
    checked here: ``SeatMapInvalid`` names every problem): its own fields
    and, with ``price_categories``, its whole list of price categories. Any
    of them at any time but on a cancelled event; the currency, and adding
    or removing a category, only while it is a draft. A price change
    reaches the seats that are not held or sold."""
    with transaction.atomic(durable=True):
        event = _event_locked(organizer, event_id)
        _not_cancelled(event)
        parsed = event_changes_from_json(changes, currency=event.currency)
        currency = parsed.get("currency", event.currency)
        if currency != event.currency and event.status != EventStatus.DRAFT:
            raise EventNotDraft("the currency changes only while the event is a draft")
        if "categories" in parsed:
            _categories_update(event=event, categories=parsed["categories"], currency=currency)
        elif currency != event.currency and PriceCategory.objects.filter(event=event).exists():
            raise EventInvalid(
                "currency",
                f"the price categories are in {event.currency}: send price_categories in "
                f"{currency} with it",
            )
        fields = {key: value for key, value in parsed.items() if key in EVENT_FIELDS}
        for key, value in fields.items():
            setattr(event, key, value)
        _check_window(event.sales_start, event.sales_end)
        if fields:
            event.save(update_fields=list(fields))
        availability_changed(event.pk)
    return event


def _categories_update(*, event: Event, categories: list[CategorySpec], currency: str) -> None:
    """The event's price categories become ``categories`` (the whole list)."""
    check_categories(categories, currency=currency)
    existing = lock_objects.categories_for_update(event=event)
    codes = [c.code for c in categories]
    if set(codes) != set(existing):
        if event.status != EventStatus.DRAFT:
            raise EventNotDraft(
                "price categories are added or removed only while the event is a draft"
            )
        used = set(
            Seat.objects.filter(event=event)
            .exclude(category__in=codes)
            .values_list("category", flat=True)
            .distinct()
        )
        if used:
            raise EventInvalid(
                "price_categories",
                f"seats still name {', '.join(sorted(used))}: replace the seat map with the "
                "categories (PUT seat-map) to remove them",
            )
        _categories_replace(event=event, categories=categories)
        _reprice_all(event=event, categories=categories)
        return
    changed = []
    for spec in categories:
        row = existing[spec.code]
        if (row.name, row.price_amount, row.currency) != (spec.name, spec.price_amount, currency):
            row.name, row.price_amount, row.currency = spec.name, spec.price_amount, currency
            row.save(update_fields=["name", "price_amount", "currency"])
            changed.append(spec)
    _reprice_all(event=event, categories=changed)


def category_prices_set(*, organizer: Organizer, event_id: int, prices: dict[str, int]) -> None:
    """New prices for some of the event's categories (by code), also on
    sale: the seats of each that are available or blocked take it, a held or
    sold seat keeps the price it was held at."""
    with transaction.atomic(durable=True):
        event = _event_locked(organizer, event_id)
        _not_cancelled(event)
        existing = lock_objects.categories_for_update(event=event)
        unknown = sorted(set(prices) - set(existing))
        if unknown:
            raise EventInvalid("price_categories", f"no price category {', '.join(unknown)}")
        for code, amount in prices.items():
            if problem := int_problem(amount, least=0, most=PRICE_MAX):
                raise EventInvalid(f"price_categories.{code}", problem)
            row = existing[code]
            row.price_amount = amount
            row.save(update_fields=["price_amount"])
        _reprice_all(event=event, categories=_specs(existing[code] for code in prices))
        availability_changed(event.pk)


def event_publish(*, organizer: Organizer, event_id: int) -> Event:
    """A draft goes on sale: the catalog lists it, its seat map is frozen,
    and its waiting room is decided if the seller left it open."""
    with transaction.atomic(durable=True):
        event = _event_locked(organizer, event_id)
        if event.status != EventStatus.DRAFT:
            raise EventNotDraft("only a draft is published")
        seats = Seat.objects.filter(event=event).count()
        if not seats:
            raise EventHasNoSeats()
        event.status = EventStatus.ON_SALE
        event.published_at = timezone.now()
        if event.waiting_room is None:
            # No setting of its own: a large seat map sells through a waiting
            # room (purchases/admission.py), decided once, now it is frozen.
            event.waiting_room = waiting_room_default(seats)
        event.save(update_fields=["status", "published_at", "waiting_room"])
        availability_changed(event.pk)
    return event


def _refs_checked(refs: list[str]) -> list[str]:
    """The refs, each once, in their order."""
    if not refs:
        raise EventInvalid("seats", "name at least one seat")
    if len(refs) > MAX_SEATS:
        raise EventInvalid("seats", f"at most {MAX_SEATS} seats at once")
    for n, ref in enumerate(refs):
        if problem := text_problem(ref, most=REF_MAX):
            raise EventInvalid(f"seats[{n}]", problem)
    return list(dict.fromkeys(refs))


def _seats_locked(event: Event, refs: list[str]) -> dict[str, tuple[int, str]]:
    """The seats named, locked: ref -> (id, status); ``UnknownSeatRefs``
    when some name none of the event's."""
    found = {
        ref: (pk, status)
        for pk, ref, status in lock_objects.seats_for_update(event_id=event.pk, refs=refs)
    }
    unknown = [ref for ref in refs if ref not in found]
    if unknown:
        raise UnknownSeatRefs(unknown)
    return found


_SET_SQL = """
UPDATE {seat} SET status = %s, block_reason = %s
 WHERE event_id = %s AND id = ANY(%s::bigint[])
"""


def _seats_set(*, event: Event, ids: list[int], status: str, reason: str) -> None:
    """Set the status of seats locked already. One array parameter, however
    many seats (an ``IN`` list takes one parameter per id)."""
    if not ids:
        return
    with connection.cursor() as cursor:
        cursor.execute(_SET_SQL.format(seat=Seat._meta.db_table), [status, reason, event.pk, ids])


def seats_block(*, organizer: Organizer, event_id: int, refs: list[str], reason: str) -> list[str]:
    """Take seats off sale (status ``unavailable``), all or none: refused
    when any is held or sold (``SeatsNotBlockable`` naming them). A seat
    blocked already stays so (with this reason). Returns the refs that were
    available."""
    refs = _refs_checked(refs)
    if problem := text_problem(reason, least=0, most=BLOCK_REASON_MAX):
        raise EventInvalid("reason", problem)
    with transaction.atomic(durable=True):
        event = _event_locked(organizer, event_id)
        _not_cancelled(event)
        found = _seats_locked(event, refs)
        taken = [ref for ref in refs if found[ref][1] in (SeatStatus.HELD, SeatStatus.SOLD)]
        if taken:
            raise SeatsNotBlockable(taken)
        ids = [found[ref][0] for ref in refs]
        _seats_set(event=event, ids=ids, status=SeatStatus.UNAVAILABLE, reason=reason)
        availability_changed(event.pk)
    return [ref for ref in refs if found[ref][1] == SeatStatus.AVAILABLE]


def seats_unblock(*, organizer: Organizer, event_id: int, refs: list[str]) -> list[str]:
    """Put blocked seats back on sale (status ``available``); a seat that is
    not blocked is left as it is. Returns the refs that were blocked."""
    refs = _refs_checked(refs)
    with transaction.atomic(durable=True):
        event = _event_locked(organizer, event_id)
        _not_cancelled(event)
        found = _seats_locked(event, refs)
        blocked = [ref for ref in refs if found[ref][1] == SeatStatus.UNAVAILABLE]
        ids = [found[ref][0] for ref in blocked]
        _seats_set(event=event, ids=ids, status=SeatStatus.AVAILABLE, reason="")
        availability_changed(event.pk)
    return blocked
