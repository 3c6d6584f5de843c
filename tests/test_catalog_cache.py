"""The catalog served from a cache (issue 13; docs/design.md, "The edges";
docs/api.md, "Catalog").

The two catalog reads come from Django's cache (Redis in this session, as on
the real stack), found by the event and valid only at its availability
version. Every committed change of a seat's status (held by the start, sold by
the confirmation, released by the compensation) bumps that version after the
commit; a rollback bumps nothing; a short TTL bounds the staleness when an
invalidation is lost. The seats answer carries an ETag derived from the
version, and a cached value is never an input to a purchase.

The requests commit for real (``transaction=True``): the bump is an
``on_commit`` hook, and a test transaction never commits. Each test has its own
key prefix in the session's cache, removed at the end, and the charge the
purchase enqueues on commit is recorded instead of sent (nothing is left in
Redis).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.core.cache import caches
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from freezegun import freeze_time
from redis.exceptions import ConnectionError as RedisConnectionError

from purchases import availability, cache_outage, catalog_answers, services
from purchases.models import Event, EventStatus, Seat

from .conftest import cache_redis, new_key, purchase_body, row_counts
from .factories import EventFactory, SeatFactory

pytestmark = pytest.mark.django_db(transaction=True)

EVENTS = "/api/events/"


@pytest.fixture(autouse=True)
def cache_of_this_test(settings):
    """The session's cache under a key prefix of this test's own (so that no
    other test's entries are seen), its keys deleted at the end. Never
    ``cache.clear()``: on Redis that flushes the database other sessions use."""
    config = settings.CACHES["default"]
    assert config["BACKEND"] == "django.core.cache.backends.redis.RedisCache", (
        "the catalog cache is tested on Redis, as on the real stack (tests/settings.py)"
    )
    prefix = f"{config.get('KEY_PREFIX') or 'boxoffice-test'}-{uuid.uuid4().hex[:12]}"
    settings.CACHES = {"default": {**config, "KEY_PREFIX": prefix}}
    client = cache_redis(write=True)
    yield prefix
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture(autouse=True)
def enqueued(monkeypatch) -> list:
    """The charges the purchases enqueue on commit, recorded instead of sent."""
    from purchases.saga import start

    sent: list = []
    monkeypatch.setattr(start, "publish_charge", sent.append)
    return sent


@pytest.fixture
def locmem_cache(settings):
    """A process-local cache, whose clock freezegun moves (Redis keeps its own)."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": f"catalog-{uuid.uuid4().hex}",
        }
    }


def seats_url(event) -> str:
    return f"{EVENTS}{event.pk}/seats/"


def buy(client, event, seats, payment_method="pm_card_visa"):
    return client.post(
        "/api/purchases/",
        purchase_body(event, seats, payment_method),
        format="json",
        headers={"Idempotency-Key": new_key()},
    )


def statuses(response) -> dict[str, str]:
    assert response.status_code == 200, response.content
    return {s["ref"]: s["status"] for s in response.json()}


def available(response, event) -> int:
    assert response.status_code == 200, response.content
    [listed] = [e for e in response.json() if e["id"] == event.pk]
    return listed["seats_available"]


# --- on commit, and only on commit ---------------------------------------------------------


def test_a_committed_purchase_is_seen_at_once_and_a_refused_one_changes_nothing(
    anon_api, alice_api, bob_api, event
):
    # given: both catalog reads cached
    seats_before, list_before = anon_api.get(seats_url(event)), anon_api.get(EVENTS)
    assert set(statuses(seats_before).values()) == {"available"}
    assert available(list_before, event) == 4

    # when: a purchase holds A1 and commits
    assert buy(alice_api, event, ["A1"]).status_code == 202

    # then: both reads show it at once, under new ETags
    seats_after, list_after = anon_api.get(seats_url(event)), anon_api.get(EVENTS)
    assert statuses(seats_after)["A1"] == "held"
    assert available(list_after, event) == 3
    assert seats_after["ETag"] != seats_before["ETag"]
    assert list_after["ETag"] != list_before["ETag"]

    # when: a purchase that asks for A1 again is refused (and rolled back)
    version = availability.availability_version(event.pk)
    refused = buy(bob_api, event, ["A2", "A1"])

    # then: nothing cached changed
    assert refused.status_code == 409, refused.content
    assert availability.availability_version(event.pk) == version
    again = anon_api.get(seats_url(event))
    assert again["ETag"] == seats_after["ETag"]
    assert statuses(again) == {
        "A1": "held",
        "A2": "available",
        "A3": "available",
        "A4": "available",
    }
    assert anon_api.get(EVENTS)["ETag"] == list_after["ETag"]


