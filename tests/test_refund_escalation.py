"""A refund that never succeeds reaches an operator: the chaser's deadline runs
from when the compensation started (not from the last retry), the alert is
raised once, and a gateway that says "not charged" stops the retries.

Two kinds of refund: the compensation's, owed for a charge that landed on a
purchase being undone (tests/late_charge.py), retried on its backoff; and a
confirmed purchase's refund row (docs/refunds.md: the purchase stays
CONFIRMED), asked of the processor once and then only looked up, whose own
chaser alerts once at ``REFUND_CHASE_SECONDS``.

Time is simulated the way production lives it: every due timer is delivered
as the relay would (``drain_outbox``) and the chaser runs every five minutes.
"""

import pytest
from freezegun import freeze_time

from outbox.models import OutboxMessage
from payments.interface import RefundOutcome, RefundResult
from purchases.models import GatewayAnswer, PurchaseSaga, Refund
from purchases.ops.audit import NO_SILENT_STUCK, audit_run
from purchases.ops.sweeps import sweep_chase, sweep_resume
from purchases.services import purchase_refund, saga_charge, saga_compensate

from .conftest import drain_outbox, start_purchase
from .late_charge import charged_while_undone

T0 = "2026-12-02 12:00:00"
CHASE_EVERY = 300
DEADLINE = 86400


@pytest.fixture(autouse=True)
def _defaults(settings):
    settings.COMPENSATION_DEADLINE_SECONDS = DEADLINE
    settings.REFUND_CHASE_SECONDS = DEADLINE
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
    saga = charged_while_undone(alice, event)
    gateway.down("refund")
    saga = saga_compensate(saga_id=saga.pk)
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
        saga = charged_while_undone(alice, event)
        monkeypatch.setattr(faulty_gateway, "refund", _NotCharged(faulty_gateway))
        saga = saga_compensate(saga_id=saga.pk)
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


# --- a confirmed purchase's refund row ---------------------------------------------------


def _refund_row_stuck(alice, event, gateway) -> Refund:
    """A refund row whose request is lost and whose look-ups never answer."""
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    assert saga.state == "CONFIRMED"
    gateway.down("create_refund")
    gateway.down("retrieve_refund")
    assert purchase_refund(saga_id=saga.pk, reason="customer asked").state == "CONFIRMED"
    drain_outbox()  # asked once: the answer is lost
    return Refund.objects.get(saga_id=saga.pk)


def _calls(gateway, method) -> int:
    return sum(1 for m, _ in gateway.calls if m == method)


@pytest.mark.django_db
def test_a_refund_row_not_settled_is_looked_up_never_resent_and_alerted_once(
    alice, event, faulty_gateway
):
    with freeze_time(T0) as clock:
        refund = _refund_row_stuck(alice, event, faulty_gateway)
        saga = PurchaseSaga.objects.get(pk=refund.saga_id)

        _live(clock, DEADLINE - 600)
        assert _alerts(saga) == []
        _live(clock, 2 * 3600 + 600)  # 26 h in all

        alerts = _alerts(saga)
        report = audit_run(gateway=faulty_gateway)

    refund.refresh_from_db()
    assert refund.status == "pending" and refund.asked
    assert _calls(faulty_gateway, "create_refund") == 1, "a refund in doubt was asked again"
    assert _calls(faulty_gateway, "retrieve_refund") > 40  # looked up, on schedule
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "CONFIRMED"
    assert len(alerts) == 1, [a.payload for a in alerts]
    assert f"refund {refund.pk} still not settled past its deadline" in alerts[0].payload["why"]
    assert (alerts[0].created_at - _ts(T0)).total_seconds() <= DEADLINE + CHASE_EVERY
    assert report.violations == []


@pytest.mark.django_db
def test_the_auditor_reports_a_refund_row_past_its_deadline_that_no_alert_names(
    alice, event, faulty_gateway
):
    with freeze_time(T0) as clock:
        refund = _refund_row_stuck(alice, event, faulty_gateway)
        # The chaser's timer is lost (cancelled by hand): nothing will alert.
        OutboxMessage.objects.filter(key=f"refund-chase:{refund.pk}").update(cancelled_at=_ts(T0))
        _live(clock, DEADLINE + 2 * 3600, chase=False)  # nor is the chaser running
        report = audit_run(gateway=faulty_gateway)

    assert _alerts(PurchaseSaga.objects.get(pk=refund.saga_id)) == []
    assert [(v.invariant, v.saga_id) for v in report.violations] == [
        (NO_SILENT_STUCK, str(refund.saga_id))
    ]
    assert f"refund {refund.pk}" in report.violations[0].detail


@pytest.mark.django_db
def test_the_chaser_sweep_alerts_a_refund_row_whose_timer_never_came_once(
    alice, event, faulty_gateway
):
    with freeze_time(T0) as clock:
        refund = _refund_row_stuck(alice, event, faulty_gateway)
        OutboxMessage.objects.filter(key=f"refund-chase:{refund.pk}").update(cancelled_at=_ts(T0))
        saga = PurchaseSaga.objects.get(pk=refund.saga_id)
        _live(clock, DEADLINE - 600)
        assert _alerts(saga) == []
        _live(clock, 2 * 3600 + 600)  # the sweep every five minutes, past the deadline

        alerts = _alerts(saga)
        report = audit_run(gateway=faulty_gateway)

    assert len(alerts) == 1, [a.payload for a in alerts]
    assert f"refund {refund.pk} still not settled past its deadline" in alerts[0].payload["why"]
    assert (alerts[0].created_at - _ts(T0)).total_seconds() <= DEADLINE + CHASE_EVERY
    assert report.violations == []


@pytest.mark.django_db
def test_a_refund_the_processor_refuses_is_alerted_once_and_never_retried(alice, event, gateway):
    with freeze_time(T0) as clock:
        saga = saga_charge(
            saga_id=start_purchase(alice, event, payment_method="pm_card_refundFail").pk
        )
        purchase_refund(saga_id=saga.pk, reason="customer asked")
        drain_outbox()
        _live(clock, 3600)

    refund = Refund.objects.get(saga_id=saga.pk)
    assert (refund.status, refund.detail) != ("pending", "")
    assert refund.status == "failed"
    assert _calls(gateway, "create_refund") == 1 and _calls(gateway, "retrieve_refund") == 0
    alerts = _alerts(saga)
    assert len(alerts) == 1 and f"refund {refund.pk}" in alerts[0].payload["why"]
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "CONFIRMED"


def _ts(text):
    from datetime import UTC, datetime

    return datetime.fromisoformat(text).replace(tzinfo=UTC)
