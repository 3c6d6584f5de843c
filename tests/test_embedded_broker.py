"""The embedded broker (kombu's filesystem transport under var/broker, as
kombu ships it), as make run's processes use it: several of them start at
once and bind their queues to exchanges in the same control folder
(docs/operations.md, "make run").

kombu creates a new exchange's file (``open("wb")``: empty) and only then
locks and writes it; a process that reads it in between fails with
``JSONDecodeError`` (make run lost its worker that way when the webhook
worker started beside it). An existing file is opened, locked, and only then
read and written. So scripts/run.sh declares every exchange first, alone
(``devtools/embedded_broker.py``), and the processes that start together
only ever meet existing files.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kombu import Connection, Exchange, Queue
from kombu.exceptions import DecodeError

ROOT = Path(__file__).resolve().parent.parent
EXCHANGES = 300
PROCESSES = 6


def _connection(control: str, data: str) -> Connection:
    """kombu's own filesystem transport, nothing of ours."""
    return Connection(
        transport="filesystem",
        transport_options={
            "data_folder_in": data,
            "data_folder_out": data,
            "control_folder": control,
        },
    )


def _declare(control: str, data: str, me: str) -> None:
    """The declare step: one process binds a queue to every exchange."""
    with _connection(control, data) as conn:
        for n in range(EXCHANGES):
            Queue(f"q{n}-{me}", Exchange(f"ex{n}"), routing_key=f"q{n}-{me}")(
                conn.default_channel
            ).declare()


def _bind_all(control: str, data: str, me: int, start) -> list[str]:
    """Bind a queue of this process's to each of EXCHANGES exchanges, in the
    same order as the other processes: they meet on every file."""
    start.wait()
    failures = []
    with _connection(control, data) as conn:
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


def test_after_the_declare_step_processes_binding_at_once_all_succeed(folders):
    control, data = folders
    # given every exchange declared by one process first (scripts/run.sh)
    _declare(control, data, "declared")
    # when several processes bind queues to them at the same moment
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
    # then none fails, and every binding is kept
    assert failures == []
    for n in (0, EXCHANGES - 1):
        with open(f"{control}/ex{n}.exchange") as fh:
            assert sorted(q[2] for q in json.load(fh)) == sorted(
                [f"q{n}-declared", *(f"q{n}-{k}" for k in range(PROCESSES))]
            )


def test_a_new_exchange_file_read_before_kombu_writes_it_fails(folders):
    # Why the step: the moment between kombu's open("wb") of a new exchange
    # and its write, as another process finds the file.
    control, data = folders
    Path(control, "ex-new.exchange").touch()
    with _connection(control, data) as conn, pytest.raises((json.JSONDecodeError, DecodeError)):
        Queue("q", Exchange("ex-new"), routing_key="q")(conn.default_channel).declare()


# --- what make run declares ------------------------------------------------------------

SEEN = """
import json
from django.conf import settings
from config.celery import app
print(json.dumps({
    "broker": settings.CELERY_BROKER_URL,
    "transport": app.conf.broker_transport,
    "remote_control": app.conf.worker_enable_remote_control,
}))
"""


def _make_run_env(var_dir: Path) -> dict[str, str]:
    """The settings of make run with no broker URL (the database is not
    reached: any PostgreSQL URL will do)."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "DEBUG": "true",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": "postgres://boxoffice@127.0.0.1:5433/boxoffice",
        "BOXOFFICE_VAR_DIR": str(var_dir),
    }


def test_make_run_declares_every_queue_a_worker_of_the_procfile_consumes(tmp_path):
    # given the Procfile's workers and the step of scripts/run.sh
    consumed = set(re.findall(r"--queues=(\S+)", (ROOT / "Procfile").read_text()))
    run_sh = (ROOT / "scripts" / "run.sh").read_text()
    assert consumed and run_sh.index("devtools.embedded_broker") < run_sh.index("honcho")
    # when the step runs with the settings of make run
    done = subprocess.run(
        [sys.executable, "-m", "devtools.embedded_broker"],
        cwd=ROOT,
        env=_make_run_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # then each of those queues is bound to its exchange, in its file
    control = tmp_path / "broker" / "control"
    for queue in consumed:
        table = json.loads((control / f"{queue}.exchange").read_text())
        assert [queue, "", queue] in table, table


def test_the_embedded_broker_is_kombus_own_transport_without_remote_control(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SEEN],
        cwd=ROOT,
        env=_make_run_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["broker"] == "filesystem://"
    # No transport of ours in between (kombu's "filesystem" by its URL).
    assert seen["transport"] is None
    # Remote control would bind each worker to celery.pidbox at its start:
    # a fanout exchange nothing declares before.
    assert seen["remote_control"] is False
