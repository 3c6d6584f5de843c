"""Outgoing webhooks (docs/design.md, "The edges"; docs/api.md): one delivery
per type per saga per endpoint, written in the saga's own commit, signed per
Standard Webhooks, retried on a schedule with the same ``webhook-id``, and
sent only to the public address that was checked.

In process: time is driven with freezegun and ``drain_outbox`` (the relay and
the worker, synchronously); the POSTs go to a real HTTP server on 127.0.0.1
in a thread of this process (``WEBHOOK_ALLOW_LOCAL_URLS`` on, as in ``make
run``), except where a test checks the rules for public URLs.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import http.server
import json
import logging
import re
import shutil
import socket
import ssl
import subprocess
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from freezegun import freeze_time
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from config.metrics import ALERTS
from outbox.models import OutboxMessage
from outbox.sweeping import outbox_sweep
from purchases import lock_objects
from purchases.models import PurchaseSaga
from purchases.saga.confirm import confirm
from purchases.services import (
    purchase_refund,
    raise_operator_alert,
    saga_charge,
    saga_compensate,
)
from webhooks import consumers, sending, url_safety
from webhooks.consumers import deliver
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhooks.sending import build_request, post
from webhooks.services import (
    WebhookInvalid,
    WebhookOutsideTransaction,
    WebhookResendRefused,
    webhook_endpoint_create,
    webhook_endpoint_delete,
    webhook_endpoint_rotate_secret,
    webhook_endpoint_update,
    webhook_publish,
    webhook_resend,
)

from .conftest import drain_outbox, new_key, purchase_body, start_purchase
from .factories import EventFactory, UserFactory
from .late_charge import charged_while_undone
from .webhook_receiver import Receiver

T0 = "2026-12-02 12:00:00"
ALL = ["purchase.confirmed", "purchase.failed", "purchase.refunded", "purchase.needs_attention"]
TOPIC = "webhook.delivery"


# --- a real receiver ------------------------------------------------------------------


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(autouse=True)
def _webhook_settings(settings):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    settings.WEBHOOK_TIMEOUT_SECONDS = 2.0
    settings.WEBHOOK_RETRY_SECONDS = [5, 300, 1800, 7200, 18000, 36000, 36000]


def _endpoint(receiver, events=ALL, path="/hook") -> WebhookEndpoint:
    return webhook_endpoint_create(
        url=receiver.url(path), events=list(events), description="the seller's system"
    )


def _deliveries(**filters) -> list[WebhookDelivery]:
    return list(WebhookDelivery.objects.filter(**filters).order_by("pk"))


def _attempts(delivery) -> list[WebhookAttempt]:
    return list(WebhookAttempt.objects.filter(delivery=delivery).order_by("number"))


def _webhook_rows() -> list[OutboxMessage]:
    return list(OutboxMessage.objects.filter(topic=TOPIC).order_by("pk"))


def _unix(when: str) -> int:
    return int(datetime.fromisoformat(when).replace(tzinfo=UTC).timestamp())


def _confirmed(alice, event) -> PurchaseSaga:
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    assert saga.state == "CONFIRMED"
    return saga


def _alert_count() -> float:
    return ALERTS.labels(kind="webhook_failed")._value.get()


# --- what is sent ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_confirmed_purchase_is_posted_once_signed_and_as_stored(alice, event, gateway, receiver):
    endpoint = _endpoint(receiver)

    with freeze_time(T0):
        saga = _confirmed(alice, event)
        drain_outbox()

        assert len(receiver.requests) == 1
        got = receiver.requests[0]
        payload = got.verify(endpoint.secret)  # raises unless the signature holds

    delivery = WebhookDelivery.objects.get()
    assert got.path == "/hook"
    assert got.headers["webhook-id"] == delivery.message_id
    assert delivery.message_id.startswith("msg_")
    assert int(got.headers["webhook-timestamp"]) == _unix(T0)
    assert got.headers["content-type"] == "application/json"
    assert got.headers["webhook-signature"].startswith("v1,")
    # The bytes signed and sent are the bytes stored, compact JSON.
    assert got.body == delivery.body.encode()
    assert got.body == json.dumps(payload, separators=(",", ":")).encode()
    assert payload == {
        "type": "purchase.confirmed",
        "timestamp": "2026-12-02T12:00:00Z",
        "data": {
            "purchase": {
                "id": str(saga.pk),
                "status": "CONFIRMED",
                "event": event.pk,
                "seats": ["A1"],
                "total": {"amount": saga.amount, "currency": saga.currency},
                "reservation": saga.reservation.ref,
            },
            "version": PurchaseSaga.objects.get(pk=saga.pk).version,
        },
    }
    assert (delivery.endpoint_id, delivery.saga_id, delivery.event_type, delivery.event_id) == (
        endpoint.pk,
        saga.pk,
        "purchase.confirmed",
        event.pk,
    )
    assert delivery.status == "delivered" and delivery.delivered_at is not None
    [attempt] = _attempts(delivery)
    assert (attempt.number, attempt.status_code, attempt.error) == (1, 200, "")
    assert attempt.response_excerpt == '{"ok": true}'


@pytest.mark.django_db
def test_a_declined_purchase_is_failed_a_refund_is_refunded_an_escalation_needs_attention(
    alice, bob, gateway, receiver
):
    event = EventFactory(seats=["A1", "A2", "A3"])
    endpoint = _endpoint(receiver)

    with freeze_time(T0):
        declined = saga_charge(
            saga_id=start_purchase(
                alice, event, seats=["A1"], payment_method="pm_card_chargeDeclined"
            ).pk
        )
        # A confirmed purchase refunded in full (a refund row: it stays
        # CONFIRMED), and one charged while it was undone (its compensation
        # refunds it).
        refunded = purchase_refund(
            saga_id=_confirmed(bob, EventFactory(seats=["A1"])).pk, reason="customer asked"
        )
        undone = saga_compensate(saga_id=charged_while_undone(bob, event, seats=["A2"]).pk)
        escalated = start_purchase(alice, event, seats=["A3"])
        with transaction.atomic():
            locked = lock_objects.saga_for_update(saga_id=escalated.pk)
            assert raise_operator_alert(locked, why="a test escalation", now=locked.created_at)
        drain_outbox()
        heard = [
            (
                r.verify(endpoint.secret)["type"],
                r.json["data"]["purchase"]["id"],
                r.json["data"]["purchase"]["status"],
            )
            for r in receiver.requests
        ]

    assert declined.state == undone.state == "COMPENSATED"
    assert refunded.state == "CONFIRMED"
    assert sorted(heard) == sorted(
        [
            ("purchase.failed", str(declined.pk), "COMPENSATED"),
            ("purchase.confirmed", str(refunded.pk), "CONFIRMED"),
            ("purchase.refunded", str(refunded.pk), "CONFIRMED"),
            ("purchase.refunded", str(undone.pk), "COMPENSATED"),
            ("purchase.needs_attention", str(escalated.pk), "PENDING"),
        ]
    )
    assert {d.status for d in _deliveries()} == {"delivered"}


@pytest.mark.django_db
def test_each_type_is_sent_at_most_once_per_saga_per_endpoint_whatever_the_redeliveries(
    alice, event, gateway, receiver
):
    first = _endpoint(receiver, path="/first")
    second = _endpoint(receiver, path="/second")

    with freeze_time(T0):
        saga = _confirmed(alice, event)
        # The same move announced again (a step re-run after a crash, say).
        with transaction.atomic():
            webhook_publish(
                event_type="purchase.confirmed",
                saga_id=saga.pk,
                event_id=saga.event_id,
                data={"purchase": {}, "version": 0},
                now=saga.updated_at,
            )
        drain_outbox()
        # The outbox is at least once: each message handed to the consumer again.
        for message in _webhook_rows():
            deliver(message)
            deliver(message)
        drain_outbox()

    assert sorted(r.path for r in receiver.requests) == ["/first", "/second"]
    for endpoint in (first, second):
        [delivery] = _deliveries(endpoint=endpoint)
        assert delivery.status == "delivered"
        assert [a.number for a in _attempts(delivery)] == [1]
    assert len(_webhook_rows()) == 2


@pytest.mark.django_db
def test_a_redelivered_failed_attempt_arms_one_next_attempt_and_sends_once(
    alice, event, gateway, receiver
):
    _endpoint(receiver)
    receiver.script = [500]

    with freeze_time(T0):
        _confirmed(alice, event)
        drain_outbox()
        deliver(_webhook_rows()[0])  # a redelivery of attempt 1, after it was recorded

    [delivery] = _deliveries()
    assert len(receiver.requests) == 1
    assert [a.number for a in _attempts(delivery)] == [1]
    assert [m.key for m in _webhook_rows()] == [
        f"webhook:{delivery.pk}:1",
        f"webhook:{delivery.pk}:2",
    ]
    assert delivery.status == "pending"


# --- retries, failure, resend ---------------------------------------------------------


@pytest.mark.django_db
def test_a_receiver_answering_500_then_200_gets_it_on_the_retry_with_the_same_webhook_id(
    alice, event, gateway, receiver
):
    endpoint = _endpoint(receiver)
    receiver.script = [500]

    with freeze_time(T0) as clock:
        _confirmed(alice, event)
        drain_outbox()
        [delivery] = _deliveries()
        assert delivery.status == "pending" and len(receiver.requests) == 1
        assert delivery.next_attempt_at == datetime.fromisoformat(T0).replace(
            tzinfo=UTC
        ) + timedelta(seconds=5)
        clock.tick(4)
        drain_outbox()
        assert len(receiver.requests) == 1  # not due yet
        clock.tick(1)
        drain_outbox()
        assert len(receiver.requests) == 2
        retry = receiver.requests[1]
        retry.verify(endpoint.secret)

    first = receiver.requests[0]
    assert first.headers["webhook-id"] == retry.headers["webhook-id"]
    assert int(retry.headers["webhook-timestamp"]) == _unix(T0) + 5  # signed at the retry
    assert first.body == retry.body
    delivery.refresh_from_db()
    assert delivery.status == "delivered"
    attempts = _attempts(delivery)
    assert [(a.number, a.status_code) for a in attempts] == [(1, 500), (2, 200)]
    assert attempts[0].error == "HTTP 500"
    assert len(attempts[0].response_excerpt) == 500  # the answer's start, no more


@pytest.mark.django_db
def test_failed_after_the_schedule_with_one_alert(
    alice, event, gateway, receiver, settings, caplog
):
    settings.WEBHOOK_RETRY_SECONDS = [5, 10]
    _endpoint(receiver)
    receiver.script = [503] * 10
    alerts_before = _alert_count()

    with freeze_time(T0) as clock:
        saga = _confirmed(alice, event)
        for step in (0, 5, 10, 3600):
            clock.tick(step)
            drain_outbox()
        for message in _webhook_rows():  # redeliveries change nothing
            deliver(message)

    [delivery] = _deliveries()
    assert len(receiver.requests) == 3
    assert delivery.status == "failed" and delivery.failed_at is not None
    assert [a.number for a in _attempts(delivery)] == [1, 2, 3]
    alerts = [r for r in caplog.records if getattr(r, "alert", None) == "webhook_failed"]
    assert len(alerts) == 1
    assert alerts[0].levelname == "ERROR"
    assert (alerts[0].delivery_id, alerts[0].saga_id, alerts[0].type) == (
        delivery.pk,
        str(saga.pk),
        "purchase.confirmed",
    )
    assert alerts[0].endpoint == receiver.url()
    assert _alert_count() == alerts_before + 1


@pytest.mark.django_db
def test_resend_makes_a_new_attempt_with_the_same_webhook_id(
    alice, event, gateway, receiver, settings
):
    settings.WEBHOOK_RETRY_SECONDS = []  # one attempt, then failed
    endpoint = _endpoint(receiver)
    receiver.script = [500]

    with freeze_time(T0) as clock:
        _confirmed(alice, event)
        drain_outbox()
        [delivery] = _deliveries()
        assert delivery.status == "failed"

        clock.tick(60)
        assert webhook_resend(delivery.pk) == 2
        with pytest.raises(WebhookResendRefused):
            webhook_resend(delivery.pk)  # pending: attempt 2 is already owed
        drain_outbox()
        delivery.refresh_from_db()
        assert delivery.status == "delivered"

        assert webhook_resend(delivery.pk) == 3  # from delivered too
        drain_outbox()
        for request in receiver.requests:
            request.verify(endpoint.secret)

    assert [r.headers["webhook-id"] for r in receiver.requests] == [delivery.message_id] * 3
    assert [(a.number, a.status_code, a.resend) for a in _attempts(delivery)] == [
        (1, 500, False),
        (2, 200, True),
        (3, 200, True),
    ]
    assert [m.key for m in _webhook_rows()] == [f"webhook:{delivery.pk}:{n}" for n in (1, 2, 3)]


@pytest.mark.django_db
def test_a_sweep_records_its_attempts_together_each_with_its_own_outcome(
    alice, event, gateway, receiver
):
    """A sweep's claim closes in one transaction (outbox/sweeping.py): its
    deliveries locked, their attempts written, the deliveries updated, the
    inbox entries and the rows' completion each in one statement."""
    endpoints = [_endpoint(receiver, path=f"/{name}") for name in ("a", "b", "c")]
    receiver.script = [500]  # the first POST only: its retry is armed

    with freeze_time(T0):
        _confirmed(alice, event)
        assert len(_webhook_rows()) == 3
        with CaptureQueriesContext(connection) as sent:
            assert outbox_sweep(topic=TOPIC, gather=0) == "delivered=3 failed=0"

    assert [r.path for r in receiver.requests] == ["/a", "/b", "/c"]
    first, *rest = (_deliveries(endpoint=e)[0] for e in endpoints)
    assert (first.status, first.armed_attempt) == ("pending", 2)
    assert first.next_attempt_at == datetime.fromisoformat(T0).replace(tzinfo=UTC) + timedelta(
        seconds=5
    )
    assert [(d.status, d.armed_attempt) for d in rest] == [("delivered", 1)] * 2
    assert [[(a.number, a.status_code) for a in _attempts(d)] for d in (first, *rest)] == [
        [(1, 500)],
        [(1, 200)],
        [(1, 200)],
    ]
    assert [m.key for m in _webhook_rows()][-1] == f"webhook:{first.pk}:2"
    statements = [q["sql"].replace('"', "").lower() for q in sent.captured_queries]

    def count(start: str) -> int:
        return sum(1 for sql in statements if sql.startswith(start))

    assert count("insert into webhooks_webhookattempt") == 1
    assert count("update webhooks_webhookdelivery") == 1
    assert count("insert into outbox_inboxentry") == 1
    assert count("update outbox_outboxmessage set completed_at") == 1
    assert sum(1 for sql in statements if sql.endswith("for update of d")) == 1
    # Read before the POSTs: the three deliveries in one statement.
    reads = [sql for sql in statements if "webhooks_webhookdelivery d " in sql]
    assert len(reads) == 2 and "unnest" in reads[0] and reads[1].endswith("for update of d")
    assert all(m.completed_at == _webhook_rows()[0].completed_at for m in _webhook_rows()[:3])


