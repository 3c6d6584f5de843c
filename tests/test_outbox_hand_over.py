"""Rows due when they are written are handed to Celery on commit, with the
relay as the safety net (outbox/handover.py); a webhook attempt's record
and its outbox row's completion are one commit (outbox/delivery.py)."""

import os
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from celery import signals
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from freezegun import freeze_time

from devtools.processes import free_port
from outbox import handover
from outbox.delivery import message_deliver, transactional
from outbox.models import InboxEntry, OutboxMessage
from outbox.relay import next_due_in, relay_tick
from outbox.services import outbox_publish, outbox_publish_many, timer_schedule
from purchases.services import saga_charge
from webhooks.models import WebhookAttempt, WebhookDelivery
from webhooks.services import webhook_endpoint_create
from webhooks.topics import DELIVERY as WEBHOOK_TOPIC

from .conftest import BrokerQueue, start_purchase
from .webhook_receiver import Receiver

T0 = "2026-12-02 12:00:00"
HERE = "tests.test_outbox_hand_over"
RUNS: Counter = Counter()
CLOSING_FAILS: list[bool] = []


def count_consumer(message):
    RUNS[message.pk] += 1


@transactional
def closing_consumer(message):
    """Runs in the delivery's closing transaction; fails it when told to."""
    if CLOSING_FAILS and CLOSING_FAILS.pop(0):
        raise RuntimeError("the closing transaction fails")


@pytest.fixture(autouse=True)
def _on(settings):
    settings.OUTBOX_HAND_OVER_ON_COMMIT = True
    settings.OUTBOX_HAND_OVER_GRACE_SECONDS = 30
    settings.OUTBOX_CONSUMERS = {
        "test.event": [f"{HERE}.count_consumer"],
        "test.timer": [f"{HERE}.count_consumer"],
    }
    settings.OUTBOX_TOPIC_QUEUES = {"test.event": "elsewhere"}
    RUNS.clear()
    CLOSING_FAILS.clear()


@pytest.fixture
def published(monkeypatch):
    """What the on-commit hand-over puts on the broker: (args, options)."""
    sent = []

    def publish(task, args, *, queue=None):
        assert task is handover.deliver
        sent.append((args, {"queue": queue} if queue else {}))

    monkeypatch.setattr(handover, "publish", publish)
    return sent


def _write(topic="test.event", **kwargs) -> OutboxMessage:
    with transaction.atomic():
        return outbox_publish(topic=topic, payload={}, **kwargs)


@pytest.mark.django_db
def test_a_row_due_now_is_handed_over_after_its_commit_to_its_topics_queue(
    published, django_capture_on_commit_callbacks
):
    with freeze_time(T0):
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            row = _write()
        assert published == []  # nothing before the commit
        for callback in callbacks:
            callback()
        row.refresh_from_db()

    assert published == [((row.pk,), {"queue": "elsewhere"})]
    # The relay's only after the grace: nothing for it to do meanwhile.
    assert row.due_at == row.available_at + timedelta(seconds=30)
    assert (
        relay_tick(
            now=row.available_at + timedelta(seconds=29),
            dispatch=lambda _: pytest.fail("handed over twice"),
        )
        == 0
    )


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_row_is_not_handed_over(published):
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox_publish(topic="test.event", payload={})
        raise RuntimeError("the move is refused")
    assert published == [] and not OutboxMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_row_delivered_by_its_worker_is_settled_and_never_the_relays(published):
    row = _write()
    [([message_id], _)] = published  # the commit ran the hand-over

    assert message_deliver(message_id=message_id) == "delivered"

    row.refresh_from_db()
    assert RUNS[row.pk] == 1
    assert row.completed_at is not None and row.due_at is None
    assert row.fired_at is not None  # the worker's lease stamped it
    assert row.deliveries == 0  # no relay handed it over
    later = timezone.now() + timedelta(days=1)
    assert relay_tick(now=later, dispatch=lambda _: pytest.fail("redelivered")) == 0


@pytest.mark.django_db(transaction=True)
def test_a_hand_over_lost_after_the_commit_is_the_relays_after_the_grace(published):
    # The process died between the commit and the publish: the row was
    # written, nothing reached the broker (the callback never ran).
    with freeze_time(T0):
        row = _write()
        published.clear()
        written = row.available_at
    handed: list[int] = []

    assert relay_tick(now=written + timedelta(seconds=29), dispatch=handed.append) == 0
    assert relay_tick(now=written + timedelta(seconds=30), dispatch=handed.append) == 1
    assert handed == [row.pk]
    message_deliver(message_id=row.pk)
    assert RUNS[row.pk] == 1


