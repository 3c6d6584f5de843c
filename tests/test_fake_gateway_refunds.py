"""Refunds of a part of a charge at the fake processor: its HTTP endpoints
(Django's test client), its services on real concurrent connections, the HTTP
adapter against a live server, and the in-process and faulty doubles."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest
from django.db import connection, transaction
from django.test import Client

from payments.codec import interpret_refund_answer, interpret_refunds
from payments.fake_gateway import services
from payments.fake_gateway.inprocess import InProcessFakeGateway
from payments.fake_gateway.models import (
    FakeCharge,
    FakeIdempotentAnswer,
    FakeIntent,
    FakeRefund,
    FakeRequest,
)
from payments.gateway import HttpPaymentGateway
from payments.guards import NetworkCallInTransaction
from payments.interface import (
    GatewayRefund,
    GatewayUnavailable,
    IntentStatus,
    RefundOutcome,
    RefundRequest,
    RefundState,
)

from .gateways import FaultyGateway

pytestmark = pytest.mark.urls("tests.fake_gateway_urls")

BASE = "/fake-gateway/v1"
DELAY = 0.05
CHARGED = 2500


@pytest.fixture(autouse=True)
def _fast_fake(settings):
    settings.FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS = DELAY
    settings.FAKE_GATEWAY_LATENCY_MS = 0
    settings.FAKE_GATEWAY_CHAOS_TIMEOUT_RATE = 0


def new_intent_id() -> str:
    return f"pi_{uuid.uuid4().hex}"


def new_refund_id() -> str:
    return str(uuid.uuid4())


def charged(intent_id: str, payment_method: str = "pm_card_visa") -> str:
    """The intent, charged CHARGED (EUR) through the fake's service."""
    answer = services.intent_charge(
        intent_id=intent_id,
        idempotency_key=intent_id,
        amount=CHARGED,
        currency="EUR",
        payment_method=payment_method,
    )
    assert (answer.status_code, answer.body["status"]) == (200, "succeeded"), answer
    return intent_id


# --- over HTTP: Django's test client ------------------------------------------------


def refund(client: Client, intent_id: str, amount, refund_id=None, *, key=None):
    refund_id = refund_id or new_refund_id()
    return client.post(
        f"{BASE}/payment_intents/{intent_id}/refunds",
        {"amount": amount, "refund_id": refund_id},
        content_type="application/json",
        headers={"Idempotency-Key": key or f"refund:{refund_id}"},
    )


def look_up(client: Client, refund_id: str):
    return client.get(f"{BASE}/refunds/{refund_id}")


def listed(client: Client, intent_id: str) -> list[dict]:
    response = client.get(f"{BASE}/refunds", {"payment_intent": intent_id})
    assert response.status_code == 200
    return response.json()


def intent_status(intent_id: str) -> str:
    return FakeIntent.objects.get(pk=intent_id).status


def charge_status(intent_id: str) -> str:
    return FakeCharge.objects.get(intent_id=intent_id).status


def assert_error(response, status_code: int, code: str) -> dict:
    assert response.status_code == status_code, response.content
    body = response.json()
    assert body["code"] == code
    assert isinstance(body["detail"], str) and body["detail"]
    return body


@pytest.mark.django_db
def test_a_part_then_the_rest_then_more_is_refused_as_too_large(client):
    intent_id = charged(new_intent_id())
    first_id, rest_id = new_refund_id(), new_refund_id()

    first = refund(client, intent_id, 1000, first_id)

    assert first.status_code == 200
    body = first.json()
    assert body["id"].startswith("re_")
    assert {k: body[k] for k in ("refund_id", "amount", "currency", "status")} == {
        "refund_id": first_id,
        "amount": 1000,
        "currency": "EUR",
        "status": "succeeded",
    }
    assert "failure_reason" not in body
    # A part refunded: the intent and its charge still read charged.
    assert (intent_status(intent_id), charge_status(intent_id)) == ("succeeded", "succeeded")

    rest = refund(client, intent_id, CHARGED - 1000, rest_id)

    assert rest.json()["status"] == "succeeded"
    assert (intent_status(intent_id), charge_status(intent_id)) == ("refunded", "refunded")
    over = assert_error(refund(client, intent_id, 1), 409, "amount_too_large")
    assert over["refundable"] == 0
    assert [(r["refund_id"], r["amount"]) for r in listed(client, intent_id)] == [
        (first_id, 1000),
        (rest_id, CHARGED - 1000),
    ]


