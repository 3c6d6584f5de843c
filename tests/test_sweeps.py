"""The resumer after each crash point, the chaser, heartbeats, and the cost of
the sweep queries as finished sagas pile up."""

import io
import json
import logging
import os
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from freezegun import freeze_time

from ledger.models import LedgerEntry
from outbox.models import OutboxMessage
from payments.fake_gateway.models import FakeCharge, FakeIntent
from payments.interface import ChargeRequest
from purchases.models import PurchaseSaga, Seat, SweepHeartbeat
from purchases.ops.heartbeats import sweeps_stalled
from purchases.ops.sweeps import stale_sagas, sweep_chase, sweep_resume
from purchases.saga.states import SagaState
from purchases.services import saga_charge, saga_transition

from .conftest import drain_outbox, start_purchase
from .late_charge import charged_while_undone

T0 = "2026-12-02 12:00:00"
LATER = 301  # just past RESUME_AFTER_SECONDS


def _state(saga):
    return PurchaseSaga.objects.get(pk=saga.pk).state


def _charges(saga):
    return FakeCharge.objects.filter(intent_id=saga.intent_id).count()


@pytest.fixture(autouse=True)
def _defaults(settings):
    settings.RESUME_AFTER_SECONDS = 300
    settings.PURCHASE_HOLD_SECONDS = 3600
    settings.COMPENSATION_DEADLINE_SECONDS = 86400


# --- the resumer after each crash point -------------------------------------------


@pytest.mark.django_db
def test_crash_before_the_charge_the_enqueue_was_lost(alice, event, gateway):
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)  # committed; the task never arrived
        clock.tick(LATER)
        report = sweep_resume()

    assert [(line.saga_id, line.state, line.result) for line in report.lines] == [
        (str(saga.pk), "PENDING", "CONFIRMED")
    ]
    assert _charges(saga) == 1
    assert PurchaseSaga.objects.get(pk=saga.pk).history.filter(actor="resumer").exists()


@pytest.mark.django_db
def test_crash_after_the_charge_before_recording_it_charges_once(alice, event, gateway):
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)
        # The worker committed CHARGING, the gateway charged, the worker died.
        saga_transition(saga_id=saga.pk, to=SagaState.CHARGING, reason="charge started")
        gateway.charge(
            ChargeRequest(
                intent_id=saga.intent_id,
                amount=saga.amount,
                currency=saga.currency,
                payment_method="pm_card_visa",
            )
        )
        gateway.calls.clear()
        clock.tick(LATER)
        sweep_resume()

    assert _state(saga) == "CONFIRMED"
    assert _charges(saga) == 1
    assert gateway.calls == [("retrieve", saga.intent_id)]  # looked up, never re-sent
    assert LedgerEntry.objects.filter(intent_id=saga.intent_id).count() == 1


@pytest.mark.django_db
def test_a_resent_charge_is_replayed_by_the_gateway_not_doubled(alice, event, gateway):
    # The charge went through and the answer was lost before CHARGING was
    # even committed (the worker's first commit rolled back on a restart):
    # resuming PENDING re-sends the charge with the same intent id, and the
    # gateway replays the original.
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)
        first = gateway.charge(
            ChargeRequest(
                intent_id=saga.intent_id,
                amount=saga.amount,
                currency=saga.currency,
                payment_method="pm_card_visa",
            )
        )
        clock.tick(LATER)
        sweep_resume()

    assert _state(saga) == "CONFIRMED"
    assert _charges(saga) == 1
    assert LedgerEntry.objects.get(intent_id=saga.intent_id).gateway_reference == first.charge_id


@pytest.mark.django_db
def test_crash_after_recording_a_decline_before_compensating(alice, event, gateway):
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_chargeDeclined")
        saga_transition(saga_id=saga.pk, to=SagaState.CHARGING, reason="charge started")
        saga_transition(saga_id=saga.pk, to=SagaState.PAYMENT_FAILED, reason="declined")
        clock.tick(LATER)
        sweep_resume()
        drain_outbox()

    assert _state(saga) == "COMPENSATED"
    assert Seat.objects.get(event=event, ref="A1").status == "available"


@pytest.mark.django_db
def test_crash_after_the_refund_before_recording_it_refunds_once(alice, event, gateway):
    from purchases.services import saga_compensate

    with freeze_time(T0) as clock:
        # A charge that landed on a purchase being undone: its compensation
        # owes the refund (a confirmed purchase's refunds are rows of their own).
        saga = charged_while_undone(alice, event)
        saga_transition(saga_id=saga.pk, to=SagaState.COMPENSATING, reason="compensating")
        gateway.refund(saga.intent_id, idempotency_key=f"refund:{saga.intent_id}")  # then died
        clock.tick(LATER)
        sweep_resume()

    assert _state(saga) == "COMPENSATED"
    assert FakeIntent.objects.get(pk=saga.intent_id).status == "refunded"
    assert list(
        LedgerEntry.objects.filter(intent_id=saga.intent_id).values_list("kind", flat=True)
    ) == ["charge", "refund"]
    assert saga_compensate(saga_id=saga.pk).state == "COMPENSATED"  # and again: nothing


