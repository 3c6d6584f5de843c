"""Throttling of purchase starts, per user.

The rate is read from settings at call time (DRF's own throttles bind their
rates at import), and counted in the default cache: Redis when CACHE_URL
points at it, so that every web process shares one count.

On Redis the purchase throttle is one round trip (:data:`_SLIDE`, a script
run by Redis): DRF's reads the user's history, then writes it back, two
commands per purchase start (5 % of the web's CPU per reserve under
``make bench``), and two starts at once in two processes may both read the
same history and both pass. The script trims, counts and appends in one
atomic step. The window, the count and ``Retry-After`` are DRF's.

What counts (docs/api.md, "Throttling"; ``purchase_start_throttled``, the
one decision for the API and the pages): the throttle is decided after the
request's key and body are valid, and a start that turns out not to count
gives its step back (``refund``): a replay of a key, and a refusal of the
input (``400``, ``422``). A start refused for its seats (``409``) counts:
it is a real attempt at them, what a scalper repeats. Over the rate, a key
that already has an answer replays it (its first answer wins over any
refusal), read without starting anything.

The cache down (docs/operations.md, "Cache down"; ``purchases/cache_outage.py``
counts and logs it): the purchase throttle counts the user's purchases
started in the window in the database (their idempotency records, one per
start, shared by every process). Refusals are not counted then, and two
starts at the same instant may both pass the last place: an outage's
approximation, which still bounds what one user holds. The token throttle
has no rows to count: it counts in the process (a local cache), so with N
web processes an address gets up to N times its rate during an outage.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.locmem import LocMemCache
from django.db.models import Count, Min
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle

from config.cache import RedisCache

from . import services
from .cache_outage import cache_answered, cache_call, cache_down, cache_skipped, cache_unavailable
from .errors import IdempotencyKeyReused, UnknownEvent, UnknownSeats
from .models import IdempotencyRecord

# KEYS[1]: the user's history, newest first; ARGV: now, the window in
# seconds, the number of requests the window allows. Returns [allowed, the
# history's length after the step, its oldest entry]: what Retry-After
# needs, never the history itself (a rate as high as the bench's keeps
# thousands of entries).
_SLIDE = """
local key = KEYS[1]
local now = tonumber(ARGV[1])
local duration = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
while true do
  local oldest = redis.call('LINDEX', key, -1)
  if oldest and tonumber(oldest) <= now - duration then
    redis.call('RPOP', key)
  else
    break
  end
end
local allowed = 0
if redis.call('LLEN', key) < limit then
  redis.call('LPUSH', key, ARGV[1])
  redis.call('EXPIRE', key, math.ceil(duration))
  allowed = 1