@pytest.mark.django_db
def test_an_amount_over_what_is_left_is_refused_and_refunds_nothing(client):
    intent_id = charged(new_intent_id())
    refund(client, intent_id, 2000)

    over = assert_error(refund(client, intent_id, 501), 409, "amount_too_large")

    assert over["refundable"] == 500
    assert FakeRefund.objects.filter(intent_id=intent_id).count() == 1
    assert refund(client, intent_id, 500).json()["status"] == "succeeded"


@pytest.mark.django_db
def test_the_same_key_replays_the_first_answer_and_refunds_once(client):
    intent_id = charged(new_intent_id())
    refund_id = new_refund_id()

    first = refund(client, intent_id, 700, refund_id)
    again = refund(client, intent_id, 700, refund_id)

    assert again.status_code == first.status_code == 200
    assert again.json() == first.json()
    assert FakeRefund.objects.filter(intent_id=intent_id).count() == 1
    assert FakeIdempotentAnswer.objects.filter(endpoint="create_refund").count() == 1
    assert (
        FakeRequest.objects.filter(
            endpoint="create_refund", intent_id=intent_id, refund_id=refund_id
        ).count()
        == 2
    )
    # A refusal is a first answer too: replayed for its key.
    refused = assert_error(refund(client, intent_id, 9999, key="k-over"), 409, "amount_too_large")
    assert refund(client, intent_id, 1, key="k-over").json() == refused


@pytest.mark.django_db
def test_a_refund_id_made_under_another_key_is_not_made_twice(client):
    intent_id = charged(new_intent_id())
    refund_id = new_refund_id()
    refund(client, intent_id, 700, refund_id)

    again = refund(client, intent_id, 700, refund_id, key="another-key")

    assert_error(again, 409, "refund_id_in_use")
    assert FakeRefund.objects.filter(intent_id=intent_id).count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("payment_method", [None, "pm_card_chargeDeclined", "pm_card_unreachable"])
def test_an_intent_without_a_successful_charge_is_not_charged(client, payment_method):
    intent_id = new_intent_id()
    if payment_method:
        services.intent_charge(
            intent_id=intent_id,
            idempotency_key=intent_id,
            amount=CHARGED,
            currency="EUR",
            payment_method=payment_method,
        )

    assert_error(refund(client, intent_id, 100), 409, "not_charged")
    assert not FakeRefund.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"amount": 0, "refund_id": "r"}, "invalid_amount"),
        ({"amount": -5, "refund_id": "r"}, "invalid_amount"),
        ({"amount": "100", "refund_id": "r"}, "invalid_amount"),
        ({"amount": True, "refund_id": "r"}, "invalid_amount"),
        ({"refund_id": "r"}, "invalid_amount"),
        ({"amount": 100}, "invalid_refund_id"),
        ({"amount": 100, "refund_id": ""}, "invalid_refund_id"),
        ({"amount": 100, "refund_id": 7}, "invalid_refund_id"),
        ({"amount": 100, "refund_id": "r" * 256}, "invalid_refund_id"),
    ],
)
def test_a_bad_body_is_refused(client, body, code):
    intent_id = charged(new_intent_id())

    response = client.post(
        f"{BASE}/payment_intents/{intent_id}/refunds",
        body,
        content_type="application/json",
        headers={"Idempotency-Key": f"k-{uuid.uuid4().hex}"},
    )

    assert_error(response, 400, code)
    assert not FakeRefund.objects.exists()


@pytest.mark.django_db
def test_a_refund_needs_a_key_and_a_json_object(client):
    intent_id = charged(new_intent_id())
    url = f"{BASE}/payment_intents/{intent_id}/refunds"

    assert_error(
        client.post(url, {"amount": 1, "refund_id": "r"}, content_type="application/json"),
        400,
        "idempotency_key_missing",
    )
    for raw in ("not json", "[1, 2]"):
        response = client.post(
            url, raw, content_type="application/json", headers={"Idempotency-Key": "k"}
        )
        assert_error(response, 400, "invalid_json")
    assert_error(client.get(url), 405, "method_not_allowed")
    assert not FakeRefund.objects.exists()


