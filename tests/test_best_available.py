"""Best available (docs/api.md, "Best available"; docs/design.md, "Start"):
``"quantity": N`` instead of ``"seats"``. Which block is chosen, what is
refused and with what, replays by Idempotency-Key, and the locking on real
concurrent PostgreSQL connections: best-available buyers never wait on a
seat's row lock (``SKIP LOCKED``; each worker runs with a short
``lock_timeout``, so a wait would fail it), never share a seat, and do not
deadlock with named-seat buyers."""

from __future__ import annotations

import hashlib

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from outbox.models import OutboxMessage
from purchases import lock_objects
from purchases.errors import NotEnoughSeats
from purchases.models import (
    IdempotencyRecord,
    PurchaseSaga,
    ReservationSeat,
    Seat,
)
from purchases.saga import start
from purchases.services import purchase_start, request_fingerprint, saga_charge

from .conftest import new_key, race, row_counts
from .factories import EventFactory, UserFactory

PURCHASES = "/api/purchases/"
# A best-available buyer that had to wait on a row lock fails with
# lock_not_available after this; none may.
LOCK_TIMEOUT = "200ms"


def hall(rows: str = "A", per_row: int = 10, **kwargs):
    """An event with ``rows`` x 1..``per_row`` seats (refs A1, A2, ...)."""
    return EventFactory(seats=[f"{r}{n}" for r in rows for n in range(1, per_row + 1)], **kwargs)


def set_status(event, refs, status="sold") -> None:
    Seat.objects.filter(event=event, ref__in=list(refs)).update(status=status)


def best_body(event, quantity, payment_method="pm_card_visa") -> dict:
    return {"event": event.pk, "quantity": quantity, "payment_method": payment_method}


def post(client, body, *, key=None):
    return client.post(
        PURCHASES, body, format="json", headers={"Idempotency-Key": key or new_key()}
    )


def seat_statuses(event) -> dict[str, str]:
    return dict(Seat.objects.filter(event=event).values_list("ref", "status"))


# --- which block ---------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        # The row's centre is 5.5 (the mean of its first and last numbers).
        (3, ["A4", "A5", "A6"]),  # 4-6 and 5-7 are as near: the lower numbers
        (2, ["A5", "A6"]),
        (1, ["A5"]),  # 5 and 6 are as near: the lower
        (4, ["A4", "A5", "A6", "A7"]),
        (10, [f"A{n}" for n in range(1, 11)]),
    ],
)
def test_an_empty_row_gives_the_block_nearest_its_middle(alice_api, quantity, expected):
    event = hall()

    answer = post(alice_api, best_body(event, quantity))

    assert answer.status_code == 202, answer.content
    assert answer.json()["seats"] == expected
    assert answer.json()["total"] == {"amount": 2500 * quantity, "currency": "EUR"}
    held = {ref for ref, status in seat_statuses(event).items() if status == "held"}
    assert held == set(expected)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        # 5 and 6 are taken: 2-4 and 7-9 are as near the middle (5.5): the lower.
        (3, ["A2", "A3", "A4"]),
        (4, ["A1", "A2", "A3", "A4"]),
        (2, ["A3", "A4"]),  # centre 3.5, as near as 7-8 (7.5): the lower
    ],
)
def test_a_row_with_a_gap_gives_its_best_block(alice_api, quantity, expected):
    event = hall()
    set_status(event, ["A5"], "sold")
    set_status(event, ["A6"], "held")

    answer = post(alice_api, best_body(event, quantity))

    assert answer.status_code == 202, answer.content
    assert answer.json()["seats"] == expected


@pytest.mark.django_db
def test_the_middle_is_the_rows_not_the_free_seats(alice_api):
    # Free: 3-5 and 7-10. The row spans 1-10 (centre 5.5): 4-5 is nearest. (The
    # middle of the free seats, 6.5, would have given 7-8.)
    event = hall()
    set_status(event, ["A1", "A2", "A6"])

    answer = post(alice_api, best_body(event, 2))

    assert answer.json()["seats"] == ["A4", "A5"]


