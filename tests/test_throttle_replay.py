"""The purchase throttle and the idempotency key (docs/api.md, "Start a
purchase" and "Throttling"): a key's stored answer replays whatever the throttle says,
and what is refused as bad input, or replayed, spends none of the rate.

The rate is three starts a minute; each test has users of its own, so its
counts on the session's Redis are its own (no ``cache.clear()``, which would
flush what other sessions keep there)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from purchases.models import IdempotencyRecord, PurchaseSaga

from .conftest import new_key, purchase_body
from .factories import EventFactory, UserFactory

pytestmark = pytest.mark.django_db

PURCHASES = "/api/purchases/"


def _client_for(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture(autouse=True)
def three_a_minute(settings):
    settings.PURCHASE_THROTTLE_RATE = "3/min"


@pytest.fixture
def hall():
    return EventFactory(seats=[f"A{n}" for n in range(1, 11)])


@pytest.fixture
def buyer():
    return _client_for(UserFactory())


def post(client, body: dict, key: str | None):
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post(PURCHASES, body, format="json", headers=headers)


def bad_requests(client, hall, n: int) -> list[int]:
    """``n`` requests refused for their input, of every kind the API has:
    no key, a malformed key, a body the serializer refuses, unknown seats and
    an unknown event (refused by the service), and a reused key (422)."""
    reused = new_key()
    assert post(client, purchase_body(hall, ["A10"]), reused).status_code == 202
    kinds = [
        lambda: post(client, purchase_body(hall, ["A1"]), None),
        lambda: post(client, purchase_body(hall, ["A1"]), "é" * 3),
        lambda: post(client, {"event": hall.pk, "payment_method": "pm_card_visa"}, new_key()),
        lambda: post(client, purchase_body(hall, ["Z99"]), new_key()),
        lambda: post(client, {**purchase_body(hall), "event": hall.pk + 10_000}, new_key()),
        lambda: post(client, purchase_body(hall, ["A2"]), reused),
    ]
    return [kinds[i % len(kinds)]().status_code for i in range(n)]


def test_a_stored_answer_replays_when_the_throttle_is_spent(buyer, hall):
    # given three starts, the rate, the first of them with key K
    key = new_key()
    first = post(buyer, purchase_body(hall, ["A1"]), key)
    assert first.status_code == 202
    for ref in ("A2", "A3"):
        assert post(buyer, purchase_body(hall, [ref]), new_key()).status_code == 202
    assert post(buyer, purchase_body(hall, ["A4"]), new_key()).status_code == 429

    # when K is sent again with its body
    replay = post(buyer, purchase_body(hall, ["A1"]), key)

    # then its first answer, whatever the throttle says
    assert replay.status_code == 202, replay.content
    assert replay.content == first.content
    assert replay["Location"] == first["Location"]
    # and K with another body is the reused key it is, not a 429
    other = post(buyer, purchase_body(hall, ["A5"]), key)
    assert (other.status_code, other.json()["code"]) == (422, "idempotency_key_reused")
    assert PurchaseSaga.objects.count() == 3


def test_sixty_bad_requests_then_a_replay_answers_the_stored_202(buyer, hall):
    key = new_key()
    first = post(buyer, purchase_body(hall, ["A1"]), key)
    assert first.status_code == 202

    refused = bad_requests(buyer, hall, 60)
    replay = post(buyer, purchase_body(hall, ["A1"]), key)

    assert replay.status_code == 202, replay.content
    assert replay.content == first.content
    assert set(refused) == {400, 422}, refused


def test_bad_requests_do_not_spend_the_throttle_and_the_rate_still_holds(buyer, hall):
    # (bad_requests starts one purchase of its own: the key it reuses)
    assert set(bad_requests(buyer, hall, 60)) == {400, 422}

    answers = [post(buyer, purchase_body(hall, [ref]), new_key()) for ref in ("A1", "A2", "A3")]

    # two valid starts fit beside the one; a fresh valid start over the rate is refused
    assert [a.status_code for a in answers] == [202, 202, 429]
    assert answers[-1].json()["code"] == "throttled"
    assert 0 < int(answers[-1]["Retry-After"]) <= 60
    assert PurchaseSaga.objects.count() == 3


def test_replays_do_not_spend_the_throttle(buyer, hall):
    key = new_key()
    assert post(buyer, purchase_body(hall, ["A1"]), key).status_code == 202
    replays = [post(buyer, purchase_body(hall, ["A1"]), key).status_code for _ in range(5)]

    answers = [post(buyer, purchase_body(hall, [ref]), new_key()) for ref in ("A2", "A3", "A4")]

    assert replays == [202] * 5
    assert [a.status_code for a in answers] == [202, 202, 429]
    assert IdempotencyRecord.objects.count() == 3


def test_seats_taken_still_spend_the_throttle(buyer, hall):
    """A 409 is a real attempt at seats, what a scalper repeats: it counts."""
    rival = _client_for(UserFactory())
    assert post(rival, purchase_body(hall, ["A1"]), new_key()).status_code == 202

    answers = [post(buyer, purchase_body(hall, ["A1"]), new_key()) for _ in range(4)]

    assert [a.status_code for a in answers] == [409, 409, 409, 429]


def test_over_the_rate_nothing_starts_and_no_seat_is_read(buyer, hall):
    # A throttled user must not be able to run the start's transaction at
    # will: over the rate, a used key with another body is answered from the
    # key's record (422), and a fresh key with unknown seats is throttled
    # (429), neither reading a seat.
    key = new_key()
    assert post(buyer, purchase_body(hall, ["A1"]), key).status_code == 202
    for ref in ("A2", "A3"):
        assert post(buyer, purchase_body(hall, [ref]), new_key()).status_code == 202

    with CaptureQueriesContext(connection) as queries:
        answers = [
            post(buyer, purchase_body(hall, ["A4"]), key).status_code,
            post(buyer, purchase_body(hall, ["Z99"]), new_key()).status_code,
        ]

    assert answers == [422, 429]
    assert [q["sql"] for q in queries if "purchases_seat" in q["sql"]] == []
