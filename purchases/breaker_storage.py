"""pybreaker's storage in Django's cache: the half of the breaker
(purchases/breaker.py) that imports pybreaker, loaded on first use.

pybreaker stores a breaker's state, its two counters and its opening time
behind ``CircuitBreakerStorage``, the base its own memory and Redis storages
implement (its docstring asks a storage to subclass it; it is not in the
package's ``__all__``, so tests/test_breaker.py checks that every method of
it is implemented here); :class:`CacheStorage` implements it on Django's
cache (no expiry), so every process that shares the cache shares the
breaker.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pybreaker
from django.core.cache import cache
from pybreaker import CircuitBreakerError

from .cache_outage import cache_call

__all__ = ["CacheStorage", "CircuitBreakerError", "Keys", "build"]


def build(*, fail_max: int, reset_seconds: float, keys: Keys) -> pybreaker.CircuitBreaker:
    return pybreaker.CircuitBreaker(
        fail_max=fail_max,
        reset_timeout=reset_seconds,
        state_storage=CacheStorage(keys),
        name="payments",
    )


@dataclass(frozen=True)
class Keys:
    """The cache keys the breaker's storage reads and writes (the web reads
    two of them itself: purchases/breaker.py)."""

    state: str
    failures: str
    successes: str
    opened_at: str


class CacheStorage(pybreaker.CircuitBreakerStorage):
    """A cache that cannot be reached reads as closed and no failures;
    writes to it are lost (the next answers count again)."""

    def __init__(self, keys: Keys) -> None:
        super().__init__("django-cache")
        self.keys = keys

    @property
    def state(self) -> str:
        return _read(self.keys.state) or pybreaker.STATE_CLOSED

    @state.setter
    def state(self, state: str) -> None:
        cache_call("breaker", lambda: cache.set(self.keys.state, state, timeout=None))

    def increment_counter(self) -> None:
        _increment(self.keys.failures)

    def reset_counter(self) -> None:
        cache_call("breaker", lambda: cache.set(self.keys.failures, 0, timeout=None))

    def increment_success_counter(self) -> None:
        _increment(self.keys.successes)

    def reset_success_counter(self) -> None:
        cache_call("breaker", lambda: cache.set(self.keys.successes, 0, timeout=None))

    @property
    def counter(self) -> int:
        return int(_read(self.keys.failures) or 0)

    @property
    def success_counter(self) -> int:
        return int(_read(self.keys.successes) or 0)

    @property
    def opened_at(self) -> datetime | None:
        stamp = _read(self.keys.opened_at)
        return datetime.fromtimestamp(stamp, UTC) if stamp is not None else None

    @opened_at.setter
    def opened_at(self, when: datetime) -> None:
        stamp = when.timestamp()
        cache_call("breaker", lambda: cache.set(self.keys.opened_at, stamp, timeout=None))


def _read(key: str) -> Any:
    reached, value = cache_call("breaker", lambda: cache.get(key))
    return value if reached else None


def _increment(key: str) -> None:
    def incr() -> None:
        try:
            cache.incr(key)
        except ValueError:  # no such key yet (Django's contract for incr)
            cache.add(key, 0, timeout=None)
            cache.incr(key)

    cache_call("breaker", incr)
