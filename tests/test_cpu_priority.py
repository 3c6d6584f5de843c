"""The refunds' pool lowers its own CPU priority wherever it runs
(config/cpu_priority.py): SCHED_IDLE, nice 19 and its autogroup's nice 19,
inherited by the pool's process; the sales' pool keeps its own. Real Celery
workers on Redis, started in sessions of their own as ``make run`` and the
stacks start them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from config.celery import app
from devtools.processes import background_env, celery_worker_argv

from .stack import Stack

LINUX_ONLY = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")


def _autogroup_nice(pid: int) -> int | None:
    path = Path(f"/proc/{pid}/autogroup")
    return int(path.read_text().split()[-1]) if path.exists() else None


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@LINUX_ONLY
def test_background_lowers_the_process_and_its_session():
    probe = (
        "import os; from config import cpu_priority; done = cpu_priority.background();"
        "print(done, os.sched_getscheduler(0) == os.SCHED_IDLE, os.getpriority(os.PRIO_PROCESS, 0),"
        " open('/proc/self/autogroup').read().split()[-1] if os.path.exists('/proc/self/autogroup')"
        " else None)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        start_new_session=True,  # an autogroup of its own, not this test's
        cwd=settings.BASE_DIR,
    ).stdout
    done, idle, nice, autogroup = out.rsplit(" ", 3)
    assert idle == "True" and nice == "19", out
    assert "SCHED_IDLE" in done and "nice 19" in done, out
    assert autogroup.strip() in ("19", "None"), out


@LINUX_ONLY
@pytest.mark.django_db
def test_a_refunds_worker_lowers_itself_and_a_sales_worker_does_not(tmp_path):
    stack = Stack(gateway_url="http://127.0.0.1:9/unused", workdir=tmp_path)
    host = socket.gethostname()
    try:
        for name, queue in (
            ("refunds", settings.CELERY_REFUND_QUEUE),
            ("sales", settings.CELERY_TASK_DEFAULT_QUEUE),
        ):
            argv = celery_worker_argv(queue=queue, concurrency=1, hostname=f"{name}-prio@%h")
            stack.start(name, argv, env=background_env(stack.env))
        for name in ("refunds", "sales"):  # each past worker_init, its pool forked
            stack.wait_ping(app, destination=[f"{name}-prio@{host}"], timeout=60)
        refunds, sales = stack.procs["refunds"].pid, stack.procs["sales"].pid
        ours = os.getpriority(os.PRIO_PROCESS, 0)

        for pid in (refunds, *_children(refunds)):
            assert os.sched_getscheduler(pid) == os.SCHED_IDLE, stack.tails(["refunds"])
            assert os.getpriority(os.PRIO_PROCESS, pid) == 19
        assert _autogroup_nice(refunds) in (19, None)
        assert "CPU priority lowered: SCHED_IDLE, nice 19" in stack.log("refunds")

        for pid in (sales, *_children(sales)):
            assert os.sched_getscheduler(pid) == os.SCHED_OTHER
            assert os.getpriority(os.PRIO_PROCESS, pid) == ours
        assert _autogroup_nice(sales) in (0, None)
        assert "CPU priority" not in stack.log("sales")
    finally:
        stack.stop()
