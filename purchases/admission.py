"""The on-sale waiting room (docs/waiting-room.md).

A hold lasts the event's hold time; a purchase waits PENDING until a worker
charges it. When purchases arrive faster than they are charged, the charges
waiting pile up, and past a point the last ones would be charged after
their hold ran out: the buyer waited and lost. The waiting room keeps that
pile within what a hold can serve, before any seat is held.

An event's room (its :class:`~purchases.models.WaitingRoom` row) is served by
:func:`room_tick`, once a second for every room (beat runs
:func:`rooms_tick`). Each tick, under the room's lock:

1. **the draw**: once the sale has opened, the buyers who came before it are
   numbered in a random order, once (those who come later are numbered in
   the order they come);
2. **the measure**: the charge rate (charges answered per second by the
   processor in the last ``WAITING_ROOM_RATE_WINDOW_SECONDS``, every event
   counted: the workers are shared; at least ``WAITING_ROOM_MIN_CHARGE_RATE``)
   and the event's backlog (its purchases not charged yet, and the buyers
   let in who have not started one);
3. **the admission**: the budget is what the rate serves in
   ``WAITING_ROOM_HOLD_SHARE`` of the event's hold (before any charge is
   measured, a probe of one second at the floor's rate); the next buyers in
   number order are let in while the backlog is under it, and nobody while
   the event's oldest purchase not charged yet has waited half that time
   (charging is slower than measured);
4. **the decision**: the room is *active* while someone waits, or the
   backlog fills the budget; an inactive room lets every start through. An
   event with no seat available lets everyone in (to be told so at once).

A start (purchases/saga/start.py) reads the room with the event's rules. An
active room (or any room before the sale opens) lets in a buyer who holds a
valid pass or whose entry was admitted within ``WAITING_ROOM_PASS_SECONDS``;
anyone else is refused, nothing held, and :func:`join` numbers them (or
tells them their place): ``503 waiting_room`` with the position and
``Retry-After``. A buyer whose admission lapsed unused joins again at the
back.

A pass (:func:`pass_issue`) is Django's signed value of the event, the buyer
and the admission's time: it cannot be forged, names its buyer (another
user's pass lets nobody else in) and lasts what the admission lasts.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core import signing
from django.db import connection, transaction

from .models import (
    Event,
    EventStatus,
    GatewayAnswer,
    PurchaseSaga,
    Seat,
    WaitingRoom,
    WaitingRoomEntry,
)
from .saga.states import SagaState
from .saga.transition import clock

logger = logging.getLogger(__name__)

PASS_SALT = "boxoffice.waiting-room.pass"
# A waiting buyer is told to ask again within this long whatever the
# position (a place is never lost by asking late: a pass lasts longer).
MAX_RETRY_AFTER = 30
# A room opens this long before its sale: buyers who come earlier are told
# when the sale opens (409 sales_not_open), those within it wait for the draw.
DOORS_OPEN_BEFORE = timedelta(hours=1)
# Purchases waiting for their charge (or being charged).
UNCHARGED = (SagaState.PENDING.value, SagaState.CHARGING.value)


# --- passes ----------------------------------------------------------------------------


def pass_issue(*, event_id: int, user_id: int, admitted_at: datetime) -> str:
    """The signed pass of a buyer let in at ``admitted_at``."""
    return signing.dumps(
        {"e": event_id, "u": user_id, "a": admitted_at.timestamp()}, salt=PASS_SALT
    )


def pass_admits(token: str | None, *, event_id: int, user_id: int, now: datetime) -> bool:
    """Whether ``token`` is a pass of this buyer for this event, still valid
    at ``now``. A forged or altered pass, another buyer's, another event's
    and an expired one are each False."""
    if not token:
        return False
    try:
        data = signing.loads(token, salt=PASS_SALT)
    except signing.BadSignature:
        return False
    if not isinstance(data, dict) or data.get("e") != event_id or data.get("u") != user_id:
        return False
    admitted = data.get("a")
    if not isinstance(admitted, int | float):
        return False
    return now.timestamp() < admitted + settings.WAITING_ROOM_PASS_SECONDS


# --- the start's side --------------------------------------------------------------------

# The buyer's admission, used: their entry admitted within the pass's time
# (or any entry of theirs when they hold a valid pass) is marked used by
# its first start. In the start's transaction: a start refused afterwards
# (a seat taken) leaves it unused.
_USE_SQL = """
UPDATE {entry} SET used_at = COALESCE(used_at, %s)
 WHERE event_id = %s AND buyer_id = %s AND (%s OR admitted_at > %s)
