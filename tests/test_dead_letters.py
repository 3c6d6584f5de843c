"""Redeliveries back off over days; a message that still fails is a dead
letter: marked on its row, one alert, listed in the admin, replayable through
the inbox (command and admin action), and a consumer added later can be
backfilled from history with the same command."""

import io
import logging
import re
import threading
from collections import Counter
from datetime import datetime, timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.core import mail
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection, transaction
from django.utils import timezone
from freezegun import freeze_time

from config.metrics import ALERTS
from outbox.delivery import message_deliver
from outbox.models import InboxEntry, OutboxMessage
from outbox.relay import dead_letters, relay_tick
from outbox.services import outbox_publish, timer_cancel, timer_schedule
from purchases.models import DailySales
from purchases.services import saga_charge

from .conftest import start_purchase
from .factories import UserFactory

T0 = "2026-12-02 12:00:00"
CHANGELIST = "/admin/outbox/outboxmessage/"
HERE = "tests.test_dead_letters"
OK, FLAKY, LATE, ALSO_LATE = (
    f"{HERE}.{name}"
    for name in ("ok_consumer", "flaky_consumer", "late_consumer", "also_late_consumer")
)

# --- test consumers: each counts its successful runs per message ---------------------

RUNS: Counter = Counter()
BROKEN: set[str] = set()


def ok_consumer(message):
    RUNS[OK, message.pk] += 1


def flaky_consumer(message):
    if FLAKY in BROKEN:
        raise ConnectionError(BROKEN_WHY.get(FLAKY, "the warehouse is unreachable"))
    RUNS[FLAKY, message.pk] += 1


def late_consumer(message):
    RUNS[LATE, message.pk] += 1


def also_late_consumer(message):
    RUNS[ALSO_LATE, message.pk] += 1


BROKEN_WHY: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _reset_consumers():
    RUNS.clear()
    BROKEN.clear()
    BROKEN_WHY.clear()
    yield
    BROKEN.clear()


def _runs(consumer) -> dict[int, int]:
    return {pk: n for (name, pk), n in RUNS.items() if name == consumer}


# --- driving the relay and the workers by hand ----------------------------------------


def _pass(now=None) -> list[int]:
    """One relay pass, then each handed-over row delivered the way a worker
    does it: a failing consumer fails the task, not the hand-over."""
    handed: list[int] = []
    relay_tick(now=now, dispatch=handed.append)
    for message_id in handed:
        try:
            message_deliver(message_id=message_id, now=now)
        except Exception:  # the task failed; the row is still the obligation
            pass
    return handed


def _drain(now=None) -> None:
    for _ in range(20):
        if not _pass(now):
            return


def _publish(topic="test.event", payload=None, **kw) -> OutboxMessage:
    with transaction.atomic():
        return outbox_publish(topic=topic, payload=payload or {}, **kw)


def _route(settings, routing) -> None:
    settings.OUTBOX_CONSUMERS = routing


def _alerts_raised() -> float:
    return ALERTS.labels(kind="outbox_dead_letter")._value.get()


def _dead_letter(settings, clock, schedule=(200,)) -> OutboxMessage:
    """A message whose consumer ``ok`` ran and ``flaky`` kept failing until
    the schedule ran out."""
    settings.OUTBOX_REDELIVER_SECONDS = list(schedule)
    _route(settings, {"test.event": [OK, FLAKY]})
    BROKEN.add(FLAKY)
    message = _publish(payload={"n": 1})
    for _ in range(22):
        _pass()
        clock.tick(max(schedule) + 1)
    assert list(dead_letters()) == [message], "the schedule should have run out"
    return message


def _run_command(*args, **options) -> str:
    out = io.StringIO()
    call_command("outbox_replay", *args, stdout=out, **options)
    return out.getvalue()


