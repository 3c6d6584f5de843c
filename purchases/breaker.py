"""The circuit breaker on the processor (docs/operations.md, "Payments paused").

When the processor stops answering (timeouts, connection errors, 5xx: an
adapter's ``unknown``), every new purchase would hold seats, be charged, go
UNKNOWN and wait out the reconciliation's schedule while its buyer waits.
The breaker counts those answers and, past ``PAYMENT_BREAKER_FAILURES`` in a
row, opens: new purchases are refused with ``503 payments_paused`` before
any seat is held (the start asks :func:`payments_paused`) until, past
``PAYMENT_BREAKER_RESET_SECONDS``, an answer closes it (below). A decline,
a refusal, a "not found" are answers: each closes the run of failures.

It is pybreaker's ``CircuitBreaker`` (the states, the counting, the
half-open trial), shared by every process through Django's cache, the store
every process of a deployment already shares (Redis through ``CACHE_URL``;
files under ``VAR_DIR`` for ``make run``'s one machine): a worker's
timeouts open it, the web refuses. pybreaker's own Redis storage would need
a second Redis setting and would not work at all under ``make run``;
:class:`CacheStorage` implements its storage interface
(``CircuitBreakerStorage``) on the cache's public API instead.

The breaker judges an answer after the call, never around it: pybreaker's
``call`` holds a process-wide lock for the length of the call, which would
queue a process's concurrent gateway calls behind each other. So
:func:`observe` hands it the answer already received. The workers' calls are
never refused: while it is open, charges already started go on and those
that go UNKNOWN are reconciled as always; only new purchases wait. Once the
reset time has passed, the first answer observed is the trial (a
reconciliation's look-up, or :func:`breaker_trial`'s, which beat runs): an
answer closes it, a failure opens it for another reset time. New purchases
wait for that answer: none is let in as the trial, so none is accepted while
the processor is still down.

A cache that cannot be reached reads as closed (purchases are not refused
because the cache is down), counted and logged as every cache outage is
(purchases/cache_outage.py, use ``breaker``).
"""

from __future__ import annotations

import logging
import math
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache

from config import metrics
from payments.interface import PaymentGateway
from payments.registry import get_gateway

from .cache_outage import cache_call

logger = logging.getLogger(__name__)

_PREFIX = "payments-breaker:"
STATE, FAILURES, SUCCESSES, OPENED_AT = (
    f"{_PREFIX}{name}" for name in ("state", "failures", "successes", "opened_at")
)
# pybreaker.STATE_OPEN, named here so that the web's check needs no import of
# pybreaker (tests/test_breaker.py holds them equal).
OPEN = "open"
# pybreaker.STATE_HALF_OPEN: written for the length of a trial's call (then
# open or closed); read as paused, so that no purchase is let in as the
# trial nor alongside it.
HALF_OPEN = "half-open"
PAUSED = frozenset({OPEN, HALF_OPEN})


class ProcessorFailing(Exception):
    """An answer that says nothing: what the breaker counts as a failure."""


_built: tuple[tuple, Any] | None = None
_build_lock = threading.Lock()


def _breaker() -> Any:
    """The process's ``pybreaker.CircuitBreaker``, built on first use
    (building reads the cache) and again when its settings change (tests)."""
    global _built
    wanted = (settings.PAYMENT_BREAKER_FAILURES, settings.PAYMENT_BREAKER_RESET_SECONDS)
    built = _built
    if built is None or built[0] != wanted:
        # Here, not at the top: pybreaker imports redis-py, which loads the
        # OpenTelemetry SDK; a web process that never observes an answer
        # (figure 12's, built without tracing) must not pay for it.
        from .breaker_storage import Keys, build

        keys = Keys(state=STATE, failures=FAILURES, successes=SUCCESSES, opened_at=OPENED_AT)
        with _build_lock:
            _built = built = (wanted, build(fail_max=wanted[0], reset_seconds=wanted[1], keys=keys))
    return built[1]


def observe(*, asked: str, label: str, detail: str = "") -> None:
    """Count one gateway answer (``label``, as the evidence stores it; an
    ``unknown`` is a failure, anything else an answer). Opens the breaker
    on the ``PAYMENT_BREAKER_FAILURES``-th failure in a row (and on a failed
    trial), with one ERROR line and one alert per opening; closes it on the
    trial's answer. Costs two cache calls while it is closed. Does nothing
    with ``PAYMENT_BREAKER_ENABLED`` off."""
    if not settings.PAYMENT_BREAKER_ENABLED:
        return
    judged = False

    def judge() -> None:
        nonlocal judged
        judged = True
        if label == "unknown":
            raise ProcessorFailing(label)

    breaker = _breaker()
    try:
        breaker.call(judge)
    except ProcessorFailing:
        pass  # counted, not (yet) opened
    except breaker_refusal():
        if not judged:
            return  # open, and its reset time has not passed: nothing to judge
        # This answer opened it (the failures' threshold, or a failed trial).
        metrics.ALERTS.labels(kind="payments_paused").inc()
        logger.error(
            "payments paused: the processor gave no answer to %s (%s), after %s in a row "
            "or as the trial; new purchases are refused for %gs",
            asked,
            detail or "unknown",
            settings.PAYMENT_BREAKER_FAILURES,
            settings.PAYMENT_BREAKER_RESET_SECONDS,
            extra={"alert": "payments_paused", "asked": asked, "detail": detail},
        )