@pytest.mark.django_db(transaction=True)
def test_a_refused_publish_makes_the_row_due_at_once(monkeypatch):
    def refuse(*args, **kwargs):
        raise ConnectionError("the broker is down")

    monkeypatch.setattr(handover, "publish", refuse)
    row = _write()

    row.refresh_from_db()
    assert row.due_at is not None and row.due_at <= timezone.now()  # not at the grace's end
    handed: list[int] = []
    assert relay_tick(dispatch=handed.append) == 1 and handed == [row.pk]


@pytest.mark.django_db(transaction=True)
def test_a_timer_is_the_relays_and_not_handed_over_on_commit(published):
    due = timezone.now() + timedelta(seconds=60)
    with transaction.atomic():
        timer = timer_schedule(key="t1", topic="test.timer", payload={}, due_at=due)
    assert published == []
    timer.refresh_from_db()
    assert timer.due_at == due


@pytest.mark.django_db(transaction=True)
def test_the_relays_look_ahead_skips_rows_waiting_out_their_grace(published):
    # A row handed over on commit is not due for the relay: the loop sleeps
    # until its grace ends instead of waking at once, over and over.
    with freeze_time(T0):
        _write()
        now = timezone.now()
        assert next_due_in(now=now) == pytest.approx(30.0)
        assert next_due_in(now=now + timedelta(seconds=31)) is None


# --- delivered in place by the task that wrote the row ------------------------------


FAILS: list[bool] = []


def failing_consumer(message):
    if FAILS and FAILS.pop(0):
        raise RuntimeError("the mail server refused")
    RUNS[message.pk] += 1


def _write_here(topic="test.timer") -> OutboxMessage:
    # "test.timer" goes to the default queue; "test.event" to "elsewhere".
    return _write(topic=topic)


@pytest.mark.django_db(transaction=True)
def test_a_row_written_in_a_delivered_here_block_is_leased_by_its_commit_and_delivered_at_its_end(
    published, settings
):
    with freeze_time(T0):
        with handover.delivered_here():
            row = _write_here()
            stored = OutboxMessage.objects.get(pk=row.pk)  # what the commit wrote
            assert RUNS[row.pk] == 0  # not before the block ends
        written = row.available_at

    lease = timedelta(seconds=settings.OUTBOX_CLAIM_LEASE_SECONDS)
    assert stored.processing_until == written + lease == stored.due_at
    assert stored.fired_at == written
    assert published == []  # no task on any queue
    assert RUNS[row.pk] == 1
    row.refresh_from_db()
    assert row.completed_at is not None and row.due_at is None and row.processing_until is None
    assert list(InboxEntry.objects.filter(message=row).values_list("consumer", flat=True)) == [
        f"{HERE}.count_consumer"
    ]
    assert relay_tick(now=written + 2 * lease, dispatch=lambda _: pytest.fail("handed over")) == 0


@pytest.mark.django_db(transaction=True)
def test_rows_written_together_are_the_rows_written_one_by_one_and_sent_the_same_ways(
    published, settings
):
    """outbox_publish_many (a charge burst's confirmations): one statement,
    each row as outbox_publish writes it, in the order given; in place here,
    handed over on commit elsewhere."""
    messages: list[dict[str, Any]] = [
        {"payload": {"n": n}, "key": f"k:{n}", "event_id": 7, "saga_id": None} for n in range(3)
    ]

    def written(rows):
        return [
            (r.topic, r.payload, r.key, r.event_id, r.fired_at is not None, r.processing_until)
            for r in OutboxMessage.objects.filter(pk__in=[r.pk for r in rows]).order_by("pk")
        ]

    with freeze_time(T0), handover.delivered_here():
        with transaction.atomic():
            one_by_one = [
                outbox_publish(topic="test.timer", **{**m, "key": f"one:{m['key']}"})
                for m in messages
            ]
        with transaction.atomic(), CaptureQueriesContext(connection) as queries:
            together = outbox_publish_many(topic="test.timer", messages=messages)
    assert len(queries) == 1
    assert [r.payload for r in together] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert [(*w[:2], w[2].removeprefix("one:"), *w[3:]) for w in written(one_by_one)] == written(
        together
    )
    assert [RUNS[r.pk] for r in together] == [1, 1, 1]  # delivered in place, as the others

    with transaction.atomic():
        elsewhere = outbox_publish_many(
            topic="test.event", messages=[{**m, "key": f"else:{m['key']}"} for m in messages]
        )
    assert published == [((r.pk,), {"queue": "elsewhere"}) for r in elsewhere]