# --- the schedule -----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_consumer_failing_for_three_hours_converges_without_an_operator(settings):
    # given: the default schedule, and a consumer that fails for three hours
    _route(settings, {"test.event": [OK, FLAKY]})
    BROKEN.add(FLAKY)
    with freeze_time(T0) as clock:
        message = _publish(payload={"n": 1})

        # when: the relay passes every minute for five hours; the consumer
        # is repaired after three
        for minute in range(5 * 60):
            if minute == 3 * 60:
                BROKEN.discard(FLAKY)
            _pass()
            clock.tick(60)

    # then: it converged by itself, each consumer ran once, nobody was alerted
    message.refresh_from_db()
    assert message.completed_at is not None, (
        f"not completed: {message.deliveries} deliveries, then given up"
    )
    assert message.dead_at is None
    assert _runs(OK) == {message.pk: 1} and _runs(FLAKY) == {message.pk: 1}


@pytest.mark.django_db
def test_redeliveries_happen_at_the_configured_offsets_not_before(settings):
    # given
    settings.OUTBOX_REDELIVER_SECONDS = [10, 30, 60]
    _route(settings, {"test.event": [FLAKY]})
    BROKEN.add(FLAKY)
    handed_at: list[int] = []
    due_after: list[datetime] = []
    with freeze_time(T0) as clock:
        t0 = timezone.now()
        message = _publish()

        # when: a relay pass every second
        for second in range(250):
            if _pass():
                handed_at.append(second)
                due = OutboxMessage.objects.filter(pk=message.pk).values().get().get("due_at")
                assert due is not None  # each hand-over wrote when the next step is due
                due_after.append(due)
            clock.tick(1)

    # then: handed over at 0, +10, +30, +60 (the schedule), and each hand-over
    # wrote when the next step is due; after the last one the row had one
    # more interval to complete, then it was a dead letter
    assert handed_at == [0, 10, 40, 100]
    assert [int((at - t0).total_seconds()) for at in due_after] == [10, 40, 100, 160]
    message.refresh_from_db()
    assert message.deliveries == 4 and message.completed_at is None
    assert message.dead_at == t0 + timedelta(seconds=160)
    assert message.fired_at == t0


@pytest.mark.django_db
def test_a_row_its_worker_completed_before_the_relay_marked_it_is_fired_and_settled(settings):
    # The relay publishes, then marks fired in its next commit; a fast worker
    # can complete the row in between.
    from outbox.relay import relay_claim, relay_mark_fired

    _route(settings, {"test.timer": [OK]})
    with transaction.atomic():
        timer = timer_schedule(key="t1", topic="test.timer", payload={}, due_at=timezone.now())
    now = timezone.now()
    assert relay_claim(now=now, limit=10) == [timer.pk]
    assert message_deliver(message_id=timer.pk) == "delivered"

    relay_mark_fired(ids=[timer.pk], now=now)

    timer.refresh_from_db()
    assert timer.fired_at == now and timer.completed_at is not None
    assert timer.due_at is None  # settled: not in the claim's index
    with transaction.atomic():
        assert timer_cancel(key="t1").status == "already_fired"
    assert relay_tick(now=now + timedelta(days=30), dispatch=lambda _: None) == 0


@pytest.mark.django_db
def test_a_failed_delivery_records_why_on_the_row(settings, admin_client):
    settings.OUTBOX_REDELIVER_SECONDS = [60]
    _route(settings, {"test.event": [OK, FLAKY]})
    BROKEN.add(FLAKY)
    BROKEN_WHY[FLAKY] = "warehouse said no " + "x" * 5000
    message = _publish()

    _pass()

    message.refresh_from_db()
    assert message.last_error.startswith(f"{FLAKY}: ConnectionError: warehouse said no xx")
    assert len(message.last_error) <= 1000
    assert message.last_error_at is not None
    listing = admin_client.get(CHANGELIST).content.decode()
    assert "ConnectionError: warehouse said no" in listing