@pytest.mark.django_db
def test_a_sweep_behind_a_hanging_receiver_gives_back_what_its_lease_cannot_cover(
    alice, event, gateway, receiver, settings, caplog, monkeypatch
):
    """Real time, a real receiver that never answers: each attempt takes the
    whole timeout (0.5 s), a claim's lease is 1.2 s and a row may take 0.6 s,
    so a claim of three starts at most two; the row left is given back and
    the next claim takes it. Each row is attempted once, none after the
    claim that started it lost its lease."""
    settings.WEBHOOK_TIMEOUT_SECONDS = 0.5
    settings.OUTBOX_CLAIM_LEASE_SECONDS = 1.2
    settings.OUTBOX_SWEEP_ROW_SECONDS = 0.6
    for name in ("a", "b", "c"):
        _endpoint(receiver, path=f"/{name}")
    receiver.script = [("hang", 5)] * 3
    _confirmed(alice, event)
    started: list[tuple[float, datetime]] = []  # (when, the lease it ran under)

    def deliver_noting_the_lease(message):
        started.append((time.time(), message.processing_until))
        return deliver(message)

    deliver_noting_the_lease.prepare = deliver.prepare  # type: ignore[attr-defined]
    monkeypatch.setattr(consumers, "deliver", deliver_noting_the_lease)
    try:
        with caplog.at_level(logging.INFO, logger="outbox.sweeping"):
            assert outbox_sweep(topic=TOPIC, gather=0) == "delivered=3 failed=0"
    finally:
        receiver.release.set()

    assert sorted(r.path for r in receiver.requests) == ["/a", "/b", "/c"]
    assert [a.number for d in _deliveries() for a in _attempts(d)] == [1, 1, 1]
    assert all("timeout" in a.error for d in _deliveries() for a in _attempts(d))
    assert any("given back" in r.getMessage() for r in caplog.records)
    # Each row started with at least a row's time left in its lease.
    assert all(lease.timestamp() - at >= 0.6 for at, lease in started), started
    assert all(m.completed_at is not None for m in _webhook_rows()[:3])