@pytest.mark.django_db(transaction=True)
def test_a_row_for_another_queue_is_handed_over_even_in_a_delivered_here_block(published):
    with handover.delivered_here():
        row = _write(topic="test.event")

    assert published == [((row.pk,), {"queue": "elsewhere"})]
    assert RUNS[row.pk] == 0
    row.refresh_from_db()
    assert row.processing_until is None and row.completed_at is None


@pytest.mark.django_db(transaction=True)
def test_a_writer_that_dies_before_delivering_in_place_leaves_the_row_to_the_relay(
    published, monkeypatch, settings
):
    # The commit wrote the leased row; the process died before the block's
    # end (its owed list is lost with it).
    monkeypatch.setattr(handover, "message_deliver_leased", lambda message: None)
    with freeze_time(T0):
        with handover.delivered_here():
            row = _write_here()
        written = row.available_at
    lease = settings.OUTBOX_CLAIM_LEASE_SECONDS
    handed: list[int] = []

    assert relay_tick(now=written + timedelta(seconds=lease - 1), dispatch=handed.append) == 0
    assert relay_tick(now=written + timedelta(seconds=lease), dispatch=handed.append) == 1
    assert handed == [row.pk] and published == []
    with freeze_time(written + timedelta(seconds=lease, milliseconds=1)):
        assert message_deliver(message_id=row.pk) == "delivered"
    assert RUNS[row.pk] == 1


@pytest.mark.django_db(transaction=True)
def test_a_delivery_in_place_that_fails_never_fails_the_block_and_is_the_relays_later(
    settings, caplog
):
    settings.OUTBOX_CONSUMERS = {"test.timer": [f"{HERE}.failing_consumer"]}
    FAILS[:] = [True]
    with freeze_time(T0):
        with handover.delivered_here():
            row = _write_here()
        written = row.available_at

    row.refresh_from_db()
    assert "the mail server refused" in row.last_error and row.completed_at is None
    assert row.processing_until is None  # given back at once
    assert row.due_at == written + timedelta(seconds=settings.OUTBOX_CLAIM_LEASE_SECONDS)
    assert "outbox delivery in place failed" in caplog.text
    handed: list[int] = []
    assert relay_tick(now=row.due_at, dispatch=handed.append) == 1 and handed == [row.pk]
    with freeze_time(row.due_at):
        assert message_deliver(message_id=row.pk) == "delivered"
    assert RUNS[row.pk] == 1


@pytest.mark.django_db(transaction=True)
def test_a_row_whose_commit_comes_after_the_block_is_handed_over_as_usual(published):
    # An outer transaction commits after the block ended: nobody is left
    # to deliver in place, so the commit publishes the row.
    with transaction.atomic():
        with handover.delivered_here():
            row = outbox_publish(topic="test.timer", payload={})
        assert published == [] and RUNS[row.pk] == 0

    assert published == [((row.pk,), {})]
    assert RUNS[row.pk] == 0


@pytest.mark.django_db(transaction=True)
def test_the_charge_task_delivers_the_confirmation_in_place(
    alice, event, gateway, published, settings
):
    from django.core import mail

    from purchases.saga.topics import ROUTING, Topic
    from purchases.tasks import saga_charge_task

    settings.OUTBOX_CONSUMERS = {str(topic): list(names) for topic, names in ROUTING.items()}
    saga = start_purchase(alice, event)

    assert saga_charge_task.run(str(saga.pk)) == "CONFIRMED"

    row = OutboxMessage.objects.get(topic=Topic.CONFIRMED, saga_id=saga.pk)
    assert row.completed_at is not None and row.deliveries == 0
    assert row.pk not in [args[0] for args, _ in published]  # no task for it
    assert len(mail.outbox) == 1 and mail.outbox[0].to == [alice.email]