end
return {allowed, redis.call('LLEN', key), redis.call('LINDEX', key, -1) or ''}
"""


class PurchaseStartThrottle(UserRateThrottle):
    scope = "purchase_start"
    # What the Redis step or the database answered (None: DRF's own step ran).
    _count: int | None = None
    _oldest: float | None = None
    # Where the step that let this start through was counted, for refund():
    # "redis", "drf", or None (nothing to give back).
    _counted: str | None = None

    def get_rate(self):
        return settings.PURCHASE_THROTTLE_RATE

    def refund(self) -> None:
        """Give back the step this start took: it replayed, or its input was
        refused. Nothing when nothing was counted."""
        counted, self._counted = self._counted, None
        if counted == "drf":
            history = self.cache.get(self.key, [])
            if self.now in history:
                history.remove(self.now)
                self.cache.set(self.key, history, self.duration)  # type: ignore[attr-defined]
        elif counted == "redis":
            backend = caches[DEFAULT_CACHE_ALIAS]
            try:
                client = _redis_client(backend, self.key)
                client.lrem(backend.make_key(f"{self.key}:log"), 1, repr(self.now))
            except cache_down() as exc:
                cache_unavailable("purchase_throttle", exc)  # the step stays: it counts

    def allow_request(self, request, view) -> bool:
        backend = caches[DEFAULT_CACHE_ALIAS]  # this thread's (self.cache is a proxy)
        if not isinstance(backend, RedisCache):
            allowed = super().allow_request(request, view)
            self._counted = "drf" if allowed and self.rate is not None and self.key else None
            return allowed
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        self.now = self.timer()
        client = _redis_client(backend, self.key)
        reached, answer = cache_call(
            "purchase_throttle",
            lambda: _slide(client)(
                # A list, not DRF's pickled one: a key of its own.
                keys=[backend.make_key(f"{self.key}:log")],
                # (Set by DRF's __init__ from the rate; not in its stubs.)
                args=[repr(self.now), self.duration, self.num_requests],  # type: ignore[attr-defined]
                client=client,
            ),
        )
        if not reached or answer is None:  # just found down, or down now
            return self._allow_from_database(request)
        allowed, count, oldest = answer
        self._count, self._oldest = int(count), float(oldest) if oldest else None
        self._counted = "redis" if allowed else None
        return bool(allowed)

    def _allow_from_database(self, request) -> bool:
        """The cache down: the user's purchases started within the window,
        counted from their idempotency records (one per start; replays and
        refusals write none). An anonymous caller starts nothing: let through
        (the view refuses it before any start)."""
        if not request.user.is_authenticated:
            return True
        duration, limit = self.duration, self.num_requests  # type: ignore[attr-defined]
        since = datetime.fromtimestamp(self.now - duration, tz=UTC)
        found = IdempotencyRecord.objects.filter(
            user_id=request.user.pk, created_at__gt=since
        ).aggregate(count=Count("id"), oldest=Min("created_at"))
        oldest = found["oldest"]
        self._count, self._oldest = found["count"], oldest.timestamp() if oldest else None
        return found["count"] < limit

    def wait(self) -> float | None:
        """DRF's: the time until the oldest start leaves the window, spread
        over the starts the window will then allow."""
        if self._count is None:
            return super().wait()
        duration, limit = self.duration, self.num_requests  # type: ignore[attr-defined]
        remaining = duration - (self.now - self._oldest) if self._oldest else duration
        available = limit - self._count + 1
        return None if available <= 0 else remaining / float(available)


_script: Any = None


def _redis_client(backend: Any, key: Any) -> Any:
    """The Redis client the cache (a ``RedisCache``) writes ``key`` with:
    Django's private one (config/cache.py keeps one per pool), reached here
    only."""
    return backend._cache.get_client(key, write=True)


def _slide(client) -> Any:
    """The script, registered once (then run by its SHA; redis-py loads it
    again into a Redis that lost it)."""
    global _script
    if _script is None:
        _script = client.register_script(_SLIDE)
    return _script


# The token throttle's count while the cache is down: this process's own.
LOCAL_COUNTS = LocMemCache("boxoffice-token-throttle-while-cache-down", {})


class TokenThrottle(AnonRateThrottle):
    """Password guesses at ``POST /api/auth/token/``, counted per client address."""

    scope = "auth_token"

    def get_rate(self):
        # Counted per address: the token view authenticates nobody, so every
        # caller is anonymous here, whatever credentials it sends.
        return settings.AUTH_TOKEN_THROTTLE_RATE

    def allow_request(self, request, view) -> bool:
        if self.rate is not None and cache_skipped("token_throttle"):
            # Found down a moment ago: not asked (DRF's documented ``cache``
            # attribute, this one throttle object's).
            self.cache = LOCAL_COUNTS
            return super().allow_request(request, view)
        try:
            allowed = super().allow_request(request, view)
        except cache_down() as exc:
            cache_unavailable("token_throttle", exc)
            # DRF's documented ``cache`` attribute: this one throttle object's.
            self.cache = LOCAL_COUNTS
            return super().allow_request(request, view)
        if self.rate is not None:
            cache_answered()
        return allowed


class PurchaseThrottled(Exception):
    """Over ``PURCHASE_THROTTLE_RATE``, and the key has no answer to replay."""

    def __init__(self, wait: float | None):
        super().__init__("purchase starts throttled")
        self.wait = wait


def purchase_start_throttled(request, view, **start: Any) -> services.PurchaseStarted:
    """``services.purchase_start`` behind the purchase throttle, as the API
    and the pages decide it (docs/api.md, "Throttling"), called once the key
    and the body are valid (bad input spent nothing before it).

    A start counts when it reaches the seats: a purchase started, or seats
    refused (``SeatUnavailable``, ``NotEnoughSeats``: a real attempt at them,
    what a scalper repeats). A replay of the key and a refusal of the input
    (``IdempotencyKeyReused``, ``UnknownEvent``, ``UnknownSeats``) give their
    step back. Over the rate, the key's first answer is replayed if it has
    one (it wins over any refusal), from one indexed read and without
    starting anything; else ``PurchaseThrottled``.
    """
    throttle = PurchaseStartThrottle()
    if not throttle.allow_request(request, view):
        replay = services.purchase_replay(user=request.user, **start)
        if replay is None:
            raise PurchaseThrottled(throttle.wait())
        return replay
    try:
        started = services.purchase_start(user=request.user, **start)
    except (IdempotencyKeyReused, UnknownEvent, UnknownSeats):
        throttle.refund()
        raise
    if not started.created:
        throttle.refund()
    return started