@pytest.mark.django_db
def test_a_full_first_row_gives_the_second(alice_api):
    event = hall("AB")
    set_status(event, [f"A{n}" for n in range(1, 11)])

    answer = post(alice_api, best_body(event, 2))

    assert answer.status_code == 202, answer.content
    assert answer.json()["seats"] == ["B5", "B6"]


@pytest.mark.django_db
def test_a_first_row_without_n_adjacent_seats_gives_the_second(alice_api):
    # Row A has 5 free seats, none next to another: rows come before the middle.
    event = hall("ABC")
    set_status(event, [f"A{n}" for n in range(2, 11, 2)])

    answer = post(alice_api, best_body(event, 2))

    assert answer.json()["seats"] == ["B5", "B6"]


@pytest.mark.django_db
def test_rows_are_taken_in_label_order_whatever_their_creation_order(alice_api):
    event = EventFactory(seats=[f"C{n}" for n in range(1, 5)] + [f"B{n}" for n in range(1, 5)])

    answer = post(alice_api, best_body(event, 2))

    assert answer.json()["seats"] == ["B2", "B3"]


@pytest.mark.django_db
def test_adjacent_means_consecutive_numbers(alice_api):
    # No seat 5 in this row: 4 and 6 are not next to each other.
    event = EventFactory(seats=["A3", "A4", "A6", "A7"])

    answer = post(alice_api, best_body(event, 3))

    assert answer.status_code == 409, answer.content
    assert answer.json()["available"] == 4


@pytest.mark.django_db
def test_no_row_with_n_adjacent_seats_is_409_with_the_available_count_and_writes_nothing(
    alice_api, django_capture_on_commit_callbacks
):
    # given: runs of at most 2 free seats, 7 free seats in all (A3, A6, A9
    # sold, row B sold out)
    event = hall("AB")
    set_status(event, ["A3", "A6", "A9"] + [f"B{n}" for n in range(1, 11)])
    before, statuses = row_counts(), seat_statuses(event)

    # when
    with django_capture_on_commit_callbacks() as callbacks:
        answer = post(alice_api, best_body(event, 3))

    # then
    assert answer.status_code == 409, answer.content
    body = answer.json()
    assert (body["code"], body["available"]) == ("not_enough_seats", 7)
    assert isinstance(body["detail"], str) and body["detail"]
    assert "seats" not in body
    assert row_counts() == before
    assert seat_statuses(event) == statuses
    assert callbacks == []


@pytest.mark.django_db
def test_a_sold_out_event_is_409_with_zero_available(alice_api):
    event = hall()
    set_status(event, [f"A{n}" for n in range(1, 11)])

    answer = post(alice_api, best_body(event, 1))

    assert answer.status_code == 409
    assert answer.json()["available"] == 0


@pytest.mark.django_db
def test_an_unknown_event_is_400_event(alice_api):
    answer = post(alice_api, {"event": 987654, "quantity": 2, "payment_method": "pm_card_visa"})

    assert answer.status_code == 400
    assert (answer.json()["code"], answer.json()["field"]) == ("invalid", "event")


@pytest.mark.django_db
def test_after_the_start_the_saga_is_the_named_seats_one(alice, alice_api, gateway):
    # Confirmed by the same charge step; a decline releases the same seats,
    # which the next best-available buyer gets again.
    event = hall()
    first = post(alice_api, best_body(event, 2)).json()
    saga = saga_charge(saga_id=first["id"])
    assert saga.state == "CONFIRMED"
    assert {seat_statuses(event)[r] for r in first["seats"]} == {"sold"}
    detail = alice_api.get(first["links"]["self"]).json()
    assert detail["seats"] == first["seats"] == ["A5", "A6"]

    declined = post(alice_api, best_body(event, 2, "pm_card_chargeDeclined")).json()
    assert declined["seats"] == ["A3", "A4"]  # as near as 7-8: the lower
    assert saga_charge(saga_id=declined["id"]).state == "COMPENSATED"
    assert post(alice_api, best_body(event, 2)).json()["seats"] == ["A3", "A4"]


