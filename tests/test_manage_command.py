"""``make manage CMD=...`` (``scripts/manage.sh``): any management command,
from a second shell, with exactly the environment of ``make run``.

Each test runs the script in a clean environment (no SECRET_KEY, no DEBUG, no
DJANGO_SETTINGS_MODULE, none of the URLs ``make test`` exports) on a fresh
embedded SQLite database under a temporary ``BOXOFFICE_VAR_DIR``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MANAGE = [str(ROOT / "scripts" / "manage.sh")]
SHARED = ("DEBUG", "PORT", "PAYMENT_GATEWAY_URL", "PROMETHEUS_MULTIPROC_DIR")


def _clean_env(var_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        # The system's PATH, without the virtualenv: the script finds it.
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "BOXOFFICE_VAR_DIR": str(var_dir),
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
    "database": str(settings.DATABASES["default"]["NAME"]),
    "broker": settings.CELERY_BROKER_URL,
    "metrics": os.environ.get("PROMETHEUS_MULTIPROC_DIR"),
}))
"""


def _seen(var_dir: Path, **extra: str) -> dict:
    out = _ok(_manage(var_dir, "shell", "-c", SEEN, cwd=ROOT, **extra))
    return json.loads(out.strip().splitlines()[-1])


def test_the_sweeps_run_from_a_shell_with_nothing_set(tmp_path):
    # given a fresh embedded database
    _ok(_manage(tmp_path, "migrate", "--no-input"))
    # when the runbook's commands run, then they work
    assert "would resume 0 saga(s)" in _ok(_manage(tmp_path, "resume_sagas", "--dry-run"))
    assert "0 violation(s)" in _ok(_manage(tmp_path, "audit_sagas"))
    # on the database of make run with this BOXOFFICE_VAR_DIR
    assert (tmp_path / "boxoffice.sqlite3").exists()


@pytest.mark.parametrize("port", [None, "8123"])
def test_the_command_sees_the_settings_of_make_run(tmp_path, port):
    extra = {"PORT": port} if port else {}
    seen = _seen(tmp_path, **extra)
    assert seen["gateway"] == f"http://127.0.0.1:{port or 8000}/fake-gateway/v1"
    assert seen["debug"] is True and seen["fake_enabled"] is True
    assert seen["database"] == str(tmp_path / "boxoffice.sqlite3")
    assert seen["broker"] == "filesystem://"
    # The counters of make run, in the folder /metrics adds up.
    assert seen["metrics"] == str(tmp_path / "metrics")


def test_what_the_shell_sets_wins_as_in_make_run(tmp_path):
    seen = _seen(
        tmp_path,
        DATABASE_URL=f"sqlite:///{tmp_path / 'other.sqlite3'}",
        CELERY_BROKER_URL="redis://127.0.0.1:6399/3",
        PAYMENT_GATEWAY_URL="http://127.0.0.1:9999/elsewhere/v1",
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "counters"),
    )
    assert seen["database"] == str(tmp_path / "other.sqlite3")
    assert seen["broker"] == "redis://127.0.0.1:6399/3"
    assert seen["gateway"] == "http://127.0.0.1:9999/elsewhere/v1"
    assert seen["metrics"] == str(tmp_path / "counters")


def test_it_runs_from_any_folder(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _ok(_manage(tmp_path, "check", cwd=elsewhere))


def test_run_and_manage_take_their_environment_from_one_file():
    env_sh = (ROOT / "scripts" / "env.sh").read_text()
    for script in ("run.sh", "manage.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert "env.sh" in text, script
        for name in SHARED:
            assert f"export {name}=" not in text, f"{script} sets {name} itself"
    for name in SHARED:
        assert f"export {name}=" in env_sh, name


def test_make_manage_hands_the_command_over(tmp_path):
    result = subprocess.run(
        ["make", "-n", "manage", "CMD=resume_sagas --dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "scripts/manage.sh resume_sagas --dry-run" in result.stdout
