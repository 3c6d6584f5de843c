"""Outgoing webhooks end to end: a real Celery worker and relay (separate
processes, tests/stack.py) deliver signed webhooks to a real receiver, and a
receiver that hangs does not slow the purchases down.

The worker is a subprocess: it gets ``WEBHOOK_ALLOW_LOCAL_URLS=true`` (the
receiver listens on 127.0.0.1) and a one-second ``WEBHOOK_TIMEOUT_SECONDS``
through its environment.
"""

from __future__ import annotations

import statistics
import time

import httpx
import pytest
from django.contrib.auth.models import Permission
from django.db.models import F

from outbox.models import OutboxMessage
from purchases.models import PurchaseSaga
from purchases.saga.states import TERMINAL
from webhooks.models import WebhookAttempt, WebhookDelivery
from webhooks.services import webhook_endpoint_create

from .factories import EventFactory, UserFactory
from .stack import Stack
from .test_webhooks import ALL
from .webhook_receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TIMEOUT = 1.0  # WEBHOOK_TIMEOUT_SECONDS of the worker
HANG = 4.0  # how long the hanging receiver holds each request: past the timeout
LONG_TIMEOUT = 20.0  # the narrow stack's WEBHOOK_TIMEOUT_SECONDS


@pytest.fixture
def stack(live_server, tmp_path, broker_queue):
    with Stack.running(
        live_server,
        tmp_path,
        webhooks=True,
        extra_env={
            "WEBHOOK_ALLOW_LOCAL_URLS": "true",
            "WEBHOOK_TIMEOUT_SECONDS": str(TIMEOUT),
            "WEBHOOK_RETRY_SECONDS": "1,1",
        },
    ) as s:
        yield s


@pytest.fixture
def narrow_stack(live_server, tmp_path, broker_queue):
    """One saga worker process and one webhook worker process: were the
    attempts on the saga's pool, one hanging attempt would stop every saga."""
    with Stack.running(
        live_server,
        tmp_path,
        concurrency=1,
        webhooks=True,
        extra_env={
            "WEBHOOK_ALLOW_LOCAL_URLS": "true",
            "WEBHOOK_TIMEOUT_SECONDS": str(LONG_TIMEOUT),
            "WEBHOOK_RETRY_SECONDS": "60",
        },
    ) as s:
        yield s


@pytest.fixture
def http(live_server):
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        yield client


@pytest.fixture
def receiver(settings):
    # The test process registers the endpoint: it checks the URL with the
    # same rule as the worker.
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    r = Receiver()
    yield r
    r.close()


def _login(http, username):
    UserFactory(username=username, password="pw-" + username)
    answer = http.post(
        "/api/auth/token/", json={"username": username, "password": "pw-" + username}
    )
    assert answer.status_code == 200, answer.text
    return {"Authorization": f"Token {answer.json()['token']}"}


def _buy(http, auth, event, seat, payment_method, key) -> tuple[dict, float]:
    started = time.perf_counter()
    answer = http.post(
        "/api/purchases/",
        json={"event": event.pk, "seats": [seat], "payment_method": payment_method},
        headers={**auth, "Idempotency-Key": key},
    )
    took = time.perf_counter() - started
    assert answer.status_code == 202, answer.text
    return answer.json(), took


def _settled(saga_id):
    return lambda: PurchaseSaga.objects.get(pk=saga_id).state in TERMINAL


def test_signed_webhooks_reach_a_real_receiver_for_a_visa_and_a_declined_purchase(
    stack, http, receiver
):
    endpoint = webhook_endpoint_create(url=receiver.url(), events=ALL)
    event = EventFactory(seats=["A1", "A2"])
    auth = _login(http, "alice")

    visa, _ = _buy(http, auth, event, "A1", "pm_card_visa", "live-webhook-visa")
    declined, _ = _buy(http, auth, event, "A2", "pm_card_chargeDeclined", "live-webhook-declined")
    for accepted in (visa, declined):
        stack.wait_for(_settled(accepted["id"]), "the saga to settle")
    stack.wait_for(lambda: len(receiver.requests) >= 2, "two webhooks at the receiver")
    stack.wait_for(
        lambda: not WebhookDelivery.objects.filter(status="pending").exists(),
        "the deliveries to be recorded",
    )

    # Verified here, in real time: signature, and a timestamp within the
    # library's five-minute tolerance.
    heard = {}
    for request in receiver.requests:
        payload = request.verify(endpoint.secret)
        heard[payload["data"]["purchase"]["id"]] = (
            payload["type"],
            payload["data"]["purchase"]["status"],
        )
    assert heard == {
        visa["id"]: ("purchase.confirmed", "CONFIRMED"),
        declined["id"]: ("purchase.failed", "COMPENSATED"),
    }
    assert len(receiver.requests) == 2  # one each, no more
    deliveries = WebhookDelivery.objects.filter(endpoint=endpoint)
    assert {d.status for d in deliveries} == {"delivered"}
    assert sorted(r.headers["webhook-id"] for r in receiver.requests) == sorted(
        d.message_id for d in deliveries
    )
    assert list(WebhookAttempt.objects.values_list("number", "status_code").distinct()) == [
        (1, 200)
    ]