# --- validation ------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"seats": ["A1"]}, "quantity"),  # both: the quantity is named
        ({"quantity": None}, "quantity"),
        ({"quantity": 0}, "quantity"),
        ({"quantity": -1}, "quantity"),
        ({"quantity": 11}, "quantity"),  # MAX_SEATS_PER_PURCHASE + 1
        ({"quantity": "3"}, "quantity"),
        ({"quantity": True}, "quantity"),
        ({"quantity": 3.5}, "quantity"),
        ({"quantity": [3]}, "quantity"),
    ],
)
def test_a_bad_quantity_or_both_fields_is_400_naming_the_field(alice_api, change, field):
    event = hall()
    before = row_counts()

    answer = post(alice_api, {**best_body(event, 3), **change})

    assert answer.status_code == 400, answer.content
    body = answer.json()
    assert (body["code"], body["field"]) == ("invalid", field)
    assert field in body["errors"]
    assert row_counts() == before


@pytest.mark.django_db
def test_neither_seats_nor_quantity_is_400_naming_seats(alice_api):
    event = hall()

    answer = post(alice_api, {"event": event.pk, "payment_method": "pm_card_visa"})

    assert answer.status_code == 400
    assert (answer.json()["code"], answer.json()["field"]) == ("invalid", "seats")
    assert "quantity" in answer.json()["detail"]


@pytest.mark.django_db
def test_the_limit_follows_the_setting(alice_api, settings):
    settings.MAX_SEATS_PER_PURCHASE = 2
    event = hall()

    assert post(alice_api, best_body(event, 3)).json()["field"] == "quantity"
    assert post(alice_api, best_body(event, 2)).status_code == 202


@pytest.mark.django_db
def test_the_service_takes_exactly_one_of_seat_refs_and_quantity(alice):
    event = hall()
    common = {"user": alice, "event_id": event.pk, "payment_method": "pm_card_visa"}

    with pytest.raises(ValueError):
        purchase_start(idempotency_key=new_key(), seat_refs=["A1"], quantity=1, **common)
    with pytest.raises(ValueError):
        purchase_start(idempotency_key=new_key(), **common)
    with pytest.raises(ValueError):
        purchase_start(idempotency_key=new_key(), quantity=0, **common)
    assert PurchaseSaga.objects.count() == 0


# --- idempotency -----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_replay_answers_the_same_seats_after_the_best_block_moved(alice_api):
    # given: a first answer, then the hall changes (its seats sold, the rest too)
    event = hall("AB")
    key, body = new_key(), best_body(event, 3)
    first = post(alice_api, body, key=key)
    assert first.json()["seats"] == ["A4", "A5", "A6"]
    set_status(event, [r for r, s in seat_statuses(event).items() if s == "available"])
    after_first = row_counts()

    # when
    replay = post(alice_api, body, key=key)

    # then: the first answer byte for byte, nothing new
    assert replay.status_code == 202
    assert replay.content == first.content
    assert row_counts() == after_first


@pytest.mark.django_db
@pytest.mark.parametrize("other", [{"quantity": 2}, {"seats": ["A1", "A2", "A3"]}])
def test_the_same_key_with_another_quantity_or_named_seats_is_422(alice_api, other):
    event = hall()
    key = new_key()
    assert post(alice_api, best_body(event, 3), key=key).status_code == 202
    before = row_counts()

    body = {k: v for k, v in best_body(event, 3).items() if k != "quantity"} | other
    answer = post(alice_api, body, key=key)

    assert answer.status_code == 422
    assert answer.json()["code"] == "idempotency_key_reused"
    assert row_counts() == before


@pytest.mark.django_db
def test_a_named_seats_key_is_not_replayed_by_a_quantity_body(alice_api):
    event = hall()
    key = new_key()
    assert (
        post(
            alice_api,
            {"event": event.pk, "seats": ["A1"], "payment_method": "pm_card_visa"},
            key=key,
        ).status_code
        == 202
    )

    assert post(alice_api, best_body(event, 1), key=key).status_code == 422


def test_the_fingerprint_of_a_named_seats_body_did_not_change():
    # Records stored before best available must still replay.
    canonical = '{"event":7,"payment_method":"pm_card_visa","seats":["A1","A2"]}'

    assert (
        request_fingerprint(event_id=7, seat_refs=["A1", "A2"], payment_method="pm_card_visa")
        == hashlib.sha256(canonical.encode()).hexdigest()
    )
    assert request_fingerprint(
        event_id=7, quantity=2, payment_method="pm_card_visa"
    ) != request_fingerprint(event_id=7, quantity=3, payment_method="pm_card_visa")


