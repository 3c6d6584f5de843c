"""kombu's Redis transport, with one Redis client per channel.

kombu's ``Channel.conn_or_acquire()`` builds a new ``redis.Redis`` for every
command it sends outside the consumer's event loop: each publish (the
reserve's charge task, a webhook sweep's wake-up), and in a worker each
message's unacked bookkeeping and its ack. Building one (its table of
response callbacks) costs more than the command (docs/performance.md, as
``config/cache.py`` found for Django's cache). A ``redis.Redis`` is safe to
share: it takes a connection from the channel's pool for each command, and
the pool reconnects by itself after a fork or a lost connection. A channel
whose pool is replaced (kombu does on reconnect) gets a new client with it.
Everything else is kombu's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis


class Channel(redis.Channel):
    _shared_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client=None) -> Iterator[Any]:
        if client:
            yield client
            return
        shared = self._shared_client
        if shared is None or shared.connection_pool is not self.pool:
            # kombu's own method, missing from kombu-stubs.
            shared = self._shared_client = self._create_client()  # type: ignore[attr-defined]
        yield shared


class Transport(redis.Transport):
    Channel = Channel