def test_with_the_relay_stopped_the_confirmation_and_its_webhook_still_arrive(
    stack, http, receiver
):
    # Rows due when they are written are handed to Celery on the commit that
    # writes them (outbox/handover.py; the webhook attempt by waking its
    # topic's sweep, outbox/sweeping.py): the relay is the safety net, not a
    # step. With it stopped, nothing waits for it.
    stack.stop("relay")
    endpoint = webhook_endpoint_create(url=receiver.url(), events=ALL)
    event = EventFactory(seats=["A1"])
    auth = _login(http, "alice")

    visa, _ = _buy(http, auth, event, "A1", "pm_card_visa", "live-webhook-no-relay")
    stack.wait_for(_settled(visa["id"]), "the saga to settle")
    stack.wait_for(
        lambda: WebhookDelivery.objects.filter(status="delivered").exists(),
        "the webhook, delivered without a relay",
    )
    stack.wait_for(lambda: len(stack.emails()) == 1, "the confirmation email")

    [request] = receiver.requests
    assert request.verify(endpoint.secret)["type"] == "purchase.confirmed"
    rows = OutboxMessage.objects.filter(saga_id=visa["id"], available_at__lte=F("created_at"))
    assert {r.topic for r in rows} == {"purchase.confirmed", "webhook.delivery"}
    # Completed by the worker the commit handed them to (or woke); no relay pass.
    assert all(r.completed_at and r.fired_at and r.deliveries == 0 for r in rows), [
        (r.topic, r.completed_at, r.fired_at, r.deliveries) for r in rows
    ]


def test_a_hanging_receiver_does_not_slow_the_purchase(stack, http, receiver):
    """A sanity comparison, not a timed performance test: the answers to
    POST /api/purchases/ with a subscribed endpoint whose receiver hangs past
    WEBHOOK_TIMEOUT_SECONDS, against the same answers without any endpoint,
    in the same test and the same stack. The medians must be of the same
    order (a generous factor); a webhook in the request path would add the
    whole hang, seconds, to each."""
    rounds = 6
    event = EventFactory(seats=[f"A{n}" for n in range(1, 2 * rounds + 3)])
    auth = _login(http, "bob")
    _buy(http, auth, event, f"A{2 * rounds + 2}", "pm_card_visa", "warm-up")  # first-request costs

    without = []
    for n in range(1, rounds + 1):
        accepted, took = _buy(http, auth, event, f"A{n}", "pm_card_visa", f"without-{n}")
        without.append(took)
        stack.wait_for(_settled(accepted["id"]), "the saga to settle")

    receiver.script = [("hang", HANG)] * 100
    endpoint = webhook_endpoint_create(url=receiver.url(), events=ALL)
    hanging, sagas = [], []
    for n in range(rounds + 1, 2 * rounds + 1):
        accepted, took = _buy(http, auth, event, f"A{n}", "pm_card_visa", f"hanging-{n}")
        hanging.append(took)
        sagas.append(accepted["id"])
        stack.wait_for(_settled(accepted["id"]), "the saga to settle")

    # The receiver did hang: every purchase's webhook was posted and timed out.
    stack.wait_for(
        lambda: (
            WebhookAttempt.objects.filter(
                delivery__endpoint=endpoint, delivery__saga_id__in=sagas
            ).count()
            >= rounds
        ),
        "the first attempts to time out",
        timeout=60,
    )
    first = WebhookAttempt.objects.filter(delivery__endpoint=endpoint, number=1)
    assert all(a.status_code is None and "timeout" in a.error.lower() for a in first)
    assert all(a.latency_ms is not None and a.latency_ms >= TIMEOUT * 1000 * 0.9 for a in first)
    assert {s.state for s in PurchaseSaga.objects.filter(pk__in=sagas)} == {"CONFIRMED"}

    median_without, median_hanging = statistics.median(without), statistics.median(hanging)
    print(
        f"POST /api/purchases/ median: {median_without * 1000:.1f} ms without an endpoint, "
        f"{median_hanging * 1000:.1f} ms with a receiver that hangs {HANG:g}s "
        f"(each: without {[round(t * 1000, 1) for t in without]}, "
        f"hanging {[round(t * 1000, 1) for t in hanging]})"
    )
    assert median_hanging < max(3 * median_without, median_without + 0.25), (without, hanging)