# --- concurrency, on real connections ----------------------------------------------------


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _answer(response) -> tuple[int, dict]:
    return response.status_code, response.json()


def _live_holdings() -> dict[int, list[Seat]]:
    """Reservation id -> its live seats."""
    holdings: dict[int, list[Seat]] = {}
    for link in ReservationSeat.objects.filter(released_at__isnull=True).select_related("seat"):
        holdings.setdefault(link.reservation_id, []).append(link.seat)
    return holdings


def _assert_no_seat_twice_and_all_held(event) -> dict[int, list[Seat]]:
    holdings = _live_holdings()
    refs = [s.ref for seats in holdings.values() for s in seats]
    assert len(refs) == len(set(refs)), "a seat is in two reservations"
    held = {r for r, s in seat_statuses(event).items() if s == "held"}
    assert held == set(refs)
    return holdings


def _assert_adjacent_in_one_row(seats: list[Seat], quantity: int) -> None:
    numbers = sorted(s.number for s in seats)
    assert len({s.row for s in seats}) == 1, seats
    assert numbers == list(range(numbers[0], numbers[0] + quantity)), seats


@pytest.mark.django_db(transaction=True)
def test_fifty_best_available_buyers_never_wait_and_never_share_a_seat():
    # given: 40 seats in 4 rows of 10, 50 buyers asking for 1 to 4 seats each
    event = hall("ABCD")
    buyers = [UserFactory(username=f"ba{i}") for i in range(50)]
    quantities = [i % 4 + 1 for i in range(50)]

    # when: all at once, each with lock_timeout set
    results = race(
        50,
        lambda i: _answer(post(_client(buyers[i]), best_body(event, quantities[i]))),
        lock_timeout=LOCK_TIMEOUT,
    )

    # then: a 202 or a 409 for every buyer, nothing else (no lock timeout, no
    # deadlock, no 500)
    unexpected = [
        r
        for r in results
        if isinstance(r, Exception)
        or (r[0], r[1].get("code")) not in {(202, None), (409, "not_enough_seats")}
    ]
    assert unexpected == [], unexpected
    accepted = {r[1]["id"]: i for i, r in enumerate(results) if r[0] == 202}
    assert accepted, "nobody got a seat"
    for status, body in results:
        if status == 409:
            assert 0 <= body["available"] <= 40
    # no seat twice; each holding is N adjacent seats of one row, as answered
    holdings = _assert_no_seat_twice_and_all_held(event)
    assert sum(len(s) for s in holdings.values()) <= 40
    for saga in PurchaseSaga.objects.filter(pk__in=accepted).select_related("reservation"):
        i = accepted[str(saga.pk)]
        seats = holdings[saga.reservation_id]
        _assert_adjacent_in_one_row(seats, quantities[i])
        assert sorted(s.ref for s in seats) == sorted(results[i][1]["seats"])
    assert PurchaseSaga.objects.count() == len(accepted)
    assert OutboxMessage.objects.count() == len(accepted)  # one hold timer each


