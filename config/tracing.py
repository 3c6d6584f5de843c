"""One trace per purchase: OpenTelemetry, set up once per process
(docs/operations.md, "Tracing"; docs/design.md, "Tracing").

Configured by the standard ``OTEL_*`` variables only. Tracing is *on* in a
process when its entry point called :func:`tracing_init` (``config/wsgi.py``
or ``config/asgi.py``, the Celery worker's pool processes and beat in
``config/celery.py``, the relay's command) and the environment names an
exporter: ``OTEL_TRACES_EXPORTER`` (anything but ``none``) or an OTLP
endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); ``OTEL_SDK_DISABLED=true`` wins
over both. With nothing set nothing is installed: no SDK provider, no
instrumentation, no log record factory, and every helper below returns at
its first line (a span is a shared no-op, a stored context is ``""``), so
the purchase's request does no work for tracing.

The saga and every outbox row store the W3C ``traceparent`` of the span
that wrote them; whoever picks the work up later continues that trace from
the row (:func:`continue_from`), not only from a Celery message's headers,
so a worker crash, a redelivery or a lost message changes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from importlib.metadata import entry_points

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# What each kind of process instruments (its entry point says which).
WEB = ("django", "celery", "psycopg", "httpx", "threading")
WORKER = ("celery", "psycopg", "httpx", "threading")
# Beat and the relay only publish tasks: their database work (a relay pass
# every second, mostly idle) belongs to no purchase and would be a trace each.
PUBLISHER = ("celery",)

# A row armed to run more than this after the commit that wrote it (the hold
# expiry, the late reconcile probes and webhook retries) starts a trace of
# its own with a link to the one that armed it, as the specification
# suggests for a long-running asynchronous operation that a fast request
# set off: a trace that stays open for hours is one no backend shows well.
# Sooner work (the charge, the first probes, the compensation, the emails,
# the webhooks) is a child: the purchase reads as one trace.
LINK_AFTER = timedelta(minutes=10)

# Django's probes and Prometheus' scrapes are not worth a trace each
# (OTEL_PYTHON_DJANGO_EXCLUDED_URLS replaces this list).
_DEFAULT_EXCLUDED_URLS = "healthz,readyz,metrics"

NOOP = contextlib.nullcontext()

_SAGA_KEY = otel_context.create_key("boxoffice.saga_id")
_PROPAGATOR = TraceContextTextMapPropagator()

_on = False
_tracer: trace.Tracer | None = None
_provider = None
_instrumented: list = []
_record_factory = None


def configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces (see the module docstring)."""
    environ = os.environ if environ is None else environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if names:
        return names != "none"
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


def enabled() -> bool:
    return _on


def tracing_init(
    *, instrument: Iterable[str] = WEB, span_exporter=None, environ: Mapping[str, str] | None = None
) -> bool:
    """Set tracing up for this process if the environment asks for it;
    True if it is on. Once per process (a second call changes nothing).

    ``span_exporter`` (tests: the SDK's in-memory exporter) is exported to
    synchronously, whatever the environment says, and the provider is then
    not made the global one, so that a test can set tracing up and down.
    """
    global _on, _tracer, _provider, _record_factory
    if _on:
        return True
    environ = os.environ if environ is None else environ
    if span_exporter is None and not configured(environ):
        return False
    # Only when tracing is on: with nothing set, the SDK is not even loaded.
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider  # (the same)
    from opentelemetry.sdk.trace.export import (  # (the same)
        BatchSpanProcessor,
        SimpleSpanProcessor,
    )

    # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG),
    # OTEL_BSP_* and each exporter's own OTEL_EXPORTER_OTLP_* are read by the SDK.
    provider = TracerProvider(resource=Resource.create())
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    else:
        for exporter in _exporters(environ):
            provider.add_span_processor(BatchSpanProcessor(exporter()))
        trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer("boxoffice")
    for name in instrument:
        _instrument(name, provider, environ)
    _record_factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(_with_trace_ids(_record_factory))
    _on = True
    return True


