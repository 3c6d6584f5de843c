"""A cache or database host that stops answering fails a call within a bound,
not the system's TCP timeout (config/settings.py; docs/operations.md,
"Settings"): the settings as a process of the stack reads them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_PRINT = (
    "import django, json; django.setup(); from django.conf import settings; "
    "print(json.dumps({'cache': settings.CACHES['default'].get('OPTIONS', {}), "
    "'db': {k: v for k, v in settings.DATABASES['default']['OPTIONS'].items() "
    "if k == 'connect_timeout'}}, default=str))"
)


def _settings(**env: str) -> dict:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CACHE_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    environ.update(DJANGO_SETTINGS_MODULE="config.settings", SECRET_KEY="x", DEBUG="true", **env)
    out = subprocess.run(
        [sys.executable, "-c", _PRINT], cwd=ROOT, env=environ, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_redis_cache_and_postgresql_get_their_timeouts():
    found = _settings(
        CACHE_URL="rediscache://127.0.0.1:6379/1",
        DATABASE_URL="postgres://u@127.0.0.1:5432/x",
        CACHE_SOCKET_TIMEOUT_SECONDS="0.5",
        DB_CONNECT_TIMEOUT_SECONDS="3",
    )
    assert found["cache"] == {"socket_connect_timeout": 0.5, "socket_timeout": 0.5}
    assert found["db"] == {"connect_timeout": 3}


@pytest.mark.parametrize("database", ["sqlite:////tmp/boxoffice-settings-probe.sqlite3", None])
def test_other_backends_get_no_option_they_would_refuse(database):
    # sqlite3.connect() refuses connect_timeout; the file cache has no socket.
    found = _settings(**({"DATABASE_URL": database} if database else {}))
    assert found["cache"] == {}
    assert found["db"] == {}