def test_the_version_moves_after_the_commit_and_never_on_a_rollback(event):
    version = availability.availability_version(event.pk)

    class Boom(Exception):
        pass

    # a change announced in a transaction that rolls back
    with pytest.raises(Boom), transaction.atomic():
        availability.availability_changed(event.pk)
        raise Boom
    assert availability.availability_version(event.pk) == version

    # a change announced in a transaction that commits: not before the commit
    with transaction.atomic():
        availability.availability_changed(event.pk)
        assert availability.availability_version(event.pk) == version
    assert availability.availability_version(event.pk) != version


# --- the TTL: the bound when an invalidation is lost ----------------------------------------


def test_a_lost_invalidation_is_stale_for_at_most_the_ttl(
    anon_api, alice_api, event, locmem_cache, settings, monkeypatch
):
    settings.AVAILABILITY_MAX_STALE_SECONDS = 2
    with freeze_time(datetime(2026, 12, 3, 19, 0, tzinfo=UTC)) as clock:
        # given: the seats cached, and the next invalidation lost (a cache or
        # broker restart between the commit and the bump)
        cached = anon_api.get(seats_url(event))
        monkeypatch.setattr(availability, "availability_bump", lambda event_id: None)
        assert buy(alice_api, event, ["A1"]).status_code == 202

        # then: stale within the bound, under the same ETag...
        clock.tick(timedelta(seconds=1.9))
        stale = anon_api.get(seats_url(event))
        assert statuses(stale)["A1"] == "available"
        assert stale["ETag"] == cached["ETag"]

        # ...and fresh once it has passed, with a new ETag: a client that
        # holds the old one gets the new answer, not a 304
        clock.tick(timedelta(seconds=0.2))
        fresh = anon_api.get(seats_url(event), headers={"If-None-Match": cached["ETag"]})
        assert statuses(fresh)["A1"] == "held"
        assert fresh["ETag"] != cached["ETag"]

        # and an entry rebuilt without a change keeps its ETag
        clock.tick(timedelta(seconds=5))
        rebuilt = anon_api.get(seats_url(event), headers={"If-None-Match": fresh["ETag"]})
        assert rebuilt.status_code == 304


def test_the_entries_on_redis_expire_within_the_bound(
    anon_api, event, settings, cache_of_this_test
):
    anon_api.get(seats_url(event))
    anon_api.get(EVENTS)

    client = cache_redis()
    ttl_ms = {
        key.decode().split(":", 2)[2]: client.pttl(key)
        for key in client.scan_iter(match=f"{cache_of_this_test}:*")
    }
    entries = {k: t for k, t in ttl_ms.items() if not k.startswith("availability:version:")}
    versions = {k: t for k, t in ttl_ms.items() if k.startswith("availability:version:")}
    assert len(entries) == 4 and len(versions) == 2, ttl_ms  # a tag and a body each
    bound = settings.AVAILABILITY_MAX_STALE_SECONDS * 1000
    assert all(0 < t <= bound for t in entries.values()), ttl_ms
    # A version is bumped, never expired: an expiry would change the ETag
    # while nothing changed.
    assert all(t == -1 for t in versions.values()), ttl_ms


def test_an_unreachable_cache_fails_neither_a_purchase_nor_the_catalog(
    anon_api, alice_api, event, monkeypatch, request
):
    # The process believes the cache down after this test, and would skip it
    # for CACHE_RETRY_SECONDS (purchases/cache_outage.py): the next test's is up.
    request.addfinalizer(cache_outage.cache_answered)
    backend = caches["default"]

    def down(*args, **kwargs):
        raise RedisConnectionError("the cache is restarting")

    # the bump after the commit cannot reach the cache: the purchase stands
    for method in ("delete", "delete_many", "incr"):
        monkeypatch.setattr(backend, method, down)
    assert buy(alice_api, event, ["A1"]).status_code == 202

    # nor can the reads: the database answers, without an ETag
    for method in ("get", "get_many", "add", "set", "set_many"):
        monkeypatch.setattr(backend, method, down)
    seats = anon_api.get(seats_url(event))
    assert statuses(seats)["A1"] == "held"
    assert "ETag" not in seats
    assert available(anon_api.get(EVENTS), event) == 3


