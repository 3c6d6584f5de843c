"""The stack as child processes: one API for the E2E stack (tests/stack.py),
the chaos harness (tests/chaos.py) and the benchmark (bench/).

- ``ProcessGroup``: named children, each in its own session (stopped with
  its own children as one process group) and killed by the kernel if the
  harness dies, each writing ``<logdir>/<name>.log``; liveness checks, waits
  that fail with the logs' tails, and orderly stops;
- the stack's command lines (gunicorn, a Celery worker, the outbox relay);
- free ports, ``/proc`` reading, PostgreSQL's programs.

Imports nothing of Django or Celery: the chaos harness's test process stays
free of them, and the bench sets its environment before Django starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
PR_SET_PDEATHSIG = 1


# --- single processes ----------------------------------------------------------------


def die_with_parent() -> None:
    """``preexec_fn``: the kernel SIGKILLs the child when its parent dies. A
    harness killed hard (CI timeout, ^C twice) must not leave a worker
    consuming from its queue or a server listening."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    argv: list[str],
    *,
    log: Path,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    header: str | None = None,
) -> subprocess.Popen:
    """Start ``argv`` in a session of its own, dying with us, stdout and stderr
    appended to ``log`` (after ``header``, if given)."""
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        if header:
            out.write(header.encode())
            out.flush()
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 15) -> None:
    """Send ``sig`` to the process's group, wait ``grace`` seconds, then SIGKILL
    the group: what is left of it (pool processes of a master that died
    first) goes too."""
    signal_group(proc, sig)
    reap_group(proc, grace)


