"""The cache down (docs/operations.md, "Cache down"): nothing a buyer does
answers 500. Token authentication reads the database, the purchase throttle
counts the buyer's starts there, the token throttle counts in the process;
each fallback is counted in ``boxoffice_cache_unavailable_total{use}`` and
logged once per outage; ``/readyz`` says ``"degraded": ["cache"]``.

The cache is down for real: the test settings' Redis cache, pointed at a
port of 127.0.0.1 where nothing listens (the shared Redis keeps running for
everyone else). Requests go through the API client to real PostgreSQL."""

from __future__ import annotations

import logging
import socket

import pytest
from django.core.cache import caches
from django.db import connections
from django.test import Client
from django.utils import timezone
from prometheus_client import REGISTRY
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from devtools.processes import free_port
from purchases import cache_outage, throttling
from purchases.models import IdempotencyRecord, PurchaseSaga
from purchases.ops.health import beat_sweep, relay_pulse_record
from purchases.ops.heartbeats import heartbeat
from purchases.saga import start

from .conftest import new_key, purchase_body
from .factories import EventFactory, UserFactory

PASSWORD = "a-long-enough-password"


@pytest.fixture
def cache_down(settings):
    """The default cache, pointed at a closed port of 127.0.0.1 (its port);
    the process starts the test believing the cache up (one outage per test)."""
    config = settings.CACHES["default"]
    assert config["BACKEND"] == "django.core.cache.backends.redis.RedisCache", (
        "tested on Redis (tests/settings.py)"
    )
    cache_outage.cache_answered()
    throttling.LOCAL_COUNTS.clear()  # the token throttle's count in the process
    port = free_port()  # bound, read and released: nothing listens there
    settings.CACHES = {"default": {**config, "LOCATION": f"redis://127.0.0.1:{port}/15"}}
    yield port
    cache_outage.cache_answered()


@pytest.fixture
def cache_hangs(settings):
    """The default cache, pointed at a socket of 127.0.0.1 that accepts
    connections (the kernel's backlog) and never answers: a cut link, not a
    refusal, so every call waits out its timeout (0.2 s here). Yields the
    listening socket: its accepted connections are the calls' attempts."""
    config = settings.CACHES["default"]
    assert config["BACKEND"] == "django.core.cache.backends.redis.RedisCache", (
        "tested on Redis (tests/settings.py)"
    )
    cache_outage.cache_answered()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        options = {**config.get("OPTIONS", {}), "socket_timeout": 0.2}
        options["socket_connect_timeout"] = 0.2
        location = f"redis://127.0.0.1:{port}/15"
        settings.CACHES = {"default": {**config, "LOCATION": location, "OPTIONS": options}}
        yield listener
    cache_outage.cache_answered()


def _connections(listener: socket.socket, accepted: list[socket.socket]) -> int:
    """How many connections reached the silent cache so far (each accepted and
    kept, unread, until the test ends)."""
    while True:
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            return len(accepted)
        accepted.append(connection)


@pytest.fixture
def clock(monkeypatch, settings):
    """The outage's clock (cache_outage.clock), moved by the test; the cache
    is asked again CACHE_RETRY_SECONDS after a call found it down."""
    settings.CACHE_RETRY_SECONDS = 5.0
    now = [1000.0]
    monkeypatch.setattr(cache_outage, "clock", lambda: now[0])
    return now


@pytest.fixture
def cache_back(settings):
    """Puts the session's cache back (the Redis that answers)."""
    config = settings.CACHES["default"]

    def back() -> None:
        settings.CACHES = {"default": {**config}}

    return back


def _api(user=None) -> APIClient:
    # A 500 is an answer here, not an exception raised into the test.
    client = APIClient(raise_request_exception=False)
    if user is not None:
        token, _ = Token.objects.get_or_create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def _unavailable(use: str) -> float:
    return REGISTRY.get_sample_value("boxoffice_cache_unavailable_total", {"use": use}) or 0.0


@pytest.fixture
def buyer(db):
    return UserFactory(username="buyer", password=PASSWORD)


@pytest.mark.django_db
def test_a_token_and_the_purchases_list_answer_with_the_cache_down(cache_down, buyer):
    token = _api().post(
        "/api/auth/token/", {"username": "buyer", "password": PASSWORD}, format="json"
    )
    assert token.status_code == 200, token.content

    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.json()['token']}")
    listed = client.get("/api/purchases/")

    assert listed.status_code == 200, listed.content
    assert listed.json()["results"] == []
    # a wrong token is still refused, by the database
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert client.get("/api/purchases/").status_code == 401