def tracing_shutdown() -> None:
    """Undo :func:`tracing_init` (tests), after exporting what is left."""
    global _on, _tracer, _provider, _record_factory
    if not _on:
        return
    _on = False
    for instrumentor in reversed(_instrumented):
        instrumentor.uninstrument()
    _instrumented.clear()
    if _record_factory is not None:
        logging.setLogRecordFactory(_record_factory)
    _record_factory = None
    if _provider is not None:  # set whenever tracing is on
        _provider.shutdown()
    _provider = _tracer = None


def tracing_flush() -> None:
    """Export the spans still batched (a pool process about to exit, which
    runs no ``atexit`` hook)."""
    if _on and _provider is not None:
        _provider.force_flush()


def _exporters(environ: Mapping[str, str]) -> list[type]:
    """The exporter classes ``OTEL_TRACES_EXPORTER`` names (``otlp`` when only
    an endpoint is set), through the SDK's entry points; ``otlp`` is gRPC or
    HTTP as ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`` says (gRPC by default,
    as the Python SDK does)."""
    names = [n.strip() for n in (environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")]
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    ).strip()
    classes = []
    for name in names:
        if name == "otlp":
            name = "otlp_proto_http" if protocol.startswith("http") else "otlp_proto_grpc"
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            raise RuntimeError(f"OTEL_TRACES_EXPORTER names {name!r}, which is not installed")
        classes.append(next(iter(found)).load())
    return classes


def _instrument(name: str, provider, environ: Mapping[str, str]) -> None:
    if name == "django":
        # Each instrumentation is imported only when it is asked for.
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        excluded = (
            environ.get("OTEL_PYTHON_DJANGO_EXCLUDED_URLS")
            or environ.get("OTEL_PYTHON_EXCLUDED_URLS")
            or _DEFAULT_EXCLUDED_URLS
        )
        instrumentor, options = DjangoInstrumentor(), {"excluded_urls": excluded}
    elif name == "celery":
        from opentelemetry.instrumentation.celery import CeleryInstrumentor  # (the same)

        instrumentor, options = CeleryInstrumentor(), {}
    elif name == "psycopg":
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor  # (the same)

        instrumentor, options = PsycopgInstrumentor(), {}
    elif name == "httpx":
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor  # (the same)

        instrumentor, options = HTTPXClientInstrumentor(), {}
    elif name == "threading":
        # A thread started inside a span (a webhook's POST) continues it.
        from opentelemetry.instrumentation.threading import ThreadingInstrumentor

        instrumentor, options = ThreadingInstrumentor(), {}
    else:
        raise ValueError(f"unknown instrumentation {name!r}")
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=provider, **options)
        _instrumented.append(instrumentor)


def _with_trace_ids(factory):
    """A log record factory that adds ``trace_id`` and ``span_id`` to every
    record written while a span is active (``config.logging`` renders them
    beside ``saga_id``)."""

    def make(*args, **kwargs):
        record = factory(*args, **kwargs)
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            record.trace_id = trace.format_trace_id(ctx.trace_id)
            record.span_id = trace.format_span_id(ctx.span_id)
        return record

    return make


# --- the spans ------------------------------------------------------------------------


def traceparent() -> str:
    """The W3C ``traceparent`` of the current span, to store on a row; ``""``
    when tracing is off or no span is active."""
    if not _on:
        return ""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent", "")


def _stored(carrier: str) -> trace.SpanContext | None:
    if not carrier:
        return None
    ctx = trace.get_current_span(_PROPAGATOR.extract({"traceparent": carrier}))
    span_context = ctx.get_span_context()
    return span_context if span_context.is_valid else None


def span(name: str, *, kind: SpanKind = SpanKind.INTERNAL, attributes: dict | None = None):
    """A span, child of the current one (a shared no-op when tracing is off)."""
    if not _on or _tracer is None:
        return NOOP
    return _tracer.start_as_current_span(name, kind=kind, attributes=_clean(attributes))