@pytest.mark.django_db(transaction=True)
def test_best_available_beside_named_seat_buyers_no_double_sale_no_deadlock():
    # given: best-available buyers (never waiting: lock_timeout) and named-seat
    # buyers (who may wait on a seat's lock) on the same rows, at once
    event = hall("ABCD")
    n = 40
    buyers = [UserFactory(username=f"mix{i}") for i in range(n)]
    quantities = {i: i % 3 + 1 for i in range(0, n, 2)}
    # Named buyers ask for overlapping pairs near the middle (4-5, 5-6, 6-7 of
    # each row), half of them in descending order.
    named = {}
    for i in range(1, n, 2):
        row, low = "ABCD"[(i // 2) % 4], 4 + (i // 2) % 3
        named[i] = [f"{row}{low}", f"{row}{low + 1}"][:: -1 if i % 4 == 1 else 1]

    def attempt(i):
        if i in quantities:
            with connection.cursor() as cursor:
                cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
            return _answer(post(_client(buyers[i]), best_body(event, quantities[i])))
        if i in named:
            return _answer(
                post(
                    _client(buyers[i]),
                    {"event": event.pk, "seats": named[i], "payment_method": "pm_card_visa"},
                )
            )
        return None

    # when
    results = race(n, attempt)

    # then
    allowed = {(202, None), (409, "not_enough_seats"), (409, "seat_unavailable")}
    unexpected = [
        (i, r)
        for i, r in enumerate(results)
        if (i in quantities or i in named)
        and (isinstance(r, Exception) or (r[0], r[1].get("code")) not in allowed)
    ]
    assert unexpected == [], unexpected
    for i in quantities:
        assert results[i][1].get("code") != "seat_unavailable"
    holdings = _assert_no_seat_twice_and_all_held(event)
    by_saga = {str(s.pk): s.reservation_id for s in PurchaseSaga.objects.all()}
    for i in quantities:
        if results[i][0] == 202:
            _assert_adjacent_in_one_row(holdings[by_saga[results[i][1]["id"]]], quantities[i])
    for i in named:
        if results[i][0] == 202:
            assert sorted(s.ref for s in holdings[by_saga[results[i][1]["id"]]]) == sorted(named[i])


@pytest.mark.django_db(transaction=True)
def test_a_seat_locked_by_another_transaction_is_skipped_not_waited_on(monkeypatch):
    # given: A5 row-locked by a transaction kept open on this connection (the
    # best block for 2 is 5-6); the next pick the next best, not one of the
    # few best at random (the spread has its own test below)
    monkeypatch.setattr(start, "RETRY_SPREAD", 1)
    event = hall()
    buyer = UserFactory(username="skipper")
    seat = Seat.objects.get(event=event, ref="A5")

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {Seat._meta.db_table} WHERE id = %s FOR UPDATE", [seat.pk]
            )

        # when: a best-available buyer on its own connection, lock_timeout set
        [result] = race(
            1,
            lambda i: _answer(post(_client(buyer), best_body(event, 2), key="skip-1")),
            lock_timeout=LOCK_TIMEOUT,
        )

        # then: the next best block, at once (a wait would have timed out)
        assert not isinstance(result, Exception), result
        assert result[0] == 202, result
        assert result[1]["seats"] == ["A6", "A7"]

    # The key keeps the block held (not the first one tried): a replay says so.
    replay = post(_client(buyer), best_body(event, 2), key="skip-1")
    assert (replay.status_code, replay.json()) == result
    assert IdempotencyRecord.objects.get(user=buyer, key="skip-1").response_body["seats"] == [
        "A6",
        "A7",
    ]
    # And once the lock is gone, 5 is taken by the next buyer, with 4.
    assert post(_client(buyer), best_body(event, 2)).json()["seats"] == ["A4", "A5"]


@pytest.mark.django_db(transaction=True)
def test_seats_being_taken_are_not_counted_as_available():
    # given: the only free pair A5-A6 with A5 row-locked by another transaction
    event = hall()
    set_status(event, [f"A{n}" for n in range(1, 11) if n not in (5, 6)])
    buyer = UserFactory(username="counter")
    seat = Seat.objects.get(event=event, ref="A5")

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {Seat._meta.db_table} WHERE id = %s FOR UPDATE", [seat.pk]
            )

        [result] = race(
            1,
            lambda i: purchase_start(
                user=buyer,
                idempotency_key=new_key(),
                event_id=event.pk,
                quantity=2,
                payment_method="pm_card_visa",
            ),
            lock_timeout=LOCK_TIMEOUT,
        )

    # then: refused at once; A5 is being taken, A6 is the one available
    assert isinstance(result, NotEnoughSeats), result
    assert result.available == 1
    assert PurchaseSaga.objects.count() == 0
    assert seat_statuses(event)["A6"] == "available"