@pytest.mark.django_db(transaction=True)
def test_a_purchase_starts_replays_and_the_catalog_answers_with_the_cache_down(
    cache_down, buyer, monkeypatch
):
    monkeypatch.setattr(start, "publish_charge", lambda saga_id: None)  # not the point
    event = EventFactory(seats=["A1", "A2"])
    client, key = _api(buyer), new_key()

    started = client.post(
        "/api/purchases/", purchase_body(event), format="json", headers={"Idempotency-Key": key}
    )
    replay = client.post(
        "/api/purchases/", purchase_body(event), format="json", headers={"Idempotency-Key": key}
    )

    assert started.status_code == 202, started.content
    assert (replay.status_code, replay.content) == (202, started.content)
    assert PurchaseSaga.objects.count() == 1
    seats = _api().get(f"/api/events/{event.pk}/seats/")
    assert seats.status_code == 200, seats.content
    assert {s["ref"]: s["status"] for s in seats.json()}["A1"] == "held"
    assert _api().get("/api/events/").status_code == 200
    assert client.get(f"/api/purchases/{started.json()['id']}/").status_code == 200


@pytest.mark.django_db
def test_the_purchase_throttle_counts_the_buyers_starts_in_the_database(
    cache_down, buyer, settings
):
    settings.PURCHASE_THROTTLE_RATE = "3/min"
    event = EventFactory(seats=[f"A{n}" for n in range(1, 9)])
    client = _api(buyer)

    def buy(ref: str, key: str | None = None):
        return client.post(
            "/api/purchases/",
            purchase_body(event, [ref]),
            format="json",
            headers={"Idempotency-Key": key or new_key()},
        )

    first_key = new_key()
    before = _unavailable("purchase_throttle")
    answers = [buy("A1", first_key), buy("A2"), buy("Z9"), buy("A3"), buy("A4")]

    # the unknown seat is refused and counts nothing: three starts, then the rate
    assert [a.status_code for a in answers] == [202, 202, 400, 202, 429]
    assert answers[-1].json()["code"] == "throttled"
    assert 0 < int(answers[-1]["Retry-After"]) <= 60
    assert IdempotencyRecord.objects.filter(user=buyer).count() == 3
    # a stored answer still replays
    assert buy("A1", first_key).status_code == 202
    assert _unavailable("purchase_throttle") - before == 6  # each decision fell back


@pytest.mark.django_db
def test_the_token_throttle_counts_in_the_process_with_the_cache_down(cache_down, buyer, settings):
    settings.AUTH_TOKEN_THROTTLE_RATE = "3/min"
    client = _api()

    answers = [
        client.post("/api/auth/token/", {"username": "buyer", "password": guess}, format="json")
        for guess in ("a", "b", "c", "d")
    ]

    assert [a.status_code for a in answers] == [400, 400, 400, 429]
    assert 0 < int(answers[-1]["Retry-After"]) <= 60


@pytest.mark.django_db
def test_a_login_on_the_pages_and_a_user_saved_answer_with_the_cache_down(cache_down, buyer):
    # Saving a user forgets its tokens in the cache (purchases/authentication.py).
    page = Client(raise_request_exception=False)
    login = page.post("/accounts/login/", {"username": "buyer", "password": PASSWORD})
    assert login.status_code == 302, login.content
    assert page.get("/").status_code == 200
    before = _unavailable("token")

    Token.objects.create(user=buyer).delete()  # forgets the token: the cache is not there

    assert _unavailable("token") - before == 1  # the forgetting fell back, and said so


@pytest.mark.django_db
def test_each_fallback_is_counted_and_the_outage_logged_once(buyer, cache_down, caplog):
    client = _api(buyer)
    before = _unavailable("token")

    with caplog.at_level(logging.INFO, logger="purchases.cache_outage"):
        answers = [client.get("/api/purchases/").status_code for _ in range(5)]
    down = [r for r in caplog.records if r.name == "purchases.cache_outage"]

    assert answers == [200] * 5
    # one per request: its token's look-up (not remembered after the
    # database answered: the cache is down)
    assert _unavailable("token") - before == 5
    assert [(r.levelno, r.getMessage()) for r in down] == [
        (logging.WARNING, "cache unreachable: falling back to the database until it answers")
    ]


@pytest.mark.django_db
def test_the_outage_ends_with_one_line_when_the_cache_answers_again(
    cache_back, cache_down, buyer, caplog, clock, settings
):
    client = _api(buyer)
    assert client.get("/api/purchases/").status_code == 200

    caplog.clear()
    cache_back()
    clock[0] += settings.CACHE_RETRY_SECONDS  # the cache is asked again
    with caplog.at_level(logging.INFO, logger="purchases.cache_outage"):
        answers = [client.get("/api/purchases/").status_code for _ in range(3)]

    assert answers == [200] * 3
    lines = [r for r in caplog.records if r.name == "purchases.cache_outage"]
    assert [(r.levelno, r.getMessage()) for r in lines] == [(logging.INFO, "cache reachable again")]