@pytest.mark.django_db
def test_a_look_up_finds_a_refund_by_our_id_and_nothing_else(client):
    intent_id = charged(new_intent_id())
    refund_id = new_refund_id()
    made = refund(client, intent_id, 300, refund_id).json()

    found = look_up(client, refund_id)

    assert found.status_code == 200 and found.json() == made
    assert_error(look_up(client, made["id"]), 404, "not_found")  # theirs, not ours
    assert_error(look_up(client, new_refund_id()), 404, "not_found")
    logged = FakeRequest.objects.filter(endpoint="retrieve_refund").order_by("id")
    assert [(r.intent_id, r.status_code) for r in logged] == [
        (intent_id, 200),
        ("", 404),
        ("", 404),
    ]


@pytest.mark.django_db
def test_the_list_shows_every_refund_of_the_intent_oldest_first(client):
    intent_id, other = charged(new_intent_id()), charged(new_intent_id())
    assert listed(client, intent_id) == []
    made = [refund(client, intent_id, amount).json() for amount in (100, 200, 300)]
    refund(client, other, 400)

    assert listed(client, intent_id) == made
    assert listed(client, new_intent_id()) == []
    assert_error(client.get(f"{BASE}/refunds"), 400, "payment_intent_missing")
    assert FakeRequest.objects.filter(endpoint="list_refunds").count() == 3


@pytest.mark.django_db
def test_the_whole_refund_after_a_part_refunds_only_the_rest(client):
    intent_id = charged(new_intent_id())
    refund(client, intent_id, 1000)

    whole = client.post(
        f"{BASE}/payment_intents/{intent_id}/refund",
        headers={"Idempotency-Key": f"{intent_id}:refund"},
    )

    assert whole.status_code == 200 and whole.json() == {"status": "refunded"}
    assert (intent_status(intent_id), charge_status(intent_id)) == ("refunded", "refunded")
    rows = FakeRefund.objects.filter(intent_id=intent_id).order_by("created", "id")
    assert [(r.amount, r.status) for r in rows] == [(1000, "succeeded"), (1500, "succeeded")]
    assert rows[1].refund_id == f"{intent_id}:refund"
    # Asked again, with or without its key: the same answer, nothing more refunded.
    again = client.post(
        f"{BASE}/payment_intents/{intent_id}/refund",
        headers={"Idempotency-Key": f"{intent_id}:refund"},
    )
    assert again.json() == {"status": "refunded"}
    assert client.post(f"{BASE}/payment_intents/{intent_id}/refund").json() == {
        "status": "refunded"
    }
    assert sum(r.amount for r in FakeRefund.objects.filter(intent_id=intent_id)) == CHARGED
    assert_error(refund(client, intent_id, 1), 409, "amount_too_large")


@pytest.mark.django_db
def test_the_whole_refund_without_a_part_is_recorded_as_one_refund(client):
    intent_id = charged(new_intent_id())

    assert client.post(f"{BASE}/payment_intents/{intent_id}/refund").json() == {
        "status": "refunded"
    }

    [row] = FakeRefund.objects.filter(intent_id=intent_id)
    assert (row.amount, row.status, row.refund_id) == (CHARGED, "succeeded", f"whole:{intent_id}")
    [only] = listed(client, intent_id)
    assert only["amount"] == CHARGED


# --- the test cards -------------------------------------------------------------------


@pytest.mark.django_db
def test_refund_pending_answers_pending_and_its_first_look_up_settles_it(client):
    intent_id = charged(new_intent_id(), "pm_card_refundPending")
    refund_id = new_refund_id()

    made = refund(client, intent_id, 1000, refund_id)

    assert made.json()["status"] == "pending"
    assert [r["status"] for r in listed(client, intent_id)] == ["pending"]  # a list settles nothing
    first, second = look_up(client, refund_id).json(), look_up(client, refund_id).json()
    assert first["status"] == second["status"] == "succeeded"
    assert first["id"] == made.json()["id"]
    row = FakeRefund.objects.get(refund_id=refund_id)
    assert row.status == "succeeded" and row.settled is not None
    # The key's answer is the first one, as stored.
    assert refund(client, intent_id, 1000, refund_id).json()["status"] == "pending"