# --- the dead letter and its alert --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_dead_letter_raises_one_alert_even_with_relays_racing(settings, caplog):
    # given: a row whose last hand-over's interval has just run out
    settings.OUTBOX_REDELIVER_SECONDS = [200]
    _route(settings, {"test.event": [FLAKY]})
    BROKEN.add(FLAKY)
    message = _publish(saga_id="6f1c8c1e-8d2a-4c1e-9a57-1f6c3b1a0d11")
    start = message.available_at
    assert _pass(now=start) == [message.pk]
    assert _pass(now=start + timedelta(seconds=200)) == [message.pk]
    deadline = start + timedelta(seconds=400)
    alerts_before = _alerts_raised()
    handed: list[int] = []
    barrier = threading.Barrier(2)

    def relay():
        try:
            barrier.wait()
            relay_tick(now=deadline, dispatch=handed.append)
        finally:
            connection.close()

    # when: two relays pass at the deadline at once, then more passes follow
    with caplog.at_level(logging.ERROR, logger="outbox"):
        threads = [threading.Thread(target=relay) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for later in (0, 1, 3600, 86400 * 7):
            relay_tick(now=deadline + timedelta(seconds=later), dispatch=handed.append)

    # then: one alert naming the message, and it is never handed over again
    alerts = [r for r in caplog.records if getattr(r, "alert", "") == "outbox_dead_letter"]
    assert len(alerts) == 1, f"{len(alerts)} dead-letter alerts"
    assert (alerts[0].levelno, alerts[0].message_id, alerts[0].topic, alerts[0].saga_id) == (
        logging.ERROR,
        message.pk,
        "test.event",
        "6f1c8c1e-8d2a-4c1e-9a57-1f6c3b1a0d11",
    )
    assert _alerts_raised() - alerts_before == 1
    assert handed == []
    assert list(dead_letters()) == [message]
    assert OutboxMessage.objects.get(pk=message.pk).dead_at == deadline


@pytest.mark.django_db
def test_a_relay_that_dies_while_marking_a_dead_letter_loses_no_alert(
    settings, caplog, monkeypatch
):
    from outbox import relay

    settings.OUTBOX_REDELIVER_SECONDS = [200]
    _route(settings, {"test.event": [FLAKY]})
    BROKEN.add(FLAKY)
    with freeze_time(T0) as clock:
        message = _publish()
        _pass()
        clock.tick(200)
        _pass()
        clock.tick(200)

        # when: the pass that finds the dead letter dies before it commits
        def dies(*args, **kwargs):
            raise OperationalError("server closed the connection unexpectedly")

        with caplog.at_level(logging.ERROR, logger="outbox"):
            with monkeypatch.context() as patch:
                patch.setattr(relay, "_mark_dead", dies, raising=False)
                with pytest.raises(OperationalError):
                    relay_tick()
            assert OutboxMessage.objects.get(pk=message.pk).dead_at is None
            # then: the next pass marks it and alerts, once
            relay_tick()
            relay_tick()

    alerts = [r for r in caplog.records if getattr(r, "alert", "") == "outbox_dead_letter"]
    assert len(alerts) == 1
    assert OutboxMessage.objects.get(pk=message.pk).dead_at is not None


@pytest.mark.django_db
def test_a_dead_letter_is_listed_in_the_admins_dead_letter_filter(settings, admin_client):
    with freeze_time(T0) as clock:
        dead = _dead_letter(settings, clock)
        BROKEN.discard(FLAKY)
        alive = _publish(payload={"n": 2})
        _drain()

    listed = _listed(admin_client.get(CHANGELIST, {"state": "dead"}))
    completed = _listed(admin_client.get(CHANGELIST, {"state": "completed"}))
    everything = admin_client.get(CHANGELIST)

    assert listed == {dead.pk}
    assert completed == {alive.pk}
    html = everything.content.decode()
    assert "dead" in html and f"{FLAKY}: ConnectionError" in html
    # the row's page: read-only, with what ran and what did not
    page = admin_client.get(f"{CHANGELIST}{dead.pk}/change/")
    text = page.content.decode()
    assert page.status_code == 200 and 'name="_save"' not in text
    assert f"{OK}: ran " in text and f"{FLAKY}: not yet" in text
    # search: by message id, by key (exact), by saga id
    keyed = _publish(key="confirmed:x", saga_id="0d3f9d0a-7a43-4f0a-a8d5-c2a57a3f7e10")
    assert _listed(admin_client.get(CHANGELIST, {"q": str(dead.pk)})) == {dead.pk}
    assert _listed(admin_client.get(CHANGELIST, {"q": "confirmed:x"})) == {keyed.pk}
    assert _listed(admin_client.get(CHANGELIST, {"q": "0d3f9d0a-7a43-4f0a-a8d5-c2a57a3f7e10"})) == {
        keyed.pk
    }


# --- replaying dead letters ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_dead_letter_replayed_by_the_command_runs_each_consumer_once(
    settings, alice, event, gateway, monkeypatch, client
):
    # given: a confirmed purchase whose analytics consumer failed until its
    # schedule ran out (the email went out once)
    settings.OUTBOX_REDELIVER_SECONDS = [200, 200]
    with freeze_time(T0) as clock:
        with monkeypatch.context() as patch:
            patch.setattr("purchases.analytics._add", _locked_table)
            saga_charge(saga_id=start_purchase(alice, event, seats=["A1"]).pk)
            for _ in range(22):
                _drain()
                clock.tick(201)
        confirmed = OutboxMessage.objects.get(topic="purchase.confirmed")
        assert list(dead_letters()) == [confirmed] and len(mail.outbox) == 1
        assert not DailySales.objects.exists()
        assert _gauge(client, "boxoffice_outbox_dead_letters") == 1
        fired_at = confirmed.fired_at

        # when: the cause is fixed and the dead letters are replayed
        out = _run_command()
        _drain()
        again = _run_command()
        _drain()

    # then: analytics counted once, the email was not sent again
    assert f"#{confirmed.pk} purchase.confirmed" in out
    assert "runs purchases.analytics.analytics_on_confirmed" in out
    assert "skips purchases.consumers.confirmation_email" in out
    assert out.strip().endswith("1 message(s) replayed")
    assert again.strip().endswith("0 message(s) replayed")
    confirmed.refresh_from_db()
    assert "OperationalError: daily_sales is locked" in confirmed.last_error
    assert confirmed.completed_at is not None and confirmed.dead_at is None
    assert confirmed.fired_at == fired_at  # the first hand-off stays as it was
    assert DailySales.objects.get().confirmed_count == 1
    assert len(mail.outbox) == 1
    assert _gauge(client, "boxoffice_outbox_dead_letters") == 0


