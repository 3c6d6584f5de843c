"""A swept topic's rows ride one sweep per gathering instead of a Celery
message each; whatever goes wrong, the relay still takes every row
(outbox/sweeping.py)."""

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from outbox import handover, sweeping
from outbox.delivery import claim_unfired, unclaim
from outbox.models import InboxEntry, OutboxMessage
from outbox.relay import relay_tick
from outbox.services import outbox_publish, timer_schedule
from outbox.sweeping import outbox_sweep

HERE = "tests.test_outbox_sweep"
RUNS: Counter = Counter()
FAILS: set[int] = set()


def count_consumer(message):
    if message.pk in FAILS:
        raise RuntimeError("the receiver's side broke")
    RUNS[message.pk] += 1


# The inside halves a consumer returns, and how they ran: one by one, or
# several together (the list of their messages' ids, per call).
CLOSED: list[list[int]] = []
BROKEN_RECORDS: set[int] = set()


@dataclass(frozen=True)
class Record:
    message_id: int

    def __call__(self):
        Record.together([self])

    @staticmethod
    def together(records):
        ids = [r.message_id for r in records]
        OutboxMessage.objects.filter(pk__in=ids).update(last_error="recorded")
        if BROKEN_RECORDS & set(ids):
            raise RuntimeError("this record cannot be written")
        CLOSED.append(ids)


def recording_consumer(message):
    RUNS[message.pk] += 1
    return Record(message.pk)


@pytest.fixture(autouse=True)
def _swept(settings):
    settings.OUTBOX_HAND_OVER_ON_COMMIT = True
    settings.OUTBOX_HAND_OVER_GRACE_SECONDS = 30
    settings.OUTBOX_CONSUMERS = {
        "test.swept": [f"{HERE}.count_consumer"],
        "test.other": [f"{HERE}.count_consumer"],
        "test.recorded": [f"{HERE}.recording_consumer"],
    }
    settings.OUTBOX_TOPIC_QUEUES = {"test.swept": "hooks"}
    settings.OUTBOX_SWEPT_TOPICS = ["test.swept", "test.recorded"]
    settings.OUTBOX_SWEEP_BATCH = 2
    RUNS.clear()
    FAILS.clear()
    CLOSED.clear()
    BROKEN_RECORDS.clear()
    cache.delete(sweeping.wake_key("test.swept"))
    yield
    cache.delete(sweeping.wake_key("test.swept"))


@pytest.fixture
def published(monkeypatch):
    """The sweeps and the single deliveries put on the broker: (task, args, options)."""
    sent = []
    names = {handover.sweep: "sweep", handover.deliver: "deliver"}

    def publish(task, args, *, queue=None):
        sent.append((names[task], args, {"queue": queue} if queue else {}))

    monkeypatch.setattr(handover, "publish", publish)
    return sent


def _write(topic="test.swept", **kwargs) -> OutboxMessage:
    with transaction.atomic():
        return outbox_publish(topic=topic, payload={}, **kwargs)


def _relay_after_grace() -> list[int]:
    handed: list[int] = []
    relay_tick(now=timezone.now() + timedelta(seconds=31), dispatch=handed.append)
    return handed


@pytest.mark.django_db(transaction=True)
def test_rows_written_while_a_sweep_is_owed_ride_it_and_are_delivered_once(published):
    rows = [_write() for _ in range(5)]

    # One sweep for the five commits, to the topic's queue.
    assert published == [("sweep", ("test.swept",), {"queue": "hooks"})]
    assert outbox_sweep(topic="test.swept", gather=0) == "delivered=5 failed=0"

    assert RUNS == Counter({row.pk: 1 for row in rows})  # batches of 2: three claims
    for row in rows:
        row.refresh_from_db()
        assert row.completed_at is not None and row.due_at is None
        assert row.fired_at is not None and row.deliveries == 0
    assert _relay_after_grace() == []
    assert outbox_sweep(topic="test.swept", gather=0) == "delivered=0 failed=0"


