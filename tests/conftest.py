"""Shared fixtures: users and API clients, an in-process fake gateway, and a
synchronous outbox drain that runs the whole story without sleeping."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import freezegun
import pytest
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from django.db import connection
from django.utils import timezone
from redis import Redis
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from config.transactions import harness_blocks
from outbox.delivery import message_deliver
from outbox.models import OutboxMessage
from outbox.relay import relay_tick
from payments.fake_gateway.inprocess import InProcessFakeGateway
from payments.registry import override_gateway
from purchases import cache_outage
from purchases.availability import availability_bump
from purchases.models import (
    IdempotencyRecord,
    PurchaseSaga,
    Reservation,
    ReservationSeat,
    SagaHistory,
)

from .factories import EventFactory, UserFactory

# pytest's own clock (``--durations``, the junit times) is never frozen: a
# test under freeze_time would otherwise be timed by the frozen clock.
freezegun.configure(extend_ignore_list=["_pytest"])


@pytest.fixture(autouse=True, scope="session")
def _throttles_read_the_real_clock():
    """DRF's throttles keep ``time.time`` as a class attribute, read when
    ``rest_framework.throttling`` is first imported: first imported under a
    frozen clock (a test that reaches the URLconf inside ``freeze_time``),
    they would keep freezegun's function for the rest of the session and
    every later throttled request would fail. Imported here, before any
    test runs."""
    import rest_framework.throttling  # noqa: F401 - the import is the point

    yield


@pytest.fixture(autouse=True)
def _cache_outage_closed():
    """Each test starts with the cache taken as up: a test that made a cache
    call fail would otherwise leave this process skipping the cache for
    CACHE_RETRY_SECONDS (purchases/cache_outage.py), in whatever test runs
    next."""
    cache_outage.cache_answered()
    yield
    cache_outage.cache_answered()


@pytest.fixture(autouse=True)
def _test_blocks_are_not_the_codes(request):
    """pytest-django wraps a ``db`` test in an atomic block: the guards
    (config/transactions.py) count only the blocks the code opens inside it,
    so a gateway call in a ``db`` test is not "inside a transaction" and a
    ledger write outside the code's own still is refused."""
    if "db" in request.fixturenames:
        request.getfixturevalue("db")  # its block open first, to be measured
    with harness_blocks():
        yield


@pytest.fixture
def alice(db):
    return UserFactory(username="alice")


@pytest.fixture
def bob(db):
    return UserFactory(username="bob")


