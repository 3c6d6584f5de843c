"""The only module that takes row locks for purchases.

Lock order, everywhere: event -> the buyer's lock of the event -> reservation
-> saga -> seats -> price category, each by primary key. Two transactions that
need the same rows take them in the same order, so they queue instead of
deadlocking. The start transaction takes the buyer's lock (events with a
limit per buyer only: ``buyer_event_lock``), then seats; the saga steps take
the saga, then its seats; a release reads its seats' categories last, shared
(``seats_release_at_current_price``). A seller's price change takes the
category before the seats it re-prices (seller/lock_objects.py), the other
way round: the two never wait for the same seats (a price change locks only
seats on offer, a release only seats held or sold), so they form no cycle.

Best available takes seats too, but never waits for one: ``SKIP LOCKED``
passes over a seat another transaction has locked, so it can stand in no
cycle of waits, whatever the others hold (docs/design.md, "Start").
"""

import functools
import hashlib
from typing import NamedTuple

from django.db import connection, transaction
from django.db.models import QuerySet

from common import rows

from .models import (
    Event,
    EventCancellation,
    EventStatus,
    PriceCategory,
    PurchaseSaga,
    Refund,
    Reservation,
    Seat,
    SeatStatus,
)

# The lock is a transaction-level advisory lock, routed through the event's
# row: under Citus the statement goes to the node that holds the event (and
# its seats, reservations and sagas: one co-location group,
# config/distribution.py), so every purchase of the event meets the lock on
# that one node. Advisory locks are per node; a lock taken on whichever node
# a client reached would not be shared.
_BUYER_LOCK_SQL = "SELECT pg_advisory_xact_lock(%s) FROM {event} WHERE id = %s"


def buyer_event_lock(*, event_id: int, buyer_id: int) -> None:
    """Wait for, then hold until the commit, the lock that every purchase of
    this buyer for this event shares: the start of an event with a limit per
    buyer (``max_seats_per_buyer``) takes it first, before it counts the
    seats the buyer holds or bought, so that two purchases by one buyer at
    once are counted one after the other (each counts the seats the other
    committed) instead of both counting what was there before either.

    First in the lock order (before the idempotency key's index entry and
    the seats): a start waiting here holds no seat and no key. Only starts
    take it, each once; releases and confirmations do not need it (a seat
    released or confirmed never lets the buyer hold more). Events without a
    limit never take it. No row is locked: the lock names (event, buyer), a
    64-bit key hashed from them (``_buyer_lock_key``); two pairs that shared a
    key would only queue behind each other.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            _BUYER_LOCK_SQL.format(event=Event._meta.db_table),
            [_buyer_lock_key(event_id=event_id, buyer_id=buyer_id), event_id],
        )


def _buyer_lock_key(*, event_id: int, buyer_id: int) -> int:
    # A namespace in the hashed text keeps this lock's keys apart from any
    # other advisory lock the project may take.
    digest = hashlib.blake2b(
        f"purchases.buyer-limit:{event_id}:{buyer_id}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


def seats_for_update(*, event_id: int, seat_ids: list[int]) -> list[Seat]:
    return list(
        Seat.objects.select_for_update(of=("self",))
        .filter(event_id=event_id, id__in=seat_ids)
        .order_by("id")
    )


_HOLD_SKIP_LOCKED_SQL = """
UPDATE {seat} SET status = %s
  FROM (SELECT id FROM {seat} WHERE event_id = %s AND id = ANY(%s::bigint[]) AND status = %s
        ORDER BY id FOR UPDATE SKIP LOCKED) AS locked
 WHERE {seat}.id = locked.id AND {seat}.event_id = %s AND {seat}.status = %s
RETURNING {seat}.id, {seat}.price_amount
"""


def seats_hold_skip_locked(*, event_id: int, seat_ids: list[int]) -> dict[int, int]:
    """Hold those of the seats still available, without waiting for any lock,
    in one statement; returns the ids held, each with its price as held.
    Fewer ids than asked: some were taken, blocked by the seller, or locked
    by another transaction right now (``SKIP LOCKED`` passes over them), and
    the caller rolls back (the holds and locks go with it). A buyer naming
    seats never queues behind another's lock: an on-sale's buyers do not
    wait on each other (issue 36).

    A row that another transaction changed and committed since this
    statement's snapshot is re-checked on its latest version once locked
    (READ COMMITTED), so a seat just sold is not held again; the price
    returned is that latest version's too: a seller's price change committed
    since the caller read the seat (without a lock) is the price the seat is
    held at.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            _HOLD_SKIP_LOCKED_SQL.format(seat=Seat._meta.db_table),
            [
                SeatStatus.HELD,
                event_id,
                list(seat_ids),
                SeatStatus.AVAILABLE,
                event_id,
                SeatStatus.AVAILABLE,
            ],
        )
        return dict(cursor.fetchall())