@pytest.mark.django_db
def test_refund_pending_counts_against_what_is_left(client):
    intent_id = charged(new_intent_id(), "pm_card_refundPending")

    refund(client, intent_id, CHARGED)

    assert intent_status(intent_id) == "refunded"
    assert_error(refund(client, intent_id, 1), 409, "amount_too_large")


@pytest.mark.django_db
def test_refund_fail_answers_failed_and_refunds_nothing(client):
    intent_id = charged(new_intent_id(), "pm_card_refundFail")
    refund_id = new_refund_id()

    made = refund(client, intent_id, CHARGED, refund_id)

    body = made.json()
    assert made.status_code == 200
    assert (body["status"], body["failure_reason"]) == ("failed", "expired_or_canceled_card")
    assert look_up(client, refund_id).json() == body
    assert (intent_status(intent_id), charge_status(intent_id)) == ("succeeded", "succeeded")
    # A failed refund leaves the whole charge to refund: another one may ask for all of it.
    assert refund(client, intent_id, CHARGED).json()["status"] == "failed"
    # The saga's whole-charge refund is not a test card's business: it succeeds.
    assert client.post(f"{BASE}/payment_intents/{intent_id}/refund").json() == {
        "status": "refunded"
    }
    assert [r["status"] for r in listed(client, intent_id)] == ["failed", "failed", "succeeded"]


@pytest.mark.django_db
def test_refund_timeout_makes_the_refund_and_stalls_the_first_answer(client):
    intent_id = charged(new_intent_id(), "pm_card_refundTimeout")
    refund_id = new_refund_id()

    started = time.perf_counter()
    first = refund(client, intent_id, 1000, refund_id)
    first_took = time.perf_counter() - started
    started = time.perf_counter()
    second = refund(client, intent_id, 1000, refund_id)
    second_took = time.perf_counter() - started

    assert first_took >= DELAY > second_took
    assert first.status_code == second.status_code == 200
    assert first.json()["status"] == "succeeded"
    assert second.json() == first.json()
    assert FakeRefund.objects.filter(intent_id=intent_id).count() == 1
    assert list(
        FakeRequest.objects.filter(endpoint="create_refund")
        .order_by("id")
        .values_list("timed_out", flat=True)
    ) == [True, False]
    assert look_up(client, refund_id).json() == first.json()


@pytest.mark.django_db
def test_chaos_loses_the_answers_of_refunds_it_made(client, settings):
    intent_id = charged(new_intent_id())
    settings.FAKE_GATEWAY_CHAOS_TIMEOUT_RATE = 1

    answer = services.refund_create(
        intent_id=intent_id, idempotency_key="k-chaos", amount=100, refund_id="r-chaos"
    )

    assert answer.times_out and answer.body["status"] == "succeeded"
    assert FakeRefund.objects.get(refund_id="r-chaos").amount == 100
    refused = services.refund_create(
        intent_id=intent_id, idempotency_key="k-over", amount=CHARGED, refund_id="r-over"
    )
    assert (refused.status_code, refused.times_out) == (409, False)


@pytest.mark.django_db
def test_the_new_cards_charge_like_visa(client):
    for method in ("pm_card_refundPending", "pm_card_refundFail", "pm_card_refundTimeout"):
        intent_id = charged(new_intent_id(), method)
        assert FakeIntent.objects.get(pk=intent_id).payment_method == method


# --- races, on real connections -------------------------------------------------------

THREADS = 8


def _race(*asks: tuple[str, str, int, str]) -> list[services.Answer]:
    """Each ``(intent_id, key, amount, refund_id)`` refunded on a thread and
    a connection of its own, all released together; their answers."""
    barrier = threading.Barrier(len(asks))
    answers: list[services.Answer] = []
    errors: list[BaseException] = []

    def attempt(intent_id: str, key: str, amount: int, refund_id: str) -> None:
        try:
            barrier.wait()
            answers.append(
                services.refund_create(
                    intent_id=intent_id, idempotency_key=key, amount=amount, refund_id=refund_id
                )
            )
        except BaseException as exc:  # surfaced below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt, args=ask) for ask in asks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(answers) == len(asks)
    return answers