@pytest.mark.django_db
def test_a_sweeps_read_goes_stale_and_each_attempt_then_reads_its_own(
    alice, event, gateway, receiver, monkeypatch
):
    """After a slow receiver, a change of the endpoint counts for the next
    attempts of the sweep: they read their delivery again."""
    from webhooks import attempts  # only this test replaces the POST an attempt makes

    endpoints = [_endpoint(receiver, path=f"/{name}") for name in ("a", "b")]
    monkeypatch.setattr(consumers, "READ_FRESH_SECONDS", 0.0)
    _confirmed(alice, event)
    real_post = attempts.post

    def post_then_disable_the_second(target, **kwargs):
        answer = real_post(target, **kwargs)
        WebhookEndpoint.objects.filter(pk=endpoints[1].pk).update(enabled=False)
        return answer

    monkeypatch.setattr(attempts, "post", post_then_disable_the_second)
    with CaptureQueriesContext(connection) as sent:
        assert outbox_sweep(topic=TOPIC, gather=0) == "delivered=2 failed=0"

    assert [r.path for r in receiver.requests] == ["/a"]
    [second] = _deliveries(endpoint=endpoints[1])
    assert second.status == "failed"
    assert _attempts(second)[0].error == "endpoint disabled: not sent"
    # Each read names its deliveries in an array: the sweep's of both (gone
    # stale), then each attempt's own.
    reads = [re.search(r"unnest\('\{([^}]*)\}'", q["sql"]) for q in sent.captured_queries]
    assert [len(r.group(1).split(",")) for r in reads if r] == [2, 1, 1]


