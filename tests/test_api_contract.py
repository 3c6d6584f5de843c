"""The public contract (docs/api.md), status code by status code: shapes,
codes and the facts behind them, through the HTTP API with real PostgreSQL."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from freezegun import freeze_time
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from purchases import services
from purchases.models import (
    EventStatus,
    IdempotencyRecord,
    PurchaseSaga,
    Seat,
    SeatStatus,
)

from .conftest import new_key, purchase_body, row_counts
from .factories import EventFactory, SeatFactory

pytestmark = pytest.mark.django_db

PURCHASES = "/api/purchases/"
ACCEPTED_KEYS = {"id", "status", "event", "seats", "total", "hold_expires_at", "links"}
DETAIL_KEYS = ACCEPTED_KEYS - {"links"} | {"payment", "history"}


def post_purchase(client, body, *, key=None):
    return client.post(
        PURCHASES, body, format="json", headers={"Idempotency-Key": key or new_key()}
    )


def assert_error(response, status_code: int, code: str) -> dict:
    assert response.status_code == status_code, response.content
    data = response.json()
    assert data["code"] == code
    assert isinstance(data["detail"], str) and data["detail"]
    return data


def seat_statuses(event) -> dict[str, str]:
    return dict(Seat.objects.filter(event=event).values_list("ref", "status"))


# --- authentication ---------------------------------------------------------------


def test_token_for_valid_credentials_then_usable_as_token_header(alice, anon_api):
    # when
    response = anon_api.post(
        "/api/auth/token/", {"username": "alice", "password": "pw"}, format="json"
    )

    # then
    assert response.status_code == 200
    assert set(response.json()) == {"token"}
    token = response.json()["token"]
    assert token == Token.objects.get(user=alice).key

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get(PURCHASES).status_code == 200


def test_token_with_bad_password_is_400_with_error_shape(alice, anon_api):
    response = anon_api.post(
        "/api/auth/token/", {"username": "alice", "password": "wrong"}, format="json"
    )

    assert_error(response, 400, "invalid")
    assert "token" not in response.json()
    assert not Token.objects.filter(user=alice).exists()


def test_unknown_token_is_401_authentication_failed(event):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)

    response = post_purchase(client, purchase_body(event))

    assert_error(response, 401, "authentication_failed")
    assert PurchaseSaga.objects.count() == 0


# --- catalog ------------------------------------------------------------------------


def test_event_list_is_public_with_exact_seats_available(
    anon_api, alice_api, event, django_capture_on_commit_callbacks, broker_queue
):
    # given
    other = EventFactory(seats=["B1", "B2", "B3"])
    other.starts_at = event.starts_at + timedelta(days=1)
    other.save()

    # when
    before = anon_api.get("/api/events/")

    # then
    assert before.status_code == 200
    assert [set(e) for e in before.json()] == [
        {
            "id",
            "name",
            "starts_at",
            "organizer",
            "currency",
            "sales_start",
            "sales_end",
            "seats_available",
        }
    ] * 2
    assert before.json()[0]["organizer"] == {
        "slug": event.organizer.slug,
        "name": event.organizer.name,
    }
    assert [(e["id"], e["name"], e["seats_available"]) for e in before.json()] == [
        (event.pk, event.name, 4),
        (other.pk, other.name, 3),
    ]

    # when: a purchase holds two seats of the first event, and commits (the
    # catalog is cached and moves on commit: docs/api.md, "Catalog")
    with django_capture_on_commit_callbacks(execute=True):
        assert post_purchase(alice_api, purchase_body(event, seats=["A1", "A3"])).status_code == 202
    after = anon_api.get("/api/events/")

    # then
    assert [(e["id"], e["seats_available"]) for e in after.json()] == [
        (event.pk, 2),
        (other.pk, 3),
    ]


def test_event_seats_is_public_with_price(anon_api):
    event = EventFactory(seats=["A2", "A1"], seats__price=3100)

    response = anon_api.get(f"/api/events/{event.pk}/seats/")

    assert response.status_code == 200
    seat = {
        "section": "",
        "row": "A",
        "category": "",
        "x": 0.0,
        "y": 0.0,
        "accessible": False,
        "status": "available",
        "price": {"amount": 3100, "currency": "EUR"},
    }
    assert response.json() == [
        {"ref": "A1", **seat, "number": 1},
        {"ref": "A2", **seat, "number": 2},
    ]
    assert list(response.json()[0]) == [
        "ref",
        "section",
        "row",
        "number",
        "category",
        "x",
        "y",
        "accessible",
        "status",
        "price",
    ]


def test_event_seats_of_unknown_event_is_404_not_found(anon_api, event):
    response = anon_api.get(f"/api/events/{event.pk + 1000}/seats/")

    data = assert_error(response, 404, "not_found")
    assert set(data) == {"code", "detail"}


@pytest.mark.parametrize("status", [EventStatus.DRAFT, EventStatus.CANCELLED])
def test_a_draft_or_cancelled_event_is_not_in_the_catalog(anon_api, status):
    # given: one event on sale, one draft (or cancelled) of the same organizer
    shown = EventFactory(seats=["A1"])
    hidden = EventFactory(seats=["A1"], status=status, organizer=shown.organizer)

    # when
    events = anon_api.get("/api/events/")
    seats = anon_api.get(f"/api/events/{hidden.pk}/seats/")
    missing = anon_api.get(f"/api/events/{hidden.pk + 1000}/seats/")

    # then: listed only on sale; its seats as missing as a missing event's
    assert [e["id"] for e in events.json()] == [shown.pk]
    assert (seats.status_code, seats.json()) == (missing.status_code, missing.json())
    assert seats.status_code == 404


def test_event_seats_show_held_and_sold(anon_api, alice_api, event, gateway):
    # given: A1 bought and confirmed, A2 held by a purchase that has not charged
    sold = post_purchase(alice_api, purchase_body(event, seats=["A1"]))
    held = post_purchase(alice_api, purchase_body(event, seats=["A2"]))
    assert (sold.status_code, held.status_code) == (202, 202)
    confirmed = services.saga_charge(saga_id=sold.json()["id"])
    assert confirmed.state == "CONFIRMED"

    # when
    response = anon_api.get(f"/api/events/{event.pk}/seats/")

    # then
    assert response.status_code == 200
    assert [(s["ref"], s["status"]) for s in response.json()] == [
        ("A1", "sold"),
        ("A2", "held"),
        ("A3", "available"),
        ("A4", "available"),
    ]


# --- POST /api/purchases/: authentication first ------------------------------------


@pytest.mark.parametrize(
    "headers, body, content_type",
    [
        pytest.param({"Idempotency-Key": "k1"}, "VALID", None, id="valid-request"),
        pytest.param({}, "VALID", None, id="no-key"),
        pytest.param({"Idempotency-Key": "x" * 300}, "VALID", None, id="invalid-key"),
        pytest.param({"Idempotency-Key": "k1"}, {"seats": []}, None, id="bad-body"),
        pytest.param({}, '{"event": ', "application/json", id="no-key-malformed-json"),
    ],
)
def test_post_purchase_without_credentials_is_401_whatever_else(
    anon_api, event, headers, body, content_type
):
    if body == "VALID":
        body = purchase_body(event)
    if content_type:
        response = anon_api.post(PURCHASES, body, content_type=content_type, headers=headers)
    else:
        response = anon_api.post(PURCHASES, body, format="json", headers=headers)

    data = assert_error(response, 401, "not_authenticated")
    assert set(data) == {"code", "detail"}
    assert PurchaseSaga.objects.count() == 0


# --- POST /api/purchases/: the key ----------------------------------------------------


def test_post_purchase_without_key_is_400_idempotency_key_missing(alice_api, event):
    response = alice_api.post(PURCHASES, purchase_body(event), format="json")

    assert_error(response, 400, "idempotency_key_missing")
    assert PurchaseSaga.objects.count() == 0


def test_post_purchase_with_empty_key_is_400_idempotency_key_missing(alice_api, event):
    response = alice_api.post(
        PURCHASES, purchase_body(event), format="json", headers={"Idempotency-Key": ""}
    )

    assert_error(response, 400, "idempotency_key_missing")
    assert PurchaseSaga.objects.count() == 0


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("k" * 256, id="256-chars"),
        pytest.param("abc\x07def", id="control-char"),
        pytest.param("abc\tdef", id="tab"),
    ],
)
def test_post_purchase_with_invalid_key_is_400_idempotency_key_invalid(alice_api, event, key):
    response = post_purchase(alice_api, purchase_body(event), key=key)

    assert_error(response, 400, "idempotency_key_invalid")
    assert row_counts() == dict.fromkeys(row_counts(), 0)


def test_post_purchase_with_255_char_key_is_accepted(alice_api, event):
    response = post_purchase(alice_api, purchase_body(event), key="k" * 255)

    assert response.status_code == 202
    assert IdempotencyRecord.objects.get().key == "k" * 255


# --- POST /api/purchases/: 202 ------------------------------------------------------


@freeze_time("2030-03-04T05:06:07Z")
def test_post_purchase_is_202_with_exact_shape_total_and_location(alice, alice_api, settings):
    # given: two prices, so the total is a sum and not a product
    settings.PURCHASE_HOLD_SECONDS = 900
    event = EventFactory(seats=["A1", "A2"], seats__price=2500)
    SeatFactory(event=event, ref="B1", price_amount=1250)

    # when
    response = post_purchase(alice_api, purchase_body(event, seats=["B1", "A2"]))

    # then
    assert response.status_code == 202, response.content
    body = response.json()
    assert set(body) == ACCEPTED_KEYS
    saga = PurchaseSaga.objects.get()
    assert body == {
        "id": str(saga.pk),
        "status": "PENDING",
        "event": event.pk,
        "seats": ["A2", "B1"],  # in seat order, as the detail lists them
        "total": {"amount": 3750, "currency": "EUR"},
        "hold_expires_at": "2030-03-04T05:21:07Z",
        "links": {"self": f"/api/purchases/{saga.pk}/"},
    }
    assert response["Location"] == f"/api/purchases/{saga.pk}/"
    assert saga.buyer == alice
    assert (saga.state, saga.amount, saga.currency) == ("PENDING", 3750, "EUR")
    assert seat_statuses(event) == {"A1": "available", "A2": "held", "B1": "held"}


def test_location_of_202_answers_the_purchase(alice_api, event):
    response = post_purchase(alice_api, purchase_body(event, seats=["A1"]))

    detail = alice_api.get(response["Location"])

    assert detail.status_code == 200
    assert detail.json()["id"] == response.json()["id"]


# --- POST /api/purchases/: 409 --------------------------------------------------------


def test_post_purchase_with_taken_seat_is_409_and_writes_nothing(alice_api, bob_api, event):
    # given: alice holds A1 and A3
    assert post_purchase(alice_api, purchase_body(event, seats=["A1", "A3"])).status_code == 202
    before = row_counts()
    statuses_before = seat_statuses(event)

    # when: bob asks for A3, A2 and A1
    response = post_purchase(bob_api, purchase_body(event, seats=["A3", "A2", "A1"]))

    # then
    data = assert_error(response, 409, "seat_unavailable")
    assert data["seats"] == ["A1", "A3"]
    assert row_counts() == before
    assert before == {
        "sagas": 1,
        "reservations": 1,
        "reservation_seats": 2,
        "outbox": 1,
        "idempotency": 1,
        "history": 1,
    }
    assert seat_statuses(event) == statuses_before
    assert statuses_before["A2"] == SeatStatus.AVAILABLE


# --- POST /api/purchases/: 400 naming the field ---------------------------------------


def _bad_bodies(event):
    good = purchase_body(event, seats=["A1", "A2"])
    return {
        "unknown-event": ({**good, "event": event.pk + 1000}, "event"),
        "non-integer-event": ({**good, "event": "abc"}, "event"),
        "unknown-seat": ({**good, "seats": ["A1", "Z9"]}, "seats"),
        "seat-of-another-event": ({**good, "seats": ["B1"]}, "seats"),
        "empty-seats": ({**good, "seats": []}, "seats"),
        "duplicate-seats": ({**good, "seats": ["A1", "A2", "A1"]}, "seats"),
        "too-many-seats": ({**good, "seats": ["A1", "A2", "A3"]}, "seats"),
        "missing-payment-method": (
            {"event": event.pk, "seats": ["A1"]},
            "payment_method",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "unknown-event",
        "non-integer-event",
        "unknown-seat",
        "seat-of-another-event",
        "empty-seats",
        "duplicate-seats",
        "too-many-seats",
        "missing-payment-method",
    ],
)
def test_post_purchase_with_bad_body_is_400_naming_the_field(alice_api, event, settings, case):
    # given
    settings.MAX_SEATS_PER_PURCHASE = 2
    EventFactory(seats=["B1"])
    body, field = _bad_bodies(event)[case]

    # when
    response = post_purchase(alice_api, body)

    # then
    data = assert_error(response, 400, "invalid")
    assert data["field"] == field
    assert isinstance(data["errors"], dict)
    assert list(data["errors"]) == [field]
    assert row_counts() == dict.fromkeys(row_counts(), 0)
    assert set(seat_statuses(event).values()) == {"available"}


def test_max_seats_per_purchase_is_inclusive(alice_api, event, settings):
    settings.MAX_SEATS_PER_PURCHASE = 2

    response = post_purchase(alice_api, purchase_body(event, seats=["A1", "A2"]))

    assert response.status_code == 202


def test_post_purchase_with_malformed_json_is_400_parse_error(alice_api, event):
    response = alice_api.post(
        PURCHASES,
        '{"event": 1, "seats": [',
        content_type="application/json",
        headers={"Idempotency-Key": new_key()},
    )

    assert_error(response, 400, "parse_error")
    assert PurchaseSaga.objects.count() == 0


# --- GET /api/purchases/ --------------------------------------------------------------


def test_purchase_list_is_per_user_newest_first(alice_api, bob_api, event):
    # given
    with freeze_time("2030-01-01T10:00:00Z"):
        first = post_purchase(alice_api, purchase_body(event, seats=["A1"])).json()
    with freeze_time("2030-01-01T11:00:00Z"):
        bobs = post_purchase(bob_api, purchase_body(event, seats=["A2"])).json()
    with freeze_time("2030-01-01T12:00:00Z"):
        second = post_purchase(alice_api, purchase_body(event, seats=["A3"])).json()

    # when
    alices_page = alice_api.get(PURCHASES)
    bobs_page = bob_api.get(PURCHASES)

    # then
    assert alices_page.status_code == 200
    data = alices_page.json()
    assert set(data) == {"count", "next", "previous", "results"}
    assert (data["count"], data["next"], data["previous"]) == (2, None, None)
    assert data["results"] == [second, first]

    assert bobs_page.json()["count"] == 1
    assert [p["id"] for p in bobs_page.json()["results"]] == [bobs["id"]]


def test_purchase_list_is_paginated(alice, alice_api):
    # given: 21 purchases, one minute apart (the page size is 20)
    event = EventFactory(seats=[f"A{n}" for n in range(1, 22)])
    start = datetime(2030, 1, 1, tzinfo=UTC)
    ids = [
        services.purchase_start(
            user=alice,
            idempotency_key=f"k{n}",
            event_id=event.pk,
            seat_refs=[f"A{n}"],
            payment_method="pm_card_visa",
            now=start + timedelta(minutes=n),
        ).saga_id
        for n in range(1, 22)
    ]

    # when
    page1 = alice_api.get(PURCHASES).json()
    page2 = alice_api.get(page1["next"]).json()

    # then
    assert page1["count"] == 21
    assert page1["previous"] is None
    assert page1["next"].endswith("/api/purchases/?page=2")
    assert [p["id"] for p in page1["results"]] == ids[::-1][:20]
    assert page2["previous"] is not None and page2["next"] is None
    assert [p["id"] for p in page2["results"]] == [ids[0]]


def test_bob_sees_none_of_alices_purchases(alice_api, bob_api, event):
    assert post_purchase(alice_api, purchase_body(event)).status_code == 202

    response = bob_api.get(PURCHASES)

    assert response.status_code == 200
    assert response.json() == {"count": 0, "next": None, "previous": None, "results": []}


def test_purchase_list_anonymous_is_401(anon_api):
    assert_error(anon_api.get(PURCHASES), 401, "not_authenticated")


# --- GET /api/purchases/{id}/ ---------------------------------------------------------


def test_purchase_detail_of_a_new_purchase(alice_api, event):
    # given
    started = post_purchase(alice_api, purchase_body(event, seats=["A2", "A1"])).json()
    saga = PurchaseSaga.objects.get(pk=started["id"])

    # when
    response = alice_api.get(f"/api/purchases/{saga.pk}/")

    # then
    assert response.status_code == 200
    data = response.json()
    # API.md may be extended (the detail also carries "links"), never shrunk
    assert DETAIL_KEYS <= set(data)
    same = ("id", "status", "event", "total", "hold_expires_at")
    assert {k: data[k] for k in same} == {k: started[k] for k in same}
    # the 202 echoes the request's order, the detail lists seats in seat order
    assert sorted(data["seats"]) == sorted(started["seats"]) == ["A1", "A2"]
    assert data["payment"] == {
        "intent_id": saga.intent_id,
        "status": "not_started",
        "processor": "fake",
        "processor_ref": None,
    }
    assert data["next_action"] is None
    assert saga.intent_id.startswith("pi_")
    assert len(data["history"]) == 1
    entry = data["history"][0]
    assert {"from", "to", "at", "reason"} <= set(entry)
    assert (entry["from"], entry["to"]) == (None, "PENDING")


def test_purchase_detail_after_confirmation(alice_api, event, gateway):
    # given
    started = post_purchase(alice_api, purchase_body(event, seats=["A1"])).json()
    services.saga_charge(saga_id=started["id"])

    # when
    data = alice_api.get(f"/api/purchases/{started['id']}/").json()

    # then
    assert data["status"] == "CONFIRMED"
    assert data["payment"]["status"] == "captured"
    assert [(h["from"], h["to"]) for h in data["history"]] == [
        (None, "PENDING"),
        ("PENDING", "CHARGING"),
        ("CHARGING", "CONFIRMED"),
    ]
    ats = [h["at"] for h in data["history"]]
    assert ats == sorted(ats)
    assert gateway.calls == [("charge", data["payment"]["intent_id"])]


def test_purchase_detail_of_someone_else_is_the_same_404_as_a_missing_one(
    alice_api, bob_api, event
):
    # given
    alices = post_purchase(alice_api, purchase_body(event)).json()

    # when
    others = bob_api.get(f"/api/purchases/{alices['id']}/")
    missing = bob_api.get(f"/api/purchases/{uuid.uuid4()}/")

    # then
    assert_error(others, 404, "not_found")
    assert others.status_code == missing.status_code == 404
    assert others.content == missing.content
    assert alices["id"] not in others.content.decode()


def test_purchase_detail_anonymous_is_401(anon_api, alice_api, event):
    alices = post_purchase(alice_api, purchase_body(event)).json()

    response = anon_api.get(f"/api/purchases/{alices['id']}/")

    assert_error(response, 401, "not_authenticated")


# --- schema and docs ------------------------------------------------------------------


def test_schema_is_public_openapi_3_with_every_public_path(anon_api):
    response = anon_api.get("/api/schema/", {"format": "json"})

    assert response.status_code == 200
    schema = json.loads(response.content)
    assert schema["openapi"].startswith("3.")
    assert set(schema["paths"]) == {
        "/api/auth/token/",
        "/api/auth/signup/",
        "/api/events/",
        "/api/events/{event_id}/seats/",
        "/api/events/{event_id}/queue/",
        "/api/purchases/",
        "/api/purchases/{saga_id}/",
        "/api/purchases/{saga_id}/cancel/",
        # The webhooks' staff API (tests/test_webhooks_api.py).
        "/api/webhook-endpoints/",
        "/api/webhook-endpoints/{endpoint_id}/",
        "/api/webhook-endpoints/{endpoint_id}/rotate-secret/",
        "/api/webhook-endpoints/{endpoint_id}/deliveries/",
        "/api/webhook-endpoints/{endpoint_id}/deliveries/{delivery_id}/resend/",
        # Organizers, their members and their own webhook endpoints
        # (tests/test_organizers.py, tests/test_organizer_scoping.py).
        "/api/organizers/",
        "/api/organizers/{slug}/",
        "/api/organizers/{slug}/members/",
        "/api/organizers/{slug}/members/{username}/",
        "/api/organizers/{slug}/webhook-endpoints/",
        "/api/organizers/{slug}/webhook-endpoints/{endpoint_id}/",
        "/api/organizers/{slug}/webhook-endpoints/{endpoint_id}/rotate-secret/",
        "/api/organizers/{slug}/webhook-endpoints/{endpoint_id}/deliveries/",
        "/api/organizers/{slug}/webhook-endpoints/{endpoint_id}/deliveries/{delivery_id}/resend/",
        "/api/organizers/{slug}/events/",
        "/api/organizers/{slug}/events/{event_id}/",
        "/api/organizers/{slug}/events/{event_id}/seat-map/",
        "/api/organizers/{slug}/events/{event_id}/publish/",
        "/api/organizers/{slug}/events/{event_id}/seats/block/",
        "/api/organizers/{slug}/events/{event_id}/seats/unblock/",
        "/api/organizers/{slug}/events/{event_id}/purchases/",
        "/api/organizers/{slug}/events/{event_id}/purchases.csv",
        "/api/organizers/{slug}/events/{event_id}/report/",
        # Money back (tests/test_refund_api.py).
        "/api/organizers/{slug}/purchases/{saga_id}/refunds/",
        "/api/organizers/{slug}/events/{event_id}/cancel/",
        "/api/organizers/{slug}/events/{event_id}/cancellation/",
        # The door (tests/test_door_checkin.py): check-in for door staff, and
        # the buyer's ticket reissue.
        "/api/organizers/{slug}/events/{event_id}/checkin/",
        "/api/organizers/{slug}/events/{event_id}/checkin/list/",
        "/api/organizers/{slug}/events/{event_id}/checkin/upload/",
        "/api/organizers/{slug}/events/{event_id}/checkin/progress/",
        "/api/purchases/{saga_id}/tickets/{seat}/reissue/",
    }
    assert set(schema["paths"]["/api/purchases/"]) >= {"get", "post"}
    assert {"202", "400", "401", "409", "422"} <= set(
        schema["paths"]["/api/purchases/"]["post"]["responses"]
    )


def test_schema_leaves_out_the_fake_gateway(anon_api, settings):
    assert settings.FAKE_GATEWAY_ENABLED  # mounted, yet not ours to document

    schema = json.loads(anon_api.get("/api/schema/", {"format": "json"}).content)

    assert not [p for p in schema["paths"] if "fake-gateway" in p or "payment_intents" in p]


def test_docs_render_html_publicly(anon_api):
    response = anon_api.get("/api/docs/")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert b"/api/schema/" in response.content


@pytest.mark.django_db
def test_a_path_no_route_matches_answers_json_under_api_and_html_elsewhere(anon_api):
    # Found by the schema fuzzer: /api/events/null/seats/ matched no route and
    # Django answered its HTML page to a JSON client. That path is now routed
    # (a malformed id is the view's 404, tests/test_generated_client.py); a
    # path no route matches still answers JSON under /api/.
    api = anon_api.get("/api/events/1/no-such-thing/")
    page = anon_api.get("/no-such-page/")

    assert api.status_code == 404 and api["Content-Type"] == "application/json"
    assert api.json() == {"code": "not_found", "detail": "Not found."}
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")
