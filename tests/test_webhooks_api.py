"""The staff API of outgoing webhooks (docs/api.md, "Webhooks"):
endpoints created, read, changed, re-keyed and deleted, their deliveries
listed and resent, through HTTP with real PostgreSQL.

Deliveries are made by driving real sagas (the in-process fake gateway and
``drain_outbox``) to an endpoint on a closed port of 127.0.0.1
(``WEBHOOK_ALLOW_LOCAL_URLS`` on, as in ``make run``): every attempt is
refused, and with ``WEBHOOK_RETRY_SECONDS`` empty a delivery is ``failed``
after its first attempt.
"""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Permission
from freezegun import freeze_time
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from outbox.models import OutboxMessage
from purchases.services import saga_charge
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhooks.services import webhook_endpoint_create, webhook_resend

from .conftest import drain_outbox, start_purchase
from .factories import EventFactory, UserFactory

pytestmark = pytest.mark.django_db

ENDPOINTS = "/api/webhook-endpoints/"
ALL = ["purchase.confirmed", "purchase.failed", "purchase.refunded", "purchase.needs_attention"]
ENDPOINT_KEYS = {"id", "url", "events", "description", "enabled", "created_at"}
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _webhook_settings(settings):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    settings.WEBHOOK_TIMEOUT_SECONDS = 1.0
    settings.WEBHOOK_RETRY_SECONDS = []  # one attempt, then failed


def _api(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def _staff(username: str):
    """A staff user holding every permission of the webhooks app (who may
    do what is tests/test_webhooks_permissions.py's)."""
    user = UserFactory(username=username, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="webhooks"))
    return user


@pytest.fixture
def staff_api(db):
    return _api(_staff("sam"))


@pytest.fixture
def user_api(db):
    return _api(UserFactory(username="carol"))


