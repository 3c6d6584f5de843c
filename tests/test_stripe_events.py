"""Stripe's events (docs/stripe.md, "Stripe's events"): ``POST
/payments/stripe/events/`` verifies the signature before anything, stores
each event once by its id with the obligation to act on it, and answers at
once; the consumer, run by the outbox (``drain_outbox``), re-reads what the
event names and probes the saga.

Events are signed here as Stripe signs them (``t=…,v1=`` HMAC-SHA256 of
``"{t}.{body}"``, written with ``hmac``); the product verifies them with the
stripe library. Stripe's objects are the documented shapes (API reference:
"The Event object", "The PaymentIntent object", "The Dispute object"),
served where a read is needed by :class:`StripeStub`, an HTTP server on
127.0.0.1 that the test scripts (tests/test_disputes.py uses it too).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.server
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client

from outbox.models import OutboxMessage
from purchases import services
from purchases.models import PurchaseSaga
from purchases.services import saga_charge
from stripe_events.models import StripeEvent

from .conftest import drain_outbox, race, start_purchase

URL = "/payments/stripe/events/"
SECRET = "whsec_dGVzdC1vbmx5LW5vdC1hLXNlY3JldA"
TOPIC = "stripe.event"


# --- Stripe's shapes, signed as Stripe signs them -------------------------------------


def sign(body: bytes, *, secret: str = SECRET, at: int | None = None) -> str:
    t = int(time.time()) if at is None else at
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def event_object(type_: str, obj: dict, *, evt: str | None = None) -> dict:
    """Stripe's Event object (a snapshot event: the object as it was)."""
    return {
        "id": evt or f"evt_{uuid.uuid4().hex[:24]}",
        "object": "event",
        "api_version": "2026-10-28.endive",
        "created": int(time.time()),
        "data": {"object": obj},
        "livemode": False,
        "pending_webhooks": 1,
        "request": {"id": None, "idempotency_key": None},
        "type": type_,
    }


def payment_intent_object(
    pi: str, *, purchase_id: str = "", intent_id: str = "", status: str = "succeeded"
) -> dict:
    metadata = {"purchase_id": purchase_id, "intent_id": intent_id} if purchase_id else {}
    return {
        "id": pi,
        "object": "payment_intent",
        "amount": 2500,
        "amount_received": 2500 if status == "succeeded" else 0,
        "capture_method": "automatic",
        "client_secret": f"{pi}_secret_abc",
        "confirmation_method": "automatic",
        "created": int(time.time()),
        "currency": "eur",
        "latest_charge": "ch_3QpLbE2eZvKYlo2C1aB2cD3e",
        "livemode": False,
        "metadata": metadata,
        "payment_method": "pm_1QpLbD2eZvKYlo2CfGhIjKlM",
        "payment_method_types": ["card"],
        "status": status,
    }


def post_event(client: Client, event: dict, *, signature: str | None = "sign"):
    """POST the event as Stripe does: signed (``"sign"``), with the header
    given, or without one (None)."""
    body = json.dumps(event).encode()
    headers: dict[str, str] = {}
    if signature is not None:
        headers["Stripe-Signature"] = sign(body) if signature == "sign" else signature
    return client.post(URL, data=body, content_type="application/json", headers=headers)


# --- a stand-in for Stripe's API, on 127.0.0.1 ----------------------------------------


@dataclass
class StubRequest:
    path: str
    query: dict[str, list[str]]
    authorization: str


