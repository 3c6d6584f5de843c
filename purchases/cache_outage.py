"""The cache cannot be reached: counted, logged once per outage, and not
asked again for a moment (docs/operations.md, "Cache down").

The cache (Redis through ``CACHE_URL``) only saves work, so a request does
not fail with it: the token is read from the database
(``purchases/authentication.py``), the purchase throttle counts the buyer's
starts in the database and the token throttle counts in the process
(``purchases/throttling.py``), the catalog is built from the database
(``purchases/availability.py``). Each caller asks ``cache_skipped`` before
its cache call, catches ``cache_down()`` around it and calls
``cache_unavailable``; a call that reached the cache calls ``cache_answered``.

A cache that hangs (a cut link) costs each call ``CACHE_SOCKET_TIMEOUT_SECONDS``
before it counts as down. So once a call has found it down, the process does
not ask it for ``CACHE_RETRY_SECONDS``: ``cache_skipped`` says so, and the
caller falls back at once. After that, one call asks again (the others go on
skipping while it does); its success ends the outage, its failure starts
another interval. While the cache is up, ``cache_skipped`` reads one flag.

Every fallback is counted in ``boxoffice_cache_unavailable_total{use}``, a
skipped call as a failed one: one per request's use of the cache. A process
logs one WARNING when it first finds the cache down and one INFO when a call
reaches it again: one pair of lines per outage, not one per request.
``/readyz`` asks the cache on its own (``purchases/ops/health.py``).

Only the errors of a cache that cannot be reached are caught: a connection
refused, reset or timed out (redis-py's ``ConnectionError`` and
``TimeoutError``, which Django's Redis cache lets through as they are).
Anything else a cache call raises is a bug, and stays a 500.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from prometheus_client import Counter

logger = logging.getLogger(__name__)

T = TypeVar("T")


@functools.cache
def cache_down() -> tuple[type[Exception], ...]:
    """What a cache that cannot be reached raises, for an ``except``
    (evaluated only when something is raised). redis-py is imported on first
    use, as Django's Redis cache imports it: importing it loads the
    OpenTelemetry SDK when installed (redis.observability), which a process
    on the file cache, or figure 12's web built without tracing
    (bench/wsgi_without_tracing.py), never needs."""
    # Here, not at the top: redis-py only when something was raised (above).
    from redis.exceptions import ConnectionError, TimeoutError

    return (ConnectionError, TimeoutError)


# What fell back: ``token`` (a token's look-up, its remembering, its
# forgetting), ``purchase_throttle``, ``token_throttle``, ``catalog`` (a
# catalog read, or a seat change's version move, lost), ``breaker`` (the
# processor's breaker read as closed, an answer not counted: purchases/breaker.py),
# ``charge_wake`` (a purchase's charge published as its own task, not gathered
# into its event's owed burst: purchases/saga/burst.py).
USES = ("token", "purchase_throttle", "token_throttle", "catalog", "breaker", "charge_wake")
CACHE_UNAVAILABLE = Counter(
    "boxoffice_cache_unavailable_total",
    "Cache calls that could not reach the cache, by what fell back",
    ["use"],
)
# Created at 0: a series that first appears at 1 is a rise increase() misses.
for _use in USES:
    CACHE_UNAVAILABLE.labels(use=_use)

# The clock of the retry interval (a module attribute, read at each call, so
# that tests/test_cache_down.py can move it).
clock = time.monotonic

_lock = threading.Lock()
_down = False
# While _down: when (on ``clock``) the next call may ask the cache again.
_retry_at = 0.0


def cache_skipped(use: str) -> bool:
    """Whether a cache call of ``use`` falls back without asking the cache:
    it was found down less than ``CACHE_RETRY_SECONDS`` ago (counted as a
    fallback, as a failed call). The first call after the interval asks (the
    others skip one more interval meanwhile). One read of a flag while the
    cache is up."""
    global _retry_at
    if not _down:
        return False
    with _lock:
        now = clock()
        skip = _down and now < _retry_at
        if _down and not skip:
            _retry_at = now + settings.CACHE_RETRY_SECONDS  # this call is the one that asks
    if skip:
        CACHE_UNAVAILABLE.labels(use=use).inc()
    return skip


def cache_unavailable(use: str, error: BaseException) -> None:
    """A cache call of ``use`` could not reach the cache, and fell back: the
    cache is skipped for ``CACHE_RETRY_SECONDS`` from now."""
    global _down, _retry_at
    CACHE_UNAVAILABLE.labels(use=use).inc()
    with _lock:
        flipped, _down = not _down, True
        _retry_at = clock() + settings.CACHE_RETRY_SECONDS
    if flipped:
        logger.warning(
            "cache unreachable: falling back to the database until it answers",
            extra={"use": use, "error": f"{type(error).__name__}: {error}"},
        )


def cache_answered() -> None:
    """A cache call reached the cache (one read of a flag while it is up)."""
    global _down
    if not _down:
        return
    with _lock:
        flipped, _down = _down, False
    if flipped:
        logger.info("cache reachable again")


def cache_call(use: str, call: Callable[[], T]) -> tuple[bool, T | None]:
    """``call()``, a call of ``use`` on the cache, as every caller makes it:
    ``(True, its answer)``; ``(False, None)`` when the cache was just found
    down (skipped) or cannot be reached now, each counted and the outage
    logged once. The caller falls back on False."""
    if cache_skipped(use):
        return False, None
    try:
        answer = call()
    except cache_down() as exc:
        cache_unavailable(use, exc)
        return False, None
    cache_answered()
    return True, answer