def observe_many(*, asked: str, answers: list[tuple[str, str]]) -> None:
    """Count the answers of calls made together (a charge burst's, each a
    ``(label, detail)``): the answers as one, then each failure as
    :func:`observe` counts it. Calls in flight together have no order, so
    the failures among them are counted in a row after the others, and a
    burst costs two cache calls however many answered, two more for each
    failure."""
    answered = [answer for answer in answers if answer[0] != "unknown"]
    if answered:
        observe(asked=asked, label=answered[0][0], detail=answered[0][1])
    for label, detail in answers:
        if label == "unknown":
            observe(asked=asked, label=label, detail=detail)


# An intent id no purchase has: the trial's look-up of it is answered
# "not found" by a processor that answers.
TRIAL_INTENT_ID = "payments-breaker-trial"


def breaker_trial(
    *, gateway: PaymentGateway | None = None, now: datetime | None = None
) -> str | None:
    """The half-open trial, when one is due (open, past its reset time): one
    look-up at the processor of an intent that does not exist, judged as any
    answer (``not_found`` closes it; no answer opens it for another reset
    time). Beat runs it every ``PAYMENT_BREAKER_TRIAL_SECONDS``, so that a
    breaker with nothing in flight still closes once the processor is back,
    without letting a buyer's purchase in as the trial. The answer's label,
    or None when no trial was due."""
    if not settings.PAYMENT_BREAKER_ENABLED:
        return None
    state = breaker_state()
    if state["state"] not in PAUSED:
        return None  # closed; half-open (a trial running, or one whose process died) is tried
    opened_at, at = state["opened_at"], now or datetime.now(UTC)
    reset = timedelta(seconds=settings.PAYMENT_BREAKER_RESET_SECONDS)
    if opened_at is not None and at < opened_at + reset:
        return None
    answer = (gateway or get_gateway()).retrieve(TRIAL_INTENT_ID)
    observe(asked="trial", label=answer.label, detail=answer.detail)
    logger.info(
        "payments breaker trial: the processor answered %s",
        answer.label,
        extra={"detail": answer.detail, "latency_ms": round(answer.latency_ms, 1)},
    )
    return answer.label


def payments_paused(*, now: datetime | None = None) -> int | None:
    """Whether new purchases are refused now: the seconds until they may be
    tried again (``Retry-After``, at least 1), or None. Open: refused, until
    the reset time has passed and then until a trial's answer closes it (the
    trial's interval is the wait then); half-open (a trial's call under way)
    too; closed: None."""
    if not settings.PAYMENT_BREAKER_ENABLED:
        return None
    # Read at every start (one cache round trip), not remembered by the
    # process: a web process that went on taking purchases for a second
    # after another saw the breaker open accepted them into a processor that
    # does not answer (figure 17 counted two).
    reached, found = cache_call("breaker", lambda: cache.get_many([STATE, OPENED_AT]))
    found = found if reached and found is not None else {}
    if found.get(STATE) not in PAUSED:
        return None
    opened = found.get(OPENED_AT)
    if opened is None:  # open with its time lost: a trial is due
        return math.ceil(settings.PAYMENT_BREAKER_TRIAL_SECONDS)
    now_stamp = (now or datetime.now(UTC)).timestamp()
    left = opened + settings.PAYMENT_BREAKER_RESET_SECONDS - now_stamp
    return math.ceil(left) if left > 0 else math.ceil(settings.PAYMENT_BREAKER_TRIAL_SECONDS)


def breaker_state() -> dict:
    """What an operator reads (the admin, ``/metrics``): the state, the
    failures in a row, and when it last opened."""
    reached, found = cache_call("breaker", lambda: cache.get_many([STATE, FAILURES, OPENED_AT]))
    found = found if reached and found is not None else {}
    stamp = found.get(OPENED_AT)
    return {
        "enabled": settings.PAYMENT_BREAKER_ENABLED,
        "state": found.get(STATE) or "closed",
        "failures": int(found.get(FAILURES) or 0),
        "opened_at": datetime.fromtimestamp(stamp, UTC) if stamp is not None else None,
    }


def breaker_refusal() -> type[Exception]:
    """pybreaker's ``CircuitBreakerError`` (imported on first use, as above)."""
    # Here, not at the top: see _breaker.
    from .breaker_storage import CircuitBreakerError

    return CircuitBreakerError
