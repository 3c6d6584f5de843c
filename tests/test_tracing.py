"""One trace per purchase (config/tracing.py), recorded by the SDK's in-memory
exporter: from the request's server span to the final email, through the
charge task, the relay's hand-overs, each reconcile probe, the compensation;
redeliveries continue the trace stored on the row; a timer armed for much
later starts a trace of its own, linked; with tracing off nothing is recorded
or stored.

The request goes through the test client (the Django instrumentation's server
span is the root) with real commits, so its on-commit publish happens inside
the request, as in production. Celery messages go to Redis and are run as a
worker's pool process runs them (``celery.worker.request.Request``: the
message's headers become the task's request, which the Celery
instrumentation reads). The outbox goes through the relay's real hand-over.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from celery.worker.request import Request
from django.conf import settings
from django.core import mail
from django.utils import timezone
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import outbox.tasks  # noqa: F401 - the tasks a worker registers
import purchases.tasks  # noqa: F401
from config import tracing
from config.celery import app
from config.logging import JsonFormatter, KeyValueFormatter
from outbox.delivery import message_deliver
from outbox.models import OutboxMessage
from outbox.relay import relay_tick
from purchases.models import PurchaseSaga
from webhooks.services import webhook_endpoint_create

from .conftest import drain_outbox, new_key, purchase_body
from .webhook_receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)

# The web process's instrumentations but the database's: a connection opened
# while it is on keeps its traced cursors for the rest of the session.
INSTRUMENTED = ("django", "celery", "httpx", "threading")


@pytest.fixture
def exporter():
    """Tracing on, spans kept in memory (exported synchronously)."""
    spans = InMemorySpanExporter()
    assert tracing.tracing_init(span_exporter=spans, instrument=INSTRUMENTED)
    yield spans
    tracing.tracing_shutdown()


@pytest.fixture
def queues(broker_queue):
    """This session's task queues on Redis (the default and the webhooks'),
    emptied before and after."""
    names = [settings.CELERY_TASK_DEFAULT_QUEUE, settings.CELERY_WEBHOOK_QUEUE]
    _take(names)
    yield names
    _take(names)


# --- driving a purchase ----------------------------------------------------------------


def _post(api, event, payment_method="pm_card_visa") -> PurchaseSaga:
    answer = api.post(
        "/api/purchases/",
        purchase_body(event, payment_method=payment_method),
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_key(),
    )
    assert answer.status_code == 202, answer.content
    return PurchaseSaga.objects.get(pk=answer.json()["id"])


def _take(queues) -> list:
    """The task messages waiting on ``queues``, taken off them."""
    taken = []
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for queue in queues:
            while (
                message := channel.basic_get(  # type: ignore[attr-defined]  # channels have it
                    queue, no_ack=True
                )
            ) is not None:
                taken.append(message)
    return taken


def _run(message) -> None:
    """Run one task message as a worker's pool process does."""
    Request(message, app=app).execute()


def _work(queues, *, at=None, rounds: int = 10) -> None:
    """Run every queued task, and every outbox row due at ``at`` through the
    relay's real hand-over, until nothing is left."""
    for _ in range(rounds):
        messages = _take(queues)
        for message in messages:
            _run(message)
        if not messages and relay_tick(now=at or timezone.now()) == 0:
            return
    raise AssertionError("the purchase did not settle")


# --- reading the spans -----------------------------------------------------------------


def _traces(exporter) -> dict[int, list[ReadableSpan]]:
    by_trace = defaultdict(list)
    for span in exporter.get_finished_spans():
        by_trace[span.context.trace_id].append(span)
    return by_trace


def _one_trace(exporter) -> list[ReadableSpan]:
    """The only trace recorded, in start order; its root is the request's
    server span and every other span's parent is in it."""
    traces = _traces(exporter)
    assert len(traces) == 1, {hex(t): _names(s) for t, s in traces.items()}
    spans = sorted(next(iter(traces.values())), key=lambda s: s.start_time or 0)
    roots = [s for s in spans if s.parent is None]
    assert [(r.name, r.kind) for r in roots] == [("POST api/purchases/", SpanKind.SERVER)]
    ids = {s.context.span_id for s in spans}
    assert all(s.parent.span_id in ids for s in spans if s.parent is not None)
    return spans


