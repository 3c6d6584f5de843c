"""The waiting rooms' ticks are not queued behind the charges they regulate.

Beat sends ``purchases.waiting_rooms_tick`` every second with a one-second
expiry. On the saga's queue, behind an on-sale's charges, each tick expired
before a worker reached it, so the room never ticked while the crowd came
(figure 18 of ``make bench``, docs/performance.md): the ticks have a queue of
their own (``CELERY_ADMISSION_QUEUE``) and ``make run`` a worker for it.
Real Celery workers on Redis, those the ``Procfile`` runs, the saga's pool
left out as if busy."""

from __future__ import annotations

import re
import socket
import time
import uuid
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from config.celery import app
from devtools.processes import background_env, celery_worker_argv
from purchases.models import WaitingRoom
from purchases.saga.topics import CHARGE_TASK

from .factories import EventFactory
from .stack import Stack
from .test_compose import ROOT

SALES_POOL = "worker"  # the Procfile's saga pool


def _procfile_workers() -> dict[str, str]:
    """Each Celery worker of the Procfile and the queues it consumes, named
    under this test run's default queue (tests/settings.py)."""
    workers = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        name, _, command = line.partition(": ")
        found = re.search(r"celery -A config worker .*--queues=(\S+)", command)
        if found and not line.startswith("#"):
            workers[name] = ",".join(
                settings.CELERY_TASK_DEFAULT_QUEUE + q.removeprefix("boxoffice")
                for q in found.group(1).split(",")
            )
    return workers


def _queue_length(queue: str) -> int:
    # kombu's Redis transport keeps a queue's messages in a list of its name.
    return redis.Redis.from_url(settings.CELERY_BROKER_URL).llen(queue)


def _purge(queue: str) -> None:
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(queue)


@pytest.mark.django_db(transaction=True)
def test_beats_room_tick_runs_while_the_saga_queue_is_backed_up(tmp_path):
    # given an event on sale with its room on, and no room ticked yet
    event = EventFactory(
        seats=["A1", "A2"], waiting_room=True, sales_start=timezone.now() - timedelta(minutes=1)
    )
    assert not WaitingRoom.objects.filter(event=event).exists()
    # and the saga's queue backed up: charges its pool has not reached (the
    # pool is left out below, as if busy with the charges before them)
    sales_queue = settings.CELERY_TASK_DEFAULT_QUEUE
    for _ in range(20):
        app.send_task(CHARGE_TASK, args=[str(uuid.uuid4())])
    assert _queue_length(sales_queue) == 20
    workers = _procfile_workers()
    assert workers[SALES_POOL] == sales_queue, workers
    stack = Stack(gateway_url="http://127.0.0.1:9/unused", workdir=tmp_path)
    host = socket.gethostname()
    try:
        # when every other worker of make run runs, and beat sends a tick
        for name, queues in workers.items():
            if name != SALES_POOL:
                argv = celery_worker_argv(queue=queues, concurrency=1, hostname=f"{name}-adm@%h")
                stack.start(name, argv, env=background_env(stack.env))
        for name in workers.keys() - {SALES_POOL}:
            stack.wait_ping(app, destination=[f"{name}-adm@{host}"], timeout=60)
        entry = settings.CELERY_BEAT_SCHEDULE["waiting-rooms-tick"]
        # As beat sends it (its routing applies), but lasting longer than
        # one tick: what is tested is where it goes, not a loaded machine's
        # second.
        app.send_task(entry["task"], **{**entry["options"], "expires": 30})
        # then the room ticks
        deadline = time.monotonic() + 30
        while not WaitingRoom.objects.filter(event=event).exists():
            assert time.monotonic() < deadline, (
                f"no room tick: it went to {app.amqp.router.route({}, entry['task'])['queue']},"
                f" which no worker but the saga pool consumes ({workers})"
                + stack.tails(list(workers.keys() - {SALES_POOL}))
            )
            time.sleep(0.1)
        # and the charges are still where they were
        assert _queue_length(sales_queue) == 20
    finally:
        stack.stop()
        _purge(sales_queue)