@pytest.mark.django_db
def test_a_sweep_whose_read_fails_still_makes_every_attempt(
    alice, event, gateway, receiver, monkeypatch, caplog
):
    from webhooks import lock_objects as webhook_locks

    real_read = webhook_locks.deliveries_with_attempt_made

    def broken(pairs):
        if len(pairs) > 1:  # the sweep's read of its claim; an attempt's own still works
            raise RuntimeError("the read broke")
        return real_read(pairs)

    for name in ("a", "b"):
        _endpoint(receiver, path=f"/{name}")
    monkeypatch.setattr(webhook_locks, "deliveries_with_attempt_made", broken)
    _confirmed(alice, event)

    assert outbox_sweep(topic=TOPIC, gather=0) == "delivered=2 failed=0"

    assert sorted(r.path for r in receiver.requests) == ["/a", "/b"]
    assert {d.status for d in _deliveries()} == {"delivered"}
    assert any("could not prepare 2 deliveries" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db
def test_a_receiver_that_hangs_is_a_timeout(alice, event, gateway, receiver, settings):
    settings.WEBHOOK_TIMEOUT_SECONDS = 0.3
    _endpoint(receiver)
    receiver.script = [("hang", 5)]

    _confirmed(alice, event)
    drain_outbox()

    [delivery] = _deliveries()
    [attempt] = _attempts(delivery)
    assert attempt.status_code is None and "timeout" in attempt.error.lower()
    assert delivery.status == "pending"  # the retry is armed


# --- who receives what ----------------------------------------------------------------


@pytest.mark.django_db
def test_a_disabled_endpoint_receives_nothing_new(alice, bob, event, gateway, receiver):
    endpoint = _endpoint(receiver)
    receiver.script = [500]

    with freeze_time(T0) as clock:
        _confirmed(alice, event)
        drain_outbox()  # attempt 1 fails; attempt 2 is armed
        [pending] = _deliveries()
        webhook_endpoint_update(endpoint_id=endpoint.pk, enabled=False)
        _confirmed(bob, EventFactory(seats=["A1"]))  # a new move: no delivery at all
        clock.tick(3600)
        drain_outbox()  # attempt 2 is due: the endpoint is disabled, nothing is sent
        with pytest.raises(WebhookResendRefused):
            webhook_resend(pending.pk)

    assert len(receiver.requests) == 1
    assert _deliveries() == [pending]
    pending.refresh_from_db()
    assert pending.status == "failed"
    last = _attempts(pending)[-1]
    assert last.number == 2 and last.status_code is None and "disabled" in last.error


@pytest.mark.django_db
def test_an_endpoint_subscribed_to_other_types_receives_nothing(alice, event, gateway, receiver):
    refunds = _endpoint(receiver, events=["purchase.refunded"], path="/refunds")
    _endpoint(receiver, events=["purchase.confirmed"], path="/sales")

    saga = _confirmed(alice, event)
    drain_outbox()
    assert [r.path for r in receiver.requests] == ["/sales"]
    assert _deliveries(endpoint=refunds) == []

    purchase_refund(saga_id=saga.pk, reason="customer asked")
    drain_outbox()
    assert [r.path for r in receiver.requests] == ["/sales", "/refunds"]
    assert receiver.requests[1].json["type"] == "purchase.refunded"


# --- in the saga's commit, never before it --------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_deleting_an_endpoint_while_a_saga_commits_its_webhook_breaks_neither(receiver):
    """The saga's commit reads the endpoints it writes deliveries for under a
    key-share lock: a delete waits for that commit (and then deletes the new
    delivery too) instead of making the saga's commit fail on the foreign
    key (PostgreSQL checks it at COMMIT)."""
    endpoint = _endpoint(receiver)
    saga_id = uuid.uuid4()
    published, deleted = threading.Event(), threading.Event()
    errors: list[str] = []

    def delete_meanwhile():
        published.wait(10)
        try:
            webhook_endpoint_delete(endpoint_id=endpoint.pk)
        except Exception as exc:  # noqa: BLE001 - the failure is the result
            errors.append(f"delete: {type(exc).__name__}: {exc}")
        finally:
            deleted.set()
            connection.close()

    other = threading.Thread(target=delete_meanwhile)
    other.start()
    try:
        with transaction.atomic():
            written = webhook_publish(
                event_type="purchase.confirmed",
                saga_id=saga_id,
                event_id=None,
                data={"x": 1},
                now=None,
            )
            published.set()
            # The delete runs now: it must wait for this commit, not pass it.
            assert not deleted.wait(1.0), "the delete did not wait for the saga's commit"
    except Exception as exc:  # noqa: BLE001
        errors.append(f"saga commit: {type(exc).__name__}: {exc}")
    other.join(20)

    assert errors == []
    assert len(written) == 1
    assert not WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert not WebhookDelivery.objects.filter(saga_id=saga_id).exists()


@pytest.mark.django_db
def test_a_rolled_back_transition_writes_no_webhook_row(alice, event, receiver):
    _endpoint(receiver)
    saga = start_purchase(alice, event)

    with pytest.raises(RuntimeError, match="the commit fails"):
        with transaction.atomic():
            locked = lock_objects.saga_for_update(saga_id=saga.pk)
            confirm(locked, charge_id="ch_test", reason="test", at=locked.created_at)
            assert len(_deliveries()) == 1 and len(_webhook_rows()) == 1  # in this commit
            raise RuntimeError("the commit fails")

    assert _deliveries() == [] and _webhook_rows() == []
    drain_outbox()
    assert receiver.requests == []


@pytest.mark.django_db
def test_publishing_refuses_to_run_outside_a_transaction(alice, event):
    with pytest.raises(WebhookOutsideTransaction):
        webhook_publish(
            event_type="purchase.confirmed", saga_id=None, event_id=event.pk, data={}, now=None
        )


@pytest.mark.django_db(transaction=True)
def test_nothing_is_sent_before_the_saga_commits(receiver, settings):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    alice = UserFactory(username="alice")
    event = EventFactory(seats=["A1"])
    _endpoint(receiver)
    saga = start_purchase(alice, event)
    drained: list = []

    def relay_and_worker_meanwhile():
        try:
            drained.extend(drain_outbox())
        finally:
            connection.close()

    with transaction.atomic():
        locked = lock_objects.saga_for_update(saga_id=saga.pk)
        confirm(locked, charge_id="ch_test", reason="test", at=locked.created_at)
        other = threading.Thread(target=relay_and_worker_meanwhile)
        other.start()
        other.join()
        assert receiver.requests == [] and not any(m.topic == TOPIC for m in drained)

    drain_outbox()
    assert [r.json["type"] for r in receiver.requests] == ["purchase.confirmed"]


@pytest.mark.django_db
def test_the_purchase_request_writes_and_sends_no_webhook(alice_api, event, receiver):
    _endpoint(receiver)

    answer = alice_api.post(
        "/api/purchases/", purchase_body(event), format="json", HTTP_IDEMPOTENCY_KEY=new_key()
    )

    assert answer.status_code == 202
    assert _deliveries() == [] and _webhook_rows() == [] and receiver.requests == []


# --- URLs: https and public addresses only, checked again at each delivery -----------


@pytest.fixture
def resolver(monkeypatch):
    """The name resolution url_safety uses, answered from a table (and counted)."""

    class Table(dict):
        calls = 0

    table = Table()

    def resolve(host, port):
        table.calls += 1
        if host not in table:
            raise url_safety.UnsafeURL(f"{host} does not resolve")
        return list(table[host])

    monkeypatch.setattr(url_safety, "resolve", resolve)
    return table


@pytest.fixture
def public_only(settings):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = False


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url, addresses, why",
    [
        ("http://hooks.example.com/x", ["93.184.216.34"], "https"),
        ("ftp://hooks.example.com/x", ["93.184.216.34"], "https"),
        ("https://127.0.0.1/x", [], "not public"),
        ("https://[::1]/x", [], "not public"),
        ("https://10.1.2.3/x", [], "not public"),
        ("https://169.254.169.254/latest/meta-data", [], "not public"),
        ("https://[::ffff:192.168.0.1]/x", [], "not public"),
        # Deprecated site-local IPv6 (fec0::/10): Python 3.11 calls it global.
        ("https://[fec0::1]/x", [], "not public"),
        ("https://site.example.com/x", ["fec0:0:0:1::5"], "not public"),
        ("https://localhost/x", ["127.0.0.1"], "not public"),
        ("https://intranet.example.com/x", ["192.168.1.10"], "not public"),
        # Every address the name resolves to must be public, not only the first.
        ("https://mixed.example.com/x", ["93.184.216.34", "10.0.0.7"], "not public"),
        ("https://nowhere.example.com/x", None, "does not resolve"),
        ("https://user:pw@hooks.example.com/x", ["93.184.216.34"], "credentials"),
        ("not a url", None, "https"),
    ],
)
def test_a_url_that_is_not_https_to_a_public_address_is_refused(
    public_only, resolver, url, addresses, why
):
    host = url.split("//")[-1].split("/")[0].split("@")[-1]
    if addresses is not None:
        resolver[host] = addresses

    with pytest.raises(WebhookInvalid) as refused:
        webhook_endpoint_create(url=url, events=ALL)

    assert refused.value.field == "url"
    assert why in refused.value.message
    assert WebhookEndpoint.objects.count() == 0


