"""A client generated from the served schema works unedited (issue 12).

The way a consumer uses the API: fetch ``/api/schema/`` from the running
service, check it with ``openapi-spec-validator``, generate a Python client
with ``openapi-python-client`` (the same generator, version and options a
consumer would use), import it as generated and, through it alone, log in,
read the catalog, buy, replay, collide, reuse a key and poll the purchase to
CONFIRMED against pytest-django's live server, with the real Celery worker
and relay of tests/test_e2e.py behind it.

The other tests read the same served document for what a generated client
cannot show by itself: enums, headers, limits and the error body. The
contract they check is docs/api.md.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import types
import typing
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlparse

import attrs
import httpx
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from openapi_spec_validator import validate
from rest_framework.authtoken.models import Token
from rest_framework.pagination import PageNumberPagination

from ledger.models import EntryKind, LedgerEntry
from purchases.models import PurchaseSaga
from purchases.saga.states import TERMINAL, SagaState
from purchases.selectors import saga_payment_status
from purchases.services import purchase_start

from .factories import EventFactory, UserFactory
from .test_e2e import stack  # noqa: F401 - the end-to-end stack, reused as a fixture

BIN = Path(sys.executable).parent
PACKAGE = "boxoffice_client"
PURCHASES = "/api/purchases/"
PAYMENT_STATUSES = {
    "captured",
    "partially_refunded",
    "refunded",
    "not_started",
    "processing",
    "requires_action",
    "unknown",
    "not_captured",
}

PUBLIC_OPERATIONS = [
    "auth.auth_token_create",
    "auth.auth_signup_create",
    "events.events_list",
    "events.events_seats_list",
]
PER_USER_OPERATIONS = [
    "purchases.purchases_create",
    "purchases.purchases_list",
    "purchases.purchases_retrieve",
]
STAFF_OPERATIONS = [
    f"webhook_endpoints.webhook_endpoints_{name}"
    for name in (
        "list",
        "create",
        "retrieve",
        "partial_update",
        "destroy",
        "rotate_secret",
        "deliveries_list",
        "deliveries_resend",
    )
]

# The error codes each operation documents, per status (docs/api.md, "Errors").
ERROR_CODES = {
    ("/api/auth/token/", "post"): {
        "400": {"invalid", "parse_error"},
        "413": {"payload_too_large"},
        "415": {"unsupported_media_type"},
        "429": {"throttled"},
    },
    ("/api/auth/signup/", "post"): {
        "400": {"invalid", "parse_error"},
        "413": {"payload_too_large"},
        "415": {"unsupported_media_type"},
        "429": {"throttled"},
    },
    ("/api/events/", "get"): {"401": {"authentication_failed"}},
    ("/api/events/{event_id}/seats/", "get"): {
        "401": {"authentication_failed"},
        "404": {"not_found"},
    },
    ("/api/purchases/", "post"): {
        "400": {"invalid", "parse_error", "idempotency_key_missing", "idempotency_key_invalid"},
        "401": {"not_authenticated", "authentication_failed"},
        "403": {"permission_denied"},
        "409": {
            "seat_unavailable",
            "not_enough_seats",
            "sales_not_open",
            "sales_closed",
            "buyer_limit_reached",
        },
        "413": {"payload_too_large"},
        "415": {"unsupported_media_type"},
        "422": {"idempotency_key_reused"},
        "429": {"throttled"},
        "503": {"payments_paused"},
    },
    ("/api/purchases/", "get"): {
        "401": {"not_authenticated", "authentication_failed"},
        "404": {"not_found"},
    },
    ("/api/purchases/{saga_id}/", "get"): {
        "401": {"not_authenticated", "authentication_failed"},
        "404": {"not_found"},
    },
    ("/api/purchases/{saga_id}/cancel/", "post"): {
        "400": {"invalid", "parse_error", "idempotency_key_missing", "idempotency_key_invalid"},
        "401": {"not_authenticated", "authentication_failed"},
        "403": {"permission_denied"},
        "404": {"not_found"},
        "409": {"cancellation_not_allowed", "refund_exceeds_paid"},
        "413": {"payload_too_large"},
        "415": {"unsupported_media_type"},
        "422": {"idempotency_key_reused"},
    },
}
# The webhooks' staff API: every operation answers 401 and 403 (not staff).
_STAFF = {"401": {"not_authenticated", "authentication_failed"}, "403": {"permission_denied"}}
_BODY = {
    "400": {"invalid", "parse_error"},
    "413": {"payload_too_large"},
    "415": {"unsupported_media_type"},
}
_ENDPOINT = "/api/webhook-endpoints/{endpoint_id}/"
ERROR_CODES |= {
    ("/api/webhook-endpoints/", "get"): {**_STAFF, "404": {"not_found"}},
    ("/api/webhook-endpoints/", "post"): {**_STAFF, **_BODY},
    (_ENDPOINT, "get"): {**_STAFF, "404": {"not_found"}},
    (_ENDPOINT, "patch"): {**_STAFF, **_BODY, "404": {"not_found"}},
    (_ENDPOINT, "delete"): {**_STAFF, "404": {"not_found"}},
    (f"{_ENDPOINT}rotate-secret/", "post"): {**_STAFF, "404": {"not_found"}},
    (f"{_ENDPOINT}deliveries/", "get"): {**_STAFF, "404": {"not_found"}},
    (f"{_ENDPOINT}deliveries/{{delivery_id}}/resend/", "post"): {
        **_STAFF,
        **_BODY,
        "404": {"not_found"},
        "409": {"resend_refused"},
    },
}
# Money back, the organizer's side (docs/api.md, "Money back: refunds and cancellations").
_SCOPED = {"401": {"not_authenticated", "authentication_failed"}, "403": {"permission_denied"}}
_ORGANIZER_EVENT = "/api/organizers/{slug}/events/{event_id}/"
ERROR_CODES |= {
    ("/api/organizers/{slug}/purchases/{saga_id}/refunds/", "post"): {
        **_SCOPED,
        **_BODY,
        "400": {"invalid", "parse_error", "idempotency_key_missing", "idempotency_key_invalid"},
        "404": {"not_found"},
        "409": {"refund_exceeds_paid", "not_refundable"},
        "422": {"idempotency_key_reused"},
    },
    (f"{_ORGANIZER_EVENT}cancel/", "post"): {**_SCOPED, **_BODY, "404": {"not_found"}},
    (f"{_ORGANIZER_EVENT}cancellation/", "get"): {**_SCOPED, "404": {"not_found"}},
}


# --- the served document and the client generated from it ----------------------------


@pytest.fixture(scope="module")
def served_schema(live_server) -> dict:
    answer = httpx.get(f"{live_server.url}/api/schema/", params={"format": "json"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.fixture(scope="module")
def client_package(served_schema, tmp_path_factory):
    """The package openapi-python-client generates from the served document,
    imported exactly as generated."""
    workdir = tmp_path_factory.mktemp("generated")
    document = workdir / "schema.json"
    document.write_text(json.dumps(served_schema))
    started = time.monotonic()
    result = subprocess.run(
        [
            str(BIN / "openapi-python-client"),
            "generate",
            "--path",
            str(document),
            "--output-path",
            str(workdir / PACKAGE),
            "--meta",
            "none",
            "--fail-on-warning",
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
        # The generator's post-hooks run ruff, which lives beside this Python.
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    print(f"client generated in {time.monotonic() - started:.1f}s")
    sys.path.insert(0, str(workdir))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(workdir))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def operation(package, dotted: str) -> types.ModuleType:
    """``purchases.purchases_create`` -> the generated module of that operation."""
    return importlib.import_module(f"{package.__name__}.api.{dotted}")


def anonymous(package, live_server):
    return package.Client(base_url=live_server.url, raise_on_unexpected_status=True)


def logged_in(package, live_server, username: str):
    """Log in through the generated client; an authenticated client."""
    login = operation(package, "auth.auth_token_create")
    credentials = typing.get_type_hints(login.sync_detailed)["body"]
    UserFactory(username=username, password=f"pw-{username}")
    answer = login.sync_detailed(
        client=anonymous(package, live_server),
        body=credentials(username=username, password=f"pw-{username}"),
    )
    assert answer.status_code == 200, answer.content
    return package.AuthenticatedClient(
        base_url=live_server.url,
        token=answer.parsed.token,
        prefix="Token",
        raise_on_unexpected_status=True,
    )


# --- reading the document ------------------------------------------------------------------


def resolved(schema: dict, node: dict) -> dict:
    """``node`` with a ``$ref``, or an ``allOf`` of one, followed."""
    while True:
        if "$ref" in node:
            node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
        elif len(node.get("allOf", [])) == 1:
            node = node["allOf"][0]
        else:
            return node


def enum_values(schema: dict, node: dict) -> tuple[set, bool]:
    """The values an enum property allows, and whether it is nullable."""
    node = resolved(schema, node)
    values, nullable = set(), bool(node.get("nullable"))
    for option in node.get("oneOf", [node]):
        option = resolved(schema, option)
        assert "enum" in option, f"not an enum: {option}"
        values |= {v for v in option["enum"] if v is not None}
        nullable = nullable or None in option["enum"]
    return values, nullable


def component_of(schema: dict, path: str, method: str, status: str) -> dict:
    content = schema["paths"][path][method]["responses"][status]["content"]
    return resolved(schema, content["application/json"]["schema"])


# --- the document itself ---------------------------------------------------------------------


def test_the_served_schema_is_valid_openapi(served_schema):
    validate(served_schema)


def test_the_public_operations_need_no_credentials_and_the_purchases_do(
    served_schema, client_package
):
    # In the document: no security requirement at all for the public ones
    # (not even an optional one), token or session for the purchases.
    operations = {
        (p, m): op for p, item in served_schema["paths"].items() for m, op in item.items()
    }
    public = {
        ("/api/auth/token/", "post"),
        ("/api/auth/signup/", "post"),
        ("/api/events/", "get"),
        ("/api/events/{event_id}/seats/", "get"),
    }
    assert {
        k: op.get("security", []) for k, op in operations.items() if k in public
    } == dict.fromkeys(public, [])
    assert {
        k: op.get("security") for k, op in operations.items() if k not in public
    } == dict.fromkeys(set(operations) - public, [{"tokenAuth": []}, {"cookieAuth": []}])

    # In the generated client: what a type checker sees.
    def client_types(dotted):
        hint = typing.get_type_hints(operation(client_package, dotted).sync)["client"]
        return set(typing.get_args(hint)) or {hint}

    everyone = {client_package.Client, client_package.AuthenticatedClient}
    assert {d: client_types(d) for d in PUBLIC_OPERATIONS} == dict.fromkeys(
        PUBLIC_OPERATIONS, everyone
    )
    assert {d: client_types(d) for d in PER_USER_OPERATIONS + STAFF_OPERATIONS} == dict.fromkeys(
        PER_USER_OPERATIONS + STAFF_OPERATIONS, {client_package.AuthenticatedClient}
    )


def test_statuses_are_enums_and_the_terminal_ones_are_named(served_schema):
    states = {s.value for s in SagaState}
    detail = component_of(served_schema, "/api/purchases/{saga_id}/", "get", "200")
    accepted = component_of(served_schema, PURCHASES, "post", "202")
    entry = resolved(served_schema, detail["properties"]["history"]["items"])
    payment = resolved(served_schema, detail["properties"]["payment"])

    assert enum_values(served_schema, detail["properties"]["status"]) == (states, False)
    assert enum_values(served_schema, accepted["properties"]["status"]) == (states, False)
    assert enum_values(served_schema, entry["properties"]["from"]) == (states, True)
    assert enum_values(served_schema, entry["properties"]["to"]) == (states, False)
    assert enum_values(served_schema, payment["properties"]["status"]) == (PAYMENT_STATUSES, False)
    # Each state's line of the description says whether it is terminal.
    lines = resolved(served_schema, detail["properties"]["status"])["description"].splitlines()
    terminal = {
        state
        for state in states
        for line in lines
        if line.startswith(f"* `{state}`") and "terminal" in line
    }
    assert terminal == {s.value for s in TERMINAL}


@pytest.mark.django_db
def test_the_payment_status_enum_holds_every_status_the_selector_answers():
    # The enum is written in purchases/serializers.py; the statuses are
    # decided in purchases/selectors.py. Every state, without a charge, with
    # one, with a refund of part of it and with the refund of the rest.
    answered = set()
    for n, state in enumerate(SagaState):
        saga = PurchaseSaga(intent_id=f"pi_enum_{n}", state=state.value)  # never saved
        answered.add(saga_payment_status(saga))
        for kind, amount in (
            (EntryKind.CHARGE, 100),
            (EntryKind.REFUND, -40),
            (EntryKind.REFUND, -60),
        ):
            LedgerEntry.objects.create(
                intent_id=saga.intent_id,
                kind=kind,
                amount=amount,
                currency="EUR",
                saga_id=uuid.uuid4(),
                event_id=1,
                created_at=timezone.now(),
                # Refunds as refund rows record them: one entry each.
                refund_id=uuid.uuid4() if kind == EntryKind.REFUND else None,
            )
            answered.add(saga_payment_status(saga))

    assert answered == PAYMENT_STATUSES


def test_the_headers_and_the_idempotency_key_rules_are_described(served_schema):
    create = served_schema["paths"][PURCHASES]["post"]
    token = served_schema["paths"]["/api/auth/token/"]["post"]

    location = create["responses"]["202"]["headers"]["Location"]
    assert location["required"] is True and location["schema"]["type"] == "string"
    for op, status in ((create, "429"), (token, "429"), (create, "503")):
        retry_after = op["responses"][status]["headers"]["Retry-After"]
        assert retry_after["required"] is True
        assert retry_after["schema"]["type"] == "integer"

    headers = {p["name"]: p for p in create["parameters"] if p["in"] == "header"}
    assert set(headers) == {"Idempotency-Key", "Waiting-Room-Pass"}
    assert not headers["Waiting-Room-Pass"].get("required", False)
    key = headers["Idempotency-Key"]
    assert key["name"] == "Idempotency-Key" and key["required"] is True
    assert (key["schema"]["minLength"], key["schema"]["maxLength"]) == (1, 255)
    assert "pattern" in key["schema"]
    for rule in ("same body", "422", "per user"):
        assert rule in key["description"], rule


def test_the_error_body_and_each_operations_codes_are_described(served_schema):
    for (path, method), codes_by_status in ERROR_CODES.items():
        responses = served_schema["paths"][path][method]["responses"]
        assert {s for s in responses if s >= "400"} == set(codes_by_status), (path, method)
        for status, codes in codes_by_status.items():
            error = component_of(served_schema, path, method, status)
            assert {"code", "detail", "field", "errors", "seats"} <= set(error["properties"])
            assert set(error["required"]) == {"code", "detail"}
            # Only not_enough_seats answers "available" (an integer).
            if (path, method, status) == (PURCHASES, "post", "409"):
                assert error["properties"]["available"]["type"] == "integer"
            else:
                assert "available" not in error["properties"], (path, method, status)
            described = responses[status]["description"]
            assert {c for c in codes if f"`{c}`" not in described} == set(), (path, status)


def test_the_seats_of_a_purchase_have_their_limits(served_schema, settings):
    body = resolved(
        served_schema,
        served_schema["paths"][PURCHASES]["post"]["requestBody"]["content"]["application/json"][
            "schema"
        ],
    )
    seats = body["properties"]["seats"]

    assert (seats["minItems"], seats["maxItems"], seats["uniqueItems"]) == (
        1,
        settings.MAX_SEATS_PER_PURCHASE,
        True,
    )
    assert (seats["items"]["minLength"], seats["items"]["maxLength"]) == (1, 32)
    # Best available: a quantity instead, one of the two (said in the description).
    quantity = body["properties"]["quantity"]
    assert (quantity["type"], quantity["minimum"], quantity["maximum"]) == (
        "integer",
        1,
        settings.MAX_SEATS_PER_PURCHASE,
    )
    assert set(body["required"]) == {"event", "payment_method"}
    assert "Exactly one of `seats`" in body["description"]


def test_links_self_is_a_typed_field(served_schema):
    for path, method, status in [
        (PURCHASES, "post", "202"),
        ("/api/purchases/{saga_id}/", "get", "200"),
    ]:
        links = resolved(
            served_schema, component_of(served_schema, path, method, status)["properties"]["links"]
        )
        assert links.get("properties", {}).get("self", {}).get("type") == "string", links
        assert links["required"] == ["self"]


@pytest.mark.django_db
def test_the_purchase_endpoints_take_json_only(served_schema, alice_api, event):
    # A generated client sends every content type the schema lists, at once.
    body = served_schema["paths"][PURCHASES]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json"}

    fields = {"event": event.pk, "seats": ["A1"], "payment_method": "pm_card_visa"}
    form = alice_api.post(
        PURCHASES,
        urlencode(fields, doseq=True),
        content_type="application/x-www-form-urlencoded",
        headers={"Idempotency-Key": "form-1"},
    )
    multipart = alice_api.post(
        PURCHASES, fields, format="multipart", headers={"Idempotency-Key": "multipart-1"}
    )

    for answer in (form, multipart):
        assert answer.status_code == 415, answer.content
        assert answer.json()["code"] == "unsupported_media_type"
    assert not PurchaseSaga.objects.exists()


@pytest.mark.parametrize(
    "path",
    [
        "/api/purchases/not-a-uuid/",
        "/api/purchases/00000000-0000-4000-8000-00000000000Z/",
        "/api/events/abc/seats/",
        "/api/events/null/seats/",
        "/api/events/-1/seats/",
    ],
)
def test_a_malformed_path_segment_answers_json_404_whatever_debug_says(alice_api, settings, path):
    for debug in (True, False):
        settings.DEBUG = debug

        answer = alice_api.get(path)

        assert answer.status_code == 404, (debug, answer.content[:200])
        assert answer["Content-Type"] == "application/json", (debug, answer["Content-Type"])
        assert answer.json()["code"] == "not_found"


def test_the_ids_in_paths_keep_their_types_in_the_schema(served_schema):
    # The routes take any segment (the views answer a malformed one with the
    # JSON 404); generated clients still see an integer and a UUID.
    def parameter(path):
        [p] = [
            p
            for op in served_schema["paths"][path].values()
            for p in op["parameters"]
            if p["in"] == "path"
        ]
        return p["schema"]

    assert parameter("/api/events/{event_id}/seats/")["type"] == "integer"
    assert parameter("/api/purchases/{saga_id}/") == {"type": "string", "format": "uuid"}
    for op in served_schema["paths"]["/api/webhook-endpoints/{endpoint_id}/"].values():
        assert [p["schema"]["type"] for p in op["parameters"] if p["in"] == "path"] == ["integer"]


# --- through the generated client ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_logging_in_takes_a_username_and_a_password_only(client_package, live_server):
    login = operation(client_package, "auth.auth_token_create")
    credentials = typing.get_type_hints(login.sync)["body"]
    user = UserFactory(username="dora", password="pw-dora")

    assert set(attrs.fields_dict(credentials)) - {"additional_properties"} == {
        "username",
        "password",
    }
    answer = login.sync(
        client=anonymous(client_package, live_server),
        body=credentials(username="dora", password="pw-dora"),
    )
    refused = login.sync(
        client=anonymous(client_package, live_server),
        body=credentials(username="dora", password="wrong"),
    )

    assert answer.token == Token.objects.get(user=user).key
    assert (refused.code, refused.field) == ("invalid", "non_field_errors")


@pytest.mark.django_db(transaction=True)
def test_the_pages_of_purchases_are_followed_with_the_page_parameter(
    client_package, live_server, broker_queue
):
    # given: one purchase more than a page holds
    size = PageNumberPagination.page_size
    assert size is not None  # (settings.REST_FRAMEWORK's PAGE_SIZE)
    alice = logged_in(client_package, live_server, "alice")
    event = EventFactory(seats=[f"A{n}" for n in range(1, size + 2)])
    buyer = get_user_model().objects.get(username="alice")
    for n in range(1, size + 2):
        purchase_start(
            user=buyer,
            idempotency_key=f"page-{n}",
            event_id=event.pk,
            seat_refs=[f"A{n}"],
            payment_method="pm_card_visa",
        )
    listing = operation(client_package, "purchases.purchases_list")

    # when: the next page is asked for as the link says
    first = listing.sync(client=alice)
    [page] = parse_qs(urlparse(first.next_).query)[PageNumberPagination.page_query_param]
    second = listing.sync(client=alice, page=int(page))

    # then
    assert (first.count, len(first.results), first.previous) == (size + 1, size, None)
    assert (len(second.results), second.next_) == (1, None)
    assert parse_qs(urlparse(second.previous).query).get("page") in (None, ["1"])


@pytest.mark.django_db(transaction=True)
def test_best_available_through_the_generated_client(client_package, live_server, broker_queue):
    # given
    models = client_package.models
    create = operation(client_package, "purchases.purchases_create")
    alice = logged_in(client_package, live_server, "alice")
    event = EventFactory(seats=[f"A{n}" for n in range(1, 6)])

    # when: three seats, then four more than are left, then both fields
    chosen = create.sync_detailed(
        client=alice,
        idempotency_key="best-1",
        body=models.PurchaseRequest(event=event.pk, quantity=3, payment_method="pm_card_visa"),
    )
    refused = create.sync_detailed(
        client=alice,
        idempotency_key="best-2",
        body=models.PurchaseRequest(event=event.pk, quantity=4, payment_method="pm_card_visa"),
    )
    both = create.sync_detailed(
        client=alice,
        idempotency_key="best-3",
        body=models.PurchaseRequest(
            event=event.pk, seats=["A1"], quantity=1, payment_method="pm_card_visa"
        ),
    )

    # then
    assert chosen.status_code == 202, chosen.content
    assert chosen.parsed.seats == ["A2", "A3", "A4"]
    assert refused.status_code == 409, refused.content
    assert (refused.parsed.code, refused.parsed.available) == ("not_enough_seats", 2)
    assert both.status_code == 400, both.content
    assert (both.parsed.code, both.parsed.field) == ("invalid", "quantity")


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_purchase_through_the_generated_client_from_login_to_confirmed(
    client_package,
    live_server,
    stack,  # noqa: F811 - the fixture imported above
):
    # given
    models = client_package.models
    create = operation(client_package, "purchases.purchases_create")
    retrieve = operation(client_package, "purchases.purchases_retrieve")
    listing = operation(client_package, "purchases.purchases_list")
    event = EventFactory(seats=["A1", "A2"], seats__price=4200)
    public = anonymous(client_package, live_server)
    alice = logged_in(client_package, live_server, "alice")
    bob = logged_in(client_package, live_server, "bob")

    # the catalog, anonymously
    events = operation(client_package, "events.events_list").sync(client=public)
    seats = operation(client_package, "events.events_seats_list").sync(
        client=public, event_id=event.pk
    )
    assert [(e.id, e.seats_available) for e in events] == [(event.pk, 2)]
    assert [(s.ref, s.status, s.price.amount) for s in seats] == [
        ("A1", models.SeatStatus.AVAILABLE, 4200),
        ("A2", models.SeatStatus.AVAILABLE, 4200),
    ]

    # when: alice buys A1, then sends the very same request again
    body = models.PurchaseRequest(event=event.pk, seats=["A1"], payment_method="pm_card_visa")
    first = create.sync_detailed(client=alice, body=body, idempotency_key="generated-1")
    replay = create.sync_detailed(client=alice, body=body, idempotency_key="generated-1")

    # then: 202, and the replay is the same answer
    assert first.status_code == 202, first.content
    accepted = first.parsed
    assert isinstance(accepted, models.PurchaseAccepted)
    assert accepted.status is models.PurchaseStatus.PENDING
    assert (accepted.seats, accepted.total.amount) == (["A1"], 4200)
    assert first.headers["Location"] == accepted.links.self_ == f"{PURCHASES}{accepted.id}/"
    assert (replay.status_code, replay.content) == (202, first.content)

    # when: bob wants A1 too; alice reuses her key for another body
    taken = create.sync_detailed(
        client=bob,
        idempotency_key="generated-2",
        body=models.PurchaseRequest(
            event=event.pk, seats=["A2", "A1"], payment_method="pm_card_visa"
        ),
    )
    reused = create.sync_detailed(
        client=alice,
        idempotency_key="generated-1",
        body=models.PurchaseRequest(event=event.pk, seats=["A2"], payment_method="pm_card_visa"),
    )

    # then
    assert taken.status_code == 409, taken.content
    assert (taken.parsed.code, taken.parsed.seats) == ("seat_unavailable", ["A1"])
    assert reused.status_code == 422, reused.content
    assert reused.parsed.code == "idempotency_key_reused"

    # when: alice polls her purchase until the saga settles
    polled = []

    def settled():
        polled.append(retrieve.sync(client=alice, saga_id=accepted.id))
        return polled[-1].status in {models.PurchaseStatus(s.value) for s in TERMINAL}

    stack.wait_for(settled, "the purchase to settle, polled through the generated client")

    # then
    detail = polled[-1]
    assert detail.status is models.PurchaseStatus.CONFIRMED
    assert detail.payment.status is models.PaymentStatus.CAPTURED
    assert [(h.from_, h.to) for h in detail.history] == [
        (None, models.PurchaseStatus.PENDING),
        (models.PurchaseStatus.PENDING, models.PurchaseStatus.CHARGING),
        (models.PurchaseStatus.CHARGING, models.PurchaseStatus.CONFIRMED),
    ]
    page = listing.sync(client=alice)
    assert [(p.id, p.status) for p in page.results] == [
        (accepted.id, models.PurchaseStatus.CONFIRMED)
    ]
    assert listing.sync(client=bob).count == 0