def signal_group(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to the process's group, if the process still runs."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)


def reap_group(proc: subprocess.Popen, grace: float = 15) -> None:
    """Wait ``grace`` seconds for a signalled process, then SIGKILL its group."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def poll(
    predicate: Callable[[], Any],
    *,
    timeout: float | None,
    every: float = 0.1,
    progress: Callable[[], None] | None = None,
    progress_every: float = 5.0,
) -> bool:
    """Call ``predicate()`` every ``every`` seconds until it is true (True) or
    ``timeout`` seconds have passed (False; None: no limit). While waiting,
    ``progress()`` (a log line) is called at most every ``progress_every`` s."""
    deadline = None if timeout is None else time.monotonic() + timeout
    reported = 0.0
    while True:
        if predicate():
            return True
        if deadline is not None and time.monotonic() > deadline:
            return False
        if progress and time.monotonic() - reported > progress_every:
            progress()
            reported = time.monotonic()
        time.sleep(every)


def wait_until(
    predicate: Callable[[], Any],
    what: str,
    timeout: float,
    every: float = 0.1,
    *,
    error: type[Exception] = AssertionError,
    detail: Callable[[], str] | None = None,
) -> None:
    """``poll`` that raises ``error`` naming ``what`` (and ``detail()``, e.g.
    the logs' tails) when ``timeout`` runs out."""
    if not poll(predicate, timeout=timeout, every=every):
        message = f"timed out after {timeout:g}s waiting for {what}"
        raise error(message + ("\n" + detail() if detail else ""))


# --- the stack's command lines ---------------------------------------------------------


def gunicorn_argv(
    *,
    port: int,
    workers: int,
    threads: int,
    extra: Iterable[str] = (),
    app: str = "config.wsgi:application",
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        app,
        "--bind",
        f"127.0.0.1:{port}",
        "--worker-class",
        "gthread",
        "--workers",
        str(workers),
        "--threads",
        str(threads),
        *extra,
    ]


# What the background processes (Celery workers, the relay, beat) run with,
# as docker-compose.yml's x-background-env does: parameters bound by the
# server and statements prepared, which made a purchase's background work
# cheaper for PostgreSQL and the workers alike; the web keeps the client-side
# binding, as fast there (docs/performance.md, "Protocol modes").
BACKGROUND_ENV = {"DB_SERVER_SIDE_BINDING": "true"}


def background_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a background process: :data:`BACKGROUND_ENV`, unless
    ``env`` says otherwise (a bench run comparing the modes)."""
    return {**BACKGROUND_ENV, **env}


def at_lowest_priority(argv: list[str]) -> list[str]:
    """``argv`` run at the lowest CPU priority this process can take
    (``config.cpu_priority.background``: SCHED_IDLE, nice 19, its
    autogroup's nice 19), inherited by what it forks: the bench's fake
    processor in figure 15, which stands for a processor on other machines."""
    launcher = (
        "import os, sys; from config import cpu_priority; cpu_priority.background();"
        " os.execvp(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", launcher, *argv]


# Celery for this project, before its command (worker, beat).
def _celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "config", *args]


def celery_worker_argv(
    *, queue: str, concurrency: int, hostname: str, extra: Iterable[str] = ()
) -> list[str]:
    return [
        *_celery("worker"),
        f"--queues={queue}",
        f"--concurrency={concurrency}",
        "--without-gossip",
        "--without-mingle",
        "--loglevel=INFO",
        f"--hostname={hostname}",
        *extra,
    ]


def celery_beat_argv(*, schedule: str) -> list[str]:
    """Beat (the sweeps, the breaker's trial), its schedule in ``schedule``."""
    return _celery("beat", "--loglevel=INFO", f"--schedule={schedule}")


def relay_argv(poll: float | None = None) -> list[str]:
    """The outbox relay; without ``poll``, OUTBOX_POLL_SECONDS from the settings."""
    return [
        sys.executable,
        "manage.py",
        "run_relay",
        *(["--poll", f"{poll:g}"] if poll is not None else []),
    ]


def manage_argv(*args: str) -> list[str]:
    return [sys.executable, "manage.py", *args]


# --- a group of named processes --------------------------------------------------------


class ProcessGroup:
    """Named child processes, each started with ``spawn`` and logging to
    ``<logdir>/<name>.log``. Failures (a process that exited, a wait that
    timed out) raise ``error``, with the logs' tails unless
    ``logs_in_errors`` is false (the caller then prints them itself)."""

    def __init__(
        self,
        logdir: Path,
        env: dict[str, str],
        *,
        error: type[Exception] = AssertionError,
        logs_in_errors: bool = True,
        tail_chars: int = 4000,
    ) -> None:
        self.logdir = logdir
        self.env = env
        self.error = error
        self.logs_in_errors = logs_in_errors
        self.tail_chars = tail_chars
        self.procs: dict[str, subprocess.Popen] = {}
        self.argv: dict[str, list[str]] = {}
        self.envs: dict[str, dict[str, str]] = {}  # each one's, to start it again alike

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        header: str | None = None,
    ) -> subprocess.Popen:
        self.argv[name] = argv
        self.envs[name] = env or self.env
        self.procs[name] = spawn(
            argv, log=self.logdir / f"{name}.log", env=self.envs[name], header=header
        )
        return self.procs[name]

    def stop(self, name: str | None = None, *, first: Iterable[str] = ()) -> None:
        """Stop ``name``, or every process: SIGTERM to each, those named in
        ``first`` first, in that order, then the rest in the order they were
        started; then each is waited for (``stop_group``'s grace) while the
        others stop too. A Celery worker takes 2-3 s to stop: one after
        another, they were most of an end-to-end test's teardown."""
        keys = [name] if name else [*first, *self.procs]
        procs = [proc for key in keys if (proc := self.procs.pop(key, None)) is not None]
        for proc in procs:
            signal_group(proc)
        for proc in procs:
            reap_group(proc)

    # liveness and waits

    def dead(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def fail(self, message: str, names: Iterable[str] | None = None) -> NoReturn:
        if self.logs_in_errors:
            message += "\n" + self.tails(names)
        raise self.error(message)

    def check_alive(self) -> None:
        dead = self.dead()
        if dead:
            self.fail(", ".join(f"{n} exited with {code}" for n, code in dead.items()), dead)

    def wait_for(
        self, predicate: Callable[[], Any], what: str, timeout: float = 45, every: float = 0.1
    ) -> None:
        """Poll until ``predicate()`` holds; fail if a process exits meanwhile."""

        def holds() -> bool:
            if predicate():
                return True
            self.check_alive()
            return False

        wait_until(
            holds,
            what,
            timeout,
            every,
            error=self.error,
            detail=self.tails if self.logs_in_errors else None,
        )

    def wait_ping(
        self,
        app,
        *,
        destination: list[str] | None = None,
        timeout: float = 30,
        ping_timeout: float = 0.5,
    ) -> None:
        """Until a Celery worker (of ``destination``, or any) answers a ping."""
        self.wait_for(
            lambda: app.control.ping(destination=destination, timeout=ping_timeout),
            "the Celery worker to answer a ping",
            timeout,
            every=0,
        )

    # logs

    def log(self, name: str) -> str:
        path = self.logdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def tails(self, names: Iterable[str] | None = None, chars: int | None = None) -> str:
        """The end of the named logs (default: every ``*.log`` in ``logdir``)."""
        if names is None:
            names = [p.stem for p in sorted(self.logdir.glob("*.log"))]
        chars = chars or self.tail_chars
        return "\n".join(f"--- {n}.log (tail) ---\n{self.log(n)[-chars:]}" for n in names)


# --- /proc and PostgreSQL's programs ---------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    ppid: int
    cpu_ticks: int  # user + system so far, in SC_CLK_TCK ticks
    comm: str


def proc_table() -> dict[int, ProcStat]:
    """Every process on the machine, from /proc (no psutil)."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            raw = stat.read_text()
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            fields = raw[raw.rindex(")") + 2 :].split()
            table[int(stat.parent.name)] = ProcStat(
                ppid=int(fields[1]),
                cpu_ticks=int(fields[11]) + int(fields[12]),
                comm=raw[raw.index("(") + 1 : raw.rindex(")")],
            )
    return table


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid``."""
    return sorted(p for p, stat in proc_table().items() if stat.ppid == pid)


def pg_bin(name: str) -> str | None:
    """A PostgreSQL program: on PATH, else from the newest /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    return str(candidates[-1]) if candidates else None
