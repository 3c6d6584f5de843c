"""The cache cannot be reached: counted, and logged once per outage
(docs/operations.md, "Cache down").

The cache (Redis through ``CACHE_URL``) only saves work, so a request does
not fail with it: the token is read from the database
(``purchases/authentication.py``), the purchase throttle counts the buyer's
starts in the database and the token throttle counts in the process
(``purchases/throttling.py``), the catalog is built from the database
(``purchases/availability.py``, which logs on its own). Each caller catches
``cache_down()`` around its cache call and calls ``cache_unavailable``; a call
that reached the cache calls ``cache_answered``.

Every fallback is counted in ``boxoffice_cache_unavailable_total{use}``. A
process logs one WARNING when it first finds the cache down and one INFO
when a call reaches it again: one pair of lines per outage, not one per
request. ``/readyz`` asks the cache on its own (``purchases/ops/health.py``).

Only the errors of a cache that cannot be reached are caught: a connection
refused, reset or timed out (redis-py's ``ConnectionError`` and
``TimeoutError``, which Django's Redis cache lets through as they are).
Anything else a cache call raises is a bug, and stays a 500.
"""

from __future__ import annotations

import functools
import logging
import threading

from prometheus_client import Counter

logger = logging.getLogger(__name__)


@functools.cache
def cache_down() -> tuple[type[Exception], ...]:
    """What a cache that cannot be reached raises, for an ``except``
    (evaluated only when something is raised). redis-py is imported on first
    use, as Django's Redis cache imports it: importing it loads the
    OpenTelemetry SDK when installed (redis.observability), which a process
    on the file cache, or figure 12's web built without tracing
    (bench/wsgi_without_tracing.py), never needs."""
    from redis.exceptions import ConnectionError, TimeoutError

    return (ConnectionError, TimeoutError)


# What fell back: ``token`` (a token's look-up, its remembering, its
# forgetting), ``purchase_throttle``, ``token_throttle``.
USES = ("token", "purchase_throttle", "token_throttle")
CACHE_UNAVAILABLE = Counter(
    "boxoffice_cache_unavailable_total",
    "Cache calls that could not reach the cache, by what fell back",
    ["use"],
)
# Created at 0: a series that first appears at 1 is a rise increase() misses.
for _use in USES:
    CACHE_UNAVAILABLE.labels(use=_use)

_lock = threading.Lock()
_down = False


def cache_unavailable(use: str, error: BaseException) -> None:
    """A cache call of ``use`` could not reach the cache, and fell back."""
    global _down
    CACHE_UNAVAILABLE.labels(use=use).inc()
    with _lock:
        flipped, _down = not _down, True
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
