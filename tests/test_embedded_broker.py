"""The embedded broker (kombu's filesystem transport under var/broker), as
make run's processes use it: several of them start at once and bind their
queues to exchanges in the same control folder (docs/operations.md, "make
run").

kombu's own transport creates an exchange's file and only then locks it: a
second process that finds the file in between reads it empty and dies with
``JSONDecodeError`` (make run lost its worker that way when the webhook
worker started beside it). The project's transport (``config.kombu_filesystem``)
creates, locks and reads in that order.
"""

from __future__ import annotations

import json
import multiprocessing

import pytest
from kombu import Connection, Exchange, Queue

ROUNDS = 40
PROCESSES = 6


TRANSPORT = "config.kombu_filesystem:Transport"


def _bind(control: str, data: str, exchange: str, queue: str, start) -> str:
    start.wait()
    try:
        with Connection(transport=TRANSPORT, transport_options={
                "data_folder_in": data, "data_folder_out": data,
                "control_folder": control}) as conn:
            Queue(queue, Exchange(exchange), routing_key=queue)(conn.default_channel).declare()
        return "ok"
    except Exception as exc:  # the failure is the result
        return f"{type(exc).__name__}: {exc}"


@pytest.fixture
def folders(tmp_path):
    (tmp_path / "control").mkdir()
    (tmp_path / "data").mkdir()
    return str(tmp_path / "control"), str(tmp_path / "data")


def test_processes_binding_one_new_exchange_at_once_all_succeed(folders):
    control, data = folders
    ctx = multiprocessing.get_context("fork")
    failures = []
    for n in range(ROUNDS):
        start = ctx.Manager().Event()
        with ctx.Pool(PROCESSES) as pool:
            results = [pool.apply_async(_bind, (control, data, f"ex{n}", f"q{n}-{k}", start))
                       for k in range(PROCESSES)]
            start.set()
            failures += [r for r in (res.get(60) for res in results) if r != "ok"]
    assert failures == []
    with open(f"{control}/ex0.exchange") as fh:
        assert sorted(q[2] for q in json.load(fh)) == [f"q0-{k}" for k in range(PROCESSES)]
