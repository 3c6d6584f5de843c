"""The refunds' pool at the machine's leftover CPU (docs/refunds.md, "Where
refunds run").

An event's cancellation refunds thousands of purchases at a pace; the sales
of every other event must not feel it. ``nice -n 19`` alone does not do
that on Linux: with autogroups on (most distributions' default), every
session is a group, and the scheduler shares the CPU between groups before
it looks at a task's nice value. A process started in a session of its own
(honcho under ``make run``, the test and bench stacks) kept an equal share
at nice 19. And even within a group, a niced task on a core runs out its
slice before a sale's thread that wakes there gets the core, a delay paid
at each of a request's dozen wake-ups.

So the pool lowers itself, in the process, before it forks its children
(who inherit it), wherever it runs:

- ``SCHED_IDLE``: a task of any other policy that wakes on its core takes
  the core at once;
- nice 19, for the systems without ``SCHED_IDLE``;
- its autogroup's nice 19 (``/proc/self/autogroup``), so that its session
  weighs as little against the others as its task does within it.

A container has no autogroup of its own (its cgroup weighs instead:
Compose gives the pool a small ``cpu_shares``). Each step the system
refuses is skipped and said in the one INFO line; a WARNING if none could
be taken. Lowering one's own priority needs no privilege.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

NICE = 19
AUTOGROUP = Path("/proc/self/autogroup")


def background() -> list[str]:
    """This process at the lowest CPU priority it can take; what was done."""
    done, refused = [], []
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        done.append("SCHED_IDLE")
    except (AttributeError, OSError) as exc:  # not Linux, or refused
        refused.append(f"SCHED_IDLE: {exc!r}")
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
        done.append(f"nice {NICE}")
    except (AttributeError, OSError) as exc:
        refused.append(f"nice: {exc!r}")
    if AUTOGROUP.exists():  # autogroups on
        try:
            AUTOGROUP.write_text(str(NICE))
            done.append(f"autogroup nice {NICE}")
        except OSError as exc:
            refused.append(f"autogroup: {exc!r}")
    said = "; refused by the system: " + "; ".join(refused) if refused else ""
    if done:
        logger.info("CPU priority lowered: %s%s", ", ".join(done), said)
    else:  # the pool runs as a sale's process would
        logger.warning("CPU priority not lowered%s", said)
    return done
