"""``make manage CMD=...`` (``scripts/manage.sh``): any management command,
from a second shell, with exactly the environment of ``make run``.

Each test runs the script in a clean environment (no SECRET_KEY, no DEBUG, no
DJANGO_SETTINGS_MODULE, none of the URLs ``make test`` exports) on a fresh
embedded PostgreSQL (devtools/embedded_pg.py) under a temporary
``BOXOFFICE_VAR_DIR``, which the script starts for the command and stops
after it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from devtools.embedded_pg import running
from devtools.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
MANAGE = [str(ROOT / "scripts" / "manage.sh")]
SHARED = ("DEBUG", "PORT", "PAYMENT_GATEWAY_URL", "PROMETHEUS_MULTIPROC_DIR")
# Not 5433, which a make run of this machine may be using: one port per session.
PG_PORT = str(free_port())


@pytest.fixture
def var_dir():
    """A folder in a folder anyone may pass through (pytest's own are closed
    to other users): as root, the embedded PostgreSQL runs as postgres (or
    nobody), who must reach its data."""
    parent = Path(tempfile.mkdtemp(prefix="boxoffice-manage-"))
    parent.chmod(0o755)
    yield parent
    shutil.rmtree(parent, ignore_errors=True)


def _clean_env(var_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        # The system's PATH, without the virtualenv: the script finds it.
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "BOXOFFICE_VAR_DIR": str(var_dir),
        "EMBEDDED_PG_PORT": PG_PORT,
    }
    env.update(extra)
    return env


def _manage(var_dir: Path, *args: str, cwd: Path = ROOT, **extra: str):
    return subprocess.run(
        [*MANAGE, *args],
        cwd=cwd,
        env=_clean_env(var_dir, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _ok(result) -> str:
    assert result.returncode == 0, f"{result.args}\n{result.stdout}\n{result.stderr}"
    return result.stdout


SEEN = """
import json, os
from django.conf import settings
print(json.dumps({
    "gateway": settings.PAYMENT_GATEWAY_URL,
    "debug": settings.DEBUG,
    "fake_enabled": settings.FAKE_GATEWAY_ENABLED,
    "database": {
        k: str(settings.DATABASES["default"][k]) for k in ("ENGINE", "HOST", "PORT", "NAME")
    },
    "broker": settings.CELERY_BROKER_URL,
    "metrics": os.environ.get("PROMETHEUS_MULTIPROC_DIR"),
}))
"""


def _seen(var_dir: Path, **extra: str) -> dict:
    out = _ok(_manage(var_dir, "shell", "-c", SEEN, cwd=ROOT, **extra))
    return json.loads(out.strip().splitlines()[-1])


def test_the_sweeps_run_from_a_shell_with_nothing_set(var_dir):
    # given a fresh embedded database
    _ok(_manage(var_dir, "migrate", "--no-input"))
    # when the runbook's commands run, then they work
    assert "would resume 0 saga(s)" in _ok(_manage(var_dir, "resume_sagas", "--dry-run"))
    assert "0 violation(s)" in _ok(_manage(var_dir, "audit_sagas"))
    # on the database of make run with this BOXOFFICE_VAR_DIR, a PostgreSQL
    # stopped again after each command
    assert (var_dir / "postgres" / "PG_VERSION").read_text().strip() == "18"
    assert running(var_dir / "postgres") is None


@pytest.mark.parametrize("port", [None, "8123"])
def test_the_command_sees_the_settings_of_make_run(var_dir, port):
    extra = {"PORT": port} if port else {}
    seen = _seen(var_dir, **extra)
    assert seen["gateway"] == f"http://127.0.0.1:{port or 8000}/fake-gateway/v1"
    assert seen["debug"] is True and seen["fake_enabled"] is True
    assert seen["database"] == {
        "ENGINE": "config.postgresql",
        "HOST": "127.0.0.1",
        "PORT": PG_PORT,
        "NAME": "boxoffice",
    }
    assert seen["broker"] == "filesystem://"
    # The counters of make run, in the folder /metrics adds up.
    assert seen["metrics"] == str(var_dir / "metrics")


def test_what_the_shell_sets_wins_as_in_make_run(var_dir):
    seen = _seen(
        var_dir,
        DATABASE_URL="postgres://someone@127.0.0.1:5999/other",
        CELERY_BROKER_URL="redis://127.0.0.1:6399/3",
        PAYMENT_GATEWAY_URL="http://127.0.0.1:9999/elsewhere/v1",
        PROMETHEUS_MULTIPROC_DIR=str(var_dir / "counters"),
    )
    assert seen["database"] == {
        "ENGINE": "config.postgresql",
        "HOST": "127.0.0.1",
        "PORT": "5999",
        "NAME": "other",
    }
    # and no embedded PostgreSQL was made
    assert not (var_dir / "postgres").exists()
    assert seen["broker"] == "redis://127.0.0.1:6399/3"
    assert seen["gateway"] == "http://127.0.0.1:9999/elsewhere/v1"
    assert seen["metrics"] == str(var_dir / "counters")


def test_it_runs_from_any_folder(var_dir):
    elsewhere = var_dir / "elsewhere"
    elsewhere.mkdir()
    _ok(_manage(var_dir, "check", cwd=elsewhere))


def test_run_and_manage_take_their_environment_from_one_file():
    env_sh = (ROOT / "scripts" / "env.sh").read_text()
    for script in ("run.sh", "manage.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert "env.sh" in text, script
        for name in SHARED:
            assert f"export {name}=" not in text, f"{script} sets {name} itself"
    for name in SHARED:
        assert f"export {name}=" in env_sh, name


def test_make_manage_hands_the_command_over():
    result = subprocess.run(
        ["make", "-n", "manage", "CMD=resume_sagas --dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "scripts/manage.sh resume_sagas --dry-run" in result.stdout
