"""Django's Redis cache, with one Redis client per connection pool.

Django's ``RedisCacheClient`` builds a new ``redis.Redis`` for every cache
call (``get_client``), and building one (its table of response callbacks)
costs more than the call itself: a reserve makes four cache calls (the
throttle's read and write, the token's look-up, the catalog's invalidation),
and these constructions were 6 % of the web's time (docs/performance.md,
"Statements written once"). A ``redis.Redis`` is safe to share between the
calls of one cache object (it takes a connection from its pool for each
command), and Django gives each thread a cache object of its own; after a
fork, the pool reconnects by itself (redis-py checks the process id).
"""

from __future__ import annotations

from django.core.cache.backends import redis as django_redis


class RedisCacheClient(django_redis.RedisCacheClient):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, object] = {}

    def get_client(self, key=None, *, write=False):
        # Django's own private names (its get_client uses them; the stubs
        # leave them out).
        pool = self._get_connection_pool(write)  # type: ignore[attr-defined]
        client = self._clients.get(id(pool))
        if client is None:
            client = self._client(connection_pool=pool)  # type: ignore[attr-defined]
            self._clients[id(pool)] = client
        return client


class RedisCache(django_redis.RedisCache):
    """``BACKEND`` of a ``redis://`` ``CACHE_URL`` (config/settings.py)."""

    def __init__(self, server, params) -> None:
        super().__init__(server, params)
        self._class = RedisCacheClient