@pytest.fixture
def closed_url():
    """A URL of 127.0.0.1 where nothing listens: every attempt is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


@pytest.fixture
def buyer(db):
    return UserFactory(username="buyer")


@pytest.fixture
def show(db):
    return EventFactory(seats=[f"A{n}" for n in range(1, 11)])


def _confirm(buyer, show, seat: str):
    """A purchase of ``seat`` driven to CONFIRMED: its commit writes the
    webhook deliveries."""
    saga = saga_charge(saga_id=start_purchase(buyer, show, seats=[seat]).pk)
    assert saga.state == "CONFIRMED"
    return saga


def _endpoint(url: str, events=ALL) -> WebhookEndpoint:
    return webhook_endpoint_create(url=url, events=list(events), description="the seller")


def _failed_delivery(buyer, show, seat: str) -> WebhookDelivery:
    _confirm(buyer, show, seat)
    drain_outbox()
    delivery = WebhookDelivery.objects.order_by("-pk").first()
    assert delivery is not None and delivery.status == "failed"
    return delivery


def _assert_error(response, status_code: int, code: str) -> dict:
    assert response.status_code == status_code, response.content
    data = response.json()
    assert data["code"] == code
    assert isinstance(data["detail"], str) and data["detail"]
    return data


def _assert_invalid(response, field: str) -> dict:
    data = _assert_error(response, 400, "invalid")
    assert data["field"] == field, data
    assert field in data["errors"]
    return data


def _webhook_rows() -> list[str | None]:
    return list(
        OutboxMessage.objects.filter(topic="webhook.delivery")
        .order_by("pk")
        .values_list("key", flat=True)
    )


# --- authorization: staff only, on every route and method -----------------------------
# (and with which permission: tests/test_webhooks_permissions.py)


@pytest.fixture
def world(buyer, show, closed_url, gateway):
    """An endpoint with one failed delivery (resendable)."""
    endpoint = _endpoint(closed_url)
    delivery = _failed_delivery(buyer, show, "A1")
    return {"endpoint": endpoint.pk, "delivery": delivery.pk, "url": closed_url}


ROUTES = [
    # method, path, body, what a staff user gets
    ("get", "/api/webhook-endpoints/", None, 200),
    ("post", "/api/webhook-endpoints/", {"url": "{url}", "events": ALL}, 201),
    ("get", "/api/webhook-endpoints/{endpoint}/", None, 200),
    ("patch", "/api/webhook-endpoints/{endpoint}/", {"description": "changed"}, 200),
    ("delete", "/api/webhook-endpoints/{endpoint}/", None, 204),
    ("post", "/api/webhook-endpoints/{endpoint}/rotate-secret/", None, 200),
    ("get", "/api/webhook-endpoints/{endpoint}/deliveries/", None, 200),
    ("post", "/api/webhook-endpoints/{endpoint}/deliveries/{delivery}/resend/", None, 202),
]
ROUTE_IDS = [f"{method.upper()} {path}" for method, path, _, _ in ROUTES]


def _call(client, world, method, path, body):
    path = path.format(**world)
    if body is not None:
        body = {k: v.format(**world) if isinstance(v, str) else v for k, v in body.items()}
        return getattr(client, method)(path, body, format="json")
    return getattr(client, method)(path)


def webhook_state() -> tuple:
    """Everything a refused request must leave as it was."""
    return (
        list(
            WebhookEndpoint.objects.order_by("pk").values_list(
                "pk", "url", "description", "enabled", "secret"
            )
        ),
        list(WebhookDelivery.objects.order_by("pk").values_list("pk", "status", "armed_attempt")),
        _webhook_rows(),
    )


@pytest.mark.parametrize("method, path, body, _", ROUTES, ids=ROUTE_IDS)
def test_anonymous_is_401_with_www_authenticate_and_changes_nothing(world, method, path, body, _):
    before = webhook_state()

    response = _call(APIClient(), world, method, path, body)

    _assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == "Token"
    assert webhook_state() == before


@pytest.mark.parametrize("method, path, body, _", ROUTES, ids=ROUTE_IDS)
def test_a_user_who_is_not_staff_is_403_and_changes_nothing(world, user_api, method, path, body, _):
    before = webhook_state()

    response = _call(user_api, world, method, path, body)

    _assert_error(response, 403, "permission_denied")
    assert webhook_state() == before


@pytest.mark.parametrize("method, path, body, status", ROUTES, ids=ROUTE_IDS)
def test_a_staff_user_is_served(world, staff_api, method, path, body, status):
    response = _call(staff_api, world, method, path, body)

    assert response.status_code == status, response.content


def test_an_invalid_token_is_401_authentication_failed(world):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)

    _assert_error(client.get(ENDPOINTS), 401, "authentication_failed")


def test_every_staff_user_sees_every_endpoint_whoever_created_it(closed_url):
    # The endpoints are the seller's, not a user's (docs/api.md).
    first = _api(_staff("ann"))
    second = _api(_staff("ben"))
    created = first.post(ENDPOINTS, {"url": closed_url, "events": ALL}, format="json").json()

    listing = second.get(ENDPOINTS)
    detail = second.get(f"{ENDPOINTS}{created['id']}/")

    assert [e["id"] for e in listing.json()["results"]] == [created["id"]]
    assert detail.status_code == 200


# --- creating, reading, changing, re-keying ---------------------------------------------


def test_create_is_201_with_a_whsec_secret_that_signs_and_verifies(staff_api, closed_url):
    response = staff_api.post(
        ENDPOINTS,
        {"url": closed_url, "events": ["purchase.confirmed"], "description": "orders system"},
        format="json",
    )

    assert response.status_code == 201, response.content
    data = response.json()
    assert set(data) == ENDPOINT_KEYS | {"secret"}
    assert data["url"] == closed_url and data["events"] == ["purchase.confirmed"]
    assert data["description"] == "orders system" and data["enabled"] is True
    assert data["created_at"].endswith("Z")
    endpoint = WebhookEndpoint.objects.get()
    assert data["id"] == endpoint.pk and data["secret"] == endpoint.secret
    assert data["secret"].startswith("whsec_")
    # A receiver verifies with any Standard Webhooks library and this secret.
    body, sent_at = '{"type": "purchase.confirmed"}', datetime.now(UTC)
    signature = Webhook(data["secret"]).sign("msg_1", sent_at, body)
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(sent_at.timestamp())),
        "webhook-signature": signature,
    }
    assert Webhook(data["secret"]).verify(body, headers) == {"type": "purchase.confirmed"}


def test_create_without_a_description_leaves_it_empty_and_drops_repeated_events(
    staff_api, closed_url
):
    response = staff_api.post(
        ENDPOINTS,
        {"url": closed_url, "events": ["purchase.failed", "purchase.failed"]},
        format="json",
    )

    assert response.status_code == 201, response.content
    assert response.json()["description"] == ""
    assert response.json()["events"] == ["purchase.failed"]


def test_the_secret_is_shown_at_creation_and_rotation_only(staff_api, closed_url):
    created = staff_api.post(ENDPOINTS, {"url": closed_url, "events": ALL}, format="json").json()
    detail_path = f"{ENDPOINTS}{created['id']}/"

    listing = staff_api.get(ENDPOINTS)
    detail = staff_api.get(detail_path)
    patched = staff_api.patch(detail_path, {"description": "renamed"}, format="json")
    rotated = staff_api.post(f"{detail_path}rotate-secret/")
    after = staff_api.get(detail_path)

    for answer in (listing, detail, patched, after):
        assert answer.status_code == 200, answer.content
        text = answer.content.decode()
        for secret in (created["secret"], rotated.json()["secret"]):
            assert secret not in text and secret.removeprefix("whsec_") not in text
        assert "secret" not in text
    assert set(detail.json()) >= ENDPOINT_KEYS and "secret" not in detail.json()
    assert rotated.status_code == 200 and set(rotated.json()) == {"secret"}
    new = rotated.json()["secret"]
    assert new.startswith("whsec_") and new != created["secret"]
    assert WebhookEndpoint.objects.get().secret == new
    # Signed with the new secret, a message no longer verifies with the old one.
    sent_at = datetime.now(UTC)
    headers = {
        "webhook-id": "msg_2",
        "webhook-timestamp": str(int(sent_at.timestamp())),
        "webhook-signature": Webhook(new).sign("msg_2", sent_at, "{}"),
    }
    with pytest.raises(WebhookVerificationError):
        Webhook(created["secret"]).verify("{}", headers)


def test_the_list_is_paginated_oldest_first_with_delivery_counts(
    staff_api, closed_url, buyer, show, gateway
):
    first = _endpoint(closed_url)
    others = [_endpoint(f"{closed_url}/{n}", events=["purchase.refunded"]) for n in range(21)]
    _failed_delivery(buyer, show, "A1")

    page_one = staff_api.get(ENDPOINTS)
    page_two = staff_api.get(ENDPOINTS, {"page": 2})
    past_the_end = staff_api.get(ENDPOINTS, {"page": 3})

    assert page_one.status_code == page_two.status_code == 200
    assert page_one.json()["count"] == 22
    ids = [e["id"] for e in page_one.json()["results"] + page_two.json()["results"]]
    assert ids == [first.pk, *(e.pk for e in others)]
    assert page_one.json()["next"].endswith("?page=2") and page_two.json()["next"] is None
    assert page_one.json()["results"][0]["delivery_counts"] == {
        "pending": 0,
        "delivered": 0,
        "failed": 1,
    }
    _assert_error(past_the_end, 404, "not_found")


def test_patch_changes_what_is_given_and_nothing_else(staff_api, closed_url):
    endpoint = _endpoint(closed_url)
    path = f"{ENDPOINTS}{endpoint.pk}/"

    response = staff_api.patch(
        path,
        {
            "url": f"{closed_url}/v2",
            "events": ["purchase.refunded", "purchase.failed"],
            "description": "",
            "enabled": False,
        },
        format="json",
    )
    only_enabled = staff_api.patch(path, {"enabled": True}, format="json")

    assert response.status_code == 200, response.content
    assert {k: response.json()[k] for k in ("url", "events", "description", "enabled")} == {
        "url": f"{closed_url}/v2",
        "events": ["purchase.refunded", "purchase.failed"],
        "description": "",
        "enabled": False,
    }
    assert only_enabled.json()["enabled"] is True
    assert only_enabled.json()["url"] == f"{closed_url}/v2"
    assert staff_api.get(path).json() == only_enabled.json()
    endpoint.refresh_from_db()
    assert (endpoint.url, endpoint.events, endpoint.enabled) == (
        f"{closed_url}/v2",
        ["purchase.refunded", "purchase.failed"],
        True,
    )


BAD_CREATES = [
    # body, local URLs allowed, the field named
    ({"url": "http://hooks.example.com/x", "events": ALL}, False, "url"),
    ({"url": "https://10.1.2.3/x", "events": ALL}, False, "url"),
    ({"url": "https://[::1]/x", "events": ALL}, False, "url"),
    ({"url": "http://169.254.169.254/latest/meta-data", "events": ALL}, True, "url"),
    ({"url": "not a url", "events": ALL}, True, "url"),
    # Not globally reachable (IETF protocol assignments), whatever Python 3.11 says.
    ({"url": "https://192.0.0.8/hook", "events": ALL}, False, "url"),
    ({"url": "http://192.0.0.8/hook", "events": ALL}, True, "url"),
    # Characters a URL may not hold.
    ({"url": "{url}/a b", "events": ALL}, True, "url"),
    ({"url": "{url}/<script>", "events": ALL}, True, "url"),
    ({"url": "{url}/a%zz", "events": ALL}, True, "url"),
    ({"url": "", "events": ALL}, True, "url"),
    ({"url": 12, "events": ALL}, True, "url"),
    ({"url": None, "events": ALL}, True, "url"),
    ({"url": "https://x.example/" + "a" * 2000, "events": ALL}, True, "url"),
    ({"events": ALL}, True, "url"),
    ({"url": "{url}", "events": ["purchase.exploded"]}, True, "events"),
    ({"url": "{url}", "events": ["purchase.confirmed", "purchase.needs_operator"]}, True, "events"),
    ({"url": "{url}", "events": []}, True, "events"),
    ({"url": "{url}", "events": "purchase.confirmed"}, True, "events"),
    ({"url": "{url}", "events": [1]}, True, "events"),
    ({"url": "{url}"}, True, "events"),
    ({"url": "{url}", "events": ALL, "description": "x" * 301}, True, "description"),
    ({"url": "{url}", "events": ALL, "description": 5}, True, "description"),
    ({"url": "{url}", "events": ALL, "description": None}, True, "description"),
    ({"url": "{url}", "events": ALL, "secret": "whsec_mine"}, True, "secret"),
    ({"url": "{url}", "events": ALL, "enabled": False}, True, "enabled"),
    ({"url": "{url}", "events": ALL, "colour": "blue"}, True, "colour"),
]


@pytest.mark.parametrize("body, local, field", BAD_CREATES)
def test_create_with_a_bad_body_is_400_naming_the_field(
    staff_api, closed_url, settings, body, local, field
):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = local
    body = {k: v.format(url=closed_url) if isinstance(v, str) else v for k, v in body.items()}

    response = staff_api.post(ENDPOINTS, body, format="json")

    _assert_invalid(response, field)
    assert not WebhookEndpoint.objects.exists()


def test_create_with_a_body_that_is_not_an_object_or_not_json_is_400(staff_api, closed_url):
    _assert_error(staff_api.post(ENDPOINTS, [closed_url], format="json"), 400, "invalid")
    _assert_error(
        staff_api.post(ENDPOINTS, "{", content_type="application/json"), 400, "parse_error"
    )
    _assert_error(
        staff_api.post(ENDPOINTS, {"url": closed_url, "events": ALL[0]}, format="multipart"),
        415,
        "unsupported_media_type",
    )
    assert not WebhookEndpoint.objects.exists()


BAD_PATCHES = [
    ({"enabled": "false"}, "enabled"),
    ({"enabled": 0}, "enabled"),
    ({"enabled": None}, "enabled"),
    ({"url": "https://192.168.1.10/x"}, "url"),
    ({"url": "https://192.0.0.8/x"}, "url"),
    ({"url": "https://93.184.216.34/a b"}, "url"),
    ({"url": None}, "url"),
    ({"events": ["purchase.exploded"]}, "events"),
    ({"events": []}, "events"),
    ({"description": "x" * 301}, "description"),
    ({"id": 7}, "id"),
    ({"secret": "whsec_mine"}, "secret"),
    ({"created_at": "2026-01-01T00:00:00Z"}, "created_at"),
    ({"description": "fine", "colour": "blue"}, "colour"),
]


@pytest.mark.parametrize("body, field", BAD_PATCHES)
def test_patch_with_a_bad_body_is_400_naming_the_field_and_changes_nothing(
    staff_api, closed_url, settings, body, field
):
    endpoint = _endpoint(closed_url)
    settings.WEBHOOK_ALLOW_LOCAL_URLS = False  # for the private address
    before = webhook_state()

    response = staff_api.patch(f"{ENDPOINTS}{endpoint.pk}/", body, format="json")

    _assert_invalid(response, field)
    assert webhook_state() == before


def test_a_disabled_endpoint_gets_no_delivery_for_a_new_confirmed_purchase(
    staff_api, closed_url, buyer, show, gateway
):
    created = staff_api.post(
        ENDPOINTS, {"url": closed_url, "events": ["purchase.confirmed"]}, format="json"
    ).json()
    path = f"{ENDPOINTS}{created['id']}/"
    _confirm(buyer, show, "A1")
    assert WebhookDelivery.objects.count() == 1

    # when
    assert staff_api.patch(path, {"enabled": False}, format="json").json()["enabled"] is False
    _confirm(buyer, show, "A2")

    # then
    assert WebhookDelivery.objects.count() == 1
    assert staff_api.get(f"{path}deliveries/").json()["count"] == 1

    # and once enabled again, the next one is written
    staff_api.patch(path, {"enabled": True}, format="json")
    _confirm(buyer, show, "A3")
    assert WebhookDelivery.objects.count() == 2


# --- deliveries and resends ----------------------------------------------------------------


def test_the_deliveries_are_listed_newest_first_with_their_attempts(
    staff_api, closed_url, buyer, show, gateway
):
    endpoint = _endpoint(closed_url)
    other = _endpoint(f"{closed_url}/other")
    with freeze_time(T0) as clock:
        for seat in ("A1", "A2", "A3"):
            _failed_delivery(buyer, show, seat)
            clock.tick(60)
    mine = list(WebhookDelivery.objects.filter(endpoint=endpoint).order_by("created_at"))
    assert WebhookDelivery.objects.filter(endpoint=other).count() == 3

    response = staff_api.get(f"{ENDPOINTS}{endpoint.pk}/deliveries/")

    assert response.status_code == 200, response.content
    page = response.json()
    assert page["count"] == 3
    assert [d["id"] for d in page["results"]] == [d.pk for d in reversed(mine)]
    newest = page["results"][0]
    assert {"id", "message_id", "type", "status", "created_at", "attempts"} <= set(newest)
    assert newest["message_id"] == mine[-1].message_id
    assert newest["message_id"].startswith("msg_")
    assert (newest["type"], newest["status"]) == ("purchase.confirmed", "failed")
    assert newest["created_at"] == "2026-12-02T12:02:00Z"
    [attempt] = newest["attempts"]
    assert {
        "number",
        "at",
        "status_code",
        "latency_ms",
        "error",
        "response_excerpt",
        "resend",
    } <= set(attempt)
    assert attempt["number"] == 1 and attempt["resend"] is False
    assert attempt["at"] == "2026-12-02T12:02:00Z"
    assert attempt["status_code"] is None and attempt["error"]


def test_an_endpoint_without_deliveries_lists_an_empty_page(staff_api, closed_url):
    endpoint = _endpoint(closed_url)

    response = staff_api.get(f"{ENDPOINTS}{endpoint.pk}/deliveries/")

    assert response.status_code == 200, response.content
    assert response.json() == {"count": 0, "next": None, "previous": None, "results": []}


def test_a_page_of_deliveries_costs_the_same_few_queries_however_many_attempts(
    staff_api, closed_url, buyer, show, gateway, django_assert_max_num_queries
):
    endpoint = _endpoint(closed_url)
    for seat in ("A1", "A2", "A3", "A4", "A5"):
        delivery = _failed_delivery(buyer, show, seat)
        webhook_resend(delivery.pk)
        drain_outbox()  # a second attempt each
    assert WebhookAttempt.objects.count() == 10

    # The token, the user's permissions and its groups' (has_perm), the
    # count, the page, the attempts of the page.
    with django_assert_max_num_queries(6):
        response = staff_api.get(f"{ENDPOINTS}{endpoint.pk}/deliveries/")

    assert response.status_code == 200
    assert [len(d["attempts"]) for d in response.json()["results"]] == [2] * 5


def test_resend_of_a_failed_delivery_is_202_and_arms_an_attempt_with_the_same_message_id(
    staff_api, closed_url, buyer, show, gateway, caplog
):
    endpoint = _endpoint(closed_url)
    delivery = _failed_delivery(buyer, show, "A1")
    path = f"{ENDPOINTS}{endpoint.pk}/deliveries/{delivery.pk}/resend/"

    with caplog.at_level(logging.INFO, logger="webhooks"):
        response = staff_api.post(path, {"reason": "receiver fixed"}, format="json")

    assert response.status_code == 202, response.content
    assert response.json() == {"delivery": delivery.pk, "attempt": 2}
    delivery.refresh_from_db()
    assert (delivery.status, delivery.armed_attempt) == ("pending", 2)
    assert _webhook_rows() == [f"webhook:{delivery.pk}:1", f"webhook:{delivery.pk}:2"]
    [logged] = [r for r in caplog.records if r.getMessage().startswith("webhook resend")]
    assert (logged.operator, logged.reason) == ("sam", "receiver fixed")

    drain_outbox()
    [listed] = staff_api.get(f"{ENDPOINTS}{endpoint.pk}/deliveries/").json()["results"]
    assert listed["message_id"] == delivery.message_id
    assert [(a["number"], a["resend"]) for a in listed["attempts"]] == [(1, False), (2, True)]


def test_resend_takes_an_empty_body_and_refuses_an_unknown_field(
    staff_api, closed_url, buyer, show, gateway
):
    endpoint = _endpoint(closed_url)
    delivery = _failed_delivery(buyer, show, "A1")
    path = f"{ENDPOINTS}{endpoint.pk}/deliveries/{delivery.pk}/resend/"

    _assert_invalid(staff_api.post(path, {"attempt": 9}, format="json"), "attempt")
    _assert_invalid(staff_api.post(path, {"reason": 9}, format="json"), "reason")
    assert staff_api.post(path).status_code == 202


def test_resend_of_a_pending_delivery_is_409_resend_refused(
    staff_api, closed_url, buyer, show, gateway
):
    endpoint = _endpoint(closed_url)
    _confirm(buyer, show, "A1")  # its first attempt is owed, not yet made
    delivery = WebhookDelivery.objects.get()
    path = f"{ENDPOINTS}{endpoint.pk}/deliveries/{delivery.pk}/resend/"

    response = staff_api.post(path)

    _assert_error(response, 409, "resend_refused")
    assert "attempt 1" in response.json()["detail"]
    assert _webhook_rows() == [f"webhook:{delivery.pk}:1"]


def test_resend_to_a_disabled_endpoint_is_409(staff_api, closed_url, buyer, show, gateway):
    endpoint = _endpoint(closed_url)
    delivery = _failed_delivery(buyer, show, "A1")
    staff_api.patch(f"{ENDPOINTS}{endpoint.pk}/", {"enabled": False}, format="json")

    response = staff_api.post(f"{ENDPOINTS}{endpoint.pk}/deliveries/{delivery.pk}/resend/")

    _assert_error(response, 409, "resend_refused")


def test_resend_through_another_endpoints_path_is_404(staff_api, closed_url, buyer, show, gateway):
    _endpoint(closed_url)
    other = _endpoint(f"{closed_url}/other", events=["purchase.refunded"])
    delivery = _failed_delivery(buyer, show, "A1")
    before = webhook_state()

    response = staff_api.post(f"{ENDPOINTS}{other.pk}/deliveries/{delivery.pk}/resend/")

    _assert_error(response, 404, "not_found")
    assert webhook_state() == before


def test_delete_is_204_then_every_route_of_it_is_404(staff_api, closed_url, buyer, show, gateway):
    endpoint = _endpoint(closed_url)
    delivery = _failed_delivery(buyer, show, "A1")
    path = f"{ENDPOINTS}{endpoint.pk}/"

    response = staff_api.delete(path)

    assert response.status_code == 204 and response.content == b""
    assert not WebhookEndpoint.objects.exists() and not WebhookDelivery.objects.exists()
    for answer in (
        staff_api.get(path),
        staff_api.patch(path, {"enabled": True}, format="json"),
        staff_api.delete(path),
        staff_api.post(f"{path}rotate-secret/"),
        staff_api.get(f"{path}deliveries/"),
        staff_api.post(f"{path}deliveries/{delivery.pk}/resend/"),
    ):
        _assert_error(answer, 404, "not_found")


@pytest.mark.parametrize(
    "path",
    [
        "/api/webhook-endpoints/{missing}/",
        "/api/webhook-endpoints/abc/",
        "/api/webhook-endpoints/-1/",
        "/api/webhook-endpoints/1.0/",
        "/api/webhook-endpoints/99999999999999999999999/",
        "/api/webhook-endpoints/{missing}/deliveries/",
        "/api/webhook-endpoints/abc/deliveries/",
        "/api/webhook-endpoints/{endpoint}/deliveries/?page=2",
    ],
)
@pytest.mark.parametrize("debug", [True, False])
def test_an_unknown_or_malformed_id_is_a_json_404(staff_api, closed_url, settings, path, debug):
    settings.DEBUG = debug
    endpoint = _endpoint(closed_url)
    path = path.format(endpoint=endpoint.pk, missing=endpoint.pk + 1000)

    response = staff_api.get(path)

    _assert_error(response, 404, "not_found")
    assert response["Content-Type"] == "application/json"


@pytest.mark.parametrize("segment", ["{missing}", "abc", "99999999999999999999999"])
def test_writes_to_an_unknown_or_malformed_id_are_404(staff_api, closed_url, segment):
    endpoint = _endpoint(closed_url)
    segment = segment.format(missing=endpoint.pk + 1000)
    path = f"{ENDPOINTS}{segment}/"

    for answer in (
        staff_api.patch(path, {"description": "x"}, format="json"),
        staff_api.delete(path),
        staff_api.post(f"{path}rotate-secret/"),
        staff_api.post(f"{ENDPOINTS}{endpoint.pk}/deliveries/{segment}/resend/"),
    ):
        _assert_error(answer, 404, "not_found")
    assert WebhookEndpoint.objects.count() == 1


# --- the schema -----------------------------------------------------------------------------


OPERATIONS = {
    ("/api/webhook-endpoints/", "get"): {"401", "403", "404"},
    ("/api/webhook-endpoints/", "post"): {"400", "401", "403", "413", "415"},
    ("/api/webhook-endpoints/{endpoint_id}/", "get"): {"401", "403", "404"},
    ("/api/webhook-endpoints/{endpoint_id}/", "patch"): {"400", "401", "403", "404", "413", "415"},
    ("/api/webhook-endpoints/{endpoint_id}/", "delete"): {"401", "403", "404"},
    ("/api/webhook-endpoints/{endpoint_id}/rotate-secret/", "post"): {"401", "403", "404"},
    ("/api/webhook-endpoints/{endpoint_id}/deliveries/", "get"): {"401", "403", "404"},
    ("/api/webhook-endpoints/{endpoint_id}/deliveries/{delivery_id}/resend/", "post"): {
        "400",
        "401",
        "403",
        "404",
        "409",
        "413",
        "415",
    },
}


def test_the_schema_documents_every_operation_its_errors_and_the_token(anon_api):
    schema = anon_api.get("/api/schema/", {"format": "json"}).json()
    served = {
        (p, m) for p, item in schema["paths"].items() for m in item if p.startswith(ENDPOINTS)
    }

    assert served == set(OPERATIONS)
    for (path, method), errors in OPERATIONS.items():
        operation = schema["paths"][path][method]
        assert {s for s in operation["responses"] if s >= "400"} == errors, (path, method)
        assert {"tokenAuth": []} in operation["security"]
        assert "staff" in operation["description"].lower(), (path, method)
        for parameter in (p for p in operation.get("parameters", []) if p["in"] == "path"):
            assert parameter["schema"]["type"] == "integer"
    assert schema["components"]["securitySchemes"]["tokenAuth"]["name"] == "Authorization"
