"""The embedded PostgreSQL of make run (devtools/embedded_pg.py): a real
PostgreSQL 18 from the wheel, on 127.0.0.1, stopped in order when asked;
started again after a hard kill; a server already running reused and left
running; each way it cannot start said in one line; make clean refusing to
remove its data under it (docs/operations.md, "make run")."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from devtools.embedded_pg import running, serving
from devtools.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = [sys.executable, "-m", "devtools.embedded_pg"]


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder anyone may pass through (as root without a user namespace,
    the server runs as postgres or nobody; pytest's own temporary folders
    are closed)."""
    parent = Path(tempfile.mkdtemp(prefix="boxoffice-embedded-pg-"))
    parent.chmod(0o755)
    yield parent
    found = running(parent / "var" / "postgres")
    if found is not None:  # a test that failed half-way
        with contextlib.suppress(OSError):
            os.kill(found.pid, signal.SIGQUIT)
    shutil.rmtree(parent, ignore_errors=True)


class Serve:
    """``python -m devtools.embedded_pg serve`` on ``var`` and a free port."""

    def __init__(self, var: Path, port: int | None = None):
        self.var = var
        self.port = port or free_port()
        self.proc = subprocess.Popen(
            [*LAUNCHER, "serve"],
            cwd=ROOT,
            env={**os.environ, "BOXOFFICE_VAR_DIR": str(var), "EMBEDDED_PG_PORT": str(self.port)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()

    def stop(self) -> tuple[int, str]:
        """SIGTERM, then its exit code and what it said."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.ended()

    def ended(self) -> tuple[int, str]:
        """Its exit code and what it said, once it leaves by itself."""
        _, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, err


@pytest.fixture
def serves(folder) -> Iterator[list[Serve]]:
    started: list[Serve] = []
    yield started
    for serve in started:
        with contextlib.suppress(Exception):
            serve.stop()


def _serve(serves: list[Serve], var: Path, port: int | None = None) -> Serve:
    serves.append(Serve(var, port))
    return serves[-1]


def _pid_alive(pid: int) -> bool:
    """Alive and not a zombie (where nothing reaps orphans, one stays)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def test_serve_answers_with_postgresql_18_and_a_sigterm_stops_it(folder, serves):
    # given the launcher on a fresh folder
    serve = _serve(serves, folder / "var")
    # then its first line is the URL of a PostgreSQL 18 on 127.0.0.1 only
    assert serve.url == f"postgres://boxoffice@127.0.0.1:{serve.port}/boxoffice"
    with psycopg.connect(serve.url) as conn:
        assert conn.info.server_version // 10000 == 18
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
    data = folder / "var" / "postgres"
    server = running(data)
    assert server is not None and server.port == serve.port
    if os.geteuid() == 0:  # PostgreSQL refuses root: it runs in a user namespace of its own
        assert os.readlink(f"/proc/{server.pid}/ns/user") != os.readlink("/proc/self/ns/user")
    # when the launcher gets a SIGTERM (honcho's, or scripts/run.sh's at exit)
    code, err = serve.stop()
    # then the server is gone, and that is no failure
    assert code == 0, err
    assert running(data) is None and not _pid_alive(server.pid)


def test_serving_yields_the_url_and_stops_the_server_after(folder):
    with serving(folder / "var") as url:
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("boxoffice",)
        server = running(folder / "var" / "postgres")
        assert server is not None
    assert running(folder / "var" / "postgres") is None and not _pid_alive(server.pid)


def test_a_second_serve_reuses_the_running_server_and_leaves_it_running(folder, serves):
    first = _serve(serves, folder / "var")
    # (on another port: the running server's wins)
    second = _serve(serves, folder / "var")
    assert second.url == first.url
    code, err = second.ended()
    assert code == 0 and "already running" in err
    with psycopg.connect(first.url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_server_killed_hard_starts_again(folder, serves):
    # given a server SIGKILLed: its postmaster.pid stays behind
    first = _serve(serves, folder / "var")
    server = running(folder / "var" / "postgres")
    assert server is not None
    os.kill(server.pid, signal.SIGKILL)
    code, err = first.ended()
    assert code != 0 and "stopped by itself" in err
    assert (folder / "var" / "postgres" / "postmaster.pid").exists()
    # when it is started again, then it answers, its data intact
    again = _serve(serves, folder / "var")
    with psycopg.connect(again.url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("boxoffice",)


def test_a_postmaster_pid_naming_another_live_program_is_removed(folder, serves):
    # given a stopped cluster whose postmaster.pid names a live process that
    # is not its server (a pid given to another program since a crash):
    # PostgreSQL alone would refuse to start
    first = _serve(serves, folder / "var")
    assert first.stop()[0] == 0
    pidfile = folder / "var" / "postgres" / "postmaster.pid"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        pidfile.write_text(f"{sleeper.pid}\n{pidfile.parent}\n0\n{first.port}\n\n127.0.0.1\n")
        # when it is started, then it answers, and says what it removed
        again = _serve(serves, folder / "var")
        with psycopg.connect(again.url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        code, err = again.stop()
        assert code == 0 and f"removed {pidfile}" in err, err
    finally:
        sleeper.kill()
        sleeper.wait()


def _one_line_refusal(serve: Serve) -> str:
    code, err = serve.ended()
    lines = err.strip().splitlines()
    assert code == 2 and serve.url == "" and len(lines) == 1, (code, err)
    return lines[0]


def test_a_port_taken_by_another_program_is_one_line(folder, serves):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        serve = _serve(serves, folder / "var", port=taken.getsockname()[1])
        line = _one_line_refusal(serve)
    assert f"port {serve.port} is taken" in line and "EMBEDDED_PG_PORT" in line


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: the server runs as another user")
def test_as_root_a_checkout_in_a_private_folder_is_served(folder, serves):
    # given a clone in a folder only root may enter (mktemp -d's 0700)
    closed = folder / "closed"
    closed.mkdir(mode=0o700)
    # when make run's launcher serves its var/ (PostgreSQL in root's user
    # namespace, where it is not root and root's files are its own)
    serve = _serve(serves, closed / "var")
    # then it answers, and its data stays root's, in the private folder
    with psycopg.connect(serve.url) as conn:
        assert conn.execute(
            "SELECT current_setting('server_version_num')::int / 10000"
        ).fetchone() == (18,)
    assert (closed / "var" / "postgres").stat().st_uid == 0
    assert serve.stop()[0] == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: the server runs as another user")
def test_without_a_user_namespace_a_folder_the_servers_user_cannot_pass_is_one_line(
    folder, serves, monkeypatch
):
    # given no user namespace (as where the kernel refuses one: here, no
    # unshare on the PATH; test(1) alone, which the launcher asks) ...
    tools = folder / "bin"  # the server's user runs test(1) from here
    tools.mkdir()
    (tools / "test").symlink_to(shutil.which("test"))
    monkeypatch.setenv("PATH", str(tools))
    # ... and a clone in a folder only root may enter
    closed = folder / "closed"
    closed.mkdir(mode=0o700)
    line = _one_line_refusal(_serve(serves, closed / "var"))
    assert f"{closed} (mode 0700) does not let the user" in line
    assert f"chmod o+x {closed}" in line and "DATABASE_URL" in line
    assert not (closed / "var" / "postgres").exists()


def test_make_clean_refuses_while_the_server_runs_then_removes_var(folder, serves):
    # make clean in a folder of its own (its var/ and .venv/, not ours)
    make_clean = ["make", "-s", "-f", str(ROOT / "Makefile"), "-C", str(folder), "clean"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    serve = _serve(serves, folder / "var")
    refused = subprocess.run(make_clean, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    assert "the embedded PostgreSQL of var/postgres is running" in refused.stderr
    assert (folder / "var" / "postgres" / "PG_VERSION").exists()
    assert serve.stop()[0] == 0
    done = subprocess.run(make_clean, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not (folder / "var").exists()
