"""Daily sales from purchase.confirmed / purchase.cancelled: a consumer that
fails for a while counts the backlog exactly once when the relay's
redeliveries reach it again, redelivery counts nothing, and concurrent
deliveries neither lose nor double an increment."""

import datetime as dt
import threading

import pytest
from django.core import mail
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from freezegun import freeze_time

from outbox.delivery import message_deliver, messages_deliver_claimed
from outbox.models import InboxEntry, OutboxMessage
from purchases import analytics
from purchases.analytics import (
    ON_CANCELLED,
    ON_CONFIRMED,
    ON_REFUND,
    analytics_on_cancelled,
    analytics_on_confirmed,
    analytics_on_refund,
    daily_sales,
)
from purchases.models import DailySales
from purchases.saga.topics import Topic
from purchases.services import By, organizer_refund, saga_charge, saga_compensate

from .conftest import drain_outbox, start_purchase
from .factories import EventFactory, UserFactory
from .late_charge import charged_while_undone

T0 = "2026-12-02 12:00:00"
TOPIC_CONFIRMED, TOPIC_CANCELLED = Topic.CONFIRMED, Topic.CANCELLED
ANALYTICS = {TOPIC_CONFIRMED: ON_CONFIRMED, TOPIC_CANCELLED: ON_CANCELLED}
EMAILS = {
    TOPIC_CONFIRMED: "purchases.consumers.confirmation_email",
    TOPIC_CANCELLED: "purchases.consumers.cancellation_email",
}


def _redeliver(messages) -> None:
    """The rows delivered again, as after a worker that died past its commit."""
    for message in messages:
        OutboxMessage.objects.filter(pk=message.pk).update(completed_at=None)
        assert message_deliver(message_id=message.pk) == "delivered"


def _events():
    return list(OutboxMessage.objects.filter(topic__in=list(ANALYTICS)).order_by("pk"))


def _ran(message) -> set[str]:
    return set(InboxEntry.objects.filter(message=message).values_list("consumer", flat=True))


class _Outage:
    """The analytics table's write fails, as a database (or a bug) would make
    it fail, until ``up()``; every failed write is counted per message."""

    def __init__(self, monkeypatch):
        self.failed: dict[int, int] = {}
        self.down = True
        write = analytics._add_many

        def add(counted):
            if self.down:
                for message, _, _ in counted:
                    self.failed[message.pk] = self.failed.get(message.pk, 0) + 1
                raise DatabaseError('could not extend file "daily_sales": No space left')
            return write(counted)

        monkeypatch.setattr(analytics, "_add_many", add)

    def up(self) -> None:
        self.down = False