@pytest.mark.django_db
def test_a_stale_first_read_costs_one_more_attempt_not_one_per_seat_sold_since(monkeypatch):
    """An on-sale: the seats a request read as available at its start are
    sold by others before its first attempt. The request reads them again
    after a failed attempt, rather than trying each seat sold since, one by
    one (bench figure 10 saw quantity-1 requests take 25 s that way)."""
    event = hall("A", per_row=20)
    stale = start._best_available_candidates(event_id=event.pk)
    # Sold since that read: every seat but the last two of the row.
    set_status(event, [f"A{n}" for n in range(1, 19)])
    reads = iter([stale])
    real_read = start._best_available_candidates
    monkeypatch.setattr(
        start,
        "_best_available_candidates",
        lambda **kwargs: next(reads, None) or real_read(**kwargs),
    )
    attempts = []
    real_hold = lock_objects.seats_hold_all_skip_locked

    def counting_hold(**kwargs):
        attempts.append(kwargs["seat_ids"])
        return real_hold(**kwargs)

    monkeypatch.setattr(lock_objects, "seats_hold_all_skip_locked", counting_hold)

    started = purchase_start(
        user=UserFactory(),
        idempotency_key=new_key(),
        event_id=event.pk,
        seat_refs=None,
        quantity=1,
        payment_method="pm_card_visa",
    )

    assert started.purchase["seats"] in (["A19"], ["A20"])
    assert len(attempts) == 2  # the stale pick, then one from a fresh read


@pytest.mark.django_db
def test_after_a_failed_attempt_the_next_block_is_one_of_the_few_best_at_random():
    """Buyers who collided on one block (they read the same seats at the
    same instant) spread over the next few instead of all trying the same
    next best: the pick after a failed attempt is one of the
    ``RETRY_SPREAD`` best blocks that share no seat, at random."""
    event = hall("A", per_row=10)
    a5 = Seat.objects.get(event=event, ref="A5")

    def picks(spread):
        found = [
            start._find_best_block(event_id=event.pk, quantity=2, excluded={a5.pk}, spread=spread)
            for _ in range(40)
        ]
        return {tuple(seat.ref for seat in block or []) for block in found}

    # The best without A5 (nearest the middle, 5.5), then the best of what
    # each leaves: 6-7, 3-4, 8-9, 1-2.
    assert picks(1) == {("A6", "A7")}
    spread = picks(4)
    assert spread <= {("A6", "A7"), ("A3", "A4"), ("A8", "A9"), ("A1", "A2")}, spread
    assert len(spread) > 1, spread  # 40 draws of 4: all alike once in 4**39
    assert start.RETRY_SPREAD > 1


# --- the search a chunk at a time ----------------------------------------------------


def _hall_with_sections(event) -> list[Seat]:
    """Sections "" and "Balcony", rows A, AA, B (code point order: "A" <
    "AA" < "B"), rows of 1 to 9 seats, some numbers missing, two currencies
    in one row: every case the search's order and runs depend on."""
    seats = []
    for section in ("", "Balcony"):
        for row, numbers in (("B", range(1, 10)), ("AA", [1, 2, 4, 5, 6]), ("A", range(3, 9))):
            for n in numbers:
                seats.append(
                    Seat(
                        event=event,
                        ref=f"{section[:1]}{row}{n}",
                        section=section,
                        row=row,
                        number=n,
                        price_amount=2500,
                        currency="USD" if (row, n) == ("B", 5) else "EUR",
                    )
                )
    return Seat.objects.bulk_create(seats)


@pytest.mark.django_db
@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8, 512])
def test_the_search_a_chunk_at_a_time_picks_what_reading_every_seat_picks(monkeypatch, chunk):
    """Whatever the chunk's size (a row cut short, a row larger than the
    chunk), the block found is the one ``_best_block`` picks among every
    available seat of the hall, read at once."""
    import random

    event = EventFactory(seats=[])
    seats = _hall_with_sections(event)
    rng = random.Random(chunk)
    monkeypatch.setattr(start, "CHUNK_SEATS", chunk)
    for _ in range(12):
        sold = {s.ref for s in seats if rng.random() < 0.45}
        Seat.objects.filter(event=event).update(status="available")
        set_status(event, sold)
        every = start._best_available_candidates(event_id=event.pk, limit=10_000)
        for quantity in (1, 2, 3, 4):
            expected = start._best_block(every, quantity=quantity)
            found = start._find_best_block(event_id=event.pk, quantity=quantity)
            assert [s.ref for s in found or []] == [s.ref for s in expected or []], (
                sorted(sold),
                quantity,
            )
