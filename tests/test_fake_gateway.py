"""The fake card processor, through its HTTP views (Django's test client) and,
for the race, its service functions on real concurrent connections."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from payments.fake_gateway import services
from payments.fake_gateway.models import (
    FakeCharge,
    FakeIdempotentAnswer,
    FakeIntent,
    FakeRequest,
)

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.fake_gateway_urls")]

BASE = "/fake-gateway/v1"
DELAY = 0.05


@pytest.fixture(autouse=True)
def _fast_fake(settings):
    settings.FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS = DELAY
    settings.FAKE_GATEWAY_LATENCY_MS = 0


@pytest.fixture
def intent_id() -> str:
    return f"pi_{uuid.uuid4().hex}"


def charge(
    client, intent_id, payment_method="pm_card_visa", *, key=None, amount=2500, currency="EUR"
):
    return client.post(
        f"{BASE}/payment_intents/{intent_id}/charge",
        {"amount": amount, "currency": currency, "payment_method": payment_method},
        content_type="application/json",
        headers={"Idempotency-Key": key or intent_id},
    )


def retrieve(client, intent_id):
    return client.get(f"{BASE}/payment_intents/{intent_id}")


def cancel(client, intent_id):
    return client.post(f"{BASE}/payment_intents/{intent_id}/cancel")


def refund(client, intent_id, key=None):
    headers = {"Idempotency-Key": key} if key else {}
    return client.post(f"{BASE}/payment_intents/{intent_id}/refund", headers=headers)


def list_charges(client, intent_id):
    return client.get(f"{BASE}/charges", {"payment_intent": intent_id})


def timed(call, *args, **kwargs):
    started = time.perf_counter()
    response = call(*args, **kwargs)
    return response, time.perf_counter() - started


def assert_error(response, status_code, code):
    assert response.status_code == status_code
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["code"] == code
    assert isinstance(body["detail"], str) and body["detail"]


# --- payment methods --------------------------------------------------------------


def test_visa_charges(client, intent_id):
    response = charge(client, intent_id)

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "succeeded"
    assert body["charge_id"].startswith("ch_")
    assert retrieve(client, intent_id).json() == {
        "id": intent_id,
        "status": "succeeded",
        "amount": 2500,
        "currency": "EUR",
        "latest_charge": body["charge_id"],  # a look-up finds the reference too
    }
    charge_row = FakeCharge.objects.get()
    assert (charge_row.id, charge_row.intent_id, charge_row.amount) == (
        body["charge_id"],
        intent_id,
        2500,
    )


def test_same_key_replays_the_first_answer_and_charges_once(client, intent_id):
    first = charge(client, intent_id)
    second = charge(client, intent_id)

    assert second.status_code == first.status_code == 200
    assert second.json() == first.json()
    assert FakeCharge.objects.count() == 1
    assert FakeRequest.objects.filter(intent_id=intent_id, endpoint="charge").count() == 2


def test_declined(client, intent_id):
    first = charge(client, intent_id, "pm_card_chargeDeclined")

    assert first.status_code == 200
    assert first.json() == {"status": "declined", "charge_id": None}
    assert retrieve(client, intent_id).json()["status"] == "declined"
    assert charge(client, intent_id, "pm_card_chargeDeclined").json() == first.json()
    assert FakeCharge.objects.count() == 0
    assert FakeIdempotentAnswer.objects.filter(idempotency_key=intent_id).count() == 1


def test_declined_intent_may_be_charged_again_with_a_new_key(client, intent_id):
    charge(client, intent_id, "pm_card_chargeDeclined", key="attempt-1")

    response = charge(client, intent_id, "pm_card_visa", key="attempt-2")

    assert response.json()["status"] == "succeeded"
    assert retrieve(client, intent_id).json()["status"] == "succeeded"
    # The first key still replays its own answer.
    assert charge(client, intent_id, key="attempt-1").json()["status"] == "declined"


def test_timeout_charged_charges_then_stalls_the_first_answer(client, intent_id):
    # when
    first, first_took = timed(charge, client, intent_id, "pm_card_timeout_charged")
    second, second_took = timed(charge, client, intent_id, "pm_card_timeout_charged")

    # then: the stalled answer was the charge; the replay is immediate
    assert first_took >= DELAY
    assert first.status_code == second.status_code == 200
    assert first.json()["status"] == "succeeded"
    assert second.json() == first.json()
    assert second_took < DELAY
    assert FakeCharge.objects.count() == 1
    assert retrieve(client, intent_id).json()["status"] == "succeeded"
    assert list(
        FakeRequest.objects.filter(endpoint="charge")
        .order_by("id")
        .values_list("timed_out", flat=True)
    ) == [True, False]


def test_timeout_not_charged_drops_the_first_call_only(client, intent_id):
    first, first_took = timed(charge, client, intent_id, "pm_card_timeout_not_charged")

    assert first_took >= DELAY
    assert_error(first, 504, "gateway_timeout")
    assert_error(retrieve(client, intent_id), 404, "not_found")
    assert not FakeIntent.objects.exists()
    assert not FakeIdempotentAnswer.objects.exists()

    retry, retry_took = timed(charge, client, intent_id, "pm_card_timeout_not_charged")
    again = charge(client, intent_id, "pm_card_timeout_not_charged")

    assert retry_took < DELAY
    assert retry.status_code == 200
    assert retry.json()["status"] == "succeeded"
    assert again.json() == retry.json()
    assert FakeCharge.objects.count() == 1


def test_timeout_not_charged_retry_after_cancel_cannot_charge(client, intent_id):
    charge(client, intent_id, "pm_card_timeout_not_charged")
    cancel(client, intent_id)

    assert_error(charge(client, intent_id, "pm_card_timeout_not_charged"), 409, "intent_canceled")
    assert FakeCharge.objects.count() == 0


def test_unreachable_never_charges_and_reads_requires_payment_until_cancelled(client, intent_id):
    for _ in range(2):
        response, took = timed(charge, client, intent_id, "pm_card_unreachable")
        assert took >= DELAY
        assert_error(response, 504, "gateway_timeout")

    assert retrieve(client, intent_id).json()["status"] == "requires_payment"
    assert cancel(client, intent_id).json() == {"status": "canceled"}
    assert retrieve(client, intent_id).json()["status"] == "canceled"
    assert_error(charge(client, intent_id, "pm_card_unreachable"), 504, "gateway_timeout")
    assert FakeCharge.objects.count() == 0
    assert not FakeIdempotentAnswer.objects.exists()


# --- refusals and error shapes ----------------------------------------------------


def test_unknown_payment_method_is_refused(client, intent_id):
    assert_error(charge(client, intent_id, "pm_card_amex"), 400, "invalid_payment_method")
    assert not FakeIntent.objects.exists()


@pytest.mark.parametrize("amount", [0, -5, "2500", 25.0, True, None, 10**15])
def test_bad_amount_is_refused(client, intent_id, amount):
    assert_error(charge(client, intent_id, amount=amount), 400, "invalid_amount")


@pytest.mark.parametrize("currency", ["EURO", "", 978, None, "E1R"])
def test_bad_currency_is_refused(client, intent_id, currency):
    assert_error(charge(client, intent_id, currency=currency), 400, "invalid_currency")


def test_refusals_are_replayed_for_their_key(client, intent_id):
    charge(client, intent_id, "pm_card_amex")

    # Same key, now a valid request: the processor replays its first answer.
    assert_error(charge(client, intent_id, "pm_card_visa"), 400, "invalid_payment_method")
    assert FakeCharge.objects.count() == 0


def test_charge_needs_an_idempotency_key(client, intent_id):
    response = client.post(
        f"{BASE}/payment_intents/{intent_id}/charge",
        {"amount": 2500, "currency": "EUR", "payment_method": "pm_card_visa"},
        content_type="application/json",
    )

    assert_error(response, 400, "idempotency_key_missing")
    assert not FakeIntent.objects.exists()


def test_charge_needs_a_json_object(client, intent_id):
    response = client.post(
        f"{BASE}/payment_intents/{intent_id}/charge",
        "not json",
        content_type="application/json",
        headers={"Idempotency-Key": intent_id},
    )

    assert_error(response, 400, "invalid_json")


def test_wrong_method_and_unknown_path_answer_json(client, intent_id):
    wrong_method = client.get(f"{BASE}/payment_intents/{intent_id}/charge")
    unknown = client.get(f"{BASE}/no/such/thing")

    assert_error(wrong_method, 405, "method_not_allowed")
    assert wrong_method["Allow"] == "POST"
    assert_error(unknown, 404, "unknown_endpoint")


def test_views_need_no_csrf_token(intent_id):
    strict = Client(enforce_csrf_checks=True)

    assert charge(strict, intent_id).status_code == 200
    assert cancel(strict, "pi_other").status_code == 200


# --- cancel -----------------------------------------------------------------------


def test_cancel_then_charge_is_refused_and_charges_nothing(client, intent_id):
    assert cancel(client, intent_id).json() == {"status": "canceled"}

    assert_error(charge(client, intent_id), 409, "intent_canceled")
    assert FakeCharge.objects.count() == 0
    assert retrieve(client, intent_id).json() == {
        "id": intent_id,
        "status": "canceled",
        "amount": None,
        "currency": None,
        "latest_charge": None,
    }


def test_cancel_is_idempotent_and_covers_declined_intents(client, intent_id):
    charge(client, intent_id, "pm_card_chargeDeclined")

    assert cancel(client, intent_id).json() == {"status": "canceled"}
    assert cancel(client, intent_id).status_code == 200
    assert_error(charge(client, intent_id, key="new-key"), 409, "intent_canceled")


def test_cancel_after_charge_is_refused(client, intent_id):
    charged = charge(client, intent_id).json()

    refused = cancel(client, intent_id)
    assert_error(refused, 409, "already_charged")
    assert refused.json()["latest_charge"] == charged["charge_id"]
    assert retrieve(client, intent_id).json()["status"] == "succeeded"


def test_second_charge_with_another_key_is_refused(client, intent_id):
    charge(client, intent_id, key="key-a")

    assert_error(charge(client, intent_id, key="key-b"), 409, "already_charged")
    assert FakeCharge.objects.count() == 1


# --- refund and charges -----------------------------------------------------------


def test_refund_is_idempotent_and_marks_the_charge(client, intent_id):
    charge_id = charge(client, intent_id).json()["charge_id"]

    first = refund(client, intent_id)
    second = refund(client, intent_id)
    charges = list_charges(client, intent_id)

    assert first.status_code == second.status_code == 200
    assert first.json() == second.json() == {"status": "refunded"}
    assert retrieve(client, intent_id).json()["status"] == "refunded"
    assert charges.status_code == 200
    [listed] = charges.json()
    assert (listed["id"], listed["amount"], listed["status"]) == (charge_id, 2500, "refunded")
    assert listed["created"].endswith("Z")
    assert_error(cancel(client, intent_id), 409, "already_charged")
    assert_error(charge(client, intent_id, key="after-refund"), 409, "already_charged")


def test_refund_with_key_replays(client, intent_id):
    charge(client, intent_id)

    assert refund(client, intent_id, key="r-1").json() == {"status": "refunded"}
    assert refund(client, intent_id, key="r-1").json() == {"status": "refunded"}
    assert FakeIdempotentAnswer.objects.filter(endpoint="refund").count() == 1


@pytest.mark.parametrize("payment_method", [None, "pm_card_chargeDeclined", "pm_card_unreachable"])
def test_refund_without_a_successful_charge(client, intent_id, payment_method):
    if payment_method:
        charge(client, intent_id, payment_method)

    assert_error(refund(client, intent_id), 409, "not_charged")


def test_list_charges(client, intent_id):
    assert list_charges(client, intent_id).json() == []
    charge(client, intent_id)
    charge(client, "pi_someone_else")

    [listed] = list_charges(client, intent_id).json()
    assert set(listed) == {"id", "amount", "status", "created"}
    assert listed["status"] == "succeeded"


def test_list_charges_needs_the_intent(client):
    assert_error(client.get(f"{BASE}/charges"), 400, "payment_intent_missing")


def test_lookup_of_unknown_intent(client):
    assert_error(retrieve(client, "pi_nobody"), 404, "not_found")


def test_latency_is_added_to_every_request(client, settings):
    settings.FAKE_GATEWAY_LATENCY_MS = 60

    _, took = timed(retrieve, client, "pi_nobody")

    assert took >= 0.06


# --- races --------------------------------------------------------------------------

THREADS = 8


def _race(*charges: tuple[str, str]) -> list[services.Answer]:
    """Each ``(intent_id, idempotency_key)`` charged (``pm_card_visa``) on a
    thread and a connection of its own, all released together; their
    answers. A thread's error fails the test."""
    barrier = threading.Barrier(len(charges))
    answers: list[services.Answer] = []
    errors: list[BaseException] = []

    def attempt(intent_id: str, key: str) -> None:
        try:
            barrier.wait()
            answers.append(
                services.intent_charge(
                    intent_id=intent_id,
                    idempotency_key=key,
                    amount=2500,
                    currency="EUR",
                    payment_method="pm_card_visa",
                )
            )
        except BaseException as exc:  # surfaced below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt, args=charge) for charge in charges]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(answers) == len(charges)
    return answers