@pytest.mark.django_db
def test_resumer_leaves_fresh_sagas_and_sagas_on_a_timer_alone(alice, bob, event, gateway):
    with freeze_time(T0) as clock:
        on_timer = start_purchase(
            alice, event, seats=["A1"], payment_method="pm_card_timeout_charged"
        )
        saga_charge(saga_id=on_timer.pk)  # UNKNOWN, probe armed
        clock.tick(LATER)
        fresh = start_purchase(bob, event, seats=["A2"])
        report = sweep_resume()

    assert report.lines == []
    assert _state(fresh) == "PENDING" and _state(on_timer) == "UNKNOWN"


@pytest.mark.django_db
def test_dry_run_changes_nothing_and_says_what_it_would_do(alice, event, gateway):
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)
        clock.tick(LATER)
        out = io.StringIO()
        call_command("resume_sagas", "--dry-run", stdout=out)

    assert _state(saga) == "PENDING"
    assert gateway.calls == []
    assert str(saga.pk) in out.getvalue() and "would resume 1 saga(s)" in out.getvalue()


@pytest.mark.django_db
def test_limit_and_older_than(alice, event, gateway):
    with freeze_time(T0) as clock:
        sagas = [start_purchase(alice, event, seats=[ref]) for ref in ("A1", "A2", "A3")]
        clock.tick(100)
        assert sweep_resume(older_than=200).lines == []
        report = sweep_resume(older_than=50, limit=2)

    assert len(report.lines) == 2
    assert sorted(_state(s) for s in sagas) == ["CONFIRMED", "CONFIRMED", "PENDING"]


# --- heartbeats ---------------------------------------------------------------------


@pytest.mark.django_db
def test_each_run_leaves_a_heartbeat_and_a_silent_sweep_is_an_alert(alice, event, gateway, caplog):
    with freeze_time(T0) as clock:
        start_purchase(alice, event)
        clock.tick(LATER)
        sweep_resume()
        beat = SweepHeartbeat.objects.get(name="resume_sagas")
        assert (beat.rows_seen, beat.rows_acted) == (1, 1)
        assert beat.last_succeeded_at == timezone.now()
        assert sweeps_stalled() == []

        clock.tick(2 * beat.interval_seconds + 1)
        with caplog.at_level(logging.ERROR, logger="purchases"):
            assert sweeps_stalled() == ["resume_sagas"]
            assert sweeps_stalled() == ["resume_sagas"]
        alerts = [r for r in caplog.records if getattr(r, "alert", "") == "sweep_stalled"]
        assert len(alerts) == 1  # once per silence

        sweep_resume()
        assert sweeps_stalled() == []


@pytest.mark.django_db
def test_a_failing_sweep_records_its_failure(monkeypatch):
    from purchases.ops import sweeps

    def broken(**kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(sweeps, "stale_sagas", broken)
    with pytest.raises(RuntimeError):
        sweep_resume()
    beat = SweepHeartbeat.objects.get(name="resume_sagas")
    assert beat.last_succeeded_at is None and "database went away" in beat.last_error


# --- the chaser ---------------------------------------------------------------------


@pytest.mark.django_db
def test_chaser_escalates_each_overdue_compensation_once(alice, event, faulty_gateway):
    from purchases.services import saga_compensate

    with freeze_time(T0) as clock:
        saga = charged_while_undone(alice, event)
        faulty_gateway.down("refund")
        assert saga_compensate(saga_id=saga.pk).state == "COMPENSATION_PENDING"
        assert sweep_chase() == []  # not overdue yet

        clock.tick(86400 + 1)
        first = sweep_chase()
        second = sweep_chase()

    assert [(line.saga_id, line.alerted) for line in first] == [(str(saga.pk), True)]
    assert [(line.saga_id, line.alerted) for line in second] == [(str(saga.pk), False)]
    assert (
        OutboxMessage.objects.filter(topic="purchase.needs_operator", saga_id=saga.pk).count() == 1
    )


@pytest.mark.django_db
def test_chaser_does_not_repeat_the_alert_raised_at_escalation(alice, event, gateway):
    saga = start_purchase(alice, event)
    for to in (SagaState.CHARGING, SagaState.UNKNOWN, SagaState.UNKNOWN_EXPIRED):
        saga_transition(saga_id=saga.pk, to=to, reason="test")
    out = io.StringIO()

    call_command("chase_compensations", stdout=out)
    call_command("chase_compensations", stdout=out)

    assert (
        OutboxMessage.objects.filter(topic="purchase.needs_operator", saga_id=saga.pk).count() == 1
    )
    assert "1 new alert(s)" in out.getvalue() and "0 new alert(s)" in out.getvalue()


# --- the sweep queries do not grow with finished sagas -------------------------------


def _add_finished_sagas(n: int, event_id: int, buyer_id: int, offset: int = 0) -> None:
    """n COMPENSATED sagas (with their reservations), set-based."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH r AS (
              INSERT INTO purchases_reservation
                (ref, event_id, buyer_id, status, hold_expires_at, total_amount, currency,
                 created_at)
              SELECT 'X' || (%s + g), %s, %s, 'CANCELLED', now(), 100,
                     'EUR', now() - interval '1 day'
              FROM generate_series(1, %s) g
              RETURNING id, ref
            )
            INSERT INTO purchases_purchasesaga
              (id, reservation_id, event_id, buyer_id, intent_id, payment_method, amount,
               currency, state, version, attempts, created_at, updated_at)
            SELECT gen_random_uuid(), r.id, %s, %s, 'pi_' || r.ref, 'pm_card_visa', 100, 'EUR',
                   'COMPENSATED', 3, 1, now() - interval '1 day', now() - interval '1 day'
            FROM r
            """,
            [offset, event_id, buyer_id, n, event_id, buyer_id],
        )
        # The reservations too, though the resumer never reads them: each
        # saga's foreign key on its reservation is checked at the test's end
        # (deferred), with the plan this connection cached from the last
        # statistics of purchases_reservation. An ANALYZE outlives the
        # rollback of its transaction, and tests/test_bench_fixtures.py leaves
        # a table of a few rows: a sequential scan per saga, 15 s for 20,000.
        cursor.execute("ANALYZE purchases_reservation")
        cursor.execute("ANALYZE purchases_purchasesaga")


