"""Publishing one task message straight to the Redis broker, as Celery would.

A reserve hands its charge to Celery after its commit
(``purchases/saga/start.py``), and a commit that writes an event due now hands
it over the same way (``outbox/handover.py``). ``apply_async`` (or
``send_task``) gets there through Celery's router and options, kombu's
producer pool, the queue's declaration (a bound copy of the queue made on
every publish) and its serializer registry: 0.33–0.37 ms of CPU per
publish in-process, and 15 % of the web's CPU per reserve under ``make bench``'s
load (docs/performance.md). The message itself is one ``LPUSH`` of a small
JSON document.

:func:`publish` writes that document from a template Celery builds once per
task and queue (``app.amqp.as_task_v2``: Celery decides the headers) and
pushes it with one command: 0.15 ms (the ``LPUSH`` alone is 0.08). It does
so only where the result is the message ``apply_async`` would send: the
broker is ``config.kombu_redis`` with no transport options (no key prefix,
no priority steps), the task's result is not kept, it has no options of its
own and no route is configured, and nothing listens to
Celery's publish signals (tracing's instrumentation does: it writes the
trace into the headers). Otherwise it calls ``apply_async``. It takes
arguments and a queue, nothing else (no countdown, no ETA).
``tests/test_task_publish.py`` holds the two messages equal field by field,
so that a Celery upgrade that changes the message fails there, and kombu's
consumer reads what it writes (the end-to-end stories run a real worker
on it).

A publish that fails raises, as ``apply_async`` does; the hand-over's caller
makes the row due for the relay (the row is the obligation).
"""

from __future__ import annotations

import base64
import functools
import json
import threading
import uuid
from typing import TYPE_CHECKING, Any

from celery import Task, signals

from config.celery import app

if TYPE_CHECKING:
    import redis

_FAST_TRANSPORT = "config.kombu_redis:Transport"
# Celery's protocol 2 body: (args, kwargs, embed); nothing is chained here.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}

_templates: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]] = {}
_lock = threading.Lock()


def publish(task: Task | str, args: tuple, *, queue: str | None = None) -> None:
    """Send ``task(*args)`` to ``queue`` (the default queue if None). A task
    named is looked up in the app's registry (a name this process does not
    know goes through ``send_task``, as before)."""
    options = routing(queue)
    if isinstance(task, str):
        found = registered(task)
        if found is None:
            app.send_task(task, args=args, **options)
            return
        task = found
    if not direct(task):
        task.apply_async(args=args, **options)
        return
    queue = queue or app.conf.task_default_queue
    headers, properties = _template(task, queue)
    task_id = str(uuid.uuid4())
    body = json.dumps([list(args), {}, _EMBED]).encode()
    message = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {**headers, "id": task_id, "root_id": task_id, "argsrepr": repr(tuple(args))},
        "properties": {
            **properties,
            "correlation_id": task_id,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    _client(app.conf.broker_url).lpush(queue, json.dumps(message))


def routing(queue: str | None) -> dict[str, Any]:
    """Celery's publish options for a queue (none: the default queue)."""
    return {"queue": queue} if queue else {}


def registered(name: str) -> Task | None:
    """The task of that name. A process that runs no worker (the web) has
    not imported the apps' task modules: the first look-up imports them, as
    a worker does at start (Celery's autodiscovery)."""
    if name not in app.tasks:
        app.loader.import_default_modules()
    return app.tasks.get(name)


def direct(task: Task) -> bool:
    """Whether :func:`publish` writes ``task``'s message itself (see the
    module): also not for a task with options of its own (a queue, a
    priority, time limits, an expiry...) nor when routes are configured,
    which the template does not carry."""
    return (
        task.ignore_result
        and not any(
            value
            for name, value in task._get_exec_options().items()  # type: ignore[attr-defined]
            # (apply_async adds ignore_result to the cached options it is
            # given; the template carries the task's own.)
            if name not in ("serializer", "ignore_result")
        )
        and task.serializer == "json"
        and not app.conf.task_routes
        and app.conf.broker_transport == _FAST_TRANSPORT
        and not app.conf.broker_transport_options
        and not signals.before_task_publish.receivers
        and not signals.after_task_publish.receivers
        and not app.conf.task_always_eager
    )


def _template(task: Task, queue: str) -> tuple[dict[str, Any], dict[str, Any]]:
    key = (task.name, queue)
    found = _templates.get(key)
    if found is not None:
        return found
    with _lock:
        placeholder = str(uuid.UUID(int=0))
        built = app.amqp.as_task_v2(
            placeholder,
            task.name,
            args=(),
            kwargs={},
            reply_to=app.thread_oid,
            ignore_result=task.ignore_result,
            replaced_task_nesting=0,
        )
        properties = {
            **built.properties,
            "delivery_mode": 2,  # persistent, kombu's default for a direct exchange
            "priority": 0,
            "body_encoding": "base64",
        }
        _templates[key] = (dict(built.headers), properties)
        return _templates[key]


@functools.cache
def _client(url: str) -> redis.Redis:
    """One client per process and broker (safe to share between threads; its
    pool reconnects after a fork or a lost connection by itself). A broker
    that does not answer fails the publish after Celery's connection
    timeout instead of holding the request."""
    # Imported here: redis-py loads OpenTelemetry's SDK, which a web with
    # tracing off never loads (tests/test_tracing.py); Django's cache and
    # kombu import it on first use too.
    import redis

    timeout = app.conf.broker_connection_timeout
    return redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