@dataclass
class StripeStub:
    """Answers ``GET <path>`` from ``objects`` (200 and the JSON), or with
    the next status of ``failures`` while there is one (5xx: an answer that
    is no answer); anything not there is Stripe's 404 ``resource_missing``.
    Records every request."""

    objects: dict[str, dict] = field(default_factory=dict)
    failures: list[int] = field(default_factory=list)
    requests: list[StubRequest] = field(default_factory=list)

    def start(self) -> str:
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 (http.server's name)
                url = urlsplit(self.path)
                stub.requests.append(
                    StubRequest(
                        url.path, parse_qs(url.query), self.headers.get("Authorization", "")
                    )
                )
                if stub.failures:
                    status, answer = (
                        stub.failures.pop(0),
                        {"error": {"type": "api_error", "message": "stub"}},
                    )
                elif url.path in stub.objects:
                    status, answer = 200, stub.objects[url.path]
                else:
                    status, answer = (
                        404,
                        {
                            "error": {
                                "type": "invalid_request_error",
                                "code": "resource_missing",
                                "message": f"No such object: '{url.path.rpartition('/')[2]}'",
                            }
                        },
                    )
                body = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Request-Id", "req_stub")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def stripe_stub(settings) -> Iterator[StripeStub]:
    """The stub, started, with the settings that point the product at it."""
    stub = StripeStub()
    settings.STRIPE_API_BASE = stub.start()
    settings.STRIPE_SECRET_KEY = "sk_test_4eC39HqLyjWDarjtT1zdp7dc"
    settings.STRIPE_TIMEOUT_SECONDS = 2.0
    try:
        yield stub
    finally:
        stub.close()


def use_webhook_secret(settings) -> None:
    settings.STRIPE_WEBHOOK_SECRET = SECRET
    settings.STRIPE_WEBHOOK_TOLERANCE_SECONDS = 300


@pytest.fixture(autouse=True)
def _webhook_secret(settings):
    use_webhook_secret(settings)


@pytest.fixture
def probes(monkeypatch) -> list[dict]:
    """The seam to the saga (``purchases.services.purchase_processor_event``),
    replaced by a recorder of its calls: what it does with them is the
    saga's, tested there (and once, for real, below)."""
    calls: list[dict] = []
    monkeypatch.setattr(services, "purchase_processor_event", lambda **kw: calls.append(kw))
    return calls


def _nothing_recorded() -> None:
    assert StripeEvent.objects.count() == 0
    assert OutboxMessage.objects.filter(topic=TOPIC).count() == 0


# --- the signature --------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "signature",
    [
        pytest.param(None, id="missing"),
        pytest.param("", id="empty"),
        pytest.param("t=1,v1=00", id="garbage"),
        pytest.param("other-secret", id="wrong secret"),
        pytest.param("stale", id="older than the tolerance"),
        pytest.param("other-body", id="another body's"),
    ],
)
def test_a_missing_wrong_or_stale_signature_is_refused_and_nothing_is_recorded(signature):
    event = event_object("payment_intent.succeeded", payment_intent_object("pi_1"))
    body = json.dumps(event).encode()
    header = {
        "other-secret": lambda: sign(body, secret="whsec_c29tZW9uZS1lbHNl"),
        "stale": lambda: sign(body, at=int(time.time()) - 301),
        "other-body": lambda: sign(body + b" "),
    }.get(signature or "", lambda: signature)()

    # when
    response = post_event(Client(), event, signature=header)

    # then
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_signature"
    _nothing_recorded()


@pytest.mark.django_db
def test_a_signature_within_the_tolerance_is_taken(settings):
    event = event_object("payment_intent.succeeded", payment_intent_object("pi_1"))
    body = json.dumps(event).encode()
    response = post_event(Client(), event, signature=sign(body, at=int(time.time()) - 290))
    assert response.status_code == 200


@pytest.mark.django_db
def test_without_a_webhook_secret_nothing_verifies(settings):
    settings.STRIPE_WEBHOOK_SECRET = ""
    response = post_event(
        Client(), event_object("payment_intent.succeeded", payment_intent_object("pi_1"))
    )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_signature"
    _nothing_recorded()


# --- the inbox ------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_valid_event_is_stored_once_with_its_obligation_and_answered_at_once():
    event = event_object(
        "payment_intent.payment_failed",
        payment_intent_object("pi_1", status="requires_payment_method"),
    )

    # when: no token, no session, CSRF enforced as for a browser
    response = post_event(Client(enforce_csrf_checks=True), event)

    # then
    assert response.status_code == 200
    assert response.json() == {"received": True}
    (row,) = StripeEvent.objects.all()
    assert (row.stripe_id, row.type, row.object_id, row.livemode, row.ignored) == (
        event["id"],
        "payment_intent.payment_failed",
        "pi_1",
        False,
        False,
    )
    assert int(row.created.timestamp()) == event["created"]
    assert row.received_at is not None and row.acted_at is None
    (owed,) = OutboxMessage.objects.filter(topic=TOPIC)
    assert owed.key == f"stripe_event:{event['id']}"
    assert owed.payload["stripe_event"] == event["id"]
    assert owed.completed_at is None  # the worker's, not the request's


@pytest.mark.django_db
def test_the_same_event_twice_is_one_row_acted_on_once(alice, event, gateway, probes):
    saga = start_purchase(alice, event)
    stripe_event = event_object(
        "payment_intent.succeeded", payment_intent_object("pi_1", purchase_id=str(saga.pk))
    )
    client = Client()

    # when: Stripe sends it again before and after it was acted on
    assert post_event(client, stripe_event).status_code == 200
    assert post_event(client, stripe_event).status_code == 200
    drain_outbox()
    assert post_event(client, stripe_event).status_code == 200
    drain_outbox()

    # then
    assert StripeEvent.objects.filter(stripe_id=stripe_event["id"]).count() == 1
    assert OutboxMessage.objects.filter(topic=TOPIC).count() == 1
    assert probes == [
        {"saga_id": saga.pk, "why": f"stripe event {stripe_event['id']} payment_intent.succeeded"}
    ]
    row = StripeEvent.objects.get()
    assert row.acted_at is not None
    assert row.outcome == f"purchase {saga.pk} probed"