# --- ETag and If-None-Match -----------------------------------------------------------------


def test_the_etag_changes_exactly_when_availability_changes(anon_api, alice_api, event):
    other = EventFactory(seats=["B1"])
    first = anon_api.get(seats_url(event))
    etag = first["ETag"]

    # the same availability: the same ETag, and a 304 without a body
    assert anon_api.get(seats_url(event))["ETag"] == etag
    not_modified = anon_api.get(seats_url(event), headers={"If-None-Match": etag})
    assert not_modified.status_code == 304
    assert not_modified.content == b""
    assert not_modified["ETag"] == etag
    # If-None-Match may list several, and * is any current one
    assert (
        anon_api.get(seats_url(event), headers={"If-None-Match": f'"nope", {etag}'}).status_code
        == 304
    )
    assert anon_api.get(seats_url(event), headers={"If-None-Match": "*"}).status_code == 304

    # another event's change is not this event's change
    assert buy(alice_api, other, ["B1"]).status_code == 202
    assert anon_api.get(seats_url(event), headers={"If-None-Match": etag}).status_code == 304

    # this event's change: the old ETag gets the new answer and the new ETag
    assert buy(alice_api, event, ["A2"]).status_code == 202
    changed = anon_api.get(seats_url(event), headers={"If-None-Match": etag})
    assert changed.status_code == 200
    assert statuses(changed)["A2"] == "held"
    assert changed["ETag"] != etag
    assert (
        anon_api.get(seats_url(event), headers={"If-None-Match": changed["ETag"]}).status_code
        == 304
    )


def test_the_event_list_has_an_etag_that_any_event_changes(anon_api, alice_api, event):
    other = EventFactory(seats=["B1"])
    listed = anon_api.get(EVENTS)
    etag = listed["ETag"]
    assert anon_api.get(EVENTS, headers={"If-None-Match": etag}).status_code == 304

    assert buy(alice_api, other, ["B1"]).status_code == 202

    changed = anon_api.get(EVENTS, headers={"If-None-Match": etag})
    assert changed.status_code == 200
    assert available(changed, other) == 0 and available(changed, event) == 4
    assert changed["ETag"] != etag


# --- a cached value never decides ----------------------------------------------------------


def test_a_stale_cache_never_decides_a_purchase(anon_api, alice_api, event, monkeypatch):
    # given: the cache says A1 is available, and A1 was sold behind its back
    # (an invalidation that has not arrived yet)
    assert statuses(anon_api.get(seats_url(event)))["A1"] == "available"
    Seat.objects.filter(event=event, ref="A1").update(status="sold")
    assert statuses(anon_api.get(seats_url(event)))["A1"] == "available"  # stale
    before = row_counts()

    backend, read = caches["default"], []
    for method in ("get", "get_many", "has_key"):
        original = getattr(backend, method)

        def spy(keys, *args, _original=original, **kwargs):
            read.extend([keys] if isinstance(keys, str) else list(keys))
            return _original(keys, *args, **kwargs)

        monkeypatch.setattr(backend, method, spy)

    # when
    refused = buy(alice_api, event, ["A1"])

    # then: the database decided, nothing was written, the cache was not read
    assert refused.status_code == 409, refused.content
    assert refused.json()["seats"] == ["A1"]
    assert row_counts() == before
    assert [key for key in read if key.startswith("availability:")] == []


# --- the saga's moves reach the catalog ----------------------------------------------------


def test_the_catalog_follows_a_confirmed_and_a_compensated_purchase(
    anon_api, alice_api, bob_api, event, gateway
):
    def look() -> tuple[dict, int]:
        return statuses(anon_api.get(seats_url(event))), available(anon_api.get(EVENTS), event)

    assert look() == (
        {"A1": "available", "A2": "available", "A3": "available", "A4": "available"},
        4,
    )

    # a purchase held, then confirmed (sold by the confirmation)
    bought = buy(alice_api, event, ["A1"]).json()["id"]
    assert look()[0]["A1"] == "held"
    assert services.saga_charge(saga_id=bought).state == "CONFIRMED"
    assert look() == ({"A1": "sold", "A2": "available", "A3": "available", "A4": "available"}, 3)

    # a declined purchase: held, then released by the compensation
    declined = buy(bob_api, event, ["A2"], payment_method="pm_card_chargeDeclined").json()["id"]
    assert look()[0]["A2"] == "held"
    assert services.saga_charge(saga_id=declined).state == "COMPENSATED"
    assert look() == ({"A1": "sold", "A2": "available", "A3": "available", "A4": "available"}, 3)

    # the confirmed one refunded: sold, then released by its refund row's commit
    # (the purchase stays CONFIRMED; the processor is asked after it)
    assert services.purchase_refund(saga_id=bought, reason="customer asked").state == "CONFIRMED"
    assert look() == (
        {"A1": "available", "A2": "available", "A3": "available", "A4": "available"},
        4,
    )