@pytest.mark.django_db(transaction=True)
def test_a_row_committed_after_the_sweep_cleared_the_flag_wakes_another(published):
    _write()
    assert outbox_sweep(topic="test.swept", gather=0) == "delivered=1 failed=0"
    later = _write()

    assert [task for task, _, _ in published] == ["sweep", "sweep"]
    assert outbox_sweep(topic="test.swept", gather=0) == "delivered=1 failed=0"
    assert RUNS[later.pk] == 1


@pytest.mark.django_db(transaction=True)
def test_the_flag_is_cleared_before_the_claim(published, monkeypatch):
    """A row committed between the clear and the claim is the claim's, and
    it woke a sweep of its own too (which then finds nothing)."""
    _write()
    real_claim = sweeping.claim_unfired
    written: list[OutboxMessage] = []

    def claim_after_a_commit(**kwargs):
        if not written:
            written.append(_write())
            kwargs["now"] = timezone.now()  # the claim's statement comes after that commit
        return real_claim(**kwargs)

    monkeypatch.setattr(sweeping, "claim_unfired", claim_after_a_commit)
    assert outbox_sweep(topic="test.swept", gather=0) == "delivered=2 failed=0"
    assert [task for task, _, _ in published] == ["sweep", "sweep"]
    assert RUNS[written[0].pk] == 1


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_row_wakes_nothing(published):
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox_publish(topic="test.swept", payload={})
        raise RuntimeError("the move is refused")
    assert published == [] and cache.get(sweeping.wake_key("test.swept")) is None


@pytest.mark.django_db(transaction=True)
def test_a_topic_not_swept_is_handed_over_row_by_row(published):
    row = _write(topic="test.other")
    assert published == [("deliver", (row.pk,), {})]
    assert cache.get(sweeping.wake_key("test.other")) is None


@pytest.mark.django_db(transaction=True)
def test_a_sweep_that_is_never_run_leaves_its_rows_to_the_relay_after_the_grace(published):
    rows = [_write(), _write()]
    assert len(published) == 1  # the sweep task, lost

    assert sorted(_relay_after_grace()) == sorted(row.pk for row in rows)


@pytest.mark.django_db(transaction=True)
def test_a_refused_publish_clears_the_flag_and_makes_the_row_the_relays_at_once(monkeypatch):
    def refuse(*args, **kwargs):
        raise ConnectionError("the broker is down")

    monkeypatch.setattr(handover, "publish", refuse)
    row = _write()
    row.refresh_from_db()

    assert row.due_at is not None and row.due_at <= timezone.now()  # the relay's now
    assert cache.get(sweeping.wake_key("test.swept")) is None  # the next commit tries again


@pytest.mark.django_db(transaction=True)
def test_a_cache_that_fails_makes_the_row_the_relays_at_once(monkeypatch, published):
    def broken(*args, **kwargs):
        raise ConnectionError("the cache is down")

    monkeypatch.setattr(sweeping.cache, "add", broken)
    row = _write()
    row.refresh_from_db()

    assert published == []
    assert row.due_at is not None and row.due_at <= timezone.now()


@pytest.mark.django_db(transaction=True)
def test_a_delivery_that_fails_is_not_swept_again_but_the_relays_at_its_due_time(published):
    failing, fine = _write(), _write()
    FAILS.add(failing.pk)

    assert outbox_sweep(topic="test.swept", gather=0) == "delivered=1 failed=1"
    assert outbox_sweep(topic="test.swept", gather=0) == "delivered=0 failed=0"

    failing.refresh_from_db()
    assert RUNS == Counter({fine.pk: 1})
    assert failing.fired_at is not None and failing.processing_until is None
    assert "the receiver's side broke" in failing.last_error
    FAILS.clear()
    assert _relay_after_grace() == [failing.pk]


