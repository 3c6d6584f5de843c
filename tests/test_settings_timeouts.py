"""A cache or database host that stops answering fails a call within a bound,
not the system's TCP timeout (config/settings.py; docs/operations.md,
"Settings"): the settings as a process of the stack reads them. PostgreSQL
is the one database they accept."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seller.seat_maps import PRICE_MAX

ROOT = Path(__file__).resolve().parent.parent

_PRINT = (
    "import django, json; django.setup(); from django.conf import settings; "
    "print(json.dumps({'cache': settings.CACHES['default'].get('OPTIONS', {}), "
    "'db': {k: v for k, v in settings.DATABASES['default']['OPTIONS'].items() "
    "if k == 'connect_timeout'}}, default=str))"
)


def _run(**env: str) -> subprocess.CompletedProcess:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CACHE_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    environ.update(DJANGO_SETTINGS_MODULE="config.settings", SECRET_KEY="x", DEBUG="true", **env)
    return subprocess.run(
        [sys.executable, "-c", _PRINT], cwd=ROOT, env=environ, capture_output=True, text=True
    )


def _settings(**env: str) -> dict:
    out = _run(**env)
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


def test_a_cache_without_sockets_gets_no_socket_option():
    # The file cache (no CACHE_URL) would refuse a socket timeout.
    found = _settings(DATABASE_URL="postgres://u@127.0.0.1:5432/x")
    assert found["cache"] == {}
    assert found["db"] == {"connect_timeout": 5}


def test_a_database_other_than_postgresql_is_refused_in_one_line():
    out = _run(DATABASE_URL="sqlite:////tmp/boxoffice-settings-probe.sqlite3")
    assert out.returncode != 0
    assert "ImproperlyConfigured: DATABASE_URL names django.db.backends.sqlite3" in out.stderr
    assert "PostgreSQL only" in out.stderr


@pytest.mark.parametrize("seats", ["0", "21"])
def test_more_seats_per_purchase_than_a_total_can_hold_is_refused(seats):
    # 20 seats at the highest price a seller may set fill the purchase's
    # integer total (seller/seat_maps.py, PRICE_MAX)
    out = _run(DATABASE_URL="postgres://u@127.0.0.1:5432/x", MAX_SEATS_PER_PURCHASE=seats)
    assert out.returncode != 0
    assert "ImproperlyConfigured: MAX_SEATS_PER_PURCHASE must be 1 to 20" in out.stderr


def test_twenty_seats_at_the_highest_price_fit_the_total_columns():
    assert 20 * PRICE_MAX <= 2**31 - 1