def _locked_table(message, increments, **key):
    raise OperationalError("daily_sales is locked")


@pytest.mark.django_db
def test_a_replayed_dead_letter_restarts_its_schedule_and_can_die_again(settings, caplog):
    with freeze_time(T0) as clock:
        message = _dead_letter(settings, clock, schedule=(200, 300))
        deliveries = OutboxMessage.objects.get(pk=message.pk).deliveries

        # when: replayed while the consumer is still broken
        _run_command("--id", str(message.pk))
        handed_at = []
        seen = len(caplog.records)
        with caplog.at_level(logging.ERROR, logger="outbox"):
            for second in range(0, 1200, 10):
                if _pass():
                    handed_at.append(second)
                clock.tick(10)

    # then: the whole schedule again, then dead again, with a new alert
    message.refresh_from_db()
    assert handed_at == [0, 200, 500]
    assert message.deliveries == deliveries + 3
    assert message.dead_at is not None
    assert (
        len([r for r in caplog.records[seen:] if getattr(r, "alert", "") == "outbox_dead_letter"])
        == 1
    )


@pytest.mark.django_db
def test_the_admin_replay_shows_a_dry_run_asks_a_reason_and_runs_each_consumer_once(
    settings, client
):
    operator = _staff("erin", "view_outboxmessage", "replay_outboxmessage")
    client.force_login(operator)
    with freeze_time(T0) as clock:
        message = _dead_letter(settings, clock)
        BROKEN.discard(FLAKY)
        assert _runs(OK) == {message.pk: 1} and _runs(FLAKY) == {}

        # when: the dry run
        dry = _post_replay(client, [message])
        # then: it says what would run, and nothing changed
        html = dry.content.decode()
        assert dry.status_code == 200
        assert "admin/outbox/outboxmessage/replay_confirm.html" in {t.name for t in dry.templates}
        assert FLAKY in html and OK in html and 'name="reason"' in html
        assert OutboxMessage.objects.get(pk=message.pk).dead_at is not None

        # when: confirmed without a reason: nothing
        _post_replay(client, [message], confirm=True, reason="")
        assert OutboxMessage.objects.get(pk=message.pk).dead_at is not None

        # when: confirmed with a reason
        done = _post_replay(client, [message], confirm=True, reason="warehouse is back")
        _drain()

    assert done.status_code in (200, 302)
    message.refresh_from_db()
    assert message.completed_at is not None and message.dead_at is None
    assert _runs(OK) == {message.pk: 1} and _runs(FLAKY) == {message.pk: 1}
    log = LogEntry.objects.get(object_id=str(message.pk), user=operator)
    assert "warehouse is back" in log.change_message and FLAKY in log.change_message


