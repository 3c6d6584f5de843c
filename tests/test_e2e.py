"""End-to-end stories: HTTP requests to the live server, a real Celery worker
and a real relay (separate processes) on Redis and PostgreSQL, and the fake
gateway over HTTP."""

import httpx
import pytest

from ledger.models import LedgerEntry
from outbox.models import OutboxMessage
from payments.fake_gateway.models import FakeCharge
from purchases.models import PurchaseSaga, Seat
from purchases.saga.states import TERMINAL

from .factories import EventFactory, UserFactory
from .stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(live_server, tmp_path, broker_queue):
    with Stack.running(
        live_server, tmp_path, extra_env={"RECONCILE_BACKOFF_SECONDS": "1,1,1,1,1,1"}
    ) as s:
        yield s


@pytest.fixture
def http(live_server):
    with httpx.Client(base_url=live_server.url, timeout=10) as client:
        yield client


def _login(http, username):
    UserFactory(username=username, password="pw-" + username)
    answer = http.post(
        "/api/auth/token/", json={"username": username, "password": "pw-" + username}
    )
    assert answer.status_code == 200, answer.text
    return {"Authorization": f"Token {answer.json()['token']}"}


def _buy(http, auth, event, seats, payment_method, key):
    answer = http.post(
        "/api/purchases/",
        json={"event": event.pk, "seats": seats, "payment_method": payment_method},
        headers={**auth, "Idempotency-Key": key},
    )
    assert answer.status_code == 202, answer.text
    return answer.json()


def _settled(saga_id):
    return lambda: PurchaseSaga.objects.get(pk=saga_id).state in TERMINAL


def test_a_visa_purchase_is_confirmed_with_one_charge_and_one_email(stack, http):
    # given
    event = EventFactory(seats=["A1", "A2"])
    auth = _login(http, "alice")

    # when
    accepted = _buy(http, auth, event, ["A1"], "pm_card_visa", "e2e-visa-1")
    stack.wait_for(_settled(accepted["id"]), "the saga to settle")
    stack.wait_for(lambda: len(stack.emails()) >= 1, "the confirmation email")

    # then: through the API
    detail = http.get(accepted["links"]["self"], headers=auth).json()
    assert detail["status"] == "CONFIRMED"
    assert detail["payment"]["status"] == "captured"
    assert [h["to"] for h in detail["history"]] == ["PENDING", "CHARGING", "CONFIRMED"]
    # and in the rows behind it
    saga = PurchaseSaga.objects.get(pk=accepted["id"])
    assert FakeCharge.objects.filter(intent_id=saga.intent_id).count() == 1
    assert LedgerEntry.objects.filter(intent_id=saga.intent_id, kind="charge").count() == 1
    assert Seat.objects.get(event=event, ref="A1").status == "sold"
    hold = OutboxMessage.objects.get(key=f"hold:{saga.pk}")
    assert hold.cancelled_at is not None and hold.fired_at is None
    stack.wait_for(
        lambda: OutboxMessage.objects.filter(
            saga_id=saga.pk, topic="purchase.confirmed", completed_at__isnull=False
        ).exists(),
        "the confirmation to be recorded as delivered",
    )
    emails = stack.emails()
    assert len(emails) == 1, emails
    assert "Your tickets" in emails[0] and saga.reservation.ref in emails[0]


def test_a_declined_purchase_is_compensated_and_the_seat_is_free(stack, http):
    event = EventFactory(seats=["A1"])
    auth = _login(http, "bob")

    accepted = _buy(http, auth, event, ["A1"], "pm_card_chargeDeclined", "e2e-declined-1")
    stack.wait_for(_settled(accepted["id"]), "the saga to settle")
    stack.wait_for(lambda: len(stack.emails()) >= 1, "the failure email")

    detail = http.get(accepted["links"]["self"], headers=auth).json()
    assert detail["status"] == "COMPENSATED"
    assert [h["to"] for h in detail["history"]] == [
        "PENDING",
        "CHARGING",
        "PAYMENT_FAILED",
        "COMPENSATING",
        "COMPENSATED",
    ]
    saga = PurchaseSaga.objects.get(pk=accepted["id"])
    assert FakeCharge.objects.filter(intent_id=saga.intent_id).count() == 0
    assert LedgerEntry.objects.filter(intent_id=saga.intent_id).count() == 0
    seats = http.get(f"/api/events/{event.pk}/seats/").json()
    assert seats[0]["ref"] == "A1" and seats[0]["status"] == "available"
    stack.wait_for(
        lambda: OutboxMessage.objects.filter(
            saga_id=saga.pk, topic="purchase.cancelled", completed_at__isnull=False
        ).exists(),
        "the cancellation to be recorded as delivered",
    )
    emails = stack.emails()
    assert len(emails) == 1, emails
    assert "did not go through" in emails[0]


def test_a_charge_that_timed_out_but_landed_is_reconciled_to_one_charge(stack, http):
    event = EventFactory(seats=["A1"])
    auth = _login(http, "carol")

    accepted = _buy(http, auth, event, ["A1"], "pm_card_timeout_charged", "e2e-timeout-1")
    stack.wait_for(_settled(accepted["id"]), "the saga to settle")

    detail = http.get(accepted["links"]["self"], headers=auth).json()
    assert detail["status"] == "CONFIRMED"
    assert [h["to"] for h in detail["history"]] == ["PENDING", "CHARGING", "UNKNOWN", "CONFIRMED"]
    saga = PurchaseSaga.objects.get(pk=accepted["id"])
    assert FakeCharge.objects.filter(intent_id=saga.intent_id).count() == 1  # ONE, not two
    assert saga.gateway_answers.filter(asked="retrieve", answer="succeeded").count() == 1
    assert Seat.objects.get(event=event, ref="A1").status == "sold"
    stack.wait_for(lambda: len(stack.emails()) >= 1, "the confirmation email")
    assert len(stack.emails()) == 1