class HoldAttempt(NamedTuple):
    """What ``seats_hold_all_skip_locked`` did: the ids it could not hold
    (empty: it held them all) and, when it held them all, each seat's price
    as held."""

    missing: set[int]
    prices: dict[int, int]


def seats_hold_all_skip_locked(*, event_id: int, seat_ids: list[int]) -> HoldAttempt:
    """Hold all of the seats or none of them, without waiting for any lock.

    ``missing`` are the ids that could not be held: sold, held or blocked,
    or locked by another transaction right now (``SKIP LOCKED`` passes over
    them instead of waiting). Empty: every seat is held, and stays locked
    until the commit; ``prices`` are then the prices they are held at (the
    latest committed version's, as ``seats_hold_skip_locked`` says).

    The statement runs in a savepoint: when it held only some of the seats,
    rolling the savepoint back releases their holds and their row locks at
    once, so a failed attempt leaves nothing locked for others to skip.
    A row that another transaction changed and committed since this
    statement's snapshot is re-checked on its latest version once locked
    (READ COMMITTED), so a seat just sold is not held again.
    """
    savepoint = transaction.savepoint()
    held = seats_hold_skip_locked(event_id=event_id, seat_ids=seat_ids)
    if held.keys() == set(seat_ids):
        transaction.savepoint_commit(savepoint)
        return HoldAttempt(missing=set(), prices=held)
    transaction.savepoint_rollback(savepoint)
    return HoldAttempt(missing=set(seat_ids) - held.keys(), prices={})


# The categories of the seats being released, locked FOR SHARE by primary
# key before the release reads them: a price change locks the categories it
# changes in the same order (seller/lock_objects.py), so two categories are
# never taken in opposite orders by the two.
_RELEASE_CATEGORIES_SQL = """
SELECT c.id FROM {category} c
 WHERE c.event_id = %s AND c.code IN (
       SELECT s.category FROM {seat} s WHERE s.event_id = %s AND s.id = ANY(%s::bigint[]))
 ORDER BY c.id FOR SHARE
"""

_RELEASE_SQL = """
UPDATE {seat} SET status = %s, price_amount = COALESCE(
    (SELECT c.price_amount FROM {category} c
      WHERE c.event_id = {seat}.event_id AND c.code = {seat}.category FOR SHARE),
    {seat}.price_amount)
 WHERE {seat}.event_id = %s AND {seat}.id = ANY(%s::bigint[])
"""


def seats_release_at_current_price(*, event_id: int, seat_ids: list[int]) -> None:
    """Make the seats available again, each at its category's current price
    (its own price when it has no category: a seat made before categories).

    A held or sold seat keeps the price it was held at while a seller's
    price change rewrites the seats on offer; released, it is on offer
    again at today's price. The category row is read ``FOR SHARE``, last in
    the lock order (the caller has locked the seats). A price change updates
    the category row first, then the seats on offer; so one in flight is
    either waited for here and its new price taken (its seat update saw this
    seat still held and passed it over), or waits for this commit and then
    finds the seat on offer and re-prices it. Either way the seat ends at the
    category's price. (The price change holds the category while it locks
    seats, this holds seats while it waits for the category; no deadlock:
    the seats it locks are on offer, never the ones a release holds.) The
    categories are locked first, by primary key, as a price change locks
    them: taken one by one in the update's own order, two categories could
    be taken in opposite orders by the two, each waiting for the other.
    """
    tables = {"seat": Seat._meta.db_table, "category": PriceCategory._meta.db_table}
    with connection.cursor() as cursor:
        cursor.execute(
            _RELEASE_CATEGORIES_SQL.format(**tables), [event_id, event_id, list(seat_ids)]
        )
        cursor.execute(
            _RELEASE_SQL.format(**tables),
            [SeatStatus.AVAILABLE, event_id, list(seat_ids)],
        )


def saga_for_update(*, saga_id) -> PurchaseSaga:
    """Lock the saga and read it with its reservation, in one statement.

    The reservation comes along unlocked (``OF`` the saga): its hold's end
    and ref never change, and the steps read them (the hold check, the facts
    an event carries) without another round trip. Every step of every saga
    starts here, twice for a gateway step, so the statement is
    written once rather than built by the ORM on each call (what a sampling
    profile of the worker showed: docs/performance.md,
    "Statements written once").
    """
    with connection.cursor() as cursor:
        cursor.execute(_saga_lock_sql(), [PurchaseSaga._meta.pk.to_python(saga_id)])
        row = cursor.fetchone()
    if row is None:
        raise PurchaseSaga.DoesNotExist(f"no saga {saga_id}")
    return _saga_of(row)


