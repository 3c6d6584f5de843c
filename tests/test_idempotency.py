"""Idempotency-Key on POST /api/purchases/ (docs/api.md): a replay answers
the first answer and creates nothing; a key is per user; a failed attempt
stores nothing. The races run on real concurrent PostgreSQL connections."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from outbox.models import OutboxMessage
from purchases import services
from purchases.models import (
    IdempotencyRecord,
    PurchaseSaga,
    Reservation,
    ReservationSeat,
    SagaHistory,
    Seat,
)

from .conftest import new_key, purchase_body, row_counts, work_callbacks
from .factories import EventFactory, UserFactory

PURCHASES = "/api/purchases/"
THREADS = 8


def post_purchase(client, body, *, key):
    return client.post(PURCHASES, body, format="json", headers={"Idempotency-Key": key})


def hold_timers(saga_id) -> int:
    return OutboxMessage.objects.filter(key=f"hold:{saga_id}").count()


def seat_statuses(event) -> dict[str, str]:
    return dict(Seat.objects.filter(event=event).values_list("ref", "status"))


# --- sequential -----------------------------------------------------------------------


@pytest.mark.django_db
def test_replay_answers_the_first_answer_byte_for_byte_and_creates_nothing(
    alice_api, event, django_capture_on_commit_callbacks
):
    # given
    key, body = new_key(), purchase_body(event, seats=["A1", "A2"])
    with django_capture_on_commit_callbacks() as first_callbacks:
        first = post_purchase(alice_api, body, key=key)
    assert first.status_code == 202
    after_first = row_counts()

    # when
    with django_capture_on_commit_callbacks() as replay_callbacks:
        replay = post_purchase(alice_api, body, key=key)

    # then
    assert replay.status_code == 202
    assert replay.json() == first.json()
    assert replay.content == first.content
    assert replay["Location"] == first["Location"]
    assert len(work_callbacks(first_callbacks)) == 1  # the charge is enqueued once...
    assert replay_callbacks == []  # ...and not again by the replay (which moves nothing)
    assert row_counts() == after_first
    assert after_first["sagas"] == after_first["reservations"] == 1
    assert after_first["idempotency"] == 1
    assert hold_timers(first.json()["id"]) == 1


@pytest.mark.django_db
def test_replay_after_the_saga_moved_on_still_answers_the_first_answer(alice_api, event, gateway):
    # given: the purchase was charged and confirmed since the first answer
    key, body = new_key(), purchase_body(event, seats=["A1"])
    first = post_purchase(alice_api, body, key=key)
    saga = services.saga_charge(saga_id=first.json()["id"])
    assert saga.state == "CONFIRMED"
    after_confirm = row_counts()

    # when
    replay = post_purchase(alice_api, body, key=key)

    # then
    assert replay.status_code == 202
    assert replay.json() == first.json()
    assert replay.json()["status"] == "PENDING"
    assert row_counts() == after_confirm
    assert gateway.calls == [("charge", saga.intent_id)]


@pytest.mark.django_db
def test_same_key_with_a_different_body_is_422_and_writes_nothing(alice_api, event):
    # given
    key = new_key()
    assert post_purchase(alice_api, purchase_body(event, seats=["A1"]), key=key).status_code == 202
    before = row_counts()
    statuses = seat_statuses(event)

    # when
    reused = [
        post_purchase(alice_api, purchase_body(event, seats=["A2"]), key=key),
        post_purchase(alice_api, purchase_body(event, seats=["A1", "A2"]), key=key),
        post_purchase(
            alice_api,
            purchase_body(event, seats=["A1"], payment_method="pm_card_chargeDeclined"),
            key=key,
        ),
    ]

    # then
    for response in reused:
        assert response.status_code == 422, response.content
        assert response.json()["code"] == "idempotency_key_reused"
        assert response.json()["detail"]
    assert row_counts() == before
    assert seat_statuses(event) == statuses


@pytest.mark.django_db
def test_keys_are_scoped_per_user(alice_api, bob_api, alice, bob, event):
    # given: alice used the key
    key = new_key()
    alices = post_purchase(alice_api, purchase_body(event, seats=["A1"]), key=key)
    assert alices.status_code == 202

    # when: bob uses the same key for his own seats
    bobs = post_purchase(bob_api, purchase_body(event, seats=["A2"]), key=key)

    # then: a purchase of his own, not a 422 and not alice's answer
    assert bobs.status_code == 202, bobs.content
    assert bobs.json()["id"] != alices.json()["id"]
    assert bobs.json()["seats"] == ["A2"]
    assert PurchaseSaga.objects.get(pk=bobs.json()["id"]).buyer == bob
    assert PurchaseSaga.objects.get(pk=alices.json()["id"]).buyer == alice
    assert IdempotencyRecord.objects.filter(key=key).count() == 2
    # and alice's replay still answers hers
    assert post_purchase(alice_api, purchase_body(event, seats=["A1"]), key=key).json() == (
        alices.json()
    )


@pytest.mark.django_db
def test_same_key_and_body_from_another_user_is_not_a_replay(alice_api, bob_api, event):
    # given
    key, body = new_key(), purchase_body(event, seats=["A1"])
    alices = post_purchase(alice_api, body, key=key)

    # when
    bobs = post_purchase(bob_api, body, key=key)

    # then: bob really tried to buy A1, which alice holds
    assert alices.status_code == 202
    assert bobs.status_code == 409
    assert bobs.json()["code"] == "seat_unavailable"
    assert bobs.json()["seats"] == ["A1"]


@pytest.mark.django_db
def test_a_failed_attempt_stores_nothing_for_its_key(alice_api, bob_api, event):
    # given: bob holds A1
    assert (
        post_purchase(bob_api, purchase_body(event, seats=["A1"]), key=new_key()).status_code == 202
    )
    key = new_key()

    # when: alice's attempt at A1 fails
    failed = post_purchase(alice_api, purchase_body(event, seats=["A1"]), key=key)

    # then
    assert failed.status_code == 409
    assert IdempotencyRecord.objects.filter(key=key).count() == 0
    # the key is still free: a different body is a new request, not a 422
    retried = post_purchase(alice_api, purchase_body(event, seats=["A2"]), key=key)
    assert retried.status_code == 202, retried.content
    assert retried.json()["seats"] == ["A2"]
    assert IdempotencyRecord.objects.filter(key=key).count() == 1


@pytest.mark.django_db
def test_a_rejected_request_stores_nothing_for_its_key(alice_api, event):
    # given: a 400 (unknown seat) with this key
    key = new_key()
    rejected = post_purchase(alice_api, purchase_body(event, seats=["Z9"]), key=key)
    assert rejected.status_code == 400

    # when
    accepted = post_purchase(alice_api, purchase_body(event, seats=["A1"]), key=key)

    # then
    assert accepted.status_code == 202, accepted.content
    assert IdempotencyRecord.objects.filter(key=key).count() == 1


# --- concurrent, on real connections ---------------------------------------------------


def _token_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _post_at_once(requests: list[tuple[str, str, dict]]) -> list[tuple[int, bytes]]:
    """POST every (token, key, body) from its own thread and connection, all
    released by one barrier. Returns (status, content) in the same order."""
    barrier = threading.Barrier(len(requests), timeout=30)
    results: list = [None] * len(requests)

    def run(i: int, token: str, key: str, body: dict) -> None:
        try:
            client = _token_client(token)
            barrier.wait()
            response = post_purchase(client, body, key=key)
            results[i] = (response.status_code, response.content)
        except BaseException as exc:  # reported by the assertion below
            results[i] = exc
        finally:
            connection.close()

    threads = [
        threading.Thread(target=run, args=(i, *request)) for i, request in enumerate(requests)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not [t for t in threads if t.is_alive()], "a request never came back"
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    return results


@pytest.mark.django_db(transaction=True)
def test_concurrent_replays_create_one_purchase():
    # given
    alice = UserFactory(username="alice")
    token = Token.objects.create(user=alice).key
    event = EventFactory(seats=["A1", "A2", "A3"])
    key, body = new_key(), purchase_body(event, seats=["A1", "A2"])

    # when
    results = _post_at_once([(token, key, body)] * THREADS)

    # then
    assert [status for status, _ in results] == [202] * THREADS, results

    bodies = [json.loads(content) for _, content in results]
    assert all(b == bodies[0] for b in bodies), bodies
    saga = PurchaseSaga.objects.get()
    assert bodies[0]["id"] == str(saga.pk)
    assert saga.buyer == alice
    assert IdempotencyRecord.objects.get().saga_id == saga.pk
    assert hold_timers(saga.pk) == 1
    assert Reservation.objects.count() == 1
    assert ReservationSeat.objects.filter(reservation=saga.reservation).count() == 2
    assert SagaHistory.objects.filter(saga=saga).count() == 1
    assert seat_statuses(event) == {"A1": "held", "A2": "held", "A3": "available"}


@pytest.mark.django_db(transaction=True)
def test_concurrent_different_keys_for_one_seat_sell_it_once():
    # given: eight buyers, each with a key of their own, want A1
    event = EventFactory(seats=["A1", "A2"])
    tokens = [
        Token.objects.create(user=UserFactory(username=f"buyer{i}")).key for i in range(THREADS)
    ]

    # when
    results = _post_at_once(
        [(token, new_key(), purchase_body(event, seats=["A1"])) for token in tokens]
    )

    # then

    statuses = sorted(status for status, _ in results)
    assert statuses == [202] + [409] * (THREADS - 1), results
    conflicts = [json.loads(c) for s, c in results if s == 409]
    assert all(c["code"] == "seat_unavailable" and c["seats"] == ["A1"] for c in conflicts)
    saga = PurchaseSaga.objects.get()
    winner = next(json.loads(c) for s, c in results if s == 202)
    assert winner["id"] == str(saga.pk)
    assert IdempotencyRecord.objects.count() == 1
    assert Reservation.objects.count() == 1
    assert OutboxMessage.objects.filter(key__startswith="hold:").count() == 1
    assert seat_statuses(event) == {"A1": "held", "A2": "available"}