@pytest.mark.django_db
def test_an_https_url_to_public_addresses_is_accepted_and_updates_are_checked(
    public_only, resolver
):
    resolver["hooks.example.com"] = ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"]
    resolver["intranet.example.com"] = ["172.16.0.5"]

    endpoint = webhook_endpoint_create(
        url="https://hooks.example.com/boxoffice",
        events=["purchase.confirmed", "purchase.confirmed"],
    )

    assert endpoint.enabled and endpoint.events == ["purchase.confirmed"]
    with pytest.raises(WebhookInvalid) as refused:
        webhook_endpoint_update(endpoint_id=endpoint.pk, url="https://intranet.example.com/")
    assert refused.value.field == "url"
    with pytest.raises(WebhookInvalid) as unknown:
        webhook_endpoint_update(endpoint_id=endpoint.pk, events=["purchase.exploded"])
    assert unknown.value.field == "events"
    endpoint.refresh_from_db()
    assert endpoint.url == "https://hooks.example.com/boxoffice"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "events", [[], ["purchase.exploded"], "purchase.confirmed", ["purchase.needs_operator"]]
)
def test_an_unknown_event_type_is_refused(receiver, events):
    with pytest.raises(WebhookInvalid) as refused:
        webhook_endpoint_create(url=receiver.url(), events=events)

    assert refused.value.field == "events"