@pytest.mark.django_db(transaction=True)
def test_the_same_event_posted_at_once_is_stored_once():
    """Stripe retrying while the first delivery is still in flight: four
    requests at once on their own connections, one row, one obligation."""
    stripe_event = event_object("payment_intent.succeeded", payment_intent_object("pi_1"))

    answers = race(4, lambda i: post_event(Client(), stripe_event).status_code)

    assert answers == [200, 200, 200, 200]
    assert StripeEvent.objects.count() == 1
    assert OutboxMessage.objects.filter(topic=TOPIC).count() == 1


@pytest.mark.django_db
def test_a_type_not_acted_on_is_answered_200_and_recorded_as_ignored(probes):
    customer = {"id": "cus_NffrFeUfNV2Hib", "object": "customer", "email": "jenny@example.com"}
    stripe_event = event_object("customer.created", customer)

    response = post_event(Client(), stripe_event)

    assert response.status_code == 200
    row = StripeEvent.objects.get()
    assert (row.type, row.object_id, row.ignored) == (
        "customer.created",
        "cus_NffrFeUfNV2Hib",
        True,
    )
    assert OutboxMessage.objects.filter(topic=TOPIC).count() == 0
    drain_outbox()
    assert probes == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"not json at all", id="not JSON"),
        pytest.param(b"[1, 2]", id="JSON, not an object"),
        pytest.param(
            b'{"object": "event", "id": "evt_1", "type": "charge.refunded"}', id="no data.object"
        ),
        pytest.param(b'{"object": "list", "data": []}', id="not an event"),
        pytest.param(b"[" * 100 + b"]" * 100, id="too deep"),
    ],
)
def test_a_signed_body_that_is_not_an_event_is_400_after_the_signature_and_records_nothing(body):
    response = Client().post(
        URL, data=body, content_type="application/json", HTTP_STRIPE_SIGNATURE=sign(body)
    )

    assert response.status_code == 400
    assert response.json()["code"] == "parse_error"
    _nothing_recorded()


@pytest.mark.django_db
def test_a_body_over_the_limit_is_refused_before_it_is_read():
    body = b"{" + b" " * (256 * 1024) + b"}"
    response = Client().post(
        URL, data=body, content_type="application/json", HTTP_STRIPE_SIGNATURE=sign(body)
    )
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"
    _nothing_recorded()


@pytest.mark.django_db
def test_only_post_is_served():
    assert Client().get(URL).status_code == 405


# --- the consumer: payment events probe the saga ---------------------------------------


@pytest.mark.django_db
def test_a_payment_event_finds_the_saga_by_the_recorded_intent_when_metadata_is_absent(
    alice, event, gateway, probes
):
    saga = start_purchase(alice, event)
    PurchaseSaga.objects.filter(pk=saga.pk).update(processor="stripe", processor_ref="pi_known")
    charge = {
        "id": "ch_3QpLbE2eZvKYlo2C1aB2cD3e",
        "object": "charge",
        "amount": 2500,
        "amount_refunded": 2500,
        "currency": "eur",
        "metadata": {},
        "payment_intent": "pi_known",
        "refunded": True,
        "status": "succeeded",
    }
    stripe_event = event_object("charge.refunded", charge)

    post_event(Client(), stripe_event)
    drain_outbox()

    assert probes == [
        {"saga_id": saga.pk, "why": f"stripe event {stripe_event['id']} charge.refunded"}
    ]


@pytest.mark.django_db
def test_a_payment_event_of_no_purchase_of_ours_probes_nothing(probes):
    stripe_event = event_object(
        "payment_intent.canceled", payment_intent_object("pi_someone_elses", status="canceled")
    )

    post_event(Client(), stripe_event)
    drain_outbox()

    assert probes == []
    row = StripeEvent.objects.get()
    assert row.acted_at is not None
    assert row.outcome == "no purchase for pi_someone_elses"


@pytest.mark.django_db
def test_an_event_is_a_faster_probe_the_intent_decides(alice, event, gateway):
    """The seam for real: a charge whose answer was lost (UNKNOWN) is looked
    up at the gateway when an event names it, before its reconcile timer is
    due; the gateway's answer, not the event, confirms it."""
    saga = saga_charge(
        saga_id=start_purchase(alice, event, payment_method="pm_card_timeout_charged").pk
    )
    assert saga.state == "UNKNOWN"
    # The event says "canceled": only a trigger, the look-up says charged.
    stripe_event = event_object(
        "payment_intent.canceled",
        payment_intent_object("pi_1", purchase_id=str(saga.pk), status="canceled"),
    )

    post_event(Client(), stripe_event)
    delivered = drain_outbox()

    saga.refresh_from_db()
    assert saga.state == "CONFIRMED"
    assert [m.topic for m in delivered if m.topic in ("purchase.reconcile", TOPIC)] == [TOPIC]