def _names(spans) -> list[str]:
    return [s.name for s in spans]


def _named(spans, name) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _the(spans, name) -> ReadableSpan:
    found = _named(spans, name)
    assert len(found) == 1, (name, _names(spans))
    return found[0]


def _attrs(span: ReadableSpan) -> Mapping[str, Any]:
    assert span.attributes is not None, span.name
    return span.attributes


def _parent_id(span: ReadableSpan) -> int:
    assert span.parent is not None, span.name
    return span.parent.span_id


def _ancestors(spans, span) -> list[str]:
    by_id = {s.context.span_id: s for s in spans}
    names = []
    while span.parent is not None:
        span = by_id[span.parent.span_id]
        names.append(span.name)
    return names


def _trace_of(traceparent: str) -> int:
    assert traceparent.startswith("00-"), traceparent
    return int(traceparent.split("-")[1], 16)


def _rows_share_the_trace(saga, trace_id: int) -> None:
    saga.refresh_from_db()
    assert _trace_of(saga.trace_context) == trace_id
    rows = OutboxMessage.objects.filter(saga_id=saga.pk)
    assert rows.exists()
    assert {_trace_of(row.trace_context) for row in rows} == {trace_id}


def print_trace(spans) -> None:
    """The spans as the exporter recorded them (``pytest -s`` shows it)."""
    start = min(s.start_time for s in spans)
    print(f"\ntrace {spans[0].context.trace_id:032x}")
    print(f"{'start ms':>9} {'dur ms':>8}  {'span id':16}  {'parent':16}  kind      name")
    for s in spans:
        parent = f"{s.parent.span_id:016x}" if s.parent else "-"
        shown = ", ".join(f"{k}={v}" for k, v in sorted(s.attributes.items()) if k in _SHOWN)
        print(
            f"{(s.start_time - start) / 1e6:9.1f} {(s.end_time - s.start_time) / 1e6:8.2f}  "
            f"{s.context.span_id:016x}  {parent:16}  {s.kind.name:8}  {s.name}"
            + (f"  [{shown}]" if shown else "")
        )


_SHOWN = {
    "saga.id",
    "intent.id",
    "saga.state.from",
    "saga.state.to",
    "gateway.outcome",
    "gateway.latency_ms",
}


# --- one trace per purchase ------------------------------------------------------------


@pytest.fixture
def receiver(settings):
    """The seller's webhook endpoint, on this machine."""
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    r = Receiver()
    webhook_endpoint_create(url=r.url("/hook"), events=["purchase.confirmed"])
    yield r
    r.close()