@pytest.mark.django_db
def test_local_urls_are_allowed_only_when_the_setting_says_so(settings, receiver):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = False
    with pytest.raises(WebhookInvalid):
        webhook_endpoint_create(url=receiver.url(), events=ALL)

    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    assert webhook_endpoint_create(url=receiver.url(), events=ALL).pk
    # Never the link-local metadata address, nor an unspecified one.
    for url in ("http://169.254.169.254/", "http://0.0.0.0/", "http://224.0.0.1/"):
        with pytest.raises(WebhookInvalid):
            webhook_endpoint_create(url=url, events=ALL)


@pytest.mark.django_db
def test_a_name_that_now_resolves_to_an_internal_address_is_refused_at_delivery(
    alice, event, gateway, receiver, resolver, public_only
):
    resolver["hooks.example.com"] = ["93.184.216.34"]
    endpoint = webhook_endpoint_create(
        url=f"https://hooks.example.com:{receiver.port}/hook", events=ALL
    )
    resolver["hooks.example.com"] = ["127.0.0.1"]  # DNS changed since it was registered

    _confirmed(alice, event)
    drain_outbox()

    assert receiver.connections == 0 and receiver.requests == []
    [delivery] = _deliveries(endpoint=endpoint)
    [attempt] = _attempts(delivery)
    assert attempt.status_code is None and "refused" in attempt.error
    assert "not public" in attempt.error
    assert delivery.status == "pending"  # a failure like any other: the retry is armed


@pytest.mark.django_db
def test_the_connection_goes_to_the_address_that_was_checked(
    alice, event, gateway, receiver, resolver
):
    # Only the patched table knows this name: reaching the receiver proves that
    # the POST went to the address the check resolved, not to a second look-up.
    resolver["hooks.boxoffice.test"] = ["127.0.0.1"]
    webhook_endpoint_create(url=f"http://hooks.boxoffice.test:{receiver.port}/hook", events=ALL)
    resolver.calls = 0

    _confirmed(alice, event)
    drain_outbox()

    [got] = receiver.requests
    assert got.headers["host"] == f"hooks.boxoffice.test:{receiver.port}"
    assert resolver.calls == 1  # one resolution per attempt: the checked one


