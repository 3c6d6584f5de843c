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
import time

import pytest
from kombu import Connection, Exchange, Queue

EXCHANGES = 300
PROCESSES = 6


TRANSPORT = "config.kombu_filesystem:Transport"


def _bind_all(control: str, data: str, me: int, start) -> list[str]:
    """Bind a queue of this process's to each of EXCHANGES new exchanges, in
    the same order as the other processes: they meet on every file."""
    start.wait()
    failures = []
    with Connection(
        transport=TRANSPORT,
        transport_options={
            "data_folder_in": data,
            "data_folder_out": data,
            "control_folder": control,
        },
    ) as conn:
        channel = conn.default_channel
        for n in range(EXCHANGES):
            try:
                Queue(f"q{n}-{me}", Exchange(f"ex{n}"), routing_key=f"q{n}-{me}")(channel).declare()
            except Exception as exc:  # the failure is the result
                failures.append(f"ex{n}: {type(exc).__name__}: {exc}")
    return failures


@pytest.fixture
def folders(tmp_path):
    (tmp_path / "control").mkdir()
    (tmp_path / "data").mkdir()
    return str(tmp_path / "control"), str(tmp_path / "data")


def test_processes_binding_one_new_exchange_at_once_all_succeed(folders):
    control, data = folders
    # Not fork: the test process has threads (other tests' servers and
    # stacks), and a fork copies whatever lock they held. The fork server is
    # a clean process whose children start together.
    ctx = multiprocessing.get_context("forkserver")
    with ctx.Manager() as manager, ctx.Pool(PROCESSES) as pool:
        start = manager.Event()
        results = [pool.apply_async(_bind_all, (control, data, k, start)) for k in range(PROCESSES)]
        time.sleep(0.5)  # every process waiting at the start
        start.set()
        failures = sum((res.get(120) for res in results), [])
    assert failures == []
    for n in (0, EXCHANGES - 1):
        with open(f"{control}/ex{n}.exchange") as fh:
            assert sorted(q[2] for q in json.load(fh)) == [f"q{n}-{k}" for k in range(PROCESSES)]