# --- the cost of a cached read --------------------------------------------------------------


def test_a_cached_catalog_read_sends_no_query(anon_api, event):
    # given: both reads cached
    etag = anon_api.get(seats_url(event))["ETag"]
    anon_api.get(EVENTS)

    # when
    with CaptureQueriesContext(connection) as queries:
        seats = anon_api.get(seats_url(event))
        not_modified = anon_api.get(seats_url(event), headers={"If-None-Match": etag})
        listed = anon_api.get(EVENTS)

    # then
    assert (seats.status_code, not_modified.status_code, listed.status_code) == (200, 304, 200)
    assert [q["sql"] for q in queries.captured_queries] == []


def test_asking_for_events_that_do_not_exist_leaves_nothing_in_the_cache(
    anon_api, cache_of_this_test
):
    """The catalog is public: a version drawn for every id anyone asks about
    would be a key that never expires, per id."""
    client = cache_redis(write=True)

    answers = [anon_api.get(f"{EVENTS}{n}/seats/").status_code for n in range(900_000, 900_020)]

    assert set(answers) == {404}
    assert list(client.scan_iter(match=f"{cache_of_this_test}:*", count=1000)) == []


def test_the_seats_show_their_row_and_number(anon_api):
    event = EventFactory(seats=["B2", "A10", "A1"], seats__price=3100)

    seats = anon_api.get(seats_url(event))

    assert [(s["ref"], s["row"], s["number"]) for s in seats.json()] == [
        ("A1", "A", 1),
        ("A10", "A", 10),
        ("B2", "B", 2),
    ]
    assert {(s["status"], s["price"]["amount"], s["price"]["currency"]) for s in seats.json()} == {
        ("available", 3100, "EUR")
    }


def test_the_seat_maps_body_is_what_the_serializer_of_the_schema_says():
    # given: seats of every kind of value the map carries
    event = EventFactory(seats=["B2", "A10", "A1", "A2"], seats__price=3100)
    Seat.objects.filter(event=event, ref="A1").update(
        section="Stalls", category="stalls", x=1.5, y=-2.25, accessible=True
    )
    Seat.objects.filter(event=event, ref="A2").update(status="unavailable", price_amount=0)
    Seat.objects.filter(event=event, ref="B2").update(status="sold", currency="CHF")

    # when
    built = catalog_answers.event_seats_body(event.pk)

    # then: byte for byte the serializer's (the fields, their order, their types)
    assert built == catalog_answers.event_seats_serialized(event.pk)
    assert built is not None and b'"x":1.5,"y":-2.25,"accessible":true' in built


def test_a_rebuilt_seat_map_splices_the_statuses_and_renders_again_only_when_a_seat_changed(
    monkeypatch,
):
    # given: a map built once, with a seat whose values need escaping
    event = EventFactory(seats=["A1", "A2", "B1"], seats__price=3100)
    Seat.objects.filter(event=event, ref="A2").update(category='bal"con\u2028y é')
    renders: list[int] = []
    cut_body = catalog_answers._cut_body

    def counted(seats):
        renders.append(len(seats))
        return cut_body(seats)

    monkeypatch.setattr(catalog_answers, "_cut_body", counted)
    assert catalog_answers.event_seats_body(event.pk) == catalog_answers.event_seats_serialized(
        event.pk
    )

    # when: only statuses change, the body is the serializer's without a render
    Seat.objects.filter(event=event, ref="A1").update(status="held")
    Seat.objects.filter(event=event, ref="B1").update(status="sold")
    spliced = catalog_answers.event_seats_body(event.pk)
    assert spliced is not None and spliced == catalog_answers.event_seats_serialized(event.pk)
    assert b'"status":"held"' in spliced and b'"status":"sold"' in spliced
    assert renders == [3]

    # when: a price changes, and a seat is added: rendered again, the serializer's still
    Seat.objects.filter(event=event, ref="A1").update(price_amount=4200)
    assert catalog_answers.event_seats_body(event.pk) == catalog_answers.event_seats_serialized(
        event.pk
    )
    SeatFactory(event=event, ref="A3", row="A", number=3)
    assert catalog_answers.event_seats_body(event.pk) == catalog_answers.event_seats_serialized(
        event.pk
    )
    assert renders == [3, 3, 4]
    # and: an event not on sale has no map
    Event.objects.filter(pk=event.pk).update(status=EventStatus.DRAFT)
    assert catalog_answers.event_seats_body(event.pk) is None