@pytest.mark.django_db(transaction=True)
def test_concurrent_refunds_with_one_key_make_one_refund():
    intent_id = charged(new_intent_id())
    refund_id = new_refund_id()

    answers = _race(*[(intent_id, f"refund:{refund_id}", 1000, refund_id)] * THREADS)

    assert {a.status_code for a in answers} == {200}
    assert len({a.body["id"] for a in answers}) == 1
    assert FakeRefund.objects.filter(intent_id=intent_id).count() == 1
    assert FakeIdempotentAnswer.objects.filter(idempotency_key=f"refund:{refund_id}").count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_refunds_never_add_up_to_more_than_the_charge():
    intent_id = charged(new_intent_id())
    asks = [(intent_id, f"k-{n}-{uuid.uuid4().hex}", 1000, new_refund_id()) for n in range(6)]

    answers = _race(*asks)

    assert sorted(a.status_code for a in answers) == [200, 200] + [409] * 4
    assert {a.body["code"] for a in answers if a.status_code == 409} == {"amount_too_large"}
    assert sum(r.amount for r in FakeRefund.objects.filter(intent_id=intent_id)) == 2000


@pytest.mark.django_db(transaction=True)
def test_concurrent_refunds_with_one_key_on_different_intents_make_one_refund():
    # The intents' locks do not serialise these: the key's unique constraint
    # (and the refund id's) does, and each loser rolls back and replays.
    intents = [charged(new_intent_id()) for _ in range(4)]
    refund_id = new_refund_id()

    answers = _race(*[(intent, f"refund:{refund_id}", 100, refund_id) for intent in intents])

    assert {a.status_code for a in answers} == {200}
    assert len({a.body["id"] for a in answers}) == 1
    assert FakeRefund.objects.filter(refund_id=refund_id).count() == 1


# --- the HTTP adapter on a live server ------------------------------------------------

SHORT_TIMEOUT = 0.3
LIVE_DELAY = 0.8
NORMAL_TIMEOUT = 5.0


@pytest.fixture
def server_url(live_server, settings) -> str:
    settings.FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS = LIVE_DELAY
    return live_server.url


@pytest.fixture
def gw(server_url) -> Iterator[HttpPaymentGateway]:
    gateway = HttpPaymentGateway(base_url=f"{server_url}/fake-gateway/v1", timeout=NORMAL_TIMEOUT)
    yield gateway
    gateway.close()


def ask(intent_id: str, amount: int, refund_id: str | None = None, ref: str = "") -> RefundRequest:
    return RefundRequest(
        refund_id=refund_id or new_refund_id(),
        intent_ref=intent_id,
        intent_id=intent_id,
        amount=amount,
        currency="EUR",
        processor_ref=ref,
    )


@pytest.mark.django_db(transaction=True)
def test_the_adapter_refunds_a_part_the_rest_and_is_refused_more(gw):
    intent_id = charged(new_intent_id())
    first, rest = ask(intent_id, 1000), ask(intent_id, CHARGED - 1000)

    made = gw.create_refund(first)

    assert made.state == RefundState.SUCCEEDED and made.processor_ref.startswith("re_")
    assert made.latency_ms > 0
    replayed = gw.create_refund(first)  # the same key: the same refund
    assert (replayed.state, replayed.processor_ref) == (RefundState.SUCCEEDED, made.processor_ref)
    found = gw.retrieve_refund(first)
    assert (found.state, found.processor_ref) == (RefundState.SUCCEEDED, made.processor_ref)
    rest_made = gw.create_refund(rest)
    assert rest_made.state == RefundState.SUCCEEDED
    over = gw.create_refund(ask(intent_id, 1))
    assert (over.state, over.detail) == (RefundState.FAILED, "amount_too_large")
    assert gw.retrieve(intent_id).status == IntentStatus.REFUNDED
    assert gw.list_refunds(intent_id) == [
        GatewayRefund(made.processor_ref, first.refund_id, 1000, "succeeded"),
        GatewayRefund(rest_made.processor_ref, rest.refund_id, CHARGED - 1000, "succeeded"),
    ]
    assert FakeRefund.objects.filter(intent_id=intent_id).count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_adapter_reads_not_charged_not_found_pending_and_failed(gw):
    never = new_intent_id()
    assert gw.create_refund(ask(never, 100)).detail == "not_charged"
    assert gw.create_refund(ask(never, 100)).state == RefundState.FAILED
    assert gw.retrieve_refund(ask(never, 100)).state == RefundState.NOT_FOUND
    assert gw.list_refunds(never) == []

    pending = ask(charged(new_intent_id(), "pm_card_refundPending"), 100)
    assert gw.create_refund(pending).state == RefundState.PENDING
    assert gw.list_refunds(pending.intent_ref)[0].status == "pending"
    assert gw.retrieve_refund(pending).state == RefundState.SUCCEEDED

    failing = ask(charged(new_intent_id(), "pm_card_refundFail"), 100)
    failed = gw.create_refund(failing)
    assert (failed.state, failed.detail) == (RefundState.FAILED, "expired_or_canceled_card")
    assert failed.processor_ref.startswith("re_")
    again = gw.retrieve_refund(failing)
    assert (again.state, again.processor_ref, again.detail) == (
        RefundState.FAILED,
        failed.processor_ref,
        "expired_or_canceled_card",
    )