@pytest.mark.django_db(transaction=True)
def test_a_claim_takes_only_rows_due_never_fired_and_free_oldest_first(published):
    now = timezone.now()
    first, second = _write(), _write()
    timer_later = None
    with transaction.atomic():
        timer_later = timer_schedule(
            key="later", topic="test.swept", payload={}, due_at=now + timedelta(minutes=5)
        )
    fired = _write()
    OutboxMessage.objects.filter(pk=fired.pk).update(fired_at=now)  # the relay handed it over
    leased = _write()
    OutboxMessage.objects.filter(pk=leased.pk).update(processing_until=now + timedelta(seconds=30))
    _write(topic="test.other")

    claimed = claim_unfired(topic="test.swept", limit=10, now=timezone.now())

    assert [m.pk for m in claimed] == [first.pk, second.pk]
    assert all(m.already_ran == [] and (m.processing_until or now) > now for m in claimed)
    assert timer_later.pk not in [m.pk for m in claimed]
    # Leased by this claim: a second one finds nothing.
    assert claim_unfired(topic="test.swept", limit=10, now=timezone.now()) == []


@pytest.mark.django_db(transaction=True)
def test_two_sweeps_claiming_at_once_take_different_rows(published):
    """Two real connections: the first holds its claim's row locks open, the
    second skips them."""
    rows = [_write() for _ in range(4)]
    claimed_first: list[int] = []
    holding, release = threading.Event(), threading.Event()

    def first_sweep():
        try:
            with transaction.atomic():
                claimed_first.extend(
                    m.pk for m in claim_unfired(topic="test.swept", limit=2, now=timezone.now())
                )
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=first_sweep)
    thread.start()
    try:
        assert holding.wait(10)
        second = [m.pk for m in claim_unfired(topic="test.swept", limit=10, now=timezone.now())]
    finally:
        release.set()
        thread.join(10)

    assert claimed_first == [rows[0].pk, rows[1].pk]
    assert second == [rows[2].pk, rows[3].pk]


@pytest.mark.django_db(transaction=True)
def test_a_sweep_whose_cache_fails_still_delivers_every_row(published, monkeypatch):
    rows = [_write(), _write(), _write()]

    def broken(*args, **kwargs):
        raise ConnectionError("the cache is down")

    with monkeypatch.context() as patched:
        patched.setattr(sweeping.cache, "delete", broken)
        assert outbox_sweep(topic="test.swept", gather=0) == "delivered=3 failed=0"
    assert RUNS == Counter({row.pk: 1 for row in rows})


@pytest.mark.django_db(transaction=True)
def test_a_claims_rows_close_in_one_transaction_their_records_together(published):
    rows = [_write(topic="test.recorded") for _ in range(3)]

    assert outbox_sweep(topic="test.recorded", gather=0) == "delivered=3 failed=0"

    # Batches of 2: the first claim's two records in one call, the last alone.
    assert CLOSED == [[rows[0].pk, rows[1].pk], [rows[2].pk]]
    done = [OutboxMessage.objects.get(pk=row.pk) for row in rows]
    assert all(m.completed_at is not None and m.last_error == "recorded" for m in done)
    # One closing transaction per claim: the first two settled by one statement.
    assert done[0].completed_at == done[1].completed_at != done[2].completed_at
    assert {e.message_id for e in InboxEntry.objects.all()} == {row.pk for row in rows}
    assert _relay_after_grace() == []


@pytest.mark.django_db(transaction=True)
def test_a_row_whose_record_fails_fails_alone_and_its_neighbour_still_settles(published):
    good, bad = _write(topic="test.recorded"), _write(topic="test.recorded")
    BROKEN_RECORDS.add(bad.pk)

    assert outbox_sweep(topic="test.recorded", gather=0) == "delivered=1 failed=1"

    # Together first (rolled back), then each alone.
    assert CLOSED == [[good.pk]]
    good.refresh_from_db()
    bad.refresh_from_db()
    assert good.completed_at is not None and good.last_error == "recorded"
    assert bad.completed_at is None and bad.processing_until is None
    assert "this record cannot be written" in bad.last_error
    # Its consumer ran but its record did not commit: it has not finished.
    assert not InboxEntry.objects.filter(message_id=bad.pk).exists()
    assert InboxEntry.objects.filter(message_id=good.pk).count() == 1
    BROKEN_RECORDS.clear()
    assert _relay_after_grace() == [bad.pk]