@pytest.mark.django_db(transaction=True)
def test_concurrent_charges_with_one_key_make_one_charge(intent_id):
    answers = _race(*[(intent_id, intent_id)] * THREADS)

    assert {a.status_code for a in answers} == {200}
    assert len({a.body["charge_id"] for a in answers}) == 1
    assert FakeCharge.objects.filter(intent_id=intent_id).count() == 1
    assert FakeIdempotentAnswer.objects.filter(idempotency_key=intent_id).count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_charges_with_different_keys_make_one_charge(intent_id):
    answers = _race(*[(intent_id, f"{intent_id}-{n}") for n in range(THREADS)])

    assert sorted(a.status_code for a in answers) == [200] + [409] * (THREADS - 1)
    assert FakeCharge.objects.filter(intent_id=intent_id).count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_charges_with_one_key_on_different_intents_make_one_charge():
    # The intents' locks do not serialise these: the key's unique constraint
    # does, and each loser's whole transaction rolls back before it replays.
    key = f"key-{uuid.uuid4().hex}"
    intents = [f"pi_{uuid.uuid4().hex}" for _ in range(THREADS)]
    answers = _race(*[(intent, key) for intent in intents])

    assert {a.status_code for a in answers} == {200}
    assert len({a.body["charge_id"] for a in answers}) == 1
    (winner,) = FakeCharge.objects.filter(intent_id__in=intents)
    assert winner.id == answers[0].body["charge_id"]
    # A loser's charge rolled back with its transaction; its intent, if one
    # got as far as the replay under its lock, is left unpaid. Every request
    # is on the log, the winner's and the replays.
    assert set(FakeIntent.objects.filter(pk__in=intents).values_list("pk", "status")) - {
        (winner.intent_id, FakeIntent.Status.SUCCEEDED)
    } <= {(intent, FakeIntent.Status.REQUIRES_PAYMENT) for intent in intents}
    assert FakeIdempotentAnswer.objects.filter(idempotency_key=key).count() == 1
    assert FakeRequest.objects.filter(idempotency_key=key, status_code=200).count() == THREADS


@pytest.mark.django_db(transaction=True)
def test_a_first_charge_is_seven_statements_and_no_savepoint(intent_id):
    # The fake's hot path, one charge per purchase (docs/performance.md,
    # "The fake processor"): the key's answer, the intent inserted or locked,
    # the answer again under the lock, the charge, the intent's new state, the
    # answer stored, the request logged.
    with CaptureQueriesContext(connection) as queries:
        answer = services.intent_charge(
            intent_id=intent_id,
            idempotency_key=intent_id,
            amount=2500,
            currency="EUR",
            payment_method="pm_card_visa",
        )

    assert answer.status_code == 200 and answer.body["status"] == "succeeded"
    statements = [q["sql"].split()[0].upper() for q in queries.captured_queries]
    expected = ["BEGIN", "SELECT", "INSERT", "SELECT", "INSERT", "UPDATE", "INSERT", "INSERT"]
    assert statements == [*expected, "COMMIT"]
    assert "ON CONFLICT" in queries.captured_queries[2]["sql"]
    assert FakeCharge.objects.get(intent_id=intent_id).id == answer.body["charge_id"]
    assert FakeIntent.objects.get(pk=intent_id).status == FakeIntent.Status.SUCCEEDED
