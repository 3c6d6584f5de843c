"""The broker's Redis transport keeps one Redis client per channel instead of
building one for every command (config/kombu_redis.py), and publishes as
kombu's does."""

import uuid
from typing import Any

import pytest
from kombu.transport import redis as kombu_redis

from config import kombu_redis as ours
from config.celery import app


@pytest.fixture
def built(monkeypatch):
    """How many Redis clients the transport's channels build for commands."""
    count = {"n": 0}
    real = kombu_redis.Channel._create_client  # type: ignore[attr-defined]  # kombu's, not in the stubs

    def counting(self, asynchronous=False):
        if not asynchronous:
            count["n"] += 1
        return real(self, asynchronous=asynchronous)

    monkeypatch.setattr(kombu_redis.Channel, "_create_client", counting)
    return count


@pytest.fixture
def queue():
    name = f"test-kombu-{uuid.uuid4().hex[:8]}"
    yield name
    with app.connection_for_write() as conn:
        channel: Any = conn.default_channel
        channel.client.delete(name)


def test_the_brokers_redis_url_selects_this_transport():
    with app.connection_for_write() as conn:
        assert conn.transport_cls == "config.kombu_redis:Transport"
        assert isinstance(conn.default_channel, ours.Channel)


def test_publishes_share_one_client_and_every_message_arrives(built, queue):
    with app.connection_for_write() as conn, conn.Producer() as producer:
        for n in range(5):
            app.send_task("test.nothing", args=[n], queue=queue, producer=producer)
        channel: Any = conn.default_channel
        depth = channel.client.llen(queue)

    assert depth == 5
    assert built["n"] == 1  # kombu's own channel: one per publish, 5


def test_a_channel_whose_pool_is_replaced_gets_a_client_of_the_new_pool():
    with app.connection_for_write() as conn:
        channel: Any = conn.default_channel
        with channel.conn_or_acquire() as first:
            assert first.connection_pool is channel.pool
        channel._pool = None  # kombu's reconnect does this
        with channel.conn_or_acquire() as second:
            assert second is not first and second.connection_pool is channel.pool
        with channel.conn_or_acquire() as third:
            assert third is second