# --- backfilling a consumer added later -----------------------------------------------------


def _history(settings, clock) -> dict[str, OutboxMessage]:
    """Completed messages routed to ``ok`` only, an hour apart."""
    _route(settings, {"test.event": [OK], "test.other": [OK]})
    made = {}
    for name, topic in (
        ("first", "test.event"),
        ("second", "test.event"),
        ("third", "test.event"),
        ("other", "test.other"),
    ):
        made[name] = _publish(topic=topic, payload={"name": name})
        _drain()
        clock.tick(3600)
    assert OutboxMessage.objects.filter(completed_at__isnull=True).count() == 0
    return made


@pytest.mark.django_db
def test_a_consumer_added_later_is_backfilled_once_for_each_old_message(settings):
    with freeze_time(T0) as clock:
        old = _history(settings, clock)
        # given: two consumers routed later; only one is asked to catch up
        _route(settings, {"test.event": [OK, LATE, ALSO_LATE], "test.other": [OK]})

        # when
        out = _run_command("--consumer", LATE)
        _drain()
        again = _run_command("--consumer", LATE)
        _drain()

    # then: LATE ran once for each old message of its topic, nothing else ran
    event_ids = {old[n].pk for n in ("first", "second", "third")}
    assert _runs(LATE) == dict.fromkeys(event_ids, 1)
    assert _runs(ALSO_LATE) == {}
    assert _runs(OK) == dict.fromkeys(event_ids | {old["other"].pk}, 1)
    assert _lines(out) == event_ids
    assert out.count(f"runs {LATE}") == 3 and ALSO_LATE not in out
    assert out.strip().endswith("3 message(s) replayed")
    assert again.strip().endswith("0 message(s) replayed")
    assert OutboxMessage.objects.filter(completed_at__isnull=True).count() == 0
    assert InboxEntry.objects.filter(consumer=LATE).count() == 3


@pytest.mark.django_db
def test_a_backfill_dry_run_changes_nothing_and_the_filters_select(settings):
    with freeze_time(T0) as clock:
        old = _history(settings, clock)
        _route(settings, {"test.event": [OK, LATE], "test.other": [OK, LATE]})
        before = _snapshot()

        everything = _run_command("--consumer", LATE, "--dry-run")
        by_topic = _run_command("--consumer", LATE, "--topic", "test.other", "--dry-run")
        by_id = _run_command(
            "--consumer",
            LATE,
            "--id",
            str(old["first"].pk),
            "--id",
            str(old["third"].pk),
            "--dry-run",
        )
        second_at = old["second"].created_at
        by_time = _run_command(
            "--consumer",
            LATE,
            "--dry-run",
            "--since",
            (second_at - timedelta(minutes=30)).isoformat(),
            "--until",
            (second_at + timedelta(minutes=30)).isoformat(),
        )
        assert _snapshot() == before  # the dry runs changed nothing
        _drain()

        # when: for real, one topic
        _run_command("--consumer", LATE, "--topic", "test.other")
        _drain()

    assert _lines(everything) == {m.pk for m in old.values()}
    assert everything.strip().endswith("4 message(s) would be replayed (dry run)")
    assert _lines(by_topic) == {old["other"].pk}
    assert _lines(by_id) == {old["first"].pk, old["third"].pk}
    assert _lines(by_time) == {old["second"].pk}
    assert _runs(LATE) == {old["other"].pk: 1}


