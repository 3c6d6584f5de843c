"""Outbox rows and durable timers: schedule, cancel, fire, relay."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from freezegun import freeze_time

from outbox.delivery import message_deliver, transactional
from outbox.models import InboxEntry, OutboxMessage
from outbox.relay import relay_claim, relay_tick
from outbox.services import (
    OutboxOutsideTransaction,
    TimerCancelStatus,
    outbox_publish,
    timer_cancel,
    timer_schedule,
)

from .conftest import BrokerQueue

T0 = "2026-12-02 12:00:00"


def _schedule(key="t1", due_in=60):
    with transaction.atomic():
        return timer_schedule(
            key=key,
            topic="test.timer",
            payload={"n": 1},
            due_at=timezone.now() + timedelta(seconds=due_in),
        )


def _cancel(key):
    with transaction.atomic():
        return timer_cancel(key=key)


def _fire_all(now=None):
    fired: list[int] = []
    relay_tick(now=now, dispatch=fired.append)
    return fired


@pytest.mark.django_db
def test_writes_refuse_to_run_outside_a_transaction():
    with pytest.raises(OutboxOutsideTransaction):
        outbox_publish(topic="x", payload={})
    with pytest.raises(OutboxOutsideTransaction):
        timer_cancel(key="x")


@pytest.mark.django_db
def test_cancel_before_fire_answers_cancelled_and_it_never_fires():
    with freeze_time(T0) as clock:
        timer = _schedule()
        result = _cancel("t1")
        clock.tick(3600)
        fired = _fire_all()

    assert result.status == TimerCancelStatus.CANCELLED
    assert fired == []
    timer.refresh_from_db()
    assert timer.cancelled_at is not None and timer.fired_at is None


@pytest.mark.django_db
def test_cancel_after_fire_answers_already_fired_with_when():
    with freeze_time(T0) as clock:
        timer = _schedule(due_in=60)
        clock.tick(61)
        assert _fire_all() == [timer.pk]
        fired_at = timezone.now()
        clock.tick(5)
        result = _cancel("t1")

    assert result.status == TimerCancelStatus.ALREADY_FIRED
    assert result.at == fired_at
    timer.refresh_from_db()
    assert timer.cancelled_at is None  # the row keeps its history


@pytest.mark.django_db
def test_cancel_of_an_unknown_timer_answers_absent():
    assert _cancel("never-armed").status == TimerCancelStatus.ABSENT


@pytest.mark.django_db
def test_cancelling_twice_keeps_answering_cancelled():
    _schedule()
    first = _cancel("t1")
    second = _cancel("t1")
    assert (first.status, second.status) == ("cancelled", "cancelled")
    assert first.at == second.at


@pytest.mark.django_db
def test_a_timer_fires_when_due_not_before():
    with freeze_time(T0) as clock:
        timer = _schedule(due_in=60)
        clock.tick(59)
        early = _fire_all()
        clock.tick(1)
        on_time = _fire_all()
        again = _fire_all()

    assert early == []
    assert on_time == [timer.pk]
    assert again == []  # fired once
    timer.refresh_from_db()
    assert timer.fired_at == timer.available_at
    assert timer.deliveries == 1


@pytest.mark.django_db
def test_a_failed_hand_off_is_retried_on_the_next_tick():
    with transaction.atomic():
        message = outbox_publish(topic="test.event", payload={})

    def broken(_):
        raise ConnectionError("broker down")

    assert relay_tick(dispatch=broken) == 0
    message.refresh_from_db()
    assert message.fired_at is None and message.claimed_until is None
    assert _fire_all() == [message.pk]


@pytest.mark.django_db
def test_a_fired_message_not_completed_is_handed_over_again(settings):
    settings.OUTBOX_REDELIVER_SECONDS = [120]
    with freeze_time(T0) as clock:
        with transaction.atomic():
            message = outbox_publish(topic="test.event", payload={})
        assert _fire_all() == [message.pk]  # and the task was lost
        clock.tick(119)
        assert _fire_all() == []
        clock.tick(2)
        assert _fire_all() == [message.pk]
    message.refresh_from_db()
    assert message.deliveries == 2


@pytest.mark.django_db
def test_delivery_runs_each_consumer_once_whatever_the_redeliveries(settings):
    settings.OUTBOX_CONSUMERS = {"test.event": ["tests.test_outbox.record_consumer"]}
    RECORDED.clear()
    with transaction.atomic():
        message = outbox_publish(topic="test.event", payload={"n": 7})

    verdicts = [message_deliver(message_id=message.pk) for _ in range(3)]

    assert verdicts == ["delivered", "skipped", "skipped"]
    assert RECORDED == [7]
    assert InboxEntry.objects.filter(message=message).count() == 1


RECORDED: list = []


def record_consumer(message):
    RECORDED.append(message.payload["n"])


COUNTED: list = []


@transactional
def counting_consumer(message):
    # A transactional consumer: its row commits with the delivery or not at all.
    OutboxMessage.objects.filter(pk=message.pk).update(payload={**message.payload, "counted": 1})
    COUNTED.append(message.payload["n"])
    if message.payload.get("fail"):
        raise RuntimeError("the counter's table is locked")


def _commits(queries) -> int:
    """Commits in a captured statement list: each COMMIT, and each statement
    run in autocommit (outside BEGIN ... COMMIT)."""
    commits, inside = 0, False
    for sql in (q["sql"] for q in queries):
        if sql == "BEGIN":
            inside = True
        elif sql in ("COMMIT", "ROLLBACK"):
            inside = False
            commits += sql == "COMMIT"
        elif not inside:
            commits += 1
    return commits


@pytest.mark.django_db(transaction=True)
def test_a_delivery_is_two_commits_and_a_transactional_consumer_commits_with_it(settings):
    from django.test.utils import CaptureQueriesContext

    settings.OUTBOX_CONSUMERS = {
        "test.event": ["tests.test_outbox.record_consumer", "tests.test_outbox.counting_consumer"]
    }
    RECORDED.clear()
    COUNTED.clear()
    with transaction.atomic():
        message = outbox_publish(topic="test.event", payload={"n": 3})

    with CaptureQueriesContext(connection) as queries:
        verdict = message_deliver(message_id=message.pk)

    assert verdict == "delivered" and RECORDED == [3] and COUNTED == [3]
    assert _commits(queries.captured_queries) == 2
    message.refresh_from_db()
    assert message.completed_at is not None and message.payload["counted"] == 1
    assert sorted(
        InboxEntry.objects.filter(message=message).values_list("consumer", flat=True)
    ) == ["tests.test_outbox.counting_consumer", "tests.test_outbox.record_consumer"]


@pytest.mark.django_db(transaction=True)
def test_a_failing_transactional_consumer_rolls_back_alone_and_what_ran_is_recorded(settings):
    settings.OUTBOX_CONSUMERS = {
        "test.event": ["tests.test_outbox.record_consumer", "tests.test_outbox.counting_consumer"]
    }
    RECORDED.clear()
    COUNTED.clear()
    with transaction.atomic():
        message = outbox_publish(topic="test.event", payload={"n": 4, "fail": True})

    with pytest.raises(RuntimeError):
        message_deliver(message_id=message.pk)

    message.refresh_from_db()
    assert "counted" not in message.payload  # its effect rolled back
    assert message.completed_at is None and message.processing_until is None  # free at once
    assert list(InboxEntry.objects.filter(message=message).values_list("consumer", flat=True)) == [
        "tests.test_outbox.record_consumer"
    ]

    OutboxMessage.objects.filter(pk=message.pk).update(payload={"n": 4})  # the cause is fixed
    assert message_deliver(message_id=message.pk) == "delivered"
    assert RECORDED == [4]  # the ordinary consumer is not run again
    assert COUNTED == [4, 4]  # the transactional one ran again, and this time committed


@pytest.mark.django_db
def test_a_cancelled_timer_is_not_delivered_even_if_handed_over(settings):
    settings.OUTBOX_CONSUMERS = {"test.timer": ["tests.test_outbox.record_consumer"]}
    RECORDED.clear()
    timer = _schedule(due_in=0)
    _cancel("t1")
    assert message_deliver(message_id=timer.pk) == "skipped"
    assert RECORDED == []


@pytest.mark.django_db(transaction=True)
def test_two_relays_never_claim_one_row_twice():
    # given: 200 due rows
    with transaction.atomic():
        for i in range(200):
            outbox_publish(topic="test.event", payload={"i": i})
    claimed: list[list[int]] = [[], []]
    barrier = threading.Barrier(2)

    def relay(n):
        try:
            barrier.wait()
            while ids := relay_claim(now=timezone.now(), limit=7):
                claimed[n].extend(ids)
        finally:
            connection.close()

    # when: two relays on two connections claim concurrently
    threads = [threading.Thread(target=relay, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    # then: every row claimed exactly once, between them
    all_ids = claimed[0] + claimed[1]
    assert len(all_ids) == 200
    assert len(set(all_ids)) == 200
    assert claimed[0] and claimed[1], "both relays should have taken part"


@pytest.mark.django_db(transaction=True)
def test_two_relays_ticking_concurrently_dispatch_each_row_once():
    with transaction.atomic():
        ids = [outbox_publish(topic="test.event", payload={}).pk for _ in range(100)]
    dispatched: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(2)

    def dispatch(message_id):
        with lock:
            dispatched.append(message_id)

    def relay():
        try:
            barrier.wait()
            while relay_tick(dispatch=dispatch, limit=5):
                pass
        finally:
            connection.close()

    threads = [threading.Thread(target=relay) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert sorted(dispatched) == sorted(ids)
    assert OutboxMessage.objects.filter(fired_at__isnull=True).count() == 0


@pytest.mark.django_db
def test_a_message_that_never_completes_becomes_a_dead_letter(settings):
    from outbox.relay import dead_letters

    settings.OUTBOX_REDELIVER_SECONDS = [10, 10]  # 3 hand-overs, then dead
    with freeze_time(T0) as clock:
        with transaction.atomic():
            message = outbox_publish(topic="test.event", payload={})
        handed = []
        for _ in range(6):
            handed += _fire_all()  # every hand-off is lost
            clock.tick(11)

    assert handed == [message.pk] * 3
    assert list(dead_letters()) == [message]


def _relay_thread(*, poll: float):
    """``relay_run`` in a thread with its own connection; returns (stop, thread)."""
    from outbox.relay import relay_run

    stop = threading.Event()

    def run() -> None:
        relay_run(stop=stop.is_set, poll=poll)
        connection.close()

    relay = threading.Thread(target=run)
    relay.start()
    return stop, relay


def _fired_within(message, *, seconds: float):
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if OutboxMessage.objects.filter(pk=message.pk, fired_at__isnull=False).exists():
            break
        time.sleep(0.05)
    return OutboxMessage.objects.get(pk=message.pk).fired_at


class _RelayProbe:
    """Watches ``relay_run`` from inside: when it enters its wait (and for how
    long it means to wait), when each pass starts, which rows each pass hands
    over."""

    def __init__(self, monkeypatch):
        import time

        from outbox import relay as relay_module

        self.waiting = threading.Event()  # the relay is inside its wait
        self.handed = threading.Event()  # a pass handed rows over (and marked them)
        self.wait_timeouts: list[float] = []
        self.pass_started: list[float] = []  # monotonic start of pass n+1
        self.handed_by: list[tuple[int, list[int]]] = []  # (pass number, ids)
        self._lock = threading.Lock()
        self._current = threading.local()
        original_wait = relay_module._Listener.wait
        original_pass = relay_module._pass
        original_hand_over = relay_module._celery_hand_over

        def wait(listener, timeout):
            self.wait_timeouts.append(timeout)
            self.waiting.set()
            return original_wait(listener, timeout)

        def a_pass(**kwargs):
            with self._lock:
                self.pass_started.append(time.monotonic())
                self._current.n = len(self.pass_started)
            handed, due = original_pass(**kwargs)
            if handed:
                self.handed.set()
            return handed, due

        def hand_over(ids, topics):
            self.handed_by.append((self._current.n, list(ids)))
            return original_hand_over(ids, topics)

        monkeypatch.setattr(relay_module._Listener, "wait", wait)
        monkeypatch.setattr(relay_module, "_pass", a_pass)
        monkeypatch.setattr(relay_module, "_celery_hand_over", hand_over)


def _wake_listeners() -> None:
    """A bare NOTIFY on the relay's channel, whatever the product's _notify does."""
    from outbox.handover import NOTIFY_CHANNEL

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [NOTIFY_CHANNEL])


@pytest.mark.django_db(transaction=True)
def test_the_relay_wakes_on_notify_not_only_on_its_poll(monkeypatch, broker_queue):
    # A relay polling every 10 minutes hands a new row over at once: the
    # commit's NOTIFY wakes it. We know it is inside its wait (its first pass
    # found nothing) before the row is published, the test gives up long
    # before the poll would end that wait, and the row must be handed over by
    # a pass that started after the publish: only the notification explains it.
    import time

    poll = 600.0
    deadline = 20.0
    probe = _RelayProbe(monkeypatch)
    stop, relay = _relay_thread(poll=poll)
    try:
        assert probe.waiting.wait(deadline), "the relay never reached its wait"
        assert probe.wait_timeouts == [poll]  # asleep for the whole poll
        assert probe.handed_by == []  # its pass before the wait found nothing
        passes_before = len(probe.pass_started)
        published_at = time.monotonic()
        with transaction.atomic():
            message = outbox_publish(topic="test.notify", payload={})
        woken = probe.handed.wait(deadline)
        handed_after = time.monotonic() - published_at
    finally:
        stop.set()
        _wake_listeners()  # so that the relay sees the stop, even without a working NOTIFY
        relay.join(30)
    assert not relay.is_alive()
    assert woken, f"the relay slept through the commit's NOTIFY (poll {poll}s)"
    assert handed_after < deadline < poll
    [(pass_number, ids)] = probe.handed_by
    assert ids == [message.pk]
    assert pass_number > passes_before
    assert probe.pass_started[pass_number - 1] > published_at
    assert OutboxMessage.objects.get(pk=message.pk).fired_at is not None


@pytest.mark.django_db(transaction=True)
def test_the_relay_survives_its_connections_being_killed():
    # A PostgreSQL restart kills the relay's LISTEN connection and its query
    # connection. The relay logs, reconnects, and goes on handing rows over;
    # before this was handled the thread died with the first broken wait.
    import time

    stop, relay = _relay_thread(poll=0.2)
    try:
        time.sleep(1.0)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            (killed,) = cursor.fetchone()
        assert killed >= 2  # the listener and the relay's own connection
        time.sleep(0.5)
        with transaction.atomic():
            message = outbox_publish(topic="test.restart", payload={})
        fired = _fired_within(message, seconds=20)
        alive = relay.is_alive()
    finally:
        stop.set()
        relay.join(30)
    assert alive, "the relay thread died with its connection"
    assert fired is not None, "the relay did not reconnect and hand the row over"


def test_a_batch_is_spread_evenly_over_at_most_the_configured_tasks():
    from outbox.handover import chunks

    assert chunks([1, 2, 3], 16) == [[1], [2], [3]]
    assert chunks(list(range(10)), 4) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert chunks([], 16) == []
    spread = chunks(list(range(100)), 16)
    assert len(spread) == 16 and sum(spread, []) == list(range(100))
    assert {len(c) for c in spread} == {6, 7}


@pytest.mark.django_db
def test_the_relay_hands_a_burst_to_celery_in_few_tasks_and_a_trickle_one_by_one(
    settings, broker_queue
):
    settings.OUTBOX_DISPATCH_TASKS = 4
    with transaction.atomic():
        burst = [outbox_publish(topic="test.event", payload={"i": i}).pk for i in range(10)]

    assert relay_tick() == 10
    burst_tasks = broker_queue.messages()
    with transaction.atomic():
        single = outbox_publish(topic="test.event", payload={}).pk
    assert relay_tick() == 1
    single_tasks = broker_queue.messages()

    assert [t["task"] for t in burst_tasks] == ["outbox.deliver_many"] * 4
    assert sorted(sum((t["args"][0] for t in burst_tasks), [])) == burst
    assert single_tasks == [{"task": "outbox.deliver", "args": [single]}]
    assert OutboxMessage.objects.filter(fired_at__isnull=True).count() == 0


@pytest.mark.django_db
def test_webhook_attempts_go_to_their_own_queue_and_everything_else_to_the_default(
    settings, broker_queue
):
    """A receiver that hangs holds a worker of the webhooks' pool for the whole
    timeout; the saga's steps never wait behind it (docs/design.md, "The
    edges")."""
    webhooks = BrokerQueue(settings.CELERY_WEBHOOK_QUEUE)
    webhooks.purge()
    with transaction.atomic():
        saga_row = outbox_publish(topic="test.event", payload={}).pk
        attempts = [
            outbox_publish(topic="webhook.delivery", payload={"delivery_id": 0, "attempt": n}).pk
            for n in (1, 2)
        ]

    assert relay_tick() == 3
    default, own = broker_queue.messages(), webhooks.messages()

    assert default == [{"task": "outbox.deliver", "args": [saga_row]}]
    assert (
        sorted(
            sum(
                ([t["args"][0]] if t["task"] == "outbox.deliver" else t["args"][0] for t in own), []
            )
        )
        == attempts
    )


@pytest.mark.django_db
def test_deliver_many_delivers_each_row_and_retries_only_the_failed_ones(settings, monkeypatch):
    from celery.exceptions import Retry

    from outbox import tasks

    settings.OUTBOX_CONSUMERS = {"test.event": ["tests.test_outbox.record_consumer"]}
    RECORDED.clear()
    with transaction.atomic():
        ok = [outbox_publish(topic="test.event", payload={"n": n}).pk for n in (1, 2)]
        bad = outbox_publish(topic="test.event", payload={}).pk  # record_consumer: KeyError
    retried = []

    def retry(args, countdown):
        retried.append(args)
        return Retry()

    monkeypatch.setattr(tasks.deliver_many, "retry", retry)

    with pytest.raises(Retry):
        tasks.deliver_many.run([ok[0], bad, ok[1]])

    assert RECORDED == [1, 2]
    assert retried == [[[bad]]]
    assert OutboxMessage.objects.filter(pk__in=ok, completed_at__isnull=False).count() == 2
    assert tasks.deliver_many.run(ok) == "delivered=0 skipped=2"