@pytest.mark.django_db
def test_a_failing_consumer_converges_on_redelivery_and_counts_each_message_once(
    alice, bob, gateway, monkeypatch
):
    # given: analytics routed as in production, and its write failing while
    # five purchases happen and the emails go out
    outage = _Outage(monkeypatch)
    event = EventFactory(seats=[f"A{n}" for n in range(1, 7)])
    with freeze_time(T0) as clock:
        saga_charge(saga_id=start_purchase(alice, event, seats=["A1", "A2"]).pk)  # 5000
        saga_charge(saga_id=start_purchase(bob, event, seats=["A3"]).pk)  # 2500
        saga_charge(saga_id=start_purchase(alice, event, seats=["A4"]).pk)  # 2500
        declined = saga_charge(
            saga_id=start_purchase(
                bob, event, seats=["A5"], payment_method="pm_card_chargeDeclined"
            ).pk
        )
        # A charge that landed while its purchase was undone: the compensation
        # refunds it (purchase.cancelled, refunded). A confirmed purchase's
        # refunds are rows of their own, not purchase.cancelled.
        refunded = charged_while_undone(alice, event, seats=["A6"])
        saga_compensate(saga_id=refunded.pk, by=By.operator("carol"))
        for _ in range(3):  # the relay keeps handing the rows over; every delivery fails
            drain_outbox(now=timezone.now())
            clock.tick(dt.timedelta(hours=1))
        assert declined.state == "COMPENSATED"
        emails = len(mail.outbox)
        assert emails == 5  # 3 confirmations, 2 failures (one with its refund)

        # then: the deliveries failed, and are recorded as failed: the emails
        # ran (and are in the inbox), the counts did not, nothing is complete
        events = _events()
        assert len(events) == 5
        assert sorted(outage.failed) == [m.pk for m in events]
        assert DailySales.objects.count() == 0
        for message in events:
            assert message.completed_at is None, message
            assert _ran(message) == {EMAILS[message.topic]}, message

        # when: the write works again; the relay's redeliveries, whenever its
        # schedule makes them due, bring analytics up to date
        outage.up()
        for _ in range(48):
            if all(m.completed_at for m in _events()):
                break
            clock.tick(dt.timedelta(hours=1))
            drain_outbox(now=timezone.now())

    # then: converged, every message counted exactly once, on the message's day
    assert all(m.completed_at for m in _events()), "analytics never caught up"
    for message in _events():
        assert _ran(message) == {EMAILS[message.topic], ANALYTICS[message.topic]}, message
    expected = [
        {
            "day": dt.date(2026, 12, 2),
            "currency": "EUR",
            "confirmed_count": 3,
            "confirmed_amount": 10000,
            "cancelled_count": 2,
            "refunded_count": 1,
            "refunded_amount": 2500,
            "net_amount": 7500,
        }
    ]
    assert daily_sales(event_id=event.pk) == expected
    assert len(mail.outbox) == emails  # the emails' inbox kept them from going again
    assert InboxEntry.objects.filter(consumer__in=list(ANALYTICS.values())).count() == 5

    # and: everything delivered again, and each consumer called again directly
    with freeze_time(T0):
        _redeliver(_events())
        for message in _events():
            handle = (
                analytics_on_confirmed
                if message.topic == TOPIC_CONFIRMED
                else analytics_on_cancelled
            )
            handle(message)
    assert daily_sales(event_id=event.pk) == expected
    assert len(mail.outbox) == emails


@pytest.mark.django_db
def test_a_confirmed_purchases_refunds_count_on_the_day_each_settled_once_each(alice, gateway):
    # given: a purchase of three seats (7500), refunded one seat on the day
    # of the sale and the rest on the next day, by its organizer
    event = EventFactory(seats=["A1", "A2", "A3"])
    finance = UserFactory(username="fiona")
    with freeze_time(T0) as clock:
        saga = saga_charge(saga_id=start_purchase(alice, event, seats=["A1", "A2", "A3"]).pk)
        assert saga.state == "CONFIRMED"
        organizer_refund(
            organizer=event.organizer, saga_id=saga.pk, user=finance, reason="A1", seats=["A1"]
        )
        drain_outbox(now=timezone.now())
        clock.tick(dt.timedelta(days=1))
        organizer_refund(organizer=event.organizer, saga_id=saga.pk, user=finance, reason="rest")
        drain_outbox(now=timezone.now())

    # then: each settled refund counted once, with its amount, on its own day,
    # and the purchase's net is what was kept: nothing
    settled = list(OutboxMessage.objects.filter(topic=Topic.REFUND_SETTLED).order_by("pk"))
    assert len(settled) == 2
    for message in settled:
        assert message.completed_at is not None
        assert ON_REFUND in _ran(message)
    rows = daily_sales(event_id=event.pk)
    assert [(r["day"], r["refunded_count"], r["refunded_amount"]) for r in rows] == [
        (dt.date(2026, 12, 2), 1, 2500),
        (dt.date(2026, 12, 3), 1, 5000),
    ]
    assert sum(r["net_amount"] for r in rows) == 0
    assert sum(r["confirmed_amount"] for r in rows) == 7500
    assert sum(r["cancelled_count"] for r in rows) == 0  # a refund is not a cancellation

    # and: delivered again, and the consumer called again: nothing more
    with freeze_time(T0):
        _redeliver(settled)
        for message in settled:
            analytics_on_refund(message)
    assert daily_sales(event_id=event.pk) == rows