def _saga_of(row) -> PurchaseSaga:
    """The saga of a row of :func:`_saga_read_sql`, its reservation attached.
    Its event's status comes in the same statement (with the lock, for a
    lock): a charge refuses to start on a cancelled event
    (purchases/saga/charge.py), whatever a start that read the event just
    before its cancellation committed."""
    *columns, event_status = row
    saga, saga.reservation = rows.split(
        tuple(columns), PurchaseSaga, Reservation, db=connection.alias
    )
    saga.event_cancelled = event_status == EventStatus.CANCELLED
    return saga


@functools.cache
def _saga_read_sql() -> str:
    """A saga with its reservation joined by its whole key (id and event)
    and its event's status."""
    return (
        f"SELECT {', '.join(rows.columns(PurchaseSaga, 's') + rows.columns(Reservation, 'r'))},"
        " e.status"
        f" FROM {PurchaseSaga._meta.db_table} s"
        f" JOIN {Reservation._meta.db_table} r"
        " ON r.id = s.reservation_id AND r.event_id = s.event_id"
        f" JOIN {Event._meta.db_table} e ON e.id = s.event_id"
    )


@functools.cache
def _saga_lock_sql() -> str:
    return _saga_read_sql() + " WHERE s.id = %s FOR UPDATE OF s"


def sagas_for_update(*, event_id: int, saga_ids: list) -> dict:
    """Lock the sagas of one event, each read as :func:`saga_for_update`
    reads it, in one statement and in the order of their ids (so that two
    such locks cannot wait on each other); by id. A charge burst's
    recording starts here (purchases/saga/burst.py)."""
    with connection.cursor() as cursor:
        cursor.execute(_sagas_lock_sql(), [list(saga_ids), event_id])
        found = cursor.fetchall()
    sagas = [_saga_of(row) for row in found]
    return {saga.pk: saga for saga in sagas}


def saga_read(*, saga_id) -> PurchaseSaga:
    """The saga read as :func:`saga_for_update` reads it, without its lock
    and outside any transaction: one statement. Only for a decision that a
    later move cannot undo (a state the saga never comes back to); anything
    else is decided under the lock."""
    with connection.cursor() as cursor:
        cursor.execute(_saga_unlocked_sql(), [PurchaseSaga._meta.pk.to_python(saga_id)])
        row = cursor.fetchone()
    if row is None:
        raise PurchaseSaga.DoesNotExist(f"no saga {saga_id}")
    return _saga_of(row)


@functools.cache
def _saga_unlocked_sql() -> str:
    return _saga_read_sql() + " WHERE s.id = %s"


@functools.cache
def _sagas_lock_sql() -> str:
    return (
        _saga_read_sql() + " WHERE s.id = ANY(%s) AND s.event_id = %s ORDER BY s.id FOR UPDATE OF s"
    )


def saga_for_update_skip_locked(*, saga_ids) -> QuerySet[PurchaseSaga]:
    """For sweepers: a saga someone else holds is someone else's to drive."""
    return PurchaseSaga.objects.select_for_update(of=("self",), skip_locked=True).filter(
        pk__in=saga_ids
    )


def refund_for_update(*, refund_id, event_id: int) -> Refund:
    """A refund row, locked: every step of a refund starts here (its saga is
    not locked: a refund's steps never move the saga). Twice per refund, on
    the refunds' own pool: written once, as the saga's lock is (a profile of
    an event cancellation put a tenth of that pool's CPU in building this
    query: docs/performance.md, "Statements written once")."""
    key = Refund._meta.pk.to_python(refund_id)  # a malformed id: ValidationError, as the ORM
    with connection.cursor() as cursor:
        cursor.execute(_refund_lock_sql(), [key, event_id])
        row = cursor.fetchone()
    if row is None:
        raise Refund.DoesNotExist(f"no refund {refund_id} of event {event_id}")
    return rows.instance(Refund, row, db=connection.alias)


@functools.cache
def _refund_lock_sql() -> str:
    return (
        f"SELECT {', '.join(rows.columns(Refund, 'r'))} FROM {Refund._meta.db_table} r"
        " WHERE r.id = %s AND r.event_id = %s FOR UPDATE OF r"
    )


def cancellation_for_update_skip_locked(*, event_id: int) -> EventCancellation | None:
    """An event's cancellation run, unless another tick holds it (then that
    tick is the run's, and this one has nothing to do)."""
    return (
        EventCancellation.objects.select_for_update(skip_locked=True)
        .filter(event_id=event_id)
        .first()
    )


def organizer_event_for_update(*, organizer_id: int, event_id: int) -> Event | None:
    """An organizer's event, locked (an event's cancellation, which changes
    its status): None when the organizer has no such event."""
    return (
        Event.objects.select_for_update(of=("self",))
        .filter(pk=event_id, organizer_id=organizer_id)
        .first()
    )
