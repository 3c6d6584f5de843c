"""CPU by process over a window (figure 2): the stack's process trees, each
PostgreSQL process by what it serves (the product database, the gateway's,
the bench's own connections, other databases, PostgreSQL's own auxiliary
processes), the Redis server and the load generator, from the
``utime + stime`` of ``/proc/<pid>/stat`` as bench/machine.py reads it.

Process trees (the stack's, the bench's) are read at the start and the end
of the window with their reaped children's times (``cutime + cstime``):
a pool process that exited inside the window is then counted in full by
its parent. PostgreSQL's backends are children of the postmaster, which
does not say which database an exited one served: they are sampled every
``every`` seconds (pid -> database from ``pg_stat_activity``) and each is
counted from its first sample (0 if it started inside the window) to its
last. What exited backends used after their last sample is the
postmaster's ``cutime + cstime`` not accounted for (``pg_exited_unsampled``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench.common import BENCH_DB, GATEWAY_DB, log
from bench.db import PG
from bench.machine import machine_busy_seconds

HZ = os.sysconf("SC_CLK_TCK")

# What each key of the result is, in the order of the table. ``TOTAL`` is
# the sum of the keys in ``COUNTED``; the others are shown, not added.
LABELS = {
    "web": "web (gunicorn master + workers)",
    "worker": "worker (celery + pool)",
    "webhooks": "webhooks worker (celery + pool)",
    "refunds": "refunds worker (celery + pool)",
    "relay": "relay",
    "beat": "beat",
    "gateway": "fake gateway",
    "pg_product": f"postgres {BENCH_DB}",
    "pg_gateway": f"postgres {GATEWAY_DB}",
    "pg_bench": "postgres, the bench's connections",
    "pg_auxiliary": "postgres auxiliary processes",
    "redis": "redis-server",
    "load_generator": "load generator (the bench)",
}
NOT_COUNTED = {
    "pg_other_databases": "postgres backends of other databases (not the bench's)",
    "pg_unmapped": "postgres processes never seen in pg_stat_activity",
    "pg_exited_unsampled": "postgres backends that exited, after their last sample",
    "py_spy": "py-spy (--profile)",
}


@dataclass(frozen=True)
class _Stat:
    ppid: int
    own: int  # utime + stime, ticks
    reaped: int  # cutime + cstime: waited-for children, ticks
    comm: str


def _stat(pid: int) -> _Stat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    f = raw[raw.rindex(")") + 2 :].split()
    return _Stat(
        ppid=int(f[1]),
        own=int(f[11]) + int(f[12]),
        reaped=int(f[13]) + int(f[14]),
        comm=raw[raw.index("(") + 1 : raw.rindex(")")],
    )


def _table() -> dict[int, _Stat]:
    # devtools.processes.proc_table has no children's times; this is its
    # twin with them (devtools is shared with the tests' harnesses).
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                out[int(entry.name)] = st
    return out


def _tree_ticks(table: dict[int, _Stat], root: int, stop_at: set[int]) -> int:
    """``root`` and its descendants, reaped ones included; the subtrees of
    ``stop_at`` are left out (they are counted under their own name)."""
    children: dict[int, list[int]] = {}
    for pid, st in table.items():
        children.setdefault(st.ppid, []).append(pid)
    todo, ticks = [root], 0
    while todo:
        pid = todo.pop()
        if pid in table:
            ticks += table[pid].own + table[pid].reaped
        todo += [c for c in children.get(pid, []) if c not in stop_at]
    return ticks


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return [p for p, st in _table().items() if st.ppid == pid]
    return [int(x) for x in text.split()]


class WindowCPU:
    """Start it before the window, stop it after; ``stop()`` returns CPU
    seconds per key of ``LABELS`` and ``NOT_COUNTED``."""

    def __init__(
        self,
        *,
        roots: dict[str, int],
        pg: PG,
        redis_pid: int | None,
        excluded: Sequence[int] = (),
        every: float = 0.5,
    ):
        self.roots = roots  # the stack's processes by key (web, worker, ...)
        self.excluded = list(excluded)  # py-spy's processes
        self.pg = pg
        # Redis's own pid (INFO): on this machine only if /proc says redis-server.
        st = _stat(redis_pid) if redis_pid else None
        self.redis_pid = redis_pid if st and st.comm.startswith("redis") else None
        self.every = every
        self.me = os.getpid()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.conn: psycopg.Connection | None = None
        self.postmaster = 0
        # pid -> what it serves (first seen), ticks at the start, last ticks.
        self.kind: dict[int, str] = {}
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.errors: list[str] = []

    # -- PostgreSQL's processes ---------------------------------------------------

    def _classify(self) -> None:
        assert self.conn is not None  # start() opened it
        rows = self.conn.execute(
            "SELECT pid, datname, backend_type, application_name FROM pg_stat_activity"
        ).fetchall()
        for pid, datname, backend_type, app in rows:
            if pid in self.kind and self.kind[pid] != "pg_unmapped":
                continue
            if backend_type != "client backend":
                kind = "pg_auxiliary"
            elif (app or "").startswith("boxoffice-bench"):
                kind = "pg_bench"
            elif datname == BENCH_DB:
                kind = "pg_product"
            elif datname == GATEWAY_DB:
                kind = "pg_gateway"
            else:
                kind = "pg_other_databases"
            self.kind[pid] = kind

    def _sample_pg(self) -> None:
        if not self.postmaster:
            return
        for pid in _children(self.postmaster):
            st = _stat(pid)
            if st is not None:
                self.last[pid] = st.own
                self.kind.setdefault(pid, "pg_unmapped")
        self._classify()

    def _kind(self, pid: int) -> str:
        kind = self.kind.get(pid, "pg_unmapped")
        if kind == "pg_unmapped" and pid in self.first:
            # There all along and not in pg_stat_activity: the logger and
            # other background processes.
            return "pg_auxiliary"
        return kind

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self._sample_pg()
            except Exception as exc:  # noqa: BLE001 - reported with the result
                if len(self.errors) < 3:
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    # -- the window ---------------------------------------------------------------

    def _trees(self) -> dict[str, int]:
        table = _table()
        named = {**self.roots, **{f"py_spy:{p}": p for p in self.excluded}}
        out = {k: _tree_ticks(table, pid, set()) for k, pid in named.items()}
        out["load_generator"] = _tree_ticks(table, self.me, set(named.values()))
        pm = table.get(self.postmaster)
        out["_postmaster_own"] = pm.own if pm else 0
        out["_postmaster_reaped"] = pm.reaped if pm else 0
        rs = table.get(self.redis_pid) if self.redis_pid else None
        out["redis"] = rs.own if rs else 0
        return out

    def start(self) -> None:
        self.conn = conn = self.pg.connect("postgres")
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        (backend,) = row
        st = _stat(backend)
        # PostgreSQL on this machine: our backend is a postgres process here.
        self.postmaster = st.ppid if st and st.comm.startswith("postgres") else 0
        if not self.postmaster:
            log("   note: PostgreSQL does not run on this machine: its CPU is not measured")
        self._classify()
        self._sample_pg()
        self.first = dict(self.last)
        self.t0 = time.monotonic()
        self.busy0 = machine_busy_seconds()
        self.trees0 = self._trees()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> dict:
        trees1 = self._trees()
        busy1 = machine_busy_seconds()
        seconds = time.monotonic() - self.t0
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        alive_before = set(self.last)
        with contextlib.suppress(Exception):
            self._sample_pg()
        with contextlib.suppress(Exception):
            if self.conn is not None:
                self.conn.close()

        def d(key: str) -> float:
            return (trees1[key] - self.trees0[key]) / HZ

        used: dict[str, float | None] = {k: d(k) for k in self.roots}
        used["beat"] = None  # the bench runs no beat (see bench/README.md)
        used["load_generator"] = d("load_generator")
        used["redis"] = d("redis") if self.redis_pid else None
        used["py_spy"] = sum(d(f"py_spy:{p}") for p in self.excluded) if self.excluded else 0.0
        pg_kinds = (
            "pg_product",
            "pg_gateway",
            "pg_bench",
            "pg_auxiliary",
            "pg_other_databases",
            "pg_unmapped",
            "pg_exited_unsampled",
        )
        for kind in pg_kinds:
            used[kind] = 0.0 if self.postmaster else None
        if not self.postmaster:
            return self._result(used, seconds, busy1, alive_before, alive_before)
        alive = set(_children(self.postmaster))
        used["pg_auxiliary"] = d("_postmaster_own")
        vanished_last = 0
        for pid, ticks in self.last.items():
            kind = self._kind(pid)
            used[kind] = (used[kind] or 0.0) + (ticks - self.first.get(pid, 0)) / HZ
            if pid not in alive:
                vanished_last += ticks
        reaped = trees1["_postmaster_reaped"] - self.trees0["_postmaster_reaped"]
        used["pg_exited_unsampled"] = max(0, reaped - vanished_last) / HZ
        return self._result(used, seconds, busy1, alive_before, alive)

    def _result(
        self, used: dict, seconds: float, busy1: float, alive_before: set[int], alive: set[int]
    ) -> dict:
        kinds: dict[str, int] = {}
        for pid in self.last:
            k = self._kind(pid)
            kinds[k] = kinds.get(k, 0) + 1
        if self.errors:
            log(f"!! CPU sampling: {self.errors}")
        return {
            "seconds": seconds,
            "cpu_seconds": used,
            "machine_busy_seconds": busy1 - self.busy0,
            "postgres_processes": kinds,
            "postgres_exited": len(alive_before - alive),
            "sampling_errors": self.errors,
        }


def per_purchase(window: dict, purchases: int) -> dict:
    """ms of CPU per purchase per key, the total of the counted keys, and
    the whole machine's (everything that ran, others' work included)."""
    used = window["cpu_seconds"]
    out: dict[str, float | None] = {}
    for key in (*LABELS, *NOT_COUNTED, *used):
        v = used.get(key)
        out[key] = None if v is None else round(v * 1000 / purchases, 2)
    out["total"] = round(
        sum(v for k, v in out.items() if k not in NOT_COUNTED and v is not None), 2
    )
    out["machine_all_processes"] = round(window["machine_busy_seconds"] * 1000 / purchases, 2)
    return out
