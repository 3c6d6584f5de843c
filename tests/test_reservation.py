"""The start transaction: seats locked on real concurrent connections, and a
failed start leaves nothing behind (no saga, timer, outbox row or task)."""

import threading

import pytest
from django.db import connection, transaction

from outbox.models import OutboxMessage
from purchases.errors import SeatUnavailable
from purchases.models import (
    IdempotencyRecord,
    PurchaseSaga,
    Reservation,
    ReservationSeat,
    SagaHistory,
    Seat,
)
from purchases.services import purchase_start

from .conftest import new_key, race, start_purchase, work_callbacks
from .factories import EventFactory, UserFactory


def _counts():
    return {
        model.__name__: model.objects.count()
        for model in (
            PurchaseSaga,
            Reservation,
            ReservationSeat,
            SagaHistory,
            OutboxMessage,
            IdempotencyRecord,
        )
    }


@pytest.mark.django_db(transaction=True)
def test_two_connections_race_for_one_seat_one_wins():
    # given: one seat, two buyers on two real connections
    event = EventFactory(seats=["A1"])
    buyers = [UserFactory(username="racer0"), UserFactory(username="racer1")]

    # when
    results = race(
        2,
        lambda i: purchase_start(
            user=buyers[i],
            idempotency_key=new_key(),
            event_id=event.pk,
            seat_refs=["A1"],
            payment_method="pm_card_visa",
        ),
    )

    # then
    winners = [r for r in results if not isinstance(r, Exception)]
    losers = [r for r in results if isinstance(r, Exception)]
    assert len(winners) == 1, results
    assert len(losers) == 1 and isinstance(losers[0], SeatUnavailable), results
    assert losers[0].seats == ["A1"]
    assert PurchaseSaga.objects.count() == 1
    assert Seat.objects.get(event=event, ref="A1").status == "held"
    assert OutboxMessage.objects.count() == 1  # the winner's hold timer only


@pytest.mark.django_db(transaction=True)
def test_many_buyers_overlapping_seats_never_share_a_seat():
    # Overlapping pairs taken in different orders: also shows the fixed lock
    # order keeps them from deadlocking.
    event = EventFactory(seats=[f"A{n}" for n in range(1, 7)])
    buyers = [UserFactory(username=f"b{i}") for i in range(12)]
    wanted = [
        [f"A{(i % 6) + 1}", f"A{((i + 1) % 6) + 1}"][:: 1 if i % 2 else -1] for i in range(12)
    ]

    results = race(
        12,
        lambda i: purchase_start(
            user=buyers[i],
            idempotency_key=new_key(),
            event_id=event.pk,
            seat_refs=wanted[i],
            payment_method="pm_card_visa",
        ),
    )

    assert all(r is not None for r in results)
    assert not [
        r for r in results if isinstance(r, Exception) and not isinstance(r, SeatUnavailable)
    ], results
    live = list(
        ReservationSeat.objects.filter(released_at__isnull=True).values_list("seat__ref", flat=True)
    )
    assert len(live) == len(set(live))
    won = [r for r in results if not isinstance(r, Exception)]
    assert len(live) == 2 * len(won) and PurchaseSaga.objects.count() == len(won)
    assert Seat.objects.filter(event=event, status="held").count() == len(live)


@pytest.mark.django_db(transaction=True)
def test_a_seat_another_buyer_has_locked_is_refused_at_once_not_waited_for():
    """Seats named fail fast: a buyer does not queue behind another's row lock
    (an on-sale's named seats waited on each other: issue 36). The refusal
    names the seat and comes while the other still holds its lock."""
    event = EventFactory(seats=["A1", "A2"])
    buyer = UserFactory(username="impatient")
    a1 = Seat.objects.get(event=event, ref="A1")
    locked, release = threading.Event(), threading.Event()
    released_by_us: list[bool] = []

    def another_buyer() -> None:
        try:
            with transaction.atomic():
                Seat.objects.select_for_update().get(pk=a1.pk)
                locked.set()
                released_by_us.append(release.wait(30))
        finally:
            connection.close()

    holder = threading.Thread(target=another_buyer)
    holder.start()
    try:
        assert locked.wait(30)
        with pytest.raises(SeatUnavailable) as refused:
            purchase_start(
                user=buyer,
                idempotency_key=new_key(),
                event_id=event.pk,
                seat_refs=["A1", "A2"],
                payment_method="pm_card_visa",
            )
    finally:
        release.set()
        holder.join(30)

    assert released_by_us == [True]  # refused before the other let go
    assert refused.value.seats == ["A1"]
    assert list(Seat.objects.filter(event=event).values_list("status", flat=True)) == [
        "available",
        "available",
    ]
    assert PurchaseSaga.objects.count() == 0


def test_a_taken_seat_rolls_back_everything(alice, bob, event, django_capture_on_commit_callbacks):
    start_purchase(alice, event, seats=["A2"])
    before = _counts()

    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(SeatUnavailable) as err:
        purchase_start(
            user=bob,
            idempotency_key=new_key(),
            event_id=event.pk,
            seat_refs=["A1", "A2"],
            payment_method="pm_card_visa",
        )

    assert err.value.seats == ["A2"]
    assert _counts() == before
    assert callbacks == []  # no task enqueued
    assert Seat.objects.get(event=event, ref="A1").status == "available"


def test_commit_enqueues_the_charge_exactly_once(
    alice, event, django_capture_on_commit_callbacks, broker_queue
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        saga = start_purchase(alice, event)

    assert len(work_callbacks(callbacks)) == 1
    assert broker_queue.messages() == [{"task": "purchases.charge", "args": [str(saga.pk)]}]


def test_rollback_enqueues_nothing(alice, event, django_capture_on_commit_callbacks, broker_queue):
    with django_capture_on_commit_callbacks(execute=True):
        start_purchase(alice, event, seats=["A1"])
    assert len(broker_queue.messages()) == 1

    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(SeatUnavailable),
    ):
        start_purchase(alice, event, seats=["A1"])

    assert callbacks == []
    assert broker_queue.messages() == []


def test_start_writes_one_of_each(alice, event):
    saga = start_purchase(alice, event, seats=["A1", "A3"])

    assert saga.state == "PENDING" and saga.version == 1
    assert saga.intent_id == f"pi_{saga.reservation.ref}"
    assert saga.amount == 5000 and saga.currency == "EUR"
    assert saga.reservation.status == "HELD"
    timer = OutboxMessage.objects.get(key=f"hold:{saga.pk}")
    assert timer.available_at == saga.reservation.hold_expires_at
    assert (timer.fired_at, timer.cancelled_at) == (None, None)
    assert list(saga.history.values_list("from_state", "to_state")) == [(None, "PENDING")]
    # The record keeps the purchase as first answered (the API adds the HTTP).
    assert IdempotencyRecord.objects.get(saga=saga).response_body["id"] == str(saga.pk)