@pytest.mark.django_db(transaction=True)
def test_a_lost_refund_answer_is_unknown_and_the_look_up_finds_the_refund(server_url):
    impatient = HttpPaymentGateway(base_url=f"{server_url}/fake-gateway/v1", timeout=SHORT_TIMEOUT)
    intent_id = charged(new_intent_id(), "pm_card_refundTimeout")
    request = ask(intent_id, 1000)

    lost = impatient.create_refund(request)

    assert (lost.state, lost.detail) == (RefundState.UNKNOWN, "timeout")
    assert SHORT_TIMEOUT * 1000 <= lost.latency_ms < LIVE_DELAY * 1000
    found = impatient.retrieve_refund(request)
    assert found.state == RefundState.SUCCEEDED
    replayed = impatient.create_refund(request)
    assert (replayed.state, replayed.processor_ref) == (RefundState.SUCCEEDED, found.processor_ref)
    assert FakeRefund.objects.filter(intent_id=intent_id).count() == 1
    impatient.close()


def _send_cut_off(server_url: str, path: str, body: bytes, *, key: str, sent: int) -> bytes:
    """A POST whose client dies after ``sent`` bytes of its body (a worker
    SIGKILLed between urllib3's send of the headers and of the body): the
    headers promise the whole body, then the connection is half-closed."""
    host, port = urlsplit(server_url).hostname, urlsplit(server_url).port
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nIdempotency-Key: {key}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((host, port), timeout=NORMAL_TIMEOUT) as conn:
        conn.sendall(head + body[:sent])
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("sent", [0, 10])
def test_a_body_cut_off_is_refused_unstored_and_the_retry_refunds(server_url, client, sent):
    # Seen in the cancellation's chaos run: the body cut off at 0 bytes was
    # read as {}, refused invalid_amount, and that refusal stored for the
    # key, so the refund's retry under its key was refused forever.
    intent_id = charged(new_intent_id())
    refund_id = new_refund_id()
    body = json.dumps({"amount": 700, "refund_id": refund_id}).encode()
    path = f"{BASE}/payment_intents/{intent_id}/refunds"

    answer = _send_cut_off(server_url, path, body, key=f"refund:{refund_id}", sent=sent)

    assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == b"400", answer
    assert b'"incomplete_body"' in answer
    assert not FakeIdempotentAnswer.objects.filter(idempotency_key=f"refund:{refund_id}").exists()
    retried = refund(client, intent_id, 700, refund_id)
    assert retried.status_code == 200, retried.json()
    assert FakeRefund.objects.get(intent_id=intent_id).amount == 700


