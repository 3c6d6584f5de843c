"""The purchase throttle on Redis (purchases/throttling.py): each place in
the window taken atomically, DRF's window and Retry-After, and no start let
through by a race between processes."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import AnonymousUser
from rest_framework.test import APIRequestFactory

from purchases.throttling import PurchaseStartThrottle
from tests.conftest import cache_redis
from tests.factories import UserFactory


def _request(user):
    request = APIRequestFactory().post("/api/purchases/")
    request.user = user
    return request


def _start(user, at: float | None = None) -> tuple[bool, float | None]:
    throttle = PurchaseStartThrottle()
    if at is not None:
        throttle.timer = lambda: at  # DRF's clock is time.time, bound at import
    allowed = throttle.allow_request(_request(user), None)
    return allowed, None if allowed else throttle.wait()


@pytest.mark.django_db
def test_the_window_slides_and_retry_after_is_drfs(tight_throttle):
    alice = UserFactory()
    t0 = 1_800_000_000.25
    assert [_start(alice, t0 + n)[0] for n in range(3)] == [True, True, True]
    allowed, wait = _start(alice, t0 + 10)
    # DRF's: the oldest start leaves the window in 50 s, and a slot with it.
    assert allowed is False
    assert wait == pytest.approx(50.0)
    assert _start(alice, t0 + 59.9)[0] is False
    assert _start(alice, t0 + 60)[0] is True  # the first start left the window
    assert _start(alice, t0 + 60.5)[0] is False  # the second has not


@pytest.mark.django_db
def test_the_count_is_a_few_keys_per_user_that_expire_with_the_window(tight_throttle):
    alice, bob = UserFactory(), UserFactory()
    _start(alice)
    _start(alice)
    _start(bob)

    redis = cache_redis()
    keys = {user: redis.keys(f"*:throttle_purchase_start_{user.pk}:*") for user in (alice, bob)}
    # a key per start let through, and the user's last number
    assert (len(keys[alice]), len(keys[bob])) == (3, 2)
    assert all(0 < redis.ttl(key) <= 60 for key in keys[alice] + keys[bob])


@pytest.mark.django_db
def test_an_anonymous_caller_is_counted_by_address(tight_throttle):
    assert [_start(AnonymousUser())[0] for _ in range(4)] == [True, True, True, False]


@pytest.mark.django_db(transaction=True)
def test_starts_at_once_from_many_threads_pass_exactly_the_rate(tight_throttle):
    """Each thread has a cache client and a connection of its own, as
    separate web processes do. DRF's read-then-write lets two starts that
    read the same history both pass; a place taken by ``cache.add`` is
    taken once."""
    alice = UserFactory()
    barrier = threading.Barrier(12)
    results: list[bool] = []

    def start() -> None:
        barrier.wait()
        results.append(_start(alice)[0])

    threads = [threading.Thread(target=start) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(results) == [False] * 9 + [True] * 3


@pytest.mark.django_db
def test_a_step_given_back_behind_a_later_one_still_counts(tight_throttle):
    """A refund of a start that is not the user's last leaves its ticket:
    deleting it would leave a gap, and the start that reads that ticket as
    the one ``limit`` places back would pass a full window."""
    alice = UserFactory()
    t0 = 1_800_000_000.0
    first = PurchaseStartThrottle()
    first.timer = lambda: t0
    assert first.allow_request(_request(alice), None) is True
    assert _start(alice, t0 + 1)[0] is True
    first.refund()  # its input refused, after the second start took a number
    assert _start(alice, t0 + 2)[0] is True
    assert _start(alice, t0 + 3)[0] is False  # three in the window: full
