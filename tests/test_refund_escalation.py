"""A refund that never succeeds reaches an operator: the chaser's deadline runs
from when the compensation started (not from the last retry), the alert is
raised once, and a gateway that says "not charged" stops the retries.

Time is simulated the way production lives it: every due timer is delivered
as the relay would (``drain_outbox``) and the chaser runs every five minutes.
"""

import pytest
from freezegun import freeze_time

from outbox.models import OutboxMessage
from payments.interface import RefundOutcome, RefundResult
from purchases.models import GatewayAnswer, PurchaseSaga
from purchases.ops.audit import NO_SILENT_STUCK, audit_run
from purchases.ops.sweeps import sweep_chase, sweep_resume
from purchases.services import purchase_refund, saga_charge

from .conftest import drain_outbox, start_purchase

T0 = "2026-12-02 12:00:00"
CHASE_EVERY = 300
DEADLINE = 86400


@pytest.fixture(autouse=True)
def _defaults(settings):
    settings.COMPENSATION_DEADLINE_SECONDS = DEADLINE
    settings.RECONCILE_BACKOFF_SECONDS = [60, 120, 240, 480, 960, 1920]
    settings.PURCHASE_HOLD_SECONDS = 900
    settings.RESUME_AFTER_SECONDS = 300


def _alerts(saga) -> list[OutboxMessage]:
    return list(OutboxMessage.objects.filter(topic="purchase.needs_operator", saga_id=saga.pk))


def _refund_calls(gateway, saga) -> int:
    return sum(
        1 for method, intent in gateway.calls if method == "refund" and intent == saga.intent_id
    )


def _live(clock, seconds: int, *, chase: bool = True) -> None:
    """``seconds`` of production, five minutes at a time: every due timer
    delivered as the relay would, then the resumer and the chaser."""
    for _ in range(seconds // CHASE_EVERY):
        clock.tick(CHASE_EVERY)
        drain_outbox()
        sweep_resume()
        if chase:
            sweep_chase()


def _refund_stuck(alice, event, gateway):
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    assert saga.state == "CONFIRMED"
    gateway.down("refund")
    saga = purchase_refund(saga_id=saga.pk, reason="customer asked")
    assert saga.state == "COMPENSATION_PENDING"
    return saga


@pytest.mark.django_db
def test_a_refund_that_never_succeeds_is_escalated_once_after_the_deadline(
    alice, event, faulty_gateway
):
    with freeze_time(T0) as clock:
        saga = _refund_stuck(alice, event, faulty_gateway)

        _live(clock, DEADLINE - 600)  # the retries go on; not overdue yet
        assert _alerts(saga) == []
        _live(clock, 2 * 3600 + 600)  # 26 h in all

        alerts = _alerts(saga)
        report = audit_run(gateway=faulty_gateway)

    assert _refund_calls(faulty_gateway, saga) > 40  # it kept trying, on schedule
    assert PurchaseSaga.objects.get(pk=saga.pk).state in ("COMPENSATION_PENDING", "COMPENSATING")
    assert len(alerts) == 1, [a.payload for a in alerts]
    assert "deadline" in alerts[0].payload["why"]
    # Raised by the first chase past the deadline, not later.
    started = T0
    assert (alerts[0].created_at - _ts(started)).total_seconds() <= DEADLINE + CHASE_EVERY
    assert report.violations == []


@pytest.mark.django_db
def test_the_auditor_reports_a_compensation_past_its_deadline_that_no_alert_names(
    alice, event, faulty_gateway
):
    with freeze_time(T0) as clock:
        saga = _refund_stuck(alice, event, faulty_gateway)
        _live(clock, DEADLINE + 2 * 3600, chase=False)  # the chaser is not running
        report = audit_run(gateway=faulty_gateway)

    assert _alerts(saga) == []
    assert [(v.invariant, v.saga_id) for v in report.violations] == [
        (NO_SILENT_STUCK, str(saga.pk))
    ]
    assert "deadline" in report.violations[0].detail


class _NotCharged:
    """The gateway's definitive "409 not_charged" to every refund."""

    def __init__(self, gateway):
        self.gateway = gateway

    def __call__(self, intent_id, *, idempotency_key):
        self.gateway.calls.append(("refund", intent_id))
        return RefundResult(RefundOutcome.NOT_CHARGED, detail="not_charged")


@pytest.mark.django_db
def test_not_charged_is_a_contradiction_raised_once_and_the_retries_stop(
    alice, event, faulty_gateway, monkeypatch
):
    with freeze_time(T0) as clock:
        saga = saga_charge(saga_id=start_purchase(alice, event).pk)
        monkeypatch.setattr(faulty_gateway, "refund", _NotCharged(faulty_gateway))
        saga = purchase_refund(saga_id=saga.pk, reason="customer asked")
        assert saga.state == "COMPENSATION_PENDING"
        calls_at_escalation = _refund_calls(faulty_gateway, saga)

        _live(clock, 6 * 3600)

    assert calls_at_escalation == 1
    assert _refund_calls(faulty_gateway, saga) == 1, "the refund was retried after not_charged"
    assert len(_alerts(saga)) == 1
    assert "gateway" in _alerts(saga)[0].payload["why"]
    saga = PurchaseSaga.objects.get(pk=saga.pk)
    assert saga.state == "COMPENSATION_PENDING"
    assert list(
        GatewayAnswer.objects.filter(saga=saga, asked="refund").values_list("answer", flat=True)
    ) == ["not_charged"]


def _ts(text):
    from datetime import UTC, datetime

    return datetime.fromisoformat(text).replace(tzinfo=UTC)
