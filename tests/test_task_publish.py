"""config/task_publish.py: the message written straight to Redis is the one
Celery's ``apply_async`` sends, field by field, on the tests' real broker;
kombu's consumer reads it; and where it could differ, ``apply_async`` sends."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid

import pytest
import redis
from celery import signals
from django.conf import settings

from config import task_publish
from config.celery import app
from outbox.tasks import deliver, sweep


@pytest.fixture
def queue():
    name = f"test-publish-{uuid.uuid4().hex[:8]}"
    yield name
    _broker().delete(name)


def _broker() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def _pop(queue: str) -> dict:
    raw = _broker().rpop(queue)
    assert isinstance(raw, bytes), f"nothing on {queue}"
    message = json.loads(raw)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return message


def _per_message(message: dict) -> dict:
    """What differs between any two messages of the same task and queue."""
    headers, properties = message["headers"], message["properties"]
    assert headers["id"] == headers["root_id"] == properties["correlation_id"]
    assert properties["delivery_tag"] != headers["id"]
    return {
        **message,
        "headers": {**headers, "id": "-", "root_id": "-"},
        "properties": {**properties, "correlation_id": "-", "delivery_tag": "-"},
    }


def test_the_tests_broker_takes_the_direct_path():
    # Otherwise every other test here would compare apply_async with itself.
    assert settings.CELERY_BROKER_TRANSPORT == "config.kombu_redis:Transport"
    assert task_publish.direct(deliver) and task_publish.direct(sweep)


@pytest.mark.parametrize(
    ("task", "args"), [(deliver, (123,)), (sweep, ("webhook.delivery",))], ids=["deliver", "sweep"]
)
def test_the_message_is_the_one_apply_async_sends(queue, task, args):
    task.apply_async(args=args, queue=queue)
    celerys = _pop(queue)
    task_publish.publish(task, args, queue=queue)
    ours = _pop(queue)

    assert _broker().llen(queue) == 0
    assert ours["body"] == [list(args), {}, task_publish._EMBED]
    assert ours["headers"]["argsrepr"] == repr(args)
    assert ours["headers"]["task"] == task.name
    assert ours["properties"]["delivery_info"] == {"exchange": "", "routing_key": queue}
    assert _per_message(ours) == _per_message(celerys)


def test_the_charge_named_is_the_message_its_apply_async_sends(queue, monkeypatch):
    # The reserve names its task (the saga does not import the task module).
    # (send_task by name says ignore_result false: it does not know the
    # task; the worker keeps no result either way, there is no backend.)
    charge = task_publish.registered("purchases.charge")
    assert charge is not None
    charge.apply_async(args=("saga-1",), queue=queue)
    celerys = _pop(queue)

    def no(*args, **kwargs):
        raise AssertionError("the charge went through send_task")

    monkeypatch.setattr(app, "send_task", no)
    task_publish.publish("purchases.charge", ("saga-1",), queue=queue)
    ours = _pop(queue)

    assert ours["body"][0] == ["saga-1"]
    assert _per_message(ours) == _per_message(celerys)


def test_a_process_that_runs_no_worker_finds_the_charge_by_name():
    """The web imports no task module by itself: a look-up that missed the
    charge would send every reserve's charge through send_task."""
    code = (
        "import django; django.setup(); from config.celery import app; "
        "from config.task_publish import registered, direct; "
        "before = 'purchases.charge' in app.tasks; task = registered('purchases.charge'); "
        "print(before, task.name, direct(task))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert out[-3:] == ["False", "purchases.charge", "True"]


def test_a_name_no_task_has_goes_through_send_task(queue):
    task_publish.publish("nobody.has.this", (1,), queue=queue)
    assert _pop(queue)["headers"]["task"] == "nobody.has.this"


def test_each_message_has_ids_of_its_own(queue):
    task_publish.publish(deliver, (1,), queue=queue)
    task_publish.publish(deliver, (2,), queue=queue)
    first, second = _pop(queue), _pop(queue)
    assert first["headers"]["id"] != second["headers"]["id"]
    assert first["properties"]["delivery_tag"] != second["properties"]["delivery_tag"]
    assert (first["body"][0], second["body"][0]) == ([1], [2])


def test_no_queue_is_the_default_queue_and_kombus_consumer_reads_it(broker_queue):
    task_publish.publish(deliver, (7,))
    task_publish.publish(sweep, ("webhook.delivery",), queue=None)
    assert broker_queue.messages() == [
        {"task": "outbox.deliver", "args": [7]},
        {"task": "outbox.sweep", "args": ["webhook.delivery"]},
    ]


def test_a_task_with_options_of_its_own_or_a_route_gets_apply_async(monkeypatch):
    # The template carries neither: Celery's own publish does.
    def forget_options() -> None:
        deliver._exec_options = None  # type: ignore[attr-defined]  # Celery caches them

    monkeypatch.setattr(deliver, "time_limit", 30)
    forget_options()
    try:
        assert not task_publish.direct(deliver)
    finally:
        monkeypatch.undo()
        forget_options()
    assert task_publish.direct(deliver)

    app.conf.task_routes = {"outbox.deliver": {"queue": "elsewhere"}}
    try:
        assert not task_publish.direct(deliver)
    finally:
        app.conf.task_routes = None
    assert task_publish.direct(deliver)


def test_a_listener_on_celerys_publish_signals_gets_apply_async(queue):
    # Tracing's instrumentation listens there: it writes the trace into the
    # headers, which only Celery's own publish carries.
    heard = []

    def listener(sender=None, headers=None, **kwargs):
        heard.append(sender)
        headers["x-listened"] = "yes"

    signals.before_task_publish.connect(listener)
    try:
        assert not task_publish.direct(deliver)
        task_publish.publish(deliver, (5,), queue=queue)
    finally:
        signals.before_task_publish.disconnect(listener)
    assert heard == ["outbox.deliver"]
    assert _pop(queue)["headers"]["x-listened"] == "yes"


def test_a_broker_that_does_not_answer_fails_the_publish(queue, monkeypatch):
    # Port 9 (discard) on the loopback: nothing listens there. (Celery reads
    # the broker's URL from the environment before its settings.)
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:9/0")
    assert app.conf.broker_url == "redis://127.0.0.1:9/0"
    with pytest.raises(redis.ConnectionError):
        task_publish.publish(deliver, (1,), queue=queue)