def continue_from(
    carrier: str,
    name: str,
    *,
    link: bool = False,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: dict | None = None,
    saga_id=None,
):
    """A span that continues the trace stored on a row (``carrier``, a
    ``traceparent``):

    - if the current span is in that trace already (a Celery message whose
      headers carried it), a child of the current span;
    - otherwise a child of the stored context, linked to the current span if
      there is one (the resumer's sweep, a task whose headers were lost);
    - with ``link`` (work armed long before: :data:`LINK_AFTER`), a trace of
      its own (or the current one, if that is not the stored trace), linked
      to the stored context.

    With ``saga_id`` the saga's steps inside it know they are in its trace
    already (:func:`in_saga`). A no-op when tracing is off.
    """
    if not _on or _tracer is None:
        return NOOP
    return _continue(
        _tracer, carrier, name, link=link, kind=kind, attributes=attributes, saga_id=saga_id
    )


@contextlib.contextmanager
def _continue(
    tracer: trace.Tracer,
    carrier: str,
    name: str,
    *,
    link: bool,
    kind: SpanKind,
    attributes: dict | None,
    saga_id,
) -> Iterator[trace.Span]:
    stored = _stored(carrier)
    current = trace.get_current_span().get_span_context()
    same_trace = stored is not None and current.is_valid and current.trace_id == stored.trace_id
    parent = otel_context.get_current()
    links = []
    if stored is not None and link:
        links.append(Link(stored))
        if same_trace:
            parent = otel_context.Context()
    elif stored is not None and not same_trace:
        parent = trace.set_span_in_context(NonRecordingSpan(stored))
        if current.is_valid:
            links.append(Link(current))
    if saga_id is not None and stored is not None:
        parent = otel_context.set_value(_SAGA_KEY, str(saga_id), parent)
    token = otel_context.attach(parent)
    try:
        with tracer.start_as_current_span(
            name, kind=kind, links=links, attributes=_clean(attributes)
        ) as current_span:
            yield current_span
    finally:
        otel_context.detach(token)


def in_saga(saga_id) -> bool:
    """True inside a :func:`continue_from` that named this saga: its trace
    is already the one to continue."""
    return _on and otel_context.get_value(_SAGA_KEY) == str(saga_id)


def is_late(created_at: datetime, available_at: datetime) -> bool:
    """A row armed for much later than its commit: its consumer links."""
    return available_at - created_at > LINK_AFTER


def use_context(carrier: str):
    """Make the stored context the current one (a hand-over published on a
    row's behalf, whose producer span then belongs to the row's trace)."""
    if not _on:
        return NOOP
    stored = _stored(carrier)
    if stored is None:
        return NOOP
    return _attached(trace.set_span_in_context(NonRecordingSpan(stored)))


@contextlib.contextmanager
def _attached(ctx) -> Iterator[None]:
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


def set_attributes(attributes: dict) -> None:
    """Attributes on the current span (nothing when tracing is off)."""
    if _on:
        trace.get_current_span().set_attributes(_clean(attributes))


def answered(
    span_or_none, *, outcome: str, latency_ms: float, failed: bool = False, detail: str = ""
) -> None:
    """A remote call's answer on its CLIENT span: ``gateway.outcome``, the
    latency, and an error status when no definite answer came."""
    if span_or_none is None or not _on:
        return
    span_or_none.set_attributes(
        {"gateway.outcome": outcome, "gateway.latency_ms": round(latency_ms, 1)}
    )
    if failed:
        span_or_none.set_status(Status(StatusCode.ERROR, detail or outcome))


def _clean(attributes: dict | None) -> dict:
    """OpenTelemetry refuses None; ids become strings."""
    if not attributes:
        return {}
    return {
        k: (v if isinstance(v, str | bool | int | float) else str(v))
        for k, v in attributes.items()
        if v is not None
    }