def _message(event, topic, *, at, amount=2500, refunded=False, was_confirmed=False):
    payload = {"saga_id": "s", "event_id": event.pk, "amount": amount, "currency": "EUR"}
    if topic == TOPIC_CANCELLED:
        payload.update(refunded=refunded, was_confirmed=was_confirmed)
    return OutboxMessage.objects.create(
        topic=topic, payload=payload, event_id=event.pk, created_at=at, available_at=at
    )


@pytest.mark.django_db
def test_the_day_is_the_messages_utc_day():
    event = EventFactory(seats=[])
    late = dt.datetime(2026, 12, 2, 23, 59, 59, tzinfo=dt.UTC)
    # 00:30 in Paris is still the 2nd in UTC.
    paris = dt.datetime(2026, 12, 3, 0, 30, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    early = dt.datetime(2026, 12, 3, 0, 0, 1, tzinfo=dt.UTC)

    analytics_on_confirmed(_message(event, TOPIC_CONFIRMED, at=late))
    analytics_on_confirmed(_message(event, TOPIC_CONFIRMED, at=paris, amount=1000))
    analytics_on_cancelled(_message(event, TOPIC_CANCELLED, at=early, refunded=True))

    assert [
        (
            r["day"],
            r["confirmed_count"],
            r["confirmed_amount"],
            r["cancelled_count"],
            r["refunded_amount"],
        )
        for r in daily_sales(event_id=event.pk)
    ] == [
        (dt.date(2026, 12, 2), 2, 3500, 0, 0),
        (dt.date(2026, 12, 3), 0, 0, 1, 2500),
    ]


# --- concurrency, on real connections --------------------------------------------------


def _in_threads(targets) -> None:
    """Run the callables at once, each on its own connection; re-raise failures."""
    barrier = threading.Barrier(len(targets))
    errors = []

    def run(target):
        try:
            barrier.wait(timeout=10)
            target()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not [t for t in threads if t.is_alive()], "a delivery hung"
    assert errors == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["consumer", "message_deliver"])
def test_the_same_message_delivered_by_four_threads_is_counted_once(settings, how):
    settings.OUTBOX_CONSUMERS = {TOPIC_CONFIRMED: [ON_CONFIRMED]}  # analytics alone
    event = EventFactory(seats=[])
    message = _message(event, TOPIC_CONFIRMED, at=dt.datetime(2026, 12, 2, 12, tzinfo=dt.UTC))

    def deliver():
        if how == "consumer":  # past the delivery lease: only the inbox stands guard
            analytics_on_confirmed(OutboxMessage.objects.get(pk=message.pk))
        else:
            message_deliver(message_id=message.pk)

    _in_threads([deliver] * 4)

    row = DailySales.objects.get(event=event)
    assert (row.confirmed_count, row.confirmed_amount) == (1, 2500)
    assert InboxEntry.objects.filter(message=message, consumer=ON_CONFIRMED).count() == 1


@pytest.mark.django_db(transaction=True)
def test_different_messages_for_the_same_day_delivered_at_once_add_up_exactly():
    event = EventFactory(seats=[])
    at = dt.datetime(2026, 12, 2, 12, tzinfo=dt.UTC)
    for round_ in range(3):  # the first round races on creating the row
        confirmed = [_message(event, TOPIC_CONFIRMED, at=at, amount=1000 + n) for n in range(4)]
        cancelled = [
            _message(event, TOPIC_CANCELLED, at=at, amount=500, refunded=n % 2 == 0)
            for n in range(4)
        ]
        _in_threads(
            [
                lambda m=m: analytics_on_confirmed(OutboxMessage.objects.get(pk=m.pk))
                for m in confirmed
            ]
            + [
                lambda m=m: analytics_on_cancelled(OutboxMessage.objects.get(pk=m.pk))
                for m in cancelled
            ]
        )
        rounds = round_ + 1
        assert DailySales.objects.count() == 1
        row = DailySales.objects.get(event=event)
        assert (row.confirmed_count, row.confirmed_amount) == (4 * rounds, 4006 * rounds)
        assert (row.cancelled_count, row.refunded_count, row.refunded_amount) == (
            4 * rounds,
            2 * rounds,
            1000 * rounds,
        )


