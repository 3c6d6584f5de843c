"""Rows due when they are written are handed to Celery on commit, with the
relay as the safety net (outbox/handover.py); a webhook attempt's record
and its outbox row's completion are one commit (outbox/delivery.py)."""

from collections import Counter
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from freezegun import freeze_time

from outbox import handover
from outbox.delivery import message_deliver, transactional
from outbox.models import InboxEntry, OutboxMessage
from outbox.relay import next_due_in, relay_tick
from outbox.services import outbox_publish, timer_schedule
from purchases.services import saga_charge
from webhooks.models import WebhookAttempt, WebhookDelivery
from webhooks.services import webhook_endpoint_create
from webhooks.topics import DELIVERY as WEBHOOK_TOPIC

from .conftest import start_purchase
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
    monkeypatch.setattr(
        handover.deliver, "apply_async", lambda args, **options: sent.append((args, options))
    )
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

    monkeypatch.setattr(handover.deliver, "apply_async", refuse)
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