def _plan(queryset) -> dict:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        return cursor.fetchone()[0][0]


def _nodes(plan):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _saga_scan(plan) -> dict:
    return next(
        n for n in _nodes(plan["Plan"]) if n.get("Relation Name") == "purchases_purchasesaga"
    )


@pytest.mark.django_db
def test_the_resumer_query_is_index_backed_and_flat_in_finished_sagas(alice, event):
    with freeze_time(T0):
        for ref in ("A1", "A2"):
            start_purchase(alice, event, seats=[ref])
    now = timezone.now() + timedelta(seconds=LATER)

    reads = {}
    added = 0
    for total_finished in (2_000, 20_000):
        _add_finished_sagas(total_finished - added, event.pk, alice.pk, offset=added)
        added = total_finished
        plan = _plan(stale_sagas(older_than=300, now=now))
        scan = _saga_scan(plan)
        assert scan.get("Index Name") == "saga_live_idx", json.dumps(scan, indent=1)
        assert scan["Actual Rows"] == 2
        reads[total_finished] = scan["Shared Hit Blocks"] + scan.get("Shared Read Blocks", 0)

    print("resumer query pages touched:", reads)
    # Ten times the finished sagas, the same pages touched (give or take one).
    assert reads[20_000] <= reads[2_000] + 1, reads


@pytest.mark.django_db
def test_a_saga_behind_a_timer_overdue_past_the_threshold_is_resumed(
    alice, event, gateway, settings
):
    settings.RECONCILE_BACKOFF_SECONDS = [60, 60]
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
        saga_charge(saga_id=saga.pk)  # UNKNOWN, probe due at +60 ... never delivered
        clock.tick(60 + 299)
        assert sweep_resume().lines == []  # the probe is late, not yet abandoned
        clock.tick(2)
        report = sweep_resume()

    assert [line.result for line in report.lines] == ["CONFIRMED"]


def test_the_beat_schedule_follows_the_sweep_settings():
    import subprocess
    import sys

    script = (
        "import django, json; django.setup(); from django.conf import settings; "
        "print(json.dumps(settings.CELERY_BEAT_SCHEDULE))"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "RESUME_SWEEP_SECONDS": "7",
        "CHASE_SWEEP_SECONDS": "11",
    }
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout
    schedule = json.loads(out)

    assert schedule["resume-sagas"] == {
        "task": "purchases.resume_sagas",
        "schedule": 7.0,
        "options": {"expires": 7.0},
    }
    assert schedule["chase-compensations"]["schedule"] == 11.0
    assert schedule["audit-sagas"]["schedule"] == 86400.0


@pytest.mark.django_db
def test_the_stall_alert_uses_the_configured_interval(settings):
    settings.SWEEP_INTERVALS = {**settings.SWEEP_INTERVALS, "resume_sagas": 5}
    with freeze_time(T0) as clock:
        sweep_resume()
        clock.tick(11)
        assert sweeps_stalled() == ["resume_sagas"]
    assert SweepHeartbeat.objects.get(name="resume_sagas").interval_seconds == 5