@pytest.mark.django_db
def test_an_unknown_consumer_is_refused(settings):
    _route(settings, {"test.event": [OK]})
    with pytest.raises(CommandError, match="not routed"):
        _run_command("--consumer", f"{HERE}.nobody")
    with pytest.raises(CommandError, match="ISO 8601"):
        _run_command("--since", "yesterday-ish")


@pytest.mark.django_db
def test_a_cancelled_timer_is_never_replayed(settings):
    _route(settings, {"test.timer": [OK]})
    with transaction.atomic():
        timer = timer_schedule(
            key="t1", topic="test.timer", payload={}, due_at=timezone.now() + timedelta(seconds=60)
        )
        timer_cancel(key="t1")
    _route(settings, {"test.timer": [OK, LATE]})

    by_id = _run_command("--id", str(timer.pk))
    backfill = _run_command("--consumer", LATE)
    _drain(now=timezone.now() + timedelta(hours=1))

    assert f"#{timer.pk}" in by_id and "refused: cancelled" in by_id
    assert by_id.strip().endswith("0 message(s) replayed, 1 refused")
    assert backfill.strip().endswith("0 message(s) replayed")
    timer.refresh_from_db()
    assert timer.fired_at is None and timer.completed_at is None
    assert RUNS == Counter()


# --- permissions -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_replay_action_needs_the_permission(settings, client):
    with freeze_time(T0) as clock:
        message = _dead_letter(settings, clock)
    viewer = _staff("dave", "view_outboxmessage")
    operator = _staff("erin", "view_outboxmessage", "replay_outboxmessage")

    # staff without the permission: may look, is offered no action
    client.force_login(viewer)
    listing = client.get(CHANGELIST)
    assert listing.status_code == 200 and _listed(listing) == {message.pk}
    assert 'value="replay"' not in listing.content.decode()
    assert "action-checkbox" not in listing.content.decode()
    # and a forged POST does nothing, neither the dry run nor the replay
    for confirm in (False, True):
        forged = _post_replay(client, [message], confirm=confirm, reason="forged")
        assert "admin/outbox/outboxmessage/replay_confirm.html" not in {
            t.name for t in forged.templates
        }
    assert OutboxMessage.objects.get(pk=message.pk).dead_at is not None
    assert not LogEntry.objects.exists()

    # staff with it are offered "Replay"
    client.force_login(operator)
    assert 'value="replay"' in client.get(CHANGELIST).content.decode()


# --- helpers ------------------------------------------------------------------------------------


def _staff(username, *codenames):
    user = UserFactory(username=username, is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="outbox", codename__in=codenames)
    )
    return user


def _post_replay(client, messages, *, confirm=False, reason="because"):
    data = {"action": "replay", "_selected_action": [str(m.pk) for m in messages]}
    if confirm:
        data.update(confirm="yes", reason=reason)
    return client.post(CHANGELIST, data)


def _listed(response) -> set[int]:
    assert response.status_code == 200, response.status_code
    return {obj.pk for obj in response.context["cl"].result_list}


def _lines(out: str) -> set[int]:
    """Message ids of the lines that will run something."""
    return {int(m) for m in re.findall(r"^#(\d+) .*: runs ", out, flags=re.M)}


def _snapshot():
    return list(OutboxMessage.objects.order_by("pk").values()), InboxEntry.objects.count()


def _gauge(client, name) -> float:
    text = client.get("/metrics").content.decode()
    match = re.search(rf"^{name} (\S+)$", text, flags=re.M)
    assert match, f"{name} not exposed"
    return float(match.group(1))
