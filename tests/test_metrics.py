"""/metrics exposes the series operators alert on."""

import re

import pytest
from django.db import transaction
from django.utils import timezone
from freezegun import freeze_time

from outbox.services import outbox_publish
from purchases.models import AuditRun
from purchases.ops.sweeps import sweep_resume
from purchases.services import saga_charge

from .conftest import drain_outbox, start_purchase


def _value(text: str, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = (
        rf"^{re.escape(name)}(\{{{re.escape(want)}\}})? (\S+)$"
        if want
        else rf"^{re.escape(name)} (\S+)$"
    )
    for line in text.splitlines():
        if m := re.match(pattern, line):
            return float(m.groups()[-1])
    raise AssertionError(f"{name}{{{want}}} not exposed")


@pytest.mark.django_db
def test_metrics_expose_state_and_events(alice, bob, event, gateway, client, settings):
    settings.RECONCILE_BACKOFF_SECONDS = [60]
    with freeze_time("2026-12-02 12:00:00") as clock:
        confirmed = start_purchase(alice, event, seats=["A1"])
        saga_charge(saga_id=confirmed.pk)
        start_purchase(bob, event, seats=["A2"])  # stays PENDING
        unknown = start_purchase(bob, event, seats=["A3"], payment_method="pm_card_unreachable")
        saga_charge(saga_id=unknown.pk)
        probes_before = _probes(client, "requires_payment")
        with transaction.atomic():
            outbox_publish(topic="nobody.listens", payload={})
        clock.tick(90)
        sweep_resume(older_than=10_000)
        AuditRun.objects.create(started_at=timezone.now(), finished_at=timezone.now(), violations=3)
        text = client.get("/metrics").content.decode()
        drain_outbox()  # the reconcile probe (requires_payment), the escalation
        after = client.get("/metrics").content.decode()

    assert _value(text, "boxoffice_sagas", state="CONFIRMED") == 1
    assert _value(text, "boxoffice_sagas", state="PENDING") == 1
    assert _value(text, "boxoffice_sagas", state="UNKNOWN") == 1
    assert _value(text, "boxoffice_sagas", state="COMPENSATED") == 0
    # The confirmation, the unconsumed event and the due probe; nothing relayed.
    assert _value(text, "boxoffice_outbox_backlog") == 3
    assert _value(text, "boxoffice_outbox_oldest_due_age_seconds") == 90
    assert _value(text, "boxoffice_sweep_stalled", sweep="resume_sagas") == 0
    assert _value(text, "boxoffice_sweep_last_success_age_seconds", sweep="resume_sagas") == 0
    assert _value(text, "boxoffice_audit_violations") == 3
    assert (
        _value(text, "boxoffice_gateway_requests_total", method="charge", outcome="succeeded") >= 1
    )
    assert _value(text, "boxoffice_gateway_latency_seconds_count", method="charge") >= 2
    assert (
        _value(after, "boxoffice_reconcile_probes_total", answer="requires_payment")
        == probes_before + 1
    )
    assert _value(after, "boxoffice_operator_alerts_raised") == 1
    assert _value(after, "boxoffice_alerts_total", kind="saga_needs_operator") >= 1
    assert _value(after, "boxoffice_timer_fire_lag_seconds_count") >= 1


def _probes(client, answer) -> float:
    try:
        return _value(
            client.get("/metrics").content.decode(),
            "boxoffice_reconcile_probes_total",
            answer=answer,
        )
    except AssertionError:
        return 0.0


@pytest.mark.django_db(transaction=True)
def test_transitions_and_fire_lag_are_counted_on_commit(gateway, client):
    from .factories import EventFactory, UserFactory

    def scrape():
        return client.get("/metrics").content.decode()

    def transitions():
        return _value(
            scrape(),
            "boxoffice_saga_transitions_total",
            from_state="CHARGING",
            to_state="CONFIRMED",
        )

    def lag_count():
        return _value(scrape(), "boxoffice_timer_fire_lag_seconds_count")

    try:
        before, lag_before = transitions(), lag_count()
    except AssertionError:
        before, lag_before = 0.0, 0.0
    saga = start_purchase(UserFactory(username="m"), EventFactory(seats=["A1"]))
    saga_charge(saga_id=saga.pk)
    drain_outbox()

    assert transitions() == before + 1
    assert lag_count() >= lag_before + 1  # the purchase.confirmed row was handed over


def test_every_alert_kind_is_exposed_at_zero_before_its_first_alert():
    # A fresh process: nothing has been raised yet. A series that first
    # appears at 1 would hide the first alert from PromQL's increase().
    import subprocess
    import sys
    from pathlib import Path

    from config.metrics import ALERT_KINDS

    root = Path(__file__).resolve().parent.parent
    raised = set()
    for path in root.glob("[a-z]*/**/*.py"):
        if ".venv" not in path.parts and "tests" not in path.parts:
            raised |= set(re.findall(r'ALERTS\.labels\(kind="([a-z_]+)"\)', path.read_text()))
    assert raised and raised <= set(ALERT_KINDS), raised - set(ALERT_KINDS)

    text = subprocess.run(
        [
            sys.executable,
            "-c",
            "from prometheus_client import REGISTRY, generate_latest; "
            "import config.metrics; print(generate_latest(REGISTRY).decode())",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for kind in ALERT_KINDS:
        assert _value(text, "boxoffice_alerts_total", kind=kind) == 0
