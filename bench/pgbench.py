"""pgbench, the baseline of figures 1 and 2: a run, its per-transaction
latencies (from its transaction log) and the machine's CPU per transaction."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

from bench.common import PhaseFailed, lat_summary
from bench.db import PG
from bench.machine import machine_busy_seconds
from devtools.processes import die_with_parent, pg_bin, stop_group


def find_pgbench() -> str:
    found = pg_bin("pgbench")
    if not found:
        raise SystemExit("make bench: pgbench not found (install postgresql-client)")
    return found


class Pgbench:
    """``mode`` is the query protocol (``-M``) Django's connections use (run.py: setup)."""

    def __init__(self, *, binary: str, pg: PG, tmp: Path, logdir: Path, mode: str = "simple"):
        self.binary = binary
        self.pg = pg
        self.tmp = tmp
        self.logdir = logdir
        self.mode = mode

    def init(self, db: str, scale: int) -> None:
        subprocess.run(
            [self.binary, *self.pg.pg_args(), "-i", "-q", "-s", str(scale), db],
            env=self.pg.pg_env(),
            check=True,
            timeout=180,
            capture_output=True,
        )

    def run(self, *, args: list[str], db: str, timeout: float, tag: str) -> dict:
        prefix = self.tmp / f"pgb-{tag}"
        cmd = [self.binary, *self.pg.pg_args(), "-n", *args, "-l", f"--log-prefix={prefix}", db]
        busy0 = machine_busy_seconds()
        proc = subprocess.Popen(
            cmd,
            env=self.pg.pg_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            stop_group(proc, signal.SIGKILL, grace=5)
            raise
        busy = machine_busy_seconds() - busy0
        (self.logdir / f"pgbench-{tag}.txt").write_text(f"$ {' '.join(cmd)}\n{out}\n{err}")
        res = self._parse(cmd, out, err, prefix)
        if res["transactions"]:
            # Everything the machine did, pgbench and PostgreSQL included
            # (and whatever else runs on a shared box) per transaction.
            res["machine_cpu_ms_per_txn"] = round(busy * 1000 / res["transactions"], 2)
        if proc.returncode != 0 or res["aborted"] or res["tps"] is None:
            raise PhaseFailed(f"pgbench {tag} failed (rc {proc.returncode}): {err[-600:]}")
        return res

    @staticmethod
    def _parse(cmd: list[str], out: str, err: str, prefix: Path) -> dict:
        lats = []
        for path in sorted(prefix.parent.glob(f"{prefix.name}.*")):
            with open(path) as fh:
                for line in fh:
                    parts = line.split()
                    if len(parts) >= 3 and parts[2].isdigit():
                        lats.append(int(parts[2]) / 1e6)
        tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
        processed = re.search(r"number of transactions actually processed: (\d+)", out)
        failed = re.search(r"number of failed transactions: (\d+)", out)
        return {
            "cmd": " ".join(cmd),
            "tps": float(tps.group(1)) if tps else None,
            "transactions": int(processed.group(1)) if processed else None,
            "failed": int(failed.group(1)) if failed else None,
            "aborted": "aborted" in (out + err),
            "latency": lat_summary(lats),
            "stderr_tail": err[-800:],
        }
