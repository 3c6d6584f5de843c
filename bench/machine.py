"""CPU accounting from /proc: what the stack's processes and the whole
machine spent, and what else the (shared) machine was doing."""

from __future__ import annotations

import os
import time
from pathlib import Path

from devtools.processes import ProcStat, proc_table


def tree_cpu_seconds(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each named process and its descendants
    (children that exited are not counted: sample around a window)."""
    table = proc_table()
    children: dict[int, list[int]] = {}
    for pid, stat in table.items():
        children.setdefault(stat.ppid, []).append(pid)
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, root in roots.items():
        todo, ticks = [root], 0
        while todo:
            pid = todo.pop()
            ticks += table[pid].cpu_ticks if pid in table else 0
            todo += children.get(pid, [])
        out[name] = ticks / hz
    return out


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _descends_from(pid: int, ancestor: int, table: dict[int, ProcStat]) -> bool:
    for _ in range(50):
        if pid == ancestor:
            return True
        pid = table[pid].ppid if pid in table else 0
        if pid <= 1:
            return False
    return False


def machine_load(seconds: float = 1.0) -> dict:
    """What else the (shared) machine was doing over ``seconds``: the CPU
    used by processes that are neither ours nor PostgreSQL's, as a share
    of all cores, and the busiest of them."""
    before = proc_table()
    time.sleep(seconds)
    after = proc_table()
    me = os.getpid()
    hz = os.sysconf("SC_CLK_TCK")
    cores = os.cpu_count() or 1
    busy, total = [], 0.0
    for pid, stat in after.items():
        if _descends_from(pid, me, after) or stat.comm.startswith("postgres") or pid not in before:
            continue
        share = (stat.cpu_ticks - before[pid].cpu_ticks) / hz / seconds / cores * 100
        total += share
        if share >= 2:
            busy.append((share, f"{stat.comm}({pid}) {share:.0f}%"))
    return {
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "other_cpu_percent_of_machine": round(total, 1),
        "busy_others": [b for _, b in sorted(busy, reverse=True)[:6]],
    }