RETURNING id
"""


def admission_use(*, event_id: int, user_id: int, token: str | None, now: datetime) -> bool:
    """Whether the buyer may start a purchase in the event's active room now
    (a valid pass, or an entry admitted within the pass's time), marking the
    admission used. Runs inside the start's transaction."""
    by_pass = pass_admits(token, event_id=event_id, user_id=user_id, now=now)
    since = now - timedelta(seconds=settings.WAITING_ROOM_PASS_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(
            _USE_SQL.format(entry=WaitingRoomEntry._meta.db_table),
            [now, event_id, user_id, by_pass, since],
        )
        return cursor.fetchone() is not None


def turn_spent(*, event_id: int, user_id: int, now: datetime) -> None:
    """A start let in and then refused (no seat left, a seat taken): the
    turn is spent, as if used (its transaction, rolled back, did not mark
    it), so that the room stops counting it as a purchase to come."""
    WaitingRoomEntry.objects.filter(
        event_id=event_id, buyer_id=user_id, used_at__isnull=True
    ).update(used_at=now)


@dataclass(frozen=True)
class Place:
    """Where a buyer stands: ``waiting`` (``position``: 1 is next; None
    before the draw), ``admitted`` (with the pass and when it expires),
    ``not_in_room`` (the room lets buyers in in turn and this one has not
    joined), or ``open`` (nothing to wait for: go and buy)."""

    status: str
    position: int | None = None
    retry_after: int = 1
    pass_token: str | None = None
    pass_expires_at: datetime | None = None
    sales_start: datetime | None = None


# Joining: a new entry (numbered now once the draw is done, else at the
# draw), or the buyer's entry again at the back if their admission lapsed.
# The room's row gives the number: one row lock per join, in arrival order.
_NUMBER_SQL = """
UPDATE {room} SET next_number = next_number + 1 WHERE event_id = %s RETURNING next_number - 1
"""


def join(*, event_id: int, user_id: int, now: datetime | None = None) -> Place:
    """The buyer in the event's room (joined now if they were not in it, or
    again at the back if their admission lapsed), and where they stand."""
    now = clock(now)
    with transaction.atomic(durable=True):
        # The room's row first, locked: joins are numbered one after the
        # other, and none slips in unnumbered after the draw.
        room = WaitingRoom.objects.select_for_update().filter(event_id=event_id).first()
        if room is None or not _letting_in_turn(room):
            return Place(status="open")
        entry = (
            WaitingRoomEntry.objects.select_for_update()
            .filter(event_id=event_id, buyer_id=user_id)
            .first()
        )
        if entry is not None and _lapsed(entry, room, now=now):
            entry.number, entry.admitted_at, entry.used_at = _number(room), None, None
            entry.joined_at = now
            entry.save(update_fields=["number", "admitted_at", "used_at", "joined_at"])
        elif entry is None:
            entry = WaitingRoomEntry.objects.create(
                event_id=event_id, buyer_id=user_id, joined_at=now, number=_number(room)
            )
    return _place(room, entry, now=now)


def buyer_place(
    *, event_id: int, user_id: int, join_room: bool, now: datetime | None = None
) -> Place | None:
    """Where the buyer stands in the event's room (:func:`join` with
    ``join_room``, else :func:`place_of`); ``open`` for an event whose room
    is off; None for no such event (or a draft, the seller's alone)."""
    # One read: the setting, or no row at all (a null setting is a row too).
    found = list(
        Event.objects.filter(pk=event_id)
        .exclude(status=EventStatus.DRAFT)
        .values_list("waiting_room", flat=True)[:1]
    )
    if not found:
        return None
    if not found[0]:
        return Place(status="open")
    if join_room:
        return join(event_id=event_id, user_id=user_id, now=now)
    return place_of(event_id=event_id, user_id=user_id, now=now)


def place_of(*, event_id: int, user_id: int, now: datetime | None = None) -> Place:
    """Where the buyer stands, joining nothing: ``open`` when the event has
    no room or the buyer is not in it and the room lets starts through."""
    now = clock(now)
    room = WaitingRoom.objects.filter(event_id=event_id).first()
    if room is None:
        return Place(status="open")
    entry = WaitingRoomEntry.objects.filter(event_id=event_id, buyer_id=user_id).first()
    if entry is None or _lapsed(entry, room, now=now):
        return Place(status="not_in_room" if _letting_in_turn(room) else "open")
    return _place(room, entry, now=now)


def _letting_in_turn(room: WaitingRoom) -> bool:
    """Whether starts must be let in: the room is active, or the sale has
    not opened (the draw has not been made)."""
    return room.active or room.drawn_at is None


def _number(room: WaitingRoom) -> int | None:
    """The next number of the room (None before the draw: the draw numbers
    everyone who came before it)."""
    if room.drawn_at is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(_NUMBER_SQL.format(room=WaitingRoom._meta.db_table), [room.event_id])
        return cursor.fetchone()[0]


def _lapsed(entry: WaitingRoomEntry, room: WaitingRoom, *, now: datetime) -> bool:
    """Admitted once, and the admission's time is over."""
    if entry.number is None or entry.number > room.admitted_through:
        return False
    return entry.admitted_at is None or not _within_pass(entry.admitted_at, now=now)


def _within_pass(admitted_at: datetime, *, now: datetime) -> bool:
    return now < admitted_at + timedelta(seconds=settings.WAITING_ROOM_PASS_SECONDS)


def _place(room: WaitingRoom, entry: WaitingRoomEntry, *, now: datetime) -> Place:
    rate = max(room.charge_rate, settings.WAITING_ROOM_MIN_CHARGE_RATE)
    if entry.number is None:  # before the draw: the sale has not opened yet
        start = Event.objects.filter(pk=room.event_id).values_list("sales_start", flat=True).first()
        wait = (start - now).total_seconds() if start is not None else 1
        return Place(
            status="waiting",
            retry_after=max(1, min(MAX_RETRY_AFTER, math.ceil(wait))),
            sales_start=start,
        )
    if entry.number > room.admitted_through:
        position = entry.number - room.admitted_through
        return Place(
            status="waiting",
            position=position,
            retry_after=max(1, min(MAX_RETRY_AFTER, math.ceil(position / rate))),
        )
    assert entry.admitted_at is not None  # numbered up to admitted_through: let in
    return Place(
        status="admitted",
        pass_token=pass_issue(
            event_id=room.event_id, user_id=entry.buyer_id, admitted_at=entry.admitted_at
        ),
        pass_expires_at=entry.admitted_at + timedelta(seconds=settings.WAITING_ROOM_PASS_SECONDS),
    )


# --- the ticks ------------------------------------------------------------------------------


def rooms_tick(*, now: datetime | None = None) -> int:
    """Every room's tick (beat, every ``WAITING_ROOM_TICK_SECONDS``): the
    rooms of events on sale with the room on, sales not over and opening
    within ``DOORS_OPEN_BEFORE`` (or open), made when missing. Returns how
    many rooms ticked."""
    now = clock(now)
    events = list(
        Event.objects.filter(status=EventStatus.ON_SALE, waiting_room=True)
        .exclude(sales_end__lte=now)
        .exclude(sales_start__gt=now + DOORS_OPEN_BEFORE)
        .values_list("pk", flat=True)
    )
    for event_id in events:
        WaitingRoom.objects.get_or_create(event_id=event_id, defaults={"updated_at": now})
        room_tick(event_id=event_id, now=now)
    return len(events)


@dataclass(frozen=True)
class _Measure:
    rate: float
    uncharged: int
    unused: int
    seats_left: bool
    # How long the event's oldest purchase not charged yet has waited (0: none).
    oldest_s: float

    @property
    def backlog(self) -> int:
        return self.uncharged + self.unused


# The event's purchases waiting for (or in) their charge, through the live
# sagas' index; and the buyers let in who have not started yet.
_BACKLOG_SQL = """
SELECT (SELECT count(*) FROM {saga} WHERE event_id = %s AND state = ANY(%s)),
       (SELECT COALESCE(EXTRACT(EPOCH FROM %s - min(created_at)), 0) FROM {saga}
         WHERE event_id = %s AND state = ANY(%s)),
       (SELECT count(*) FROM {entry}
         WHERE event_id = %s AND admitted_at > %s AND used_at IS NULL),
       EXISTS (SELECT 1 FROM {seat} WHERE event_id = %s AND status COLLATE "C" = 'available')
"""
_RATE_SQL = "SELECT count(*) FROM {answer} WHERE at > %s AND asked = 'charge'"


def _measure(event_id: int, *, now: datetime, opened_at: datetime) -> _Measure:
    # The window, and never longer than the time since the sale opened: a
    # sale's first seconds are not averaged with the quiet before them.
    window = max(
        1.0, min(settings.WAITING_ROOM_RATE_WINDOW_SECONDS, (now - opened_at).total_seconds())
    )
    since = now - timedelta(seconds=settings.WAITING_ROOM_PASS_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(
            _RATE_SQL.format(answer=GatewayAnswer._meta.db_table),
            [now - timedelta(seconds=window)],
        )
        (charges,) = cursor.fetchone()
        cursor.execute(
            _BACKLOG_SQL.format(
                saga=PurchaseSaga._meta.db_table,
                entry=WaitingRoomEntry._meta.db_table,
                seat=Seat._meta.db_table,
            ),
            [event_id, list(UNCHARGED), now, event_id, list(UNCHARGED), event_id, since, event_id],
        )
        uncharged, oldest, unused, seats_left = cursor.fetchone()
    return _Measure(
        rate=charges / window,
        uncharged=uncharged,
        unused=unused,
        seats_left=seats_left,
        oldest_s=float(oldest),
    )


# The draw: everyone who came before the opening, numbered from the room's
# next number in a random order, in one statement.
_DRAW_SQL = """
WITH drawn AS (
  SELECT id, row_number() OVER (ORDER BY random()) AS k
    FROM {entry} WHERE event_id = %s AND number IS NULL
)
UPDATE {entry} e SET number = %s - 1 + drawn.k
  FROM drawn WHERE e.id = drawn.id AND e.event_id = %s
"""
_ADMIT_SQL = """
UPDATE {entry} SET admitted_at = %s
 WHERE event_id = %s AND number > %s AND number <= %s
"""


def room_tick(*, event_id: int, now: datetime | None = None) -> str:
    """One tick of the event's room (the module docstring): ``"none"`` when
    it has no room, else ``"active"`` or ``"inactive"``."""
    now = clock(now)
    with transaction.atomic(durable=True):
        # Waits for the joins (each holds the row for one number) and for
        # another tick: the next one measures again.
        room = WaitingRoom.objects.select_for_update().filter(event_id=event_id).first()
        if room is None:
            return "none"
        event = Event.objects.only("sales_start", "hold_seconds").get(pk=event_id)
        if event.sales_start is not None and now < event.sales_start:
            # Before the opening every start waits (the room holds those
            # who came early for the draw).
            room.active, room.updated_at = True, now
            room.save(update_fields=["active", "updated_at"])
            return "active"
        if room.drawn_at is None:
            _draw(room, now=now)
        assert room.drawn_at is not None  # drawn above
        measure = _measure(event_id, now=now, opened_at=room.drawn_at)
        serve_s = (event.hold_seconds or settings.PURCHASE_HOLD_SECONDS) * (
            settings.WAITING_ROOM_HOLD_SHARE
        )
        budget = _budget(measure, serve_s=serve_s)
        waiting = room.next_number - 1 - room.admitted_through
        admit = _admit(measure, waiting=waiting, budget=budget, serve_s=serve_s)
        if admit:
            with connection.cursor() as cursor:
                cursor.execute(
                    _ADMIT_SQL.format(entry=WaitingRoomEntry._meta.db_table),
                    [now, event_id, room.admitted_through, room.admitted_through + admit],
                )
            room.admitted_through += admit
        room.active = measure.seats_left and (waiting > admit or measure.backlog + admit >= budget)
        room.charge_rate, room.backlog = measure.rate, measure.backlog + admit
        room.updated_at = now
        room.save(
            update_fields=[
                "active",
                "admitted_through",
                "charge_rate",
                "backlog",
                "updated_at",
                "drawn_at",
                "next_number",
            ]
        )
    if admit:
        logger.info(
            "waiting room admitted",
            extra={"event_id": event_id, "admitted": admit, "through": room.admitted_through},
        )
    return "active" if room.active else "inactive"


def _admit(measure: _Measure, *, waiting: int, budget: int, serve_s: float) -> int:
    """How many of those waiting to let in now."""
    if not measure.seats_left:
        # Sold out (or every seat held): nothing to protect; everyone waiting
        # is let in to be told so at once, not after their turn.
        return waiting
    if measure.oldest_s >= serve_s / 2:
        # The oldest purchase has waited half of what the budget allows:
        # charging is slower than measured (the workers busy elsewhere).
        # Nobody more until it catches up.
        return 0
    return max(0, min(waiting, budget - measure.backlog))


def _budget(measure: _Measure, *, serve_s: float) -> int:
    """How many purchases may wait for their charge: what the measured rate
    charges in ``serve_s``, the rate taken to be at least the floor; before
    any charge was measured, a probe of the floor's worth (one second of it),
    so that a processor slower than the floor cannot expire a whole budget."""
    floor = settings.WAITING_ROOM_MIN_CHARGE_RATE
    if measure.rate == 0:
        return math.ceil(floor)
    return max(1, math.floor(max(measure.rate, floor) * serve_s))


def _draw(room: WaitingRoom, *, now: datetime) -> None:
    """Number the buyers who came before the opening, in a random order."""
    with connection.cursor() as cursor:
        cursor.execute(
            _DRAW_SQL.format(entry=WaitingRoomEntry._meta.db_table),
            [room.event_id, room.next_number, room.event_id],
        )
        drawn = cursor.rowcount
    room.next_number += drawn
    room.drawn_at = now
    if drawn:
        logger.info("waiting room drawn", extra={"event_id": room.event_id, "drawn": drawn})


def default_for(seats: int) -> bool:
    """The room's setting for an event published with ``seats`` seats and
    no setting of its own."""
    return seats >= settings.WAITING_ROOM_MIN_SEATS


@dataclass(frozen=True)
class RoomSummary:
    """An event's room as its last tick left it, for the admin and the
    seller's dashboard."""

    active: bool
    waiting: int
    admitted: int
    charge_rate: float
    backlog: int
    updated_at: datetime

    def __str__(self) -> str:
        state = "letting buyers in in turn" if self.active else "letting everyone through"
        return (
            f"{state}: {self.waiting} waiting, {self.admitted} let in; "
            f"{self.charge_rate:.1f} charges/s measured, {self.backlog} purchases to charge "
            f"(at {self.updated_at:%Y-%m-%d %H:%M:%S} UTC)"
        )


def room_summary(event_id: int) -> RoomSummary | None:
    """The event's room now (None: it has none)."""
    room = WaitingRoom.objects.filter(event_id=event_id).first()
    if room is None:
        return None
    undrawn = (
        0
        if room.drawn_at is not None
        else WaitingRoomEntry.objects.filter(event_id=event_id, number__isnull=True).count()
    )
    return RoomSummary(
        active=room.active or room.drawn_at is None,
        waiting=room.next_number - 1 - room.admitted_through + undrawn,
        admitted=room.admitted_through,
        charge_rate=room.charge_rate,
        backlog=room.backlog,
        updated_at=room.updated_at,
    )