def test_a_seat_maps_rebuild_is_one_unordered_statement_and_says_whether_the_event_is_on_sale():
    # given: an event on sale, one on sale with no seat yet, a draft with seats
    event = EventFactory(seats=["A1", "A2"])
    empty = EventFactory(seats=[])
    draft = EventFactory(seats=["A1"], status=EventStatus.DRAFT)

    # when: the on-sale event's map is built, then built again after a hold
    with CaptureQueriesContext(connection) as first:
        catalog_answers.event_seats_body(event.pk)
    Seat.objects.filter(event=event, ref="A2").update(status="held")
    with CaptureQueriesContext(connection) as again:
        built = catalog_answers.event_seats_body(event.pk)

    # then: the first read its seats and whether it is on sale, then the seats
    # in the map's order; the next one statement, without ORDER BY (the order
    # kept), the serializer's bytes all the same
    assert built == catalog_answers.event_seats_serialized(event.pk)
    assert built is not None and b'"status":"held"' in built
    assert [("ORDER BY" in q["sql"]) for q in first.captured_queries] == [False, True]
    assert [("ORDER BY" in q["sql"]) for q in again.captured_queries] == [False], [
        q["sql"] for q in again.captured_queries
    ]
    # and: an event on sale without seats has an empty map; a draft none
    assert catalog_answers.event_seats_body(empty.pk) == b"[]"
    assert catalog_answers.event_seats_body(draft.pk) is None
    assert catalog_answers.event_seats_body(draft.pk + 1000) is None


def test_the_cut_bodies_kept_are_bounded_by_their_seats_the_last_read_kept(monkeypatch):
    monkeypatch.setattr(catalog_answers, "FRAGMENT_SEATS_MAX", 5)
    monkeypatch.setattr(catalog_answers, "_cut", {})
    first, second, third = (EventFactory(seats=["A1", "A2", "A3"]) for _ in range(3))

    for event in (first, second, third, second):
        catalog_answers.event_seats_body(event.pk)

    assert list(catalog_answers._cut) == [second.pk]  # 3 + 3 > 5: the older ones forgotten
    big = EventFactory(seats=[f"A{n}" for n in range(1, 8)])
    catalog_answers.event_seats_body(big.pk)
    assert list(catalog_answers._cut) == [big.pk]  # the last read kept even when over


# --- the bench's switch -----------------------------------------------------------------------


def test_with_the_cache_off_the_database_answers_and_nothing_is_announced(
    anon_api, event, settings, monkeypatch
):
    settings.AVAILABILITY_CACHE = False
    bumped: list[int] = []
    monkeypatch.setattr(availability, "availability_bump", bumped.append)
    anon_api.get(seats_url(event))
    Seat.objects.filter(event=event, ref="A1").update(status="sold")

    seats = anon_api.get(seats_url(event))

    assert statuses(seats)["A1"] == "sold"
    assert "ETag" not in seats
    with transaction.atomic():
        availability.availability_changed(event.pk)
    assert bumped == []


# --- the embedded default ------------------------------------------------------------------


def test_without_cache_url_every_process_of_the_machine_shares_the_catalog(tmp_path):
    """make run sets no CACHE_URL: the web process and the worker are separate
    processes, and the worker's invalidations must reach the web's entries.
    A process-local default (locmem) would give each process its own version."""
    env = {k: v for k, v in os.environ.items() if k != "CACHE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="config.settings", BOXOFFICE_VAR_DIR=str(tmp_path))
    script = (
        "import django; django.setup(); from purchases import availability; "
        "import sys; sys.argv[1:] == ['bump'] and availability.availability_bump(7); "
        "print(availability.availability_version(7))"
    )

    def version(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", script, *args],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return done.stdout.strip().splitlines()[-1]

    first = version()
    assert version() == first, "a second process drew its own version: the cache is not shared"
    moved = version("bump")
    assert moved != first, "a move in one process did not change the version another sees"
    assert version() == moved
