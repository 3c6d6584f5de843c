"""The web as it would be built without tracing (figure 12): ``config.tracing``
replaced, before anything imports it, by bare functions that return what the
real ones return when tracing is off, with none of their checks, and no
``tracing_init``. The OpenTelemetry SDK and instrumentations are never
imported (``purchases/saga/step.py`` and ``outbox/delivery.py`` still import
the API's ``SpanKind`` enum, a constant).

gunicorn ``bench.wsgi_without_tracing:application``; the line it writes to
stderr at start is the figure's proof that this module, not
``config.wsgi``, served the run.
"""

import contextlib
import os
import sys
import types

import config
from bench.common import WITHOUT_TRACING_MARK

_NOOP = contextlib.nullcontext()
stub = types.ModuleType("config.tracing")
stub.__dict__.update(
    WEB=(),
    WORKER=(),
    PUBLISHER=(),
    NOOP=_NOOP,
    configured=lambda environ=None: False,
    enabled=lambda: False,
    tracing_init=lambda **kwargs: False,
    tracing_shutdown=lambda: None,
    tracing_flush=lambda: None,
    traceparent=lambda: "",
    span=lambda name, **kwargs: _NOOP,
    continue_from=lambda carrier, name, **kwargs: _NOOP,
    in_saga=lambda saga_id: False,
    is_late=lambda created_at, available_at: False,
    use_context=lambda carrier: _NOOP,
    set_attributes=lambda attributes: None,
    answered=lambda span_or_none, **kwargs: None,
)
sys.modules["config.tracing"] = stub
config.tracing = stub  # the package's attribute too (a "from config import tracing" reads it)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.core.wsgi import get_wsgi_application  # noqa: E402 (after the stub)

application = get_wsgi_application()

assert not any(name.startswith("opentelemetry.sdk") for name in sys.modules)
print(WITHOUT_TRACING_MARK, file=sys.stderr, flush=True)