def _client_for(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def alice_api(alice):
    return _client_for(alice)


@pytest.fixture
def bob_api(bob):
    return _client_for(bob)


@pytest.fixture
def anon_api():
    return APIClient()


@pytest.fixture
def event(db):
    return EventFactory(seats=["A1", "A2", "A3", "A4"])


@pytest.fixture
def gateway():
    """The in-process fake, installed as the process-wide gateway."""
    gw = InProcessFakeGateway()
    with override_gateway(gw):
        yield gw


@pytest.fixture
def faulty_gateway():
    """The in-process fake behind a network that can lose answers."""
    from .gateways import FaultyGateway

    gw = FaultyGateway()
    with override_gateway(gw):
        yield gw


def purchase_body(event, seats=("A1",), payment_method="pm_card_visa") -> dict:
    return {"event": event.pk, "seats": list(seats), "payment_method": payment_method}


def new_key() -> str:
    return f"key-{uuid.uuid4()}"


def drain_outbox(*, now=None, max_rounds: int = 20) -> list[OutboxMessage]:
    """Fire everything due at ``now`` and deliver it synchronously, until
    nothing is due. Returns the messages delivered, in order."""
    delivered: list[int] = []

    def deliver(message_id: int) -> None:
        delivered.append(message_id)
        message_deliver(message_id=message_id, now=now)

    for _ in range(max_rounds):
        if relay_tick(now=now or timezone.now(), dispatch=deliver) == 0:
            break
    return list(OutboxMessage.objects.filter(pk__in=delivered).order_by("pk"))


def model_fields(obj) -> dict:
    """Every concrete field of a model instance, by attribute name: what a
    statement written once must read as the ORM reads it."""
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def start_purchase(user, event, seats=("A1",), payment_method="pm_card_visa", key=None, now=None):
    """Start a purchase through the service; returns the saga."""
    from purchases.models import PurchaseSaga
    from purchases.services import purchase_start

    started = purchase_start(
        user=user,
        idempotency_key=key or new_key(),
        event_id=event.pk,
        seat_refs=list(seats),
        payment_method=payment_method,
        now=now,
    )
    return PurchaseSaga.objects.get(pk=started.saga_id)


def cache_redis(*, write: bool = False) -> Redis:
    """The Redis client under the default cache (Redis, as on the real stack:
    tests/settings.py)."""
    backend = caches["default"]
    assert isinstance(backend, RedisCache), "the tests' cache is Redis (tests/settings.py)"
    return backend._cache.get_client(write=write)


class BrokerQueue:
    """The real Celery queue of this test session on Redis."""

    def __init__(self, name: str | None = None):
        from django.conf import settings

        from config.celery import app

        self.app = app
        self.name = name or settings.CELERY_TASK_DEFAULT_QUEUE

    def purge(self) -> None:
        with self.app.connection_for_write() as conn:
            conn.default_channel.queue_purge(  # type: ignore[attr-defined]  # channels have it
                self.name
            )

    def messages(self) -> list[dict]:
        """Drain and return the queued task messages (name and args)."""
        out = []
        with self.app.connection_for_write() as conn:
            channel = conn.default_channel
            while (
                msg := channel.basic_get(  # type: ignore[attr-defined]  # channels have it
                    self.name, no_ack=True
                )
            ) is not None:
                out.append({"task": msg.headers["task"], "args": msg.decode()[0]})
        return out


@pytest.fixture
def tight_throttle(settings):
    """Three purchase starts a minute per user, counted from an empty cache."""
    settings.PURCHASE_THROTTLE_RATE = "3/min"
    caches["default"].clear()
    yield
    caches["default"].clear()


@pytest.fixture
def broker_queue():
    queue = BrokerQueue()
    queue.purge()
    yield queue
    queue.purge()


def work_callbacks(callbacks: list) -> list:
    """The on-commit callbacks of a commit, without the catalog's version
    moves (purchases/availability.py): what is left is the work it hands on
    (the charge's enqueue)."""
    return [c for c in callbacks if getattr(c, "func", None) is not availability_bump]


def race(n, attempt, *, lock_timeout=None):
    """Run ``attempt(i)`` on n threads released together by a barrier; each
    thread has its own database connection (with ``lock_timeout`` set on it
    when given). Returns the results (or exceptions) by index."""
    barrier = threading.Barrier(n, timeout=60)
    results: list[Any] = [None] * n

    def run(i):
        try:
            if lock_timeout is not None:
                with connection.cursor() as cursor:
                    cursor.execute(f"SET lock_timeout = '{lock_timeout}'")
            barrier.wait()
            results[i] = attempt(i)
            if lock_timeout is not None:
                # The request ran on this very connection, with the timeout.
                with connection.cursor() as cursor:
                    cursor.execute("SHOW lock_timeout")
                    assert cursor.fetchone()[0] == lock_timeout
        except Exception as exc:  # noqa: BLE001 - the verdict is the result
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a buyer is still waiting"
    return results


def row_counts() -> dict[str, int]:
    """The rows a purchase's start writes, counted: a refused or replayed
    start must leave them as they were."""
    return {
        "sagas": PurchaseSaga.objects.count(),
        "reservations": Reservation.objects.count(),
        "reservation_seats": ReservationSeat.objects.count(),
        "history": SagaHistory.objects.count(),
        "outbox": OutboxMessage.objects.count(),
        "idempotency": IdempotencyRecord.objects.count(),
    }
