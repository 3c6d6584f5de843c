"""The seat statements of a purchase find their rows by the primary key
whatever the planner's statistics say: the key is (id, event_id) in the
database (config/distribution.py), so a statement naming the id alone lets
the planner guess, and on a large table it guessed a sequential scan of
every seat for each reserve (make bench, after the key changed)."""

import pytest
from django.db import connection

from purchases import lock_objects
from purchases.models import Seat
from purchases.saga import start

from .factories import EventFactory


def _plan(sql: str, params) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.fixture
def many_seats():
    """An event among 250,000 seats of another, never analyzed (as right
    after an on-sale's seats are created)."""
    event, other = EventFactory(seats=["A1", "A2"]), EventFactory(seats=[])
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Seat._meta.db_table} (event_id, ref, row, number, price_amount,"
            " currency, status, section, category, x, y, accessible, block_reason)"
            " SELECT %s, 'S' || n, 'S', n, 5000, 'EUR', 'available', '', '', 0, 0, false, ''"
            " FROM generate_series(1, 250000) AS n",
            [other.pk],
        )
    return event, list(Seat.objects.filter(event=event).values_list("id", flat=True))


@pytest.mark.django_db
def test_holding_seats_reads_them_by_the_key(many_seats):
    """Not through best available's partial index of the available seats
    either: with the statistics missing, a hold by ids that said status =
    'available' was planned as a scan of every available seat of the event
    along that index (figure 1's reserve, 3.5 times slower). The index's
    predicate compares the status COLLATE "C", which no hold implies."""
    event, ids = many_seats
    sql = lock_objects._HOLD_SKIP_LOCKED_SQL.format(seat=Seat._meta.db_table)
    params = ["held", event.pk, ids, "available", event.pk, "available"]

    plan = _plan(sql, params)

    assert "Seq Scan" not in plan, plan
    assert "seat_available_in_row_order" not in plan, plan
    assert "purchases_seat_pkey" in plan, plan


@pytest.mark.django_db
def test_best_available_reads_the_available_seats_along_their_index(many_seats):
    event, _ = many_seats
    sql = start._CANDIDATES_SQL.format(
        seat=Seat._meta.db_table, available="available", after="", category=""
    )

    plan = _plan(sql, {"event": event.pk, "limit": 64})

    assert "Seq Scan" not in plan, plan
    assert "seat_available_in_row_order" in plan, plan