@pytest.mark.django_db(transaction=True)
def test_concurrent_adapter_calls_with_one_key_make_one_refund(gw):
    intent_id = charged(new_intent_id())
    request = ask(intent_id, 1000)
    barrier = threading.Barrier(THREADS)
    answers = []

    def attempt() -> None:
        barrier.wait()
        answers.append(gw.create_refund(request))

    threads = [threading.Thread(target=attempt) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(answers) == THREADS
    assert {(a.state, a.processor_ref) for a in answers} == {
        (RefundState.SUCCEEDED, answers[0].processor_ref)
    }
    assert FakeRefund.objects.filter(intent_id=intent_id).count() == 1


@pytest.mark.parametrize(("path", "detail"), [("broken", "http_503"), ("garbage", "bad_response")])
def test_no_usable_answer_is_unknown_and_a_list_raises(server_url, path, detail):
    broken = HttpPaymentGateway(base_url=f"{server_url}/{path}/v1", timeout=NORMAL_TIMEOUT)
    request = ask(new_intent_id(), 100)

    assert (broken.create_refund(request).state, broken.create_refund(request).detail) == (
        RefundState.UNKNOWN,
        detail,
    )
    assert broken.retrieve_refund(request).state == RefundState.UNKNOWN
    with pytest.raises(GatewayUnavailable, match=detail):
        broken.list_refunds(request.intent_ref)
    broken.close()


def test_a_wrong_url_is_unknown_not_not_found(server_url):
    lost = HttpPaymentGateway(
        base_url=f"{server_url}/fake-gateway/v1/nowhere", timeout=NORMAL_TIMEOUT
    )

    assert lost.retrieve_refund(ask(new_intent_id(), 100)).state == RefundState.UNKNOWN
    lost.close()


def test_no_server_is_unknown_with_the_failure():
    nowhere = HttpPaymentGateway(base_url="http://127.0.0.1:9/fake-gateway/v1", timeout=2.0)
    request = ask(new_intent_id(), 100)

    assert nowhere.create_refund(request).detail == "connection_error"
    assert nowhere.retrieve_refund(request).detail == "connection_error"
    with pytest.raises(GatewayUnavailable, match="connection_error"):
        nowhere.list_refunds(request.intent_ref)
    nowhere.close()


# --- reading answers ------------------------------------------------------------------

REFUND = {"id": "re_1", "refund_id": "r", "amount": 100, "currency": "EUR"}


@pytest.mark.parametrize(
    ("status_code", "body", "state", "ref", "detail"),
    [
        (200, {**REFUND, "status": "succeeded"}, RefundState.SUCCEEDED, "re_1", ""),
        (200, {**REFUND, "status": "pending"}, RefundState.PENDING, "re_1", ""),
        (
            200,
            {**REFUND, "status": "failed", "failure_reason": "lost_or_stolen_card"},
            RefundState.FAILED,
            "re_1",
            "lost_or_stolen_card",
        ),
        (200, {**REFUND, "status": "failed"}, RefundState.FAILED, "re_1", "failed"),
        (200, {**REFUND, "status": "refunded"}, RefundState.UNKNOWN, "", "bad_response"),
        (200, {"status": "succeeded"}, RefundState.UNKNOWN, "", "bad_response"),
        (200, None, RefundState.UNKNOWN, "", "bad_response"),
        (409, {"code": "not_charged"}, RefundState.FAILED, "", "not_charged"),
        (409, {"code": "amount_too_large"}, RefundState.FAILED, "", "amount_too_large"),
        (409, {"code": "refund_id_in_use"}, RefundState.UNKNOWN, "", "refund_id_in_use"),
        (400, {"code": "invalid_amount"}, RefundState.FAILED, "", "invalid_amount"),
        (400, None, RefundState.UNKNOWN, "", "bad_response"),
        (404, {"code": "not_found"}, RefundState.NOT_FOUND, "", "not_found"),
        (404, {"code": "unknown_endpoint"}, RefundState.UNKNOWN, "", "unknown_endpoint"),
        (429, {"code": "rate_limited"}, RefundState.UNKNOWN, "", "rate_limited"),
        (503, None, RefundState.UNKNOWN, "", "http_503"),
    ],
)
def test_interpret_refund_answer(status_code, body, state, ref, detail):
    answer = interpret_refund_answer(status_code, body, latency_ms=3.0)

    assert (answer.state, answer.processor_ref, answer.detail) == (state, ref, detail)
    assert answer.label == state.value and answer.latency_ms == 3.0


@pytest.mark.parametrize(
    ("status_code", "body"), [(200, None), (200, {"data": []}), (200, [{"id": "re_1"}]), (502, [])]
)
def test_interpret_refunds_raises_without_a_readable_list(status_code, body):
    with pytest.raises(GatewayUnavailable, match="list refunds"):
        interpret_refunds(status_code, body)


# --- the in-process fake and the faulty one -------------------------------------------


@pytest.fixture
def inprocess(settings) -> InProcessFakeGateway:
    settings.FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS = 5  # long: any sleeping would show
    return InProcessFakeGateway()


@pytest.mark.django_db
def test_inprocess_refunds_a_part_and_reads_as_the_adapter(inprocess):
    intent_id = charged(new_intent_id())
    request = ask(intent_id, 1000)

    made = inprocess.create_refund(request)

    assert made.state == RefundState.SUCCEEDED
    assert inprocess.retrieve_refund(request).processor_ref == made.processor_ref
    assert inprocess.create_refund(ask(intent_id, CHARGED)).detail == "amount_too_large"
    assert inprocess.list_refunds(intent_id) == [
        GatewayRefund(made.processor_ref, request.refund_id, 1000, "succeeded")
    ]
    assert inprocess.refund(intent_id, idempotency_key=f"{intent_id}:refund").outcome == (
        RefundOutcome.REFUNDED
    )
    assert [r.amount for r in inprocess.list_refunds(intent_id)] == [1000, CHARGED - 1000]
    assert inprocess.calls == [
        ("create_refund", intent_id),
        ("retrieve_refund", intent_id),
        ("create_refund", intent_id),
        ("list_refunds", intent_id),
        ("refund", intent_id),
        ("list_refunds", intent_id),
    ]


@pytest.mark.django_db
def test_inprocess_refund_timeout_is_unknown_without_sleeping_and_the_refund_is_made(inprocess):
    intent_id = charged(new_intent_id(), "pm_card_refundTimeout")
    request = ask(intent_id, 1000)

    started = time.perf_counter()
    lost = inprocess.create_refund(request)

    assert time.perf_counter() - started < 1
    assert (lost.state, lost.detail) == (RefundState.UNKNOWN, "timeout")
    assert inprocess.retrieve_refund(request).state == RefundState.SUCCEEDED
    assert inprocess.create_refund(request).state == RefundState.SUCCEEDED
    assert FakeRefund.objects.filter(intent_id=intent_id).count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "call",
    [
        lambda gw: gw.create_refund(ask(new_intent_id(), 1)),
        lambda gw: gw.retrieve_refund(ask(new_intent_id(), 1)),
        lambda gw: gw.list_refunds(new_intent_id()),
    ],
)
@pytest.mark.parametrize(
    "make_gateway",
    [lambda: HttpPaymentGateway(base_url="http://127.0.0.1:9"), InProcessFakeGateway],
)
def test_no_refund_call_inside_a_transaction(make_gateway, call: Callable):
    gateway = make_gateway()

    with transaction.atomic(), pytest.raises(NetworkCallInTransaction):
        call(gateway)


@pytest.mark.django_db
def test_the_faulty_gateway_loses_refund_calls_before_they_reach_the_fake():
    faulty = FaultyGateway()
    intent_id = charged(new_intent_id())
    request = ask(intent_id, 1000)
    seen: list[str] = []
    faulty.before["create_refund"] = seen.append
    faulty.down("create_refund", times=1)
    faulty.down("list_refunds", times=1)
    faulty.down("retrieve_refund", times=1)

    lost = faulty.create_refund(request)

    assert (lost.state, lost.detail) == (RefundState.UNKNOWN, "timeout")
    assert not FakeRefund.objects.exists()  # it never arrived
    assert faulty.retrieve_refund(request).state == RefundState.UNKNOWN
    assert faulty.retrieve_refund(request).state == RefundState.NOT_FOUND
    with pytest.raises(GatewayUnavailable):
        faulty.list_refunds(intent_id)
    assert faulty.create_refund(request).state == RefundState.SUCCEEDED
    assert [r.amount for r in faulty.list_refunds(intent_id)] == [1000]
    assert seen == [intent_id, intent_id]