def _claimed_leased(messages, now):
    """The rows as a sweep's claim (or a charge burst's writer) holds them."""
    for message in messages:
        OutboxMessage.objects.filter(pk=message.pk).update(
            processing_until=now + dt.timedelta(minutes=1)
        )
        message.refresh_from_db()
        message.already_ran = []
    return messages


@pytest.mark.django_db
def test_confirmations_closing_together_are_counted_in_two_statements_once_each(settings):
    """A charge burst's confirmations (``messages_deliver_claimed``): their
    inbox entries in one statement and their sales in one more, one row per
    event and day, summed; a message counted before is not counted again."""
    settings.OUTBOX_CONSUMERS = {TOPIC_CONFIRMED: [ON_CONFIRMED]}  # analytics alone
    first, second = EventFactory(seats=[]), EventFactory(seats=[])
    day = dt.datetime(2026, 12, 2, 12, tzinfo=dt.UTC)
    messages = [
        _message(first, TOPIC_CONFIRMED, at=day, amount=1000),
        _message(first, TOPIC_CONFIRMED, at=day, amount=2000),
        _message(first, TOPIC_CONFIRMED, at=day + dt.timedelta(days=1), amount=4000),
        _message(second, TOPIC_CONFIRMED, at=day, amount=8000),
        _message(first, TOPIC_CONFIRMED, at=day, amount=16000),
    ]
    # The last was counted already (a redelivery after a crash past the count).
    analytics_on_confirmed(messages[-1])

    with CaptureQueriesContext(connection) as seen:
        delivered, failed, left = messages_deliver_claimed(
            _claimed_leased(messages, timezone.now())
        )

    assert (delivered, failed, left) == (5, 0, [])
    sqls = [q["sql"] for q in seen.captured_queries]
    counting = [sql for sql in sqls if DailySales._meta.db_table in sql]
    inbox = InboxEntry._meta.db_table
    claims = [sql for sql in sqls if sql.startswith(f"INSERT INTO {inbox} ") and "RETURNING" in sql]
    assert (len(counting), len(claims)) == (1, 1)
    assert [
        (r["day"].day, r["confirmed_count"], r["confirmed_amount"])
        for r in daily_sales(event_id=first.pk)
    ] == [(2, 3, 19000), (3, 1, 4000)]
    assert [
        (r["confirmed_count"], r["confirmed_amount"]) for r in daily_sales(event_id=second.pk)
    ] == [(1, 8000)]
    assert all(_ran(m) == {ON_CONFIRMED} for m in messages)


@pytest.mark.django_db(transaction=True)
def test_two_bursts_of_the_same_confirmations_at_once_count_each_once():
    """The same rows closing together in two threads (a lease that ran out
    under a slow burst): the inbox's claims wait on each other, each message
    counted by exactly one of them, and no deadlock."""
    event = EventFactory(seats=[])
    at = dt.datetime(2026, 12, 2, 12, tzinfo=dt.UTC)
    messages = [_message(event, TOPIC_CONFIRMED, at=at, amount=100 + n) for n in range(8)]

    def count(order):
        analytics.analytics_on_confirmed_together(
            [OutboxMessage.objects.get(pk=messages[i].pk) for i in order]
        )

    _in_threads([lambda: count(range(8)), lambda: count(reversed(range(8)))])

    row = DailySales.objects.get(event=event)
    assert (row.confirmed_count, row.confirmed_amount) == (8, sum(100 + n for n in range(8)))
    assert InboxEntry.objects.filter(consumer=ON_CONFIRMED).count() == 8
