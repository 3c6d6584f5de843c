"""The auditor's webhook invariant (docs/operations.md, "Management commands"):
every finished saga owes each endpoint that was enabled and subscribed when it
ended exactly one delivery of the type its end calls for (``webhook_missing``),
no delivery announces another end (``webhook_contradicts``), and a delivery
that ran out of attempts is a finding (``webhook_failed``), not a violation:
its own alert was raised when the schedule ran out.

The story of ``tests/test_audit.py`` (one saga of every outcome) with an
endpoint subscribed to every type from an hour before; the deliveries go to
a receiver on 127.0.0.1 that answers 204.

A confirmed purchase's refunds (rows of their own: docs/refunds.md) leave it
CONFIRMED and announce themselves: ``purchase.refunded`` once its refunds
add up to everything, ``purchase.partially_refunded`` while they do not,
``purchase.cancelled`` when its buyer cancels.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from freezegun import freeze_time

from purchases.models import Event
from purchases.ops.audit import audit_run
from purchases.services import purchase_cancel, saga_charge
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.services import webhook_endpoint_create, webhook_endpoint_update

from . import test_audit as base
from .conftest import drain_outbox, start_purchase
from .factories import EventFactory
from .webhook_receiver import Receiver

ALL = [
    "purchase.confirmed",
    "purchase.failed",
    "purchase.refunded",
    "purchase.partially_refunded",
    "purchase.cancelled",
    "purchase.needs_attention",
]
BEFORE = datetime(2026, 12, 2, 11, 0, tzinfo=UTC)  # an hour before the story (T0)
AFTER = datetime(2026, 12, 2, 13, 0, tzinfo=UTC)  # after every saga of the story ended

# The story's fixture, under its own name here (its sagas, the frozen clock).
story = base.story


@pytest.fixture
def receiver_url(settings):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    receiver = Receiver()  # answers 200 to every POST
    yield receiver.url()
    receiver.close()


@pytest.fixture
def endpoint(db, receiver_url) -> WebhookEndpoint:
    return webhook_endpoint_create(url=receiver_url, events=ALL, now=BEFORE)


@pytest.fixture
def hooked(endpoint, request):
    """The story, told with the endpoint listening from the start."""
    return request.getfixturevalue("story")


def _delivery(saga, event_type) -> WebhookDelivery:
    return WebhookDelivery.objects.get(saga_id=saga.pk, event_type=event_type)


def _add_delivery(endpoint, saga, event_type) -> WebhookDelivery:
    return WebhookDelivery.objects.create(
        endpoint=endpoint,
        message_id=f"msg_{uuid.uuid4().hex}",
        event_type=event_type,
        saga_id=saga.pk,
        event_id=saga.event_id,
        body="{}",
        status="delivered",
        created_at=timezone.now(),
        delivered_at=timezone.now(),
    )


def _findings(report) -> list[tuple[str, str]]:
    return [(f.name, f.saga_id) for f in report.findings]


# --- a clean run ----------------------------------------------------------------------


@pytest.mark.django_db
def test_every_finished_saga_has_the_webhook_its_end_calls_for(hooked, endpoint):
    s = hooked

    report = audit_run()

    assert report.violations == [] and report.findings == []
    assert report.counts["webhook_missing"] == report.counts["webhook_contradicts"] == 0
    # What the saga wrote (the compensation decides refunded or failed), all
    # delivered: the auditor's rule agrees with it for every outcome.
    assert sorted(
        (str(d.saga_id), d.event_type, d.status)
        for d in WebhookDelivery.objects.filter(endpoint=endpoint)
    ) == sorted(
        [
            (str(s.visa.pk), "purchase.confirmed", "delivered"),
            (str(s.declined.pk), "purchase.failed", "delivered"),
            (str(s.reconciled.pk), "purchase.confirmed", "delivered"),
            # Confirmed, then refunded (a refund row; the saga stays
            # CONFIRMED): both are owed, neither contradicts.
            (str(s.refunded.pk), "purchase.confirmed", "delivered"),
            (str(s.refunded.pk), "purchase.refunded", "delivered"),
            (str(s.expired_unknown.pk), "purchase.failed", "delivered"),
            # Charged while undone: the compensation refunded it.
            (str(s.undone.pk), "purchase.refunded", "delivered"),
            (str(s.partly.pk), "purchase.confirmed", "delivered"),
            (str(s.partly.pk), "purchase.partially_refunded", "delivered"),
        ]
    )
    assert report.as_dict()["findings"] == []


# --- webhook_missing --------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("which", "event_type"),
    [
        ("visa", "purchase.confirmed"),
        ("declined", "purchase.failed"),
        ("refunded", "purchase.refunded"),
        ("expired_unknown", "purchase.failed"),
        ("undone", "purchase.refunded"),
        ("partly", "purchase.partially_refunded"),
    ],
)
def test_a_missing_webhook_is_a_violation(hooked, endpoint, which, event_type):
    saga = getattr(hooked, which)
    _delivery(saga, event_type).delete()

    report = audit_run()

    base._only(report, "webhook_missing", saga)
    [violation] = report.violations
    assert event_type in violation.detail and f"endpoint {endpoint.pk}" in violation.detail
    base._command_fails("webhook_missing", saga)


@pytest.mark.django_db
def test_an_endpoint_that_existed_and_was_subscribed_is_owed_one_per_finished_saga(
    story, receiver_url
):
    # Registered (on the record) before the story, yet nothing was written
    # for it: every finished saga misses its webhook.
    late = webhook_endpoint_create(url=receiver_url, events=ALL, now=BEFORE)

    report = audit_run()

    assert {v.invariant for v in report.violations} == {"webhook_missing"}
    assert sorted((v.saga_id for v in report.violations), key=str) == sorted(
        str(s.pk)
        for s in (
            story.visa,
            story.declined,
            story.reconciled,
            story.refunded,  # its confirmation, and its refund
            story.refunded,
            story.expired_unknown,
            story.undone,
            story.partly,  # its confirmation, and its partial refund
            story.partly,
        )
    )
    assert all(f"endpoint {late.pk}" in v.detail for v in report.violations)


@pytest.mark.django_db
def test_an_endpoint_created_after_the_saga_ended_is_owed_nothing(story, receiver_url):
    webhook_endpoint_create(url=receiver_url, events=ALL, now=AFTER)

    report = audit_run()

    assert report.violations == []


@pytest.mark.django_db
def test_a_disabled_or_unsubscribed_endpoint_is_owed_nothing(story, receiver_url):
    disabled = webhook_endpoint_create(url=receiver_url, events=ALL, now=BEFORE)
    webhook_endpoint_update(endpoint_id=disabled.pk, enabled=False, now=BEFORE)
    webhook_endpoint_create(url=receiver_url, events=["purchase.needs_attention"], now=BEFORE)

    report = audit_run()

    assert report.violations == []


@pytest.mark.django_db
def test_an_endpoint_changed_after_the_saga_ended_is_not_judged_for_it(hooked, endpoint):
    # What it listened to when the saga ended is no longer known: it may have
    # been disabled then. Its deliveries are still checked for contradictions.
    _delivery(hooked.visa, "purchase.confirmed").delete()
    webhook_endpoint_update(endpoint_id=endpoint.pk, description="renamed", now=AFTER)

    assert audit_run().violations == []

    _add_delivery(endpoint, hooked.visa, "purchase.refunded")
    base._only(audit_run(), "webhook_contradicts", hooked.visa)


@pytest.mark.django_db
def test_an_alert_owes_needs_attention(hooked, endpoint, alice, settings):
    # Reconciled until the probes run out: UNKNOWN_EXPIRED, and an alert names it.
    settings.PURCHASE_HOLD_SECONDS = 4 * 3600
    saga = start_purchase(alice, hooked.event, seats=["A7"], payment_method="pm_card_unreachable")
    saga_charge(saga_id=saga.pk)
    for offset in base.BACKOFF:
        hooked.clock.tick(offset)
        drain_outbox()
    assert base._fresh(saga).state == "UNKNOWN_EXPIRED"
    assert _delivery(saga, "purchase.needs_attention").status == "delivered"

    assert audit_run().violations == []

    _delivery(saga, "purchase.needs_attention").delete()
    report = audit_run()
    base._only(report, "webhook_missing", saga)
    assert "purchase.needs_attention" in report.violations[0].detail


@pytest.mark.django_db
def test_a_buyers_cancellation_owes_cancelled_then_refunded(hooked, endpoint, alice):
    Event.objects.filter(pk=hooked.event.pk).update(
        buyer_can_cancel_until=timezone.now() + timedelta(days=1)
    )
    purchase_cancel(saga_id=hooked.visa.pk, user=alice, seats=None, request_key="k1")
    drain_outbox()
    assert {d.event_type for d in WebhookDelivery.objects.filter(saga_id=hooked.visa.pk)} == {
        "purchase.confirmed",
        "purchase.cancelled",
        "purchase.refunded",
    }
    assert audit_run().violations == []

    _delivery(hooked.visa, "purchase.cancelled").delete()
    report = audit_run()

    base._only(report, "webhook_missing", hooked.visa)
    assert "no purchase.cancelled delivery" in report.violations[0].detail


# --- webhook_contradicts ------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("which", "event_type"),
    [
        ("visa", "purchase.failed"),  # confirmed, announced as failed
        ("visa", "purchase.refunded"),
        ("declined", "purchase.refunded"),  # nothing was charged
        ("declined", "purchase.confirmed"),  # never confirmed
        ("refunded", "purchase.failed"),  # confirmed (and refunded), announced as failed
        ("expired_unknown", "purchase.confirmed"),
        ("undone", "purchase.failed"),  # both failed and refunded
        ("visa", "purchase.partially_refunded"),  # no refund
        ("refunded", "purchase.partially_refunded"),  # refunded in one go
        ("partly", "purchase.refunded"),  # a part only
        ("visa", "purchase.cancelled"),  # its buyer never cancelled
        ("declined", "purchase.partially_refunded"),  # never confirmed
    ],
)
def test_a_webhook_that_contradicts_the_end_is_a_violation(hooked, endpoint, which, event_type):
    saga = getattr(hooked, which)
    _add_delivery(endpoint, saga, event_type)

    report = audit_run()

    base._only(report, "webhook_contradicts", saga)
    assert event_type in report.violations[0].detail
    base._command_fails("webhook_contradicts", saga)


@pytest.mark.django_db
def test_an_end_announced_for_a_saga_still_moving_contradicts_it(hooked, endpoint, alice):
    saga = start_purchase(alice, hooked.event, seats=["A7"])  # PENDING
    _add_delivery(endpoint, saga, "purchase.confirmed")

    base._only(audit_run(), "webhook_contradicts", saga)


# --- webhook_failed: a finding ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_failed_webhook_is_a_finding_not_a_violation(hooked, endpoint):
    WebhookDelivery.objects.filter(saga_id=hooked.visa.pk).update(
        status="failed", failed_at=timezone.now(), armed_attempt=8
    )

    report = audit_run()

    assert report.violations == []
    assert _findings(report) == [("webhook_failed", str(hooked.visa.pk))]
    assert "purchase.confirmed" in report.findings[0].detail
    assert "8 attempt" in report.findings[0].detail
    assert report.as_dict()["findings"][0]["name"] == "webhook_failed"
    call_command("audit_sagas", stdout=StringIO())  # exit status 0: nothing is violated


# --- cost ------------------------------------------------------------------------------------


def _webhook_queries(**kwargs) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        audit_run(**kwargs)
    return [q["sql"] for q in ctx.captured_queries if "webhooks_" in q["sql"]]


@pytest.mark.django_db
def test_without_endpoints_the_webhook_check_costs_one_query(story):
    assert len(_webhook_queries()) == 1
    assert len(_webhook_queries(chunk_size=2)) == 1


@pytest.mark.django_db
def test_with_endpoints_the_number_of_queries_does_not_grow_with_the_number_of_sagas(
    alice, gateway, endpoint
):
    event = EventFactory(seats=[f"A{n}" for n in range(1, 9)])
    with freeze_time(base.T0):
        for ref in ("A1", "A2"):
            saga_charge(saga_id=start_purchase(alice, event, seats=[ref]).pk)
        drain_outbox()
        few = base._audit_queries()
        for ref in ("A3", "A4", "A5", "A6", "A7", "A8"):
            saga_charge(saga_id=start_purchase(alice, event, seats=[ref]).pk)
        drain_outbox()
        many = base._audit_queries()
        assert audit_run().violations == []
    assert WebhookDelivery.objects.filter(status="delivered").count() == 8

    assert few == many