def test_a_visa_purchase_is_one_trace_from_the_request_to_the_email(
    exporter, alice_api, event, gateway, queues, receiver, caplog
):
    caplog.set_level(logging.INFO, logger="purchases")

    saga = _post(alice_api, event)
    _work(queues)

    spans = _one_trace(exporter)
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "CONFIRMED"
    assert len(mail.outbox) == 1 and len(receiver.requests) == 1
    names = _names(spans)
    for expected in [
        "saga.start",
        "apply_async/purchases.charge",
        "run/purchases.charge",
        "saga.charge",
        "saga.transition PENDING->CHARGING",
        "gateway charge",
        "saga.transition CHARGING->CONFIRMED",
        "apply_async/outbox.deliver",
        "run/outbox.deliver",
        "process purchase.confirmed",
        "purchases.consumers.confirmation_email",
        "purchases.analytics.analytics_on_confirmed",
    ]:
        assert expected in names, (expected, names)
    email = _the(spans, "purchases.consumers.confirmation_email")
    assert _ancestors(spans, email) == [
        "process purchase.confirmed",
        "run/outbox.deliver",
        "apply_async/outbox.deliver",
        "saga.charge",
        "run/purchases.charge",
        "apply_async/purchases.charge",
        "saga.start",
        "POST api/purchases/",
    ]
    # The webhook's POST, made on a thread of its own, is in the trace too.
    [post] = [s for s in spans if s.kind == SpanKind.CLIENT and s.name.startswith("POST")]
    assert _ancestors(spans, post)[:4] == [
        "webhooks.consumers.deliver",
        "process webhook.delivery",
        "run/outbox.deliver",
        "apply_async/outbox.deliver",
    ]
    assert _attrs(_the(spans, "webhooks.consumers.deliver"))["webhook.attempt"] == 1
    charge = _the(spans, "gateway charge")
    assert charge.kind == SpanKind.CLIENT
    assert _attrs(charge)["gateway.outcome"] == "succeeded"
    assert _attrs(charge)["intent.id"] == saga.intent_id
    assert _attrs(charge)["saga.id"] == str(saga.pk)
    assert "gateway.latency_ms" in _attrs(charge)
    move = _the(spans, "saga.transition CHARGING->CONFIRMED")
    assert (_attrs(move)["saga.state.from"], _attrs(move)["saga.state.to"]) == (
        "CHARGING",
        "CONFIRMED",
    )
    assert _attrs(move)["saga.id"] == str(saga.pk)
    root = spans[0]
    assert _attrs(_the(spans, "saga.start"))["saga.id"] == str(saga.pk)
    trace_id = root.context.trace_id
    _rows_share_the_trace(saga, trace_id)
    # Logs carry the trace and the span beside the saga.
    answered = [r for r in caplog.records if r.getMessage() == "gateway charge answered succeeded"]
    assert len(answered) == 1
    assert answered[0].saga_id == str(saga.pk)
    assert answered[0].trace_id == f"{trace_id:032x}"
    assert answered[0].span_id == f"{_the(spans, 'saga.charge').context.span_id:016x}"


def test_a_declined_purchase_is_one_trace_to_the_failure_email(
    exporter, alice_api, event, gateway, queues
):
    saga = _post(alice_api, event, payment_method="pm_card_chargeDeclined")
    _work(queues)

    spans = _one_trace(exporter)
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "COMPENSATED"
    assert len(mail.outbox) == 1 and "did not go through" in mail.outbox[0].subject
    assert _attrs(_the(spans, "gateway charge"))["gateway.outcome"] == "declined"
    compensate = _the(spans, "saga.compensate")
    assert _ancestors(spans, compensate)[0] == "saga.charge"
    for move in [
        "CHARGING->PAYMENT_FAILED",
        "PAYMENT_FAILED->COMPENSATING",
        "COMPENSATING->COMPENSATED",
    ]:
        _the(spans, f"saga.transition {move}")
    email = _the(spans, "purchases.consumers.cancellation_email")
    assert _ancestors(spans, email)[:4] == [
        "process purchase.cancelled",
        "run/outbox.deliver",
        "apply_async/outbox.deliver",
        "saga.compensate",
    ]
    _rows_share_the_trace(saga, spans[0].context.trace_id)


def test_a_timeout_then_reconciled_purchase_is_one_trace(
    exporter, alice_api, event, gateway, queues
):
    saga = _post(alice_api, event, payment_method="pm_card_timeout_charged")
    _work(queues)
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "UNKNOWN"

    _work(queues, at=timezone.now() + timedelta(seconds=61))  # the first probe is due

    spans = _one_trace(exporter)
    print_trace(spans)
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "CONFIRMED"
    assert len(mail.outbox) == 1
    charge = _the(spans, "gateway charge")
    assert _attrs(charge)["gateway.outcome"] == "unknown"
    assert charge.status.status_code == StatusCode.ERROR
    _the(spans, "saga.transition CHARGING->UNKNOWN")
    probe = _the(spans, "gateway retrieve")
    assert (probe.kind, _attrs(probe)["gateway.outcome"]) == (SpanKind.CLIENT, "succeeded")
    assert _ancestors(spans, probe)[:5] == [
        "saga.reconcile",
        "purchases.consumers.reconcile_due",
        "process purchase.reconcile",
        "run/outbox.deliver",
        "apply_async/outbox.deliver",
    ]
    # The probe's row was written by the charge: the relay published it in
    # that trace, a minute later.
    assert _ancestors(spans, probe)[5] == "saga.charge"
    _the(spans, "saga.transition UNKNOWN->CONFIRMED")
    email = _the(spans, "purchases.consumers.confirmation_email")
    assert "saga.reconcile" in _ancestors(spans, email)
    _rows_share_the_trace(saga, spans[0].context.trace_id)


