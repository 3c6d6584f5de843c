"""The only module that takes row locks for purchases.

Lock order, everywhere: event -> reservation -> saga -> seats, each by primary
key. Two transactions that need the same rows take them in the same order, so
they queue instead of deadlocking. The start transaction takes seats only; the
saga steps take the saga, then its seats.

Best available takes seats too, but never waits for one: ``SKIP LOCKED``
passes over a seat another transaction has locked, so it can stand in no
cycle of waits, whatever the others hold (docs/design.md, "Start").
"""

import functools

from django.db import connection, transaction
from django.db.models import QuerySet

from common import rows

from .models import PurchaseSaga, Reservation, Seat, SeatStatus


def seats_for_update(*, event_id: int, seat_ids: list[int]) -> list[Seat]:
    return list(
        Seat.objects.select_for_update(of=("self",))
        .filter(event_id=event_id, id__in=seat_ids)
        .order_by("id")
    )


_HOLD_SQL = """
UPDATE {seat} SET status = %s
  FROM (SELECT id FROM {seat} WHERE event_id = %s AND id = ANY(%s::bigint[])
        ORDER BY id FOR UPDATE) AS locked
 WHERE {seat}.id = locked.id AND {seat}.event_id = %s AND {seat}.status = %s
RETURNING {seat}.id
"""


def seats_lock_and_hold(*, event_id: int, seat_ids: list[int]) -> set[int]:
    """Lock the seats in id order and hold those still available, in one
    statement; returns the ids held. Fewer ids than asked: some were taken,
    and the caller rolls back (the locks go with it).

    The subquery takes the row locks in the fixed order; the UPDATE re-checks
    ``status`` on the latest committed version of each row (READ COMMITTED's
    re-check after a wait), so a seat sold by the transaction we waited for is
    not held again.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            _HOLD_SQL.format(seat=Seat._meta.db_table),
            [SeatStatus.HELD, event_id, list(seat_ids), event_id, SeatStatus.AVAILABLE],
        )
        return {row[0] for row in cursor.fetchall()}


_HOLD_SKIP_LOCKED_SQL = """
UPDATE {seat} SET status = %s
  FROM (SELECT id FROM {seat} WHERE event_id = %s AND id = ANY(%s::bigint[]) AND status = %s
        ORDER BY id FOR UPDATE SKIP LOCKED) AS locked
 WHERE {seat}.id = locked.id AND {seat}.event_id = %s AND {seat}.status = %s
RETURNING {seat}.id
"""


def seats_hold_all_skip_locked(*, event_id: int, seat_ids: list[int]) -> set[int]:
    """Hold all of the seats or none of them, without waiting for any lock.

    Returns the ids that could not be held: sold or held already, or locked by
    another transaction right now (``SKIP LOCKED`` passes over them instead of
    waiting). Empty: every seat is held, and stays locked until the commit.

    The statement runs in a savepoint: when it held only some of the seats,
    rolling the savepoint back releases their holds and their row locks at
    once, so a failed attempt leaves nothing locked for others to skip.
    A row that another transaction changed and committed since this
    statement's snapshot is re-checked on its latest version once locked
    (READ COMMITTED), so a seat just sold is not held again.
    """
    savepoint = transaction.savepoint()
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
        held = {row[0] for row in cursor.fetchall()}
    if held == set(seat_ids):
        transaction.savepoint_commit(savepoint)
        return set()
    transaction.savepoint_rollback(savepoint)
    return set(seat_ids) - held


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
    saga, saga.reservation = rows.split(row, PurchaseSaga, Reservation, db=connection.alias)
    return saga


@functools.cache
def _saga_lock_sql() -> str:
    """The saga's lock, with its reservation joined by its whole key (id
    and event)."""
    return (
        f"SELECT {', '.join(rows.columns(PurchaseSaga, 's') + rows.columns(Reservation, 'r'))}"
        f" FROM {PurchaseSaga._meta.db_table} s"
        f" JOIN {Reservation._meta.db_table} r"
        " ON r.id = s.reservation_id AND r.event_id = s.event_id"
        " WHERE s.id = %s FOR UPDATE OF s"
    )


def saga_for_update_skip_locked(*, saga_ids) -> QuerySet[PurchaseSaga]:
    """For sweepers: a saga someone else holds is someone else's to drive."""
    return PurchaseSaga.objects.select_for_update(of=("self",), skip_locked=True).filter(
        pk__in=saga_ids
    )
