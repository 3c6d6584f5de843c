"""What every part of `make bench` shares: where things are, the names of its
databases, progress on stderr, percentiles and ratios, the errors that end a
phase, and ``Context``, what a figure receives."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from devtools.processes import ROOT

if TYPE_CHECKING:
    from bench.db import PG, BenchDB
    from bench.pgbench import Pgbench
    from bench.profile import Profiler
    from bench.stack import Broker, Stack

BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
RESERVE_SQL = BENCH / "reserve.sql"

BENCH_DB = "boxoffice_bench"
SWEEPS_DB = "boxoffice_bench_sweeps"
PGBENCH_DB = "boxoffice_bench_pgbench"
# The fake gateway runs as its own process on its own database, as a real
# processor is outside the product: the product database's commit counts
# (figure 2) are then the product's alone.
GATEWAY_DB = "boxoffice_bench_gateway"

# bench/tasks.py's counters (figure 7): spread the row locks, so that the
# transport is measured, not contention.
COUNTER_ROWS = 1000
# Long enough that no hold-expiry timer written during the run fires during the
# run (a purchase left PENDING on purpose would otherwise wake up mid-figure).
HOLD_SECONDS = 7200
# PostgreSQL 15 flushes a backend's statistics at most once a second, and an
# idle backend 10 s after its last transaction: wait this long before reading
# pg_stat_* as "quiesced".
STATS_FLUSH_SECONDS = 12.0
_T0 = time.monotonic()


def log(msg: str) -> None:
    elapsed = time.monotonic() - _T0
    print(f"[{int(elapsed // 60):02d}:{elapsed % 60:04.1f}] {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], p: float) -> float | None:
    """Linear-interpolated percentile, p in [0, 100]."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def lat_summary(seconds: list[float]) -> dict:
    ms = [x * 1000 for x in seconds]
    return {
        "n": len(ms),
        "p50_ms": pct(ms, 50),
        "p90_ms": pct(ms, 90),
        "p99_ms": pct(ms, 99),
        "max_ms": max(ms) if ms else None,
        "mean_ms": statistics.fmean(ms) if ms else None,
    }


def mean_of(runs: list[dict], get) -> float:
    """The mean of ``get(run)`` over a figure's runs."""
    return statistics.fmean(get(r) for r in runs)


def ratio(a, b) -> float | None:
    if a is None or b in (None, 0):
        return None
    return a / b


class PhaseTimeout(Exception):
    pass


class PhaseFailed(Exception):
    pass


# What bench/wsgi_without_tracing.py writes to the web's log at start: figure
# 12's proof that the run was served by it.
WITHOUT_TRACING_MARK = "bench: web without tracing (config.tracing stubbed)"


@dataclass
class Context:
    """What a figure receives. It writes its figure into
    ``results["figures"]`` (and notes into ``results["notes"]``) and appends
    its rows of the table to ``rows``."""

    args: argparse.Namespace
    results: dict
    rows: list[dict]
    logdir: Path
    pg: PG
    db: BenchDB  # the bench database, one autocommit connection
    stack: Stack
    broker: Broker  # the bench's queue and the worker's consumer of it
    pgbench: Pgbench
    users: list[int]  # 256 users with tokens, contiguous ids
    profiler: Profiler | None = None  # --profile: py-spy on the stack's processes

    @property
    def full(self) -> bool:
        return self.args.full

    @property
    def dur(self) -> float:
        return self.args.duration or (60.0 if self.full else 12.0)

    @property
    def warmup(self) -> float:
        return 5.0 if self.full else 3.0


@dataclass(frozen=True)
class Figure:
    """A figure's names and time limit: ``phase`` for ``--phases``, ``key`` in
    the JSON's ``figures`` and ``load``, ``label`` in the log and on failure,
    ``timeout(ctx)`` seconds before the phase is given up."""

    phase: str
    key: str
    label: str
    timeout: Callable[[Context], float]