def test_a_hanging_receiver_does_not_hold_up_the_sagas(narrow_stack, http, receiver):
    """Each purchase's webhook hangs for the whole 20 s timeout on the one
    webhook worker, while the one saga worker goes on: every purchase is
    confirmed well before a single attempt could have let a shared pool go
    (with attempts on the saga's pool, the second purchase would wait 20 s)."""
    receiver.script = [("hang", 2 * LONG_TIMEOUT)] * 100
    webhook_endpoint_create(url=receiver.url(), events=ALL)
    event = EventFactory(seats=["A1", "A2", "A3"])
    auth = _login(http, "carol")

    for seat in ("A1", "A2", "A3"):
        accepted, _ = _buy(http, auth, event, seat, "pm_card_visa", f"narrow-{seat}")
        narrow_stack.wait_for(
            _settled(accepted["id"]), f"{seat}'s saga to settle", timeout=LONG_TIMEOUT / 2
        )
        assert PurchaseSaga.objects.get(pk=accepted["id"]).state == "CONFIRMED"

    # The attempts really were in flight: the receiver holds every one.
    narrow_stack.wait_for(lambda: len(receiver.requests) >= 1, "an attempt at the receiver")
    assert WebhookAttempt.objects.count() == 0  # none has come back yet


def test_a_real_worker_retries_with_the_same_webhook_id_fails_after_the_schedule_and_resends(
    stack, http, receiver
):
    """The worker's schedule here is two retries 1 s apart (WEBHOOK_RETRY_SECONDS
    "1,1"). First purchase: 500, then 200 -> delivered on the retry, one
    webhook-id. Second: 500 three times -> failed; a resend through the staff
    API is one more attempt with the same webhook-id, answered 200."""
    endpoint = webhook_endpoint_create(url=receiver.url(), events=["purchase.confirmed"])
    event = EventFactory(seats=["A1", "A2"])
    auth = _login(http, "dave")

    receiver.script = [500]
    retried, _ = _buy(http, auth, event, "A1", "pm_card_visa", "live-retry")
    stack.wait_for(
        lambda: WebhookDelivery.objects.filter(saga_id=retried["id"], status="delivered").exists(),
        "the retry to be delivered",
    )
    receiver.script = [500, 500, 500]
    failing, _ = _buy(http, auth, event, "A2", "pm_card_visa", "live-fail")
    stack.wait_for(
        lambda: WebhookDelivery.objects.filter(saga_id=failing["id"], status="failed").exists(),
        "the schedule to run out",
    )
    failed = WebhookDelivery.objects.get(saga_id=failing["id"])
    staff = UserFactory(username="ops", password="pw-ops", is_staff=True)
    # What the admin's Resend takes: the action's permission, on a list the user can see.
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["resend_webhookdelivery", "view_webhookdelivery"])
    )
    token = http.post(
        "/api/auth/token/", json={"username": staff.username, "password": "pw-ops"}
    ).json()["token"]
    resent = http.post(
        f"/api/webhook-endpoints/{endpoint.pk}/deliveries/{failed.pk}/resend/",
        headers={"Authorization": f"Token {token}"},
        json={},
    )
    assert resent.status_code == 202, resent.text
    stack.wait_for(
        lambda: WebhookDelivery.objects.get(pk=failed.pk).status == "delivered",
        "the resend to be delivered",
    )

    ids: dict[str, set[str]] = {}
    for request in receiver.requests:
        payload = request.verify(endpoint.secret)
        ids.setdefault(payload["data"]["purchase"]["id"], set()).add(request.headers["webhook-id"])
    assert {saga: len(found) for saga, found in ids.items()} == {retried["id"]: 1, failing["id"]: 1}
    codes = {
        d.saga_id.hex: [a.status_code for a in d.attempts.order_by("number")]
        for d in WebhookDelivery.objects.filter(endpoint=endpoint)
    }
    assert codes == {
        retried["id"].replace("-", ""): [500, 200],
        failing["id"].replace("-", ""): [500, 500, 500, 200],
    }
