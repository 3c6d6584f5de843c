"""The Redis cache with one client per pool (config/cache.py). That a
``redis://`` ``CACHE_URL`` selects it: tests/test_compose.py."""

from __future__ import annotations

import multiprocessing
import os
import uuid

from django.core.cache import caches

from config.cache import RedisCache


def test_calls_share_one_client_and_still_read_what_they_wrote():
    cache = caches["default"]
    assert isinstance(cache, RedisCache)
    first = cache._cache.get_client()
    key = f"cache-client-{uuid.uuid4().hex}"

    cache.set(key, {"seats": 3}, 30)

    assert cache.get(key) == {"seats": 3}
    assert cache._cache.get_client() is first
    assert cache._cache.get_client(write=True) is first  # one server: one pool
    cache.delete(key)
    assert cache.get(key) is None


def _in_a_forked_child(key: str, out) -> None:
    cache = caches["default"]
    cache.set(key, os.getpid(), 30)
    out.put(cache.get(key))


def test_a_forked_process_uses_the_shared_client_on_connections_of_its_own():
    cache = caches["default"]
    key = f"cache-client-fork-{uuid.uuid4().hex}"
    cache.set(key, "parent", 30)  # the parent's pool holds a connection now
    out = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_in_a_forked_child, args=(key, out))
    child.start()
    child.join(20)

    assert child.exitcode == 0
    assert out.get(timeout=5) == child.pid
    assert cache.get(key) == child.pid  # and the parent's connection still answers
    cache.delete(key)