def test_a_receiver_that_trickles_its_answer_is_cut_off_at_the_timeout():
    """httpx's timeouts are per read: a receiver that sends a byte every
    0.2 s never trips a 1 s timeout. The attempt has one deadline for the
    whole answer, so it cannot hold a webhook worker past it."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle():
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(40):  # 8 s of one header byte at a time
                if stop.is_set():
                    return
                with contextlib.suppress(OSError):
                    conn.sendall(b"X")
                time.sleep(0.2)

    threading.Thread(target=trickle, daemon=True).start()
    target = url_safety.check_url(f"http://127.0.0.1:{server.getsockname()[1]}/hook")
    started = time.monotonic()
    try:
        answer = post(target, headers={}, body=b"{}", timeout=1.0)
        took = time.monotonic() - started
    finally:
        stop.set()
        server.close()

    assert answer.status_code is None
    assert "timeout" in answer.error
    assert took < 4, f"the attempt took {took:.1f}s: no deadline on the whole answer"


def test_attempts_share_one_tls_context_per_process(receiver, monkeypatch):
    """A new TLS context costs about 20 ms of CPU (certifi's roots parsed
    again): attempts build it once per process, not once per POST."""
    built = []
    real = ssl.create_default_context

    def create_default_context(*a, **k):
        built.append(1)
        return real(*a, **k)

    monkeypatch.setattr(ssl, "create_default_context", create_default_context)
    target = url_safety.check_url(receiver.url())

    answers = [post(target, headers={}, body=b"{}", timeout=2.0) for _ in range(3)]

    assert [a.status_code for a in answers] == [200, 200, 200]
    assert len(built) <= 1


def test_attempts_to_one_receiver_ride_one_connection(receiver):
    """A worker keeps the connection of an attempt answered for the next one
    to the same checked target: no TCP (or TLS) set-up per attempt."""
    target = url_safety.check_url(receiver.url())

    answers = [post(target, headers={}, body=b"{}", timeout=2.0) for _ in range(3)]

    assert [a.status_code for a in answers] == [200, 200, 200]
    assert (len(receiver.requests), receiver.connections) == (3, 1)


def test_a_kept_connection_serves_only_its_address_and_host_name(receiver):
    """The same address under another name (another endpoint on one
    server) is another connection: a connection is reused only where a new
    one would have gone, with the same name sent."""
    target = url_safety.check_url(receiver.url())
    other = dataclasses.replace(target, host="localhost")

    post(target, headers={}, body=b"{}", timeout=2.0)
    post(other, headers={}, body=b"{}", timeout=2.0)
    post(target, headers={}, body=b"{}", timeout=2.0)

    assert [r.headers["host"] for r in receiver.requests] == [
        target.host_header,
        other.host_header,
        target.host_header,
    ]
    assert receiver.connections == 2


def test_an_attempt_without_an_answer_closes_its_connection(receiver):
    receiver.script = [("hang", 5)]
    target = url_safety.check_url(receiver.url())

    timed_out = post(target, headers={}, body=b"{}", timeout=0.5)
    answered = post(target, headers={}, body=b"{}", timeout=2.0)

    assert (timed_out.status_code, answered.status_code) == (None, 200)
    assert receiver.connections == 2  # the second attempt did not inherit the first's


def test_an_attempt_logs_no_line_of_httpx_even_when_the_root_logs_info(receiver, caplog):
    """A Celery worker sets the root logger to INFO; httpx's line per request
    would repeat the attempt's own (docs/operations.md, "Logs")."""
    caplog.set_level(logging.INFO)  # the root, as celery worker --loglevel=INFO
    target = url_safety.check_url(receiver.url())

    answer = post(target, headers={}, body=b"{}", timeout=2.0)

    assert answer.status_code == 200
    assert len(receiver.requests) == 1
    assert [r.getMessage() for r in caplog.records if r.name.startswith("httpx")] == []


class _TLSReceiver:
    """An HTTPS server on 127.0.0.1 with a certificate for ``name`` from a
    CA of its own (made by the openssl command line); it keeps the TLS server
    names it was asked for and the Host header of each request."""

    def __init__(self, workdir, name: str):
        if shutil.which("openssl") is None:
            pytest.fail("no openssl command for the TLS test: install Debian's package openssl")

        def openssl(*args):
            subprocess.run(["openssl", *args], cwd=workdir, check=True, capture_output=True)

        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"]
        openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=test CA")
        openssl("req", *ec[:-2], "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", f"/CN={name}")
        (workdir / "san.ext").write_text(f"subjectAltName=DNS:{name}\n")
        openssl(
            "x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "leaf.pem", "-days", "2", "-extfile", "san.ext",
        )  # fmt: skip
        self.ca = str(workdir / "ca.pem")
        self.server_names: list[str | None] = []
        self.hosts: list[str] = []
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(workdir / "leaf.pem", workdir / "leaf.key")
        tls.sni_callback = lambda _sock, server_name, _ctx: self.server_names.append(server_name)
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                receiver.hosts.append(self.headers["Host"])
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a client that refuses the certificate

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_an_https_attempt_goes_to_the_checked_address_and_verifies_the_name(tmp_path, monkeypatch):
    """The POST connects to the address that was checked, asks TLS for the
    endpoint's host name and verifies the certificate against it: the name
    is never resolved again, and a certificate for another name is refused."""
    server = _TLSReceiver(tmp_path, "hooks.example.test")
    monkeypatch.setattr(sending, "_tls", lambda: ssl.create_default_context(cafile=server.ca))
    target = url_safety.Target(
        scheme="https", host="hooks.example.test", port=server.port, address="127.0.0.1", path="/"
    )
    try:
        answer = post(target, headers={}, body=b"{}", timeout=2.0)
        refused = post(
            dataclasses.replace(target, host="elsewhere.example.test"),
            headers={},
            body=b"{}",
            timeout=2.0,
        )
    finally:
        server.close()

    assert (answer.status_code, answer.error, answer.excerpt) == (200, "", "ok")
    assert server.hosts == [f"hooks.example.test:{server.port}"]
    assert server.server_names == ["hooks.example.test", "elsewhere.example.test"]
    assert refused.status_code is None
    assert "CERTIFICATE_VERIFY_FAILED" in refused.error, refused.error