class _Clock:
    """time.monotonic for the sweep and the delivery: each consumer's run
    takes ``step`` seconds of it."""

    def __init__(self, step: float):
        self.at, self.step = 1000.0, step

    def monotonic(self) -> float:
        return self.at

    def sleep(self, seconds: float) -> None:
        self.at += seconds


CLOCK = _Clock(step=0)


def slow_recording_consumer(message):
    CLOCK.at += CLOCK.step
    return recording_consumer(message)


@pytest.mark.django_db(transaction=True)
def test_rows_that_no_longer_fit_in_the_claims_lease_are_given_back_and_claimed_again(
    published, settings, monkeypatch, caplog
):
    """Lease 30 s, a row may take 10 s, each takes 12: the first row of a
    claim always runs, the second starts at 12 s (ends by 22), the third
    would start at 24 s and could end past the lease: given back."""
    settings.OUTBOX_SWEEP_BATCH = 10
    settings.OUTBOX_CLAIM_LEASE_SECONDS = 30
    settings.OUTBOX_SWEEP_ROW_SECONDS = 10
    clock = _Clock(step=12)
    monkeypatch.setattr(sweeping, "time", clock)
    monkeypatch.setattr("outbox.delivery.time", clock)
    claims: list[list[int]] = []
    real_claim = sweeping.claim_unfired

    def claim(**kwargs):
        claimed = real_claim(**kwargs)
        claims.append([m.pk for m in claimed])
        return claimed

    monkeypatch.setattr(sweeping, "claim_unfired", claim)

    monkeypatch.setattr(f"{HERE}.CLOCK", clock)
    settings.OUTBOX_CONSUMERS = {"test.recorded": [f"{HERE}.slow_recording_consumer"]}
    rows = [_write(topic="test.recorded").pk for _ in range(5)]

    with caplog.at_level(logging.INFO, logger="outbox.sweeping"):
        assert outbox_sweep(topic="test.recorded", gather=0) == "delivered=5 failed=0"

    # Each claim took what was left, oldest first; two rows ran per lease.
    said = "claimed rows given back, their lease too short after slow deliveries"
    assert [(r.getMessage(), r.message_ids) for r in caplog.records if "given" in r.msg] == [
        (f"outbox sweep: 3 of 5 {said}", rows[2:]),
        (f"outbox sweep: 1 of 3 {said}", rows[4:]),
    ]
    assert claims == [rows, rows[2:], rows[4:]]
    assert CLOSED == [rows[:2], rows[2:4], rows[4:]]
    assert RUNS == Counter({pk: 1 for pk in rows})
    done = OutboxMessage.objects.filter(pk__in=rows)
    assert all(m.completed_at is not None and m.fired_at is not None for m in done)
    assert _relay_after_grace() == []


@pytest.mark.django_db(transaction=True)
def test_unclaim_gives_back_only_the_rows_its_claim_still_holds(published):
    mine, expired, settled = _write(), _write(), _write()
    claimed = claim_unfired(topic="test.swept", limit=10, now=timezone.now())
    assert [m.pk for m in claimed] == [mine.pk, expired.pk, settled.pk]
    # Its lease ran out and someone else leased it; another one was settled.
    later = timezone.now() + timedelta(minutes=5)
    OutboxMessage.objects.filter(pk=expired.pk).update(processing_until=later)
    OutboxMessage.objects.filter(pk=settled.pk).update(completed_at=timezone.now())

    assert unclaim(claimed) == 1

    states = {
        m.pk: (m.fired_at is None, m.processing_until)
        for m in OutboxMessage.objects.filter(pk__in=[mine.pk, expired.pk, settled.pk])
    }
    assert states[mine.pk] == (True, None)
    assert states[expired.pk] == (False, later)
    assert states[settled.pk][0] is False and states[settled.pk][1] is not None
    # Free and never fired again: the next claim takes it.
    assert [m.pk for m in claim_unfired(topic="test.swept", limit=10, now=timezone.now())] == [
        mine.pk
    ]
