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
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle

from config.cache import RedisCache

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
    # What the Redis step answered (None: DRF's own step ran).
    _count: int | None = None
    _oldest: float | None = None

    def get_rate(self):
        return settings.PURCHASE_THROTTLE_RATE

    def allow_request(self, request, view) -> bool:
        backend = caches[DEFAULT_CACHE_ALIAS]  # this thread's (self.cache is a proxy)
        if not isinstance(backend, RedisCache):
            return super().allow_request(request, view)
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        self.now = self.timer()
        # Django's private client (config/cache.py keeps one per pool).
        client = backend._cache.get_client(self.key, write=True)
        allowed, count, oldest = _slide(client)(
            # A list, not DRF's pickled one: a key of its own.
            keys=[backend.make_key(f"{self.key}:log")],
            # (Set by DRF's __init__ from the rate; not in its stubs.)
            args=[repr(self.now), self.duration, self.num_requests],  # type: ignore[attr-defined]
            client=client,
        )
        self._count, self._oldest = int(count), float(oldest) if oldest else None
        return bool(allowed)

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


def _slide(client) -> Any:
    """The script, registered once (then run by its SHA; redis-py loads it
    again into a Redis that lost it)."""
    global _script
    if _script is None:
        _script = client.register_script(_SLIDE)
    return _script


class TokenThrottle(AnonRateThrottle):
    """Password guesses at ``POST /api/auth/token/``, counted per client address."""

    scope = "auth_token"

    def get_rate(self):
        # Counted per address: the token view authenticates nobody, so every
        # caller is anonymous here, whatever credentials it sends.
        return settings.AUTH_TOKEN_THROTTLE_RATE