def test_an_https_request_is_pinned_to_the_checked_address_with_the_name_for_tls():
    target = url_safety.Target(
        scheme="https", host="hooks.example.com", port=443, address="93.184.216.34", path="/x?y=1"
    )
    v6 = url_safety.Target(
        scheme="https",
        host="hooks.example.com",
        port=8443,
        address="2606:2800:220:1:248:1893:25c8:1946",
        path="/",
    )

    request = build_request(target, headers={"webhook-id": "msg_1"}, body=b"{}")
    request6 = build_request(v6, headers={}, body=b"{}")

    assert str(request.url) == "https://93.184.216.34/x?y=1"
    assert request.headers["host"] == "hooks.example.com"
    assert request.extensions["sni_hostname"] == "hooks.example.com"
    assert str(request6.url) == "https://[2606:2800:220:1:248:1893:25c8:1946]:8443/"
    assert request6.headers["host"] == "hooks.example.com:8443"


@pytest.mark.django_db
def test_a_redirect_is_not_followed_and_counts_as_a_failure(alice, event, gateway, receiver):
    _endpoint(receiver)
    receiver.script = [("redirect", "/elsewhere")]

    _confirmed(alice, event)
    drain_outbox()

    assert [r.path for r in receiver.requests] == ["/hook"]
    [delivery] = _deliveries()
    [attempt] = _attempts(delivery)
    assert attempt.status_code == 302 and "redirect" in attempt.error
    assert delivery.status == "pending"


# --- secrets --------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_secret_is_random_and_rotating_it_signs_later_attempts_with_the_new_one(
    alice, event, gateway, receiver
):
    endpoint = _endpoint(receiver)
    other = _endpoint(receiver, events=["purchase.refunded"], path="/other")
    receiver.script = [500]

    assert endpoint.secret.startswith("whsec_") and endpoint.secret != other.secret
    assert len(base64.b64decode(endpoint.secret.removeprefix("whsec_"))) >= 24
    with freeze_time(T0) as clock:
        _confirmed(alice, event)
        drain_outbox()
        new = webhook_endpoint_rotate_secret(endpoint_id=endpoint.pk)
        clock.tick(5)
        drain_outbox()
        [_, retry] = receiver.requests
        retry.verify(new)
        with pytest.raises(WebhookVerificationError):
            Webhook(endpoint.secret).verify(retry.body, retry.headers)

    assert new != endpoint.secret


# --- the admin ------------------------------------------------------------------------


@pytest.fixture
def staff(client):
    def login(*codenames):
        user = UserFactory(username=f"staff-{len(codenames)}", is_staff=True)
        user.user_permissions.add(
            *Permission.objects.filter(
                codename__in=[
                    "view_webhookendpoint",
                    "view_webhookdelivery",
                    "view_purchasesaga",
                    *codenames,
                ]
            )
        )
        client.force_login(user)
        return client

    return login


@pytest.mark.django_db
def test_the_admin_lists_endpoints_without_their_secret(staff, alice, event, gateway, receiver):
    endpoint = _endpoint(receiver)
    _confirmed(alice, event)
    drain_outbox()
    client = staff()

    listing = client.get("/admin/webhooks/webhookendpoint/")
    page = client.get(f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/")

    assert listing.status_code == page.status_code == 200
    for html in (listing.content.decode(), page.content.decode()):
        assert endpoint.secret not in html
        assert endpoint.secret.removeprefix("whsec_") not in html
    assert receiver.url() in listing.content.decode()
    assert "1 delivered" in listing.content.decode()


@pytest.mark.django_db
def test_the_admin_resends_with_a_reason_and_only_with_the_permission(
    staff, alice, event, gateway, receiver, settings
):
    settings.WEBHOOK_RETRY_SECONDS = []
    _endpoint(receiver)
    receiver.script = [500]
    saga = _confirmed(alice, event)
    drain_outbox()
    [delivery] = _deliveries()
    changelist = "/admin/webhooks/webhookdelivery/"
    post = {"action": "resend", "_selected_action": [delivery.pk]}

    viewer = staff()
    page = viewer.get(f"/admin/webhooks/webhookdelivery/{delivery.pk}/change/")
    assert page.status_code == 200 and "HTTP 500" in page.content.decode()
    viewer.post(changelist, {**post, "confirm": "yes", "reason": "try again"})
    assert _webhook_rows()[-1].key == f"webhook:{delivery.pk}:1"  # nothing armed

    operator = staff("resend_webhookdelivery")
    dry_run = operator.post(changelist, post)
    assert dry_run.status_code == 200 and "Resend" in dry_run.content.decode()
    assert len(_webhook_rows()) == 1
    done = operator.post(changelist, {**post, "confirm": "yes", "reason": "receiver fixed"})
    assert done.status_code == 302
    assert _webhook_rows()[-1].key == f"webhook:{delivery.pk}:2"
    drain_outbox()
    delivery.refresh_from_db()
    assert delivery.status == "delivered"

    saga_page = operator.get(f"/admin/purchases/purchasesaga/{saga.pk}/change/")
    html = saga_page.content.decode()
    assert saga_page.status_code == 200
    assert 'id="saga-webhooks"' in html and delivery.message_id in html
    assert "purchase.confirmed" in html and "delivered" in html


@pytest.mark.django_db
def test_the_saga_page_says_when_no_webhook_was_written(staff, alice, event, gateway):
    saga = _confirmed(alice, event)

    html = staff().get(f"/admin/purchases/purchasesaga/{saga.pk}/change/").content.decode()

    assert 'id="saga-webhooks"' in html and "No webhook" in html


def test_the_resolver_answers_every_address_of_a_name():
    addresses = url_safety.resolve("localhost", 443)

    assert "127.0.0.1" in addresses or "::1" in addresses
    assert url_safety.resolve("10.0.0.1", 443) == ["10.0.0.1"]