# --- redeliveries ------------------------------------------------------------------------


def test_a_row_delivered_twice_continues_the_trace_stored_on_it(
    exporter, alice_api, event, gateway, queues
):
    saga = _post(alice_api, event)
    for message in _take(queues):
        _run(message)
    # No Celery from here on: the rows alone carry the trace.
    drain_outbox()
    confirmed = OutboxMessage.objects.get(topic="purchase.confirmed", saga_id=saga.pk)
    OutboxMessage.objects.filter(pk=confirmed.pk).update(completed_at=None)  # a redelivery

    assert message_deliver(message_id=confirmed.pk) == "delivered"

    spans = _one_trace(exporter)
    deliveries = _named(spans, "process purchase.confirmed")
    assert len(deliveries) == 2
    written_by = _trace_of(confirmed.trace_context), int(confirmed.trace_context.split("-")[2], 16)
    assert {(d.context.trace_id, _parent_id(d)) for d in deliveries} == {written_by}
    assert len(_named(spans, "purchases.consumers.confirmation_email")) == 1  # the inbox
    assert len(mail.outbox) == 1


def test_a_charge_task_run_twice_stays_in_the_purchases_trace(
    exporter, alice_api, event, gateway, queues
):
    saga = _post(alice_api, event)
    [message] = _take(queues)

    _run(message)
    _run(message)  # the broker's redelivery after a worker was lost

    spans = _one_trace(exporter)
    assert len(_named(spans, "run/purchases.charge")) == 2
    assert len(_named(spans, "saga.charge")) == 2
    assert len(_named(spans, "gateway charge")) == 1  # the second found it charging no more
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "CONFIRMED"


def test_a_charge_whose_message_lost_its_trace_continues_from_the_saga(
    exporter, alice_api, event, gateway, queues
):
    saga = _post(alice_api, event)
    [message] = _take(queues)
    message.headers.pop("traceparent")
    message.headers.pop("tracestate", None)

    _run(message)

    traces = _traces(exporter)
    assert len(traces) == 2
    purchase = next(t for t in traces.values() if any(s.name == "saga.start" for s in t))
    orphan = next(t for t in traces.values() if t is not purchase)
    assert _names(orphan) == ["run/purchases.charge"]  # the task's own span: no context
    step = _the(purchase, "saga.charge")
    assert _parent_id(step) == _the(purchase, "saga.start").context.span_id
    assert [link.context.span_id for link in step.links] == [orphan[0].context.span_id]
    _the(purchase, "gateway charge")
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "CONFIRMED"


# --- much later: a trace of its own, linked ---------------------------------------------


