"""``--profile PHASE[,PHASE]``: a sampling profile of the stack's processes
during the named figures, with ``py-spy record --subprocesses``, one flame
graph (SVG) per process started by the stack, in the run's log directory:
``profile-<phase>-<name>-<pid>.svg`` (gunicorn's master with its workers,
a Celery master with its pool, the relay, the fake gateway; figure 2's
count run's processes, which run the statement counter, as
``sqlcount-<name>``).

A process the figure starts or restarts (figure 3's worker, figure 2's count
run, figure 11's second pool and relay) is attached to as it appears. py-spy
stops on SIGINT (at the figure's end) or when its process exits, and writes
its SVG then. It needs ptrace (root, or CAP_SYS_PTRACE): if it cannot
attach, the option fails in one line and the figure runs unprofiled. A
profiled figure's numbers include py-spy's cost (each sample stops the
process for a moment); its own CPU is shown apart in figure 2's CPU.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import log

RATE = 100  # samples per second per process (py-spy's default)
# --profile-format: py-spy's output formats, and the file each writes. "raw"
# is the collapsed stacks (one "frame;frame;... count" line per stack), for
# reading with a script or feeding to another flame graph tool.
SUFFIX = {"flamegraph": "svg", "raw": "txt", "speedscope": "speedscope.json"}


def find_py_spy() -> str | None:
    """py-spy beside this interpreter (the venv's, ``pip install py-spy``), or on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Profiler:
    def __init__(
        self,
        *,
        phases: set[str],
        logdir: Path,
        binary: str,
        results: dict,
        fmt: str = "flamegraph",
        gil: bool = False,
    ):
        self.phases = phases
        self.fmt = fmt
        self.suffix = SUFFIX[fmt]
        self.gil = gil
        self.logdir = logdir
        self.binary = binary
        self.results = results
        self.failed: str | None = None
        self.procs: dict[tuple[str, int], subprocess.Popen] = {}
        self.files: list[str] = []
        self._stop = threading.Event()

    def pids(self) -> list[int]:
        """py-spy's own processes now running (figure 2 counts their CPU apart)."""
        return [p.pid for p in list(self.procs.values()) if p.poll() is None]

    @contextlib.contextmanager
    def recording(self, phase: str, stack):
        if phase not in self.phases or self.failed or stack is None:
            yield
            return
        self.results.setdefault("profiles", {}).setdefault(phase, [])
        self.results["notes"].append(
            f"--profile {phase}: its numbers include py-spy's cost ({RATE} samples/s per process)"
        )
        self._stop.clear()
        watcher = threading.Thread(target=self._watch, args=(phase, stack), daemon=True)
        watcher.start()
        try:
            yield
        finally:
            self._stop.set()
            watcher.join(10)
            self._finish(phase)

    def _watch(self, phase: str, stack) -> None:
        """Attach to each process of the stack as it appears."""
        while not self._stop.is_set() and not self.failed:
            variant = stack.variant
            for name, proc in list(stack.procs.items()):
                key = (f"{variant}-{name}" if variant else name, proc.pid)
                if key not in self.procs and proc.poll() is None:
                    self._attach(phase, *key)
            self._stop.wait(0.5)

    def _attach(self, phase: str, name: str, pid: int) -> None:
        out = self.logdir / f"profile-{phase}-{name}-{pid}.{self.suffix}"
        argv = [
            self.binary,
            "record",
            "--pid",
            str(pid),
            "--subprocesses",
            "--rate",
            str(RATE),
            "--format",
            self.fmt,
            "--output",
            str(out),
            # --profile-gil: only the samples that hold the GIL, the Python
            # code's CPU (py-spy counts a thread waiting in libpq or a socket
            # as running otherwise).
            *(["--gil"] if self.gil else []),
        ]
        log_path = self.logdir / f"py-spy-{phase}-{name}-{pid}.log"
        # Not devtools' spawn: its preexec_fn is not safe from this thread. A
        # py-spy left behind by a bench killed hard exits with its process.
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs[(name, pid)] = proc
        # py-spy fails at once when it cannot attach (no ptrace).
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = proc.wait(1.0)
            if code != 0 and Path(f"/proc/{pid}").exists():
                lines = log_path.read_text(errors="replace").strip().splitlines()
                self.failed = (
                    f"--profile: py-spy could not attach to {name} (pid {pid}): "
                    f"{lines[-1] if lines else f'exit {code}'}"
                )
                log("!! " + self.failed)
                self.results["failures"].append({"phase": "profile", "error": self.failed})

    def _finish(self, phase: str) -> None:
        running = [(k, p) for k, p in self.procs.items() if p.poll() is None]
        for _, proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)  # py-spy writes its profile and exits
        deadline = time.monotonic() + 120
        for (name, pid), proc in self.procs.items():
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log(f"!! py-spy for {name} (pid {pid}) did not write its profile in time")
                proc.kill()
                proc.wait(5)
            out = self.logdir / f"profile-{phase}-{name}-{pid}.{self.suffix}"
            if out.exists():
                self.results["profiles"][phase].append(str(out))
                self.files.append(str(out))
        self.procs = {}
        got = self.results["profiles"][phase]
        log(f"   --profile {phase}: {len(got)} profiles ({self.fmt}) in {self.logdir}")