@pytest.mark.django_db
def test_a_cache_that_hangs_is_waited_for_once_then_asked_again_after_the_retry_interval(
    buyer, cache_hangs, clock, settings, caplog
):
    """Once a call has waited out its timeout, the cache is not asked for
    CACHE_RETRY_SECONDS: N requests wait once, not N times (measured at the
    socket: the attempts that reached it)."""
    client, accepted = _api(buyer), list[socket.socket]()
    before = {use: _unavailable(use) for use in ("token", "catalog")}

    with caplog.at_level(logging.INFO, logger="purchases.cache_outage"):
        assert client.get("/api/purchases/").status_code == 200
        first = _connections(cache_hangs, accepted)
        answers = [client.get("/api/purchases/").status_code for _ in range(4)]
        answers += [_api().get("/api/events/").status_code for _ in range(2)]
        meanwhile = _connections(cache_hangs, accepted)

        clock[0] += settings.CACHE_RETRY_SECONDS  # the interval is over: one call tries
        answers.append(client.get("/api/purchases/").status_code)
        retried = _connections(cache_hangs, accepted)
        answers.append(client.get("/api/purchases/").status_code)  # that try failed: skipped
        after = _connections(cache_hangs, accepted)

    assert answers == [200] * 8
    assert first >= 1, "the first look-up did not reach the cache"
    assert meanwhile == first, f"{meanwhile - first} more attempts within the interval"
    assert retried > first, "the cache was not asked again after the interval"
    assert after == retried
    # each request's fall-back is counted, the skipped ones too
    assert _unavailable("token") - before["token"] == 7
    assert _unavailable("catalog") - before["catalog"] == 2
    lines = [r for r in caplog.records if r.name == "purchases.cache_outage"]
    assert [r.levelno for r in lines] == [logging.WARNING]
    for connection in accepted:
        connection.close()


@pytest.mark.django_db
def test_a_catalog_read_with_the_cache_down_is_counted_and_logged_once(cache_down, caplog):
    event = EventFactory(seats=["A1", "A2"])
    before = _unavailable("catalog")

    with caplog.at_level(logging.INFO):
        seats = [_api().get(f"/api/events/{event.pk}/seats/") for _ in range(3)]
        listed = _api().get("/api/events/")

    assert [a.status_code for a in [*seats, listed]] == [200] * 4
    assert all("ETag" not in a for a in [*seats, listed])
    assert _unavailable("catalog") - before == 4
    logged = [
        (r.name, r.levelno, r.getMessage())
        for r in caplog.records
        if r.name.startswith("purchases.")
    ]
    assert logged == [
        (
            "purchases.cache_outage",
            logging.WARNING,
            "cache unreachable: falling back to the database until it answers",
        )
    ]


@pytest.mark.django_db
def test_a_catalog_cache_error_that_is_not_an_outage_is_not_swallowed(monkeypatch):
    """Only a cache that cannot be reached falls back; anything else the
    cache raises is a bug, and answers 500 (docs/operations.md, "Cache down")."""
    event = EventFactory(seats=["A1"])

    def bug(*args, **kwargs):
        raise RuntimeError("a bug in the cache's use")

    monkeypatch.setattr(caches["default"], "get_many", bug)

    assert _api().get(f"/api/events/{event.pk}/seats/").status_code == 500


# --- /readyz ---------------------------------------------------------------------------


def _fresh_heartbeats() -> None:
    """What a running relay and a running beat leave (tests/test_health.py)."""
    now = timezone.now()
    relay_pulse_record(now=now)
    with heartbeat(beat_sweep(), now=now):
        pass


@pytest.mark.django_db(transaction=True)
def test_readyz_says_the_cache_is_degraded_and_stays_200(cache_down):
    _fresh_heartbeats()

    response = Client().get("/readyz")

    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok" and body["failed"] == []
    assert body["degraded"] == ["cache"]
    cache = body["checks"]["cache"]
    assert cache["ok"] is False and "refused" in cache["detail"].lower(), cache
    assert str(cache_down) in cache["detail"]


@pytest.mark.django_db(transaction=True)
def test_readyz_is_503_when_the_database_is_down_whatever_the_cache(cache_down, monkeypatch):
    _fresh_heartbeats()
    database = {**connections.settings["default"], "HOST": "127.0.0.1", "PORT": str(free_port())}
    monkeypatch.setitem(connections.settings, "default", database)

    response = Client().get("/readyz")

    body = response.json()
    assert response.status_code == 503
    assert body["status"] == "fail"
    assert body["failed"] == ["database", "relay", "beat"]
    assert body["degraded"] == ["cache"]