def test_the_hold_expiry_starts_a_trace_linked_to_the_purchase(
    exporter, alice_api, event, gateway, queues
):
    saga = _post(alice_api, event)
    _take(queues)  # the worker never charged it
    purchase_trace = _trace_of(PurchaseSaga.objects.get(pk=saga.pk).trace_context)

    _work(queues, at=timezone.now() + timedelta(seconds=settings.PURCHASE_HOLD_SECONDS + 1))

    assert PurchaseSaga.objects.get(pk=saga.pk).state == "COMPENSATED"
    traces = _traces(exporter)
    assert set(traces) > {purchase_trace}
    [expiry] = [t for t in traces.values() if any(s.name == "saga.expire_hold" for s in t)]
    assert expiry[0].context.trace_id != purchase_trace
    process = _the(expiry, "process purchase.hold_expired")
    start = _the(traces[purchase_trace], "saga.start")
    assert [(link.context.trace_id, link.context.span_id) for link in process.links] == [
        (purchase_trace, start.context.span_id)
    ]
    # What the expiry set off (the compensation, its email) continues its trace.
    for name in [
        "saga.transition PENDING->EXPIRED",
        "saga.compensate",
        "purchases.consumers.cancellation_email",
    ]:
        _the(expiry, name)
    cancelled = OutboxMessage.objects.get(topic="purchase.cancelled", saga_id=saga.pk)
    assert _trace_of(cancelled.trace_context) == expiry[0].context.trace_id


# --- off --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "boxoffice"}, False),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_only_the_otel_variables_turn_tracing_on(environ, on):
    assert tracing.configured(environ) is on


def test_with_nothing_set_nothing_is_recorded_or_stored(
    monkeypatch, alice_api, event, gateway, queues
):
    factory = logging.getLogRecordFactory()
    middleware = list(settings.MIDDLEWARE)

    assert tracing.tracing_init(environ={}) is False

    assert not tracing.enabled()
    assert settings.MIDDLEWARE == middleware and logging.getLogRecordFactory() is factory
    # Even a provider someone else installed sees nothing of ours.
    seen = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(seen))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    saga = _post(alice_api, event, payment_method="pm_card_timeout_charged")
    [charge] = _take(queues)
    assert "traceparent" not in charge.headers
    _run(charge)
    _work(queues, at=timezone.now() + timedelta(seconds=61))

    assert PurchaseSaga.objects.get(pk=saga.pk).state == "CONFIRMED"
    assert seen.get_finished_spans() == ()
    assert PurchaseSaga.objects.get(pk=saga.pk).trace_context == ""
    assert set(OutboxMessage.objects.values_list("trace_context", flat=True)) == {""}
    assert tracing.traceparent() == "" and tracing.span("x") is tracing.NOOP


# --- logs ---------------------------------------------------------------------------------


def test_log_lines_carry_the_span_and_json_is_one_object_per_line(exporter):
    logger = logging.getLogger("purchases.test_tracing")
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep()
    logger.addHandler(handler)
    try:
        with tracing.span("a span") as span:
            logger.warning("inside %s", "a span", extra={"saga_id": "s-1"})
        logger.warning("outside", extra={"saga_id": "s-1"})
    finally:
        logger.removeHandler(handler)

    inside, outside = records
    ctx = span.get_span_context()
    line = JsonFormatter().format(inside)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "inside a span" and entry["level"] == "WARNING"
    assert entry["logger"] == "purchases.test_tracing" and entry["time"].endswith("Z")
    assert (entry["saga_id"], entry["trace_id"], entry["span_id"]) == (
        "s-1",
        f"{ctx.trace_id:032x}",
        f"{ctx.span_id:016x}",
    )
    assert f"trace_id={ctx.trace_id:032x}" in KeyValueFormatter().format(inside)
    assert "trace_id" not in json.loads(JsonFormatter().format(outside))


@pytest.mark.parametrize("entry", ["config.wsgi", "config.asgi"])
@pytest.mark.parametrize("environ", [{}, {"OTEL_TRACES_EXPORTER": "console"}])
def test_each_web_entry_point_sets_tracing_up_when_asked(entry, environ):
    """gunicorn loads config.wsgi, an ASGI server config.asgi: either turns
    tracing on from the OTEL_* variables, and neither without them."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OTEL_") and k != "DJANGO_SETTINGS_MODULE"
    }
    code = (
        f"import {entry}, sys; from config import tracing; "
        "print(tracing.enabled(), any(m.startswith('opentelemetry.sdk') for m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "DJANGO_SETTINGS_MODULE": "tests.settings", **environ},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    on = bool(environ)
    assert out[-2:] == [str(on), str(on)]