# --- a webhook attempt and its row's completion: one commit ---------------------------


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def webhooks(settings, receiver):
    from webhooks.topics import ROUTING

    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    settings.WEBHOOK_TIMEOUT_SECONDS = 2.0
    settings.OUTBOX_HAND_OVER_ON_COMMIT = False  # delivered here, through the relay
    settings.OUTBOX_CONSUMERS = {
        **{str(topic): list(names) for topic, names in ROUTING.items()},
        WEBHOOK_TOPIC: [*ROUTING[WEBHOOK_TOPIC], f"{HERE}.closing_consumer"],
    }
    webhook_endpoint_create(url=receiver.url("/hook"), events=["purchase.confirmed"])


@pytest.mark.django_db
def test_an_attempt_whose_closing_commit_fails_is_made_again_and_recorded_once(
    alice, event, gateway, receiver, webhooks
):
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    [row] = OutboxMessage.objects.filter(topic=WEBHOOK_TOPIC)
    CLOSING_FAILS.append(True)

    with pytest.raises(RuntimeError):
        message_deliver(message_id=row.pk)

    # The POST happened; its record rolled back with the row's completion,
    # and the webhook consumer is not marked as having run.
    assert len(receiver.requests) == 1
    assert not WebhookAttempt.objects.exists()
    assert not InboxEntry.objects.filter(message=row).exists()
    row.refresh_from_db()
    assert row.completed_at is None and "the closing transaction fails" in row.last_error

    assert message_deliver(message_id=row.pk) == "delivered"

    assert len(receiver.requests) == 2  # at least once: the same message again
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    [attempt] = WebhookAttempt.objects.all()
    assert attempt.number == 1 and attempt.status_code == 200
    delivery = WebhookDelivery.objects.get(saga_id=saga.pk)
    assert delivery.status == "delivered"
    row.refresh_from_db()
    assert row.completed_at is not None


# --- the publish: Celery's own, on the session's real broker --------------------


def test_a_publish_reaches_its_queue_and_celerys_consumer_reads_it(broker_queue):
    elsewhere = BrokerQueue(f"{broker_queue.name}-elsewhere")
    elsewhere.purge()
    handover.publish(handover.deliver, (7,))  # no queue: the default queue
    handover.publish(handover.sweep, ("webhook.delivery",), queue=None)
    handover.publish(handover.deliver, (8,), queue=elsewhere.name)

    assert broker_queue.messages() == [
        {"task": "outbox.deliver", "args": [7]},
        {"task": "outbox.sweep", "args": ["webhook.delivery"]},
    ]
    assert elsewhere.messages() == [{"task": "outbox.deliver", "args": [8]}]


def test_celerys_publish_signals_hear_the_hand_over(broker_queue):
    # Tracing's instrumentation listens there: it writes the trace into the
    # message's headers (config/tracing.py).
    heard = []

    def listener(sender=None, headers=None, **kwargs):
        heard.append(sender)

    signals.before_task_publish.connect(listener)
    try:
        handover.publish(handover.deliver, (5,))
    finally:
        signals.before_task_publish.disconnect(listener)

    assert heard == ["outbox.deliver"]
    assert broker_queue.messages() == [{"task": "outbox.deliver", "args": [5]}]


def test_a_broker_that_cannot_be_reached_fails_the_publish():
    """The hand-over and the charge's enqueue raise, after Celery's publish
    retries, so that their callers fall back (the row made due at once, the
    saga left to the resumer). In a process of its own: Celery reads the
    broker's URL from the environment, before its settings, as it builds its
    connection pool."""
    code = (
        "import django; django.setup()\n"
        "from outbox import handover\n"
        "from purchases.saga import burst\n"
        "for name, publish in [\n"
        "    ('hand-over', lambda: handover.publish(handover.deliver, (1,))),\n"
        "    ('charge', lambda: burst.publish_charge('saga-1')),\n"
        "]:\n"
        "    try:\n"
        "        publish()\n"
        "    except Exception as refused:\n"
        "        print(name, type(refused).__name__)\n"
        "    else:\n"
        "        print(name, 'sent')\n"
    )
    dead = f"redis://127.0.0.1:{free_port()}/0"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "CELERY_BROKER_URL": dead},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()

    assert out == ["hand-over OperationalError", "charge OperationalError"]
