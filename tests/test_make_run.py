"""``make run`` (scripts/run.sh): its banner points at pages that exist, its
logs hold no false alarm, and its database is a real PostgreSQL that outlives
it.

- every URL the banner prints answers 200 or 302, and the admin's "View site"
  link is not a 404;
- with the settings of ``make run``, one ``django.request`` record is one line
  (not two), and the filesystem broker says nothing about a hostname;
- the fake gateway's deliberate stalls are logged at INFO by the fake, not at
  ERROR by ``django.request``; a real server error of the product's own views
  still is;
- e2e: ``scripts/run.sh`` on a free port and a temporary ``BOXOFFICE_VAR_DIR``,
  in a clean environment; purchases whose gateway answers stall (the fake
  answers 200, or 504, after the client gave up), a 404; then SIGINT to its
  process group, as a terminal's Ctrl-C: it exits 0 and prints no ERROR line,
  no "No hostname was supplied", each ``django.request`` line once, and leaves
  no process behind. Before buying, the staff user registers a webhook
  endpoint (``http://127.0.0.1``: ``make run`` allows local URLs) at a
  receiver this test runs: each confirmed purchase reaches it once, signed
  with the endpoint's secret. Meanwhile ``make manage`` (scripts/manage.sh)
  finds the database to be PostgreSQL 18 (the embedded one of make run,
  which it leaves running); after the Ctrl-C no process is left, the
  embedded PostgreSQL included. Then make run again: the purchases are still
  there, and a second Ctrl-C leaves nothing either.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
from django.test import Client

from devtools.processes import free_port, poll, spawn, stop_group, wait_until

from .webhook_receiver import Receiver

ROOT = Path(__file__).resolve().parent.parent
RUN_SH = ROOT / "scripts" / "run.sh"
MANAGE_SH = ROOT / "scripts" / "manage.sh"
# A banner line: "    <label>  http://127.0.0.1:$PORT<path>" and nothing after it
# (the curl examples under "try:" are not pages).
BANNER_PAGE = re.compile(r"^ {4}(\w+) +http://127\.0\.0\.1:\$PORT(/\S*)$", re.MULTILINE)
# The log format of config/logging.py: "<date> <time> <LEVEL> <logger> <message> key=value ..."
# (after honcho's "<time> <process> | " prefix).
DJANGO_REQUEST = re.compile(r" django\.request (.*?)(?: request=<.*)?$")
# An ERROR (or worse) line in that format, or in Celery's own
# ("[<date> <time>: ERROR/MainProcess] ...").
ERROR_LINE = re.compile(r" (ERROR|CRITICAL) |: (ERROR|CRITICAL)/")


def _clean_env(var_dir: Path, **extra: str) -> dict[str, str]:
    """What a shell with nothing set hands to make run: none of the URLs,
    settings module or secret ``make test`` exports."""
    return {
        # The system's PATH, without the virtualenv: scripts/env.sh adds it.
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "BOXOFFICE_VAR_DIR": str(var_dir),
        **extra,
    }


# --- the banner ----------------------------------------------------------------------


def banner_pages() -> dict[str, str]:
    """label -> path, for every page the banner of scripts/run.sh prints."""
    return {m.group(1): m.group(2) for m in BANNER_PAGE.finditer(RUN_SH.read_text())}


def test_the_banner_lists_the_pages_to_look_at():
    paths = set(banner_pages().values())
    assert {
        "/api/docs/",
        "/api/redoc/",
        "/api/schema/",
        "/api/events/",
        "/admin/",
        "/metrics",
    } <= paths


@pytest.mark.django_db
def test_every_page_the_banner_points_at_answers():
    client = Client()
    answers = {path: client.get(path).status_code for path in banner_pages().values()}
    assert answers and all(code in (200, 302) for code in answers.values()), answers


@pytest.mark.django_db
def test_the_admins_view_site_link_leads_to_a_page(admin_client):
    index = admin_client.get("/admin/")
    assert index.status_code == 200
    link = re.search(r'<a href="([^"]+)">View site</a>', index.content.decode())
    assert link, "the admin shows no View site link"
    assert admin_client.get(link.group(1)).status_code == 200, link.group(1)


# --- one record, one line -------------------------------------------------------------

LOG_SOME = """
import logging
import django
django.setup()
from config.celery import app
logging.getLogger("django.request").warning("Not Found: /probe-404/")
logging.getLogger("django.request").error("Internal Server Error: /probe-500/")
logging.getLogger("purchases").info("probe info line")
with app.connection_for_write() as conn:
    conn.info()
"""


def test_with_the_settings_of_make_run_a_record_is_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", LOG_SOME],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(
            tmp_path,
            DEBUG="true",
            DJANGO_SETTINGS_MODULE="config.settings",
            PYTHONPATH=str(ROOT),
            # What scripts/env.sh exports for its embedded PostgreSQL (not
            # reached here: nothing below queries).
            DATABASE_URL="postgres://boxoffice@127.0.0.1:5433/boxoffice",
        ),
    )
    assert result.returncode == 0, result.stderr
    lines = (result.stdout + result.stderr).splitlines()
    for text in ("Not Found: /probe-404/", "Internal Server Error: /probe-500/", "probe info line"):
        assert sum(text in line for line in lines) == 1, lines
    assert not [line for line in lines if "No hostname was supplied" in line], lines


def test_without_database_url_the_settings_refuse_naming_it(tmp_path):
    # No database is picked silently: make run and make manage export the
    # embedded PostgreSQL's URL (scripts/env.sh); a bare process has none.
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(
            tmp_path, DEBUG="true", DJANGO_SETTINGS_MODULE="config.settings", PYTHONPATH=str(ROOT)
        ),
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured: DATABASE_URL is not set" in result.stderr
    assert "make run" in result.stderr.splitlines()[-1]


# --- the fake's stalls are not server errors --------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "payment_method, status",
    [
        ("pm_card_unreachable", 504),
        ("pm_card_timeout_not_charged", 504),
        ("pm_card_timeout_charged", 200),
    ],
)
def test_a_deliberate_stall_of_the_fake_is_not_logged_as_an_error(
    settings, caplog, payment_method, status
):
    settings.FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS = 0
    caplog.set_level(logging.INFO)
    answer = Client().post(
        "/fake-gateway/v1/payment_intents/pi_stall/charge",
        {"amount": 5000, "currency": "EUR", "payment_method": payment_method},
        content_type="application/json",
        headers={"Idempotency-Key": "stall-1"},
    )
    assert answer.status_code == status
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    [stall] = [r for r in caplog.records if r.name.startswith("payments.fake_gateway")]
    assert stall.levelno == logging.INFO
    assert "on purpose" in stall.getMessage() and str(status) in stall.getMessage()
    assert [r for r in caplog.records if r.name == "django.request"] == []


@pytest.mark.django_db
def test_a_real_server_error_of_the_products_views_is_still_an_error(caplog, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the catalog is broken")

    monkeypatch.setattr("purchases.apis.EventListApi.get", broken)
    answer = Client(raise_request_exception=False).get("/api/events/")
    assert answer.status_code == 500
    [error] = [r for r in caplog.records if r.name == "django.request"]
    assert error.levelno == logging.ERROR and "/api/events/" in error.getMessage()


# --- make run, for real ------------------------------------------------------------------


def _pids_of(var_dir: Path) -> set[int]:
    """Processes started with this BOXOFFICE_VAR_DIR (a fresh temporary folder:
    only ours)."""
    marker = f"BOXOFFICE_VAR_DIR={var_dir}".encode()
    found = set()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if marker in environ.read_bytes().split(b"\0"):
                found.add(int(environ.parent.name))
    return found


def _alive(pids: set[int]) -> dict[int, str]:
    """Those of ``pids`` still in the process table (zombies included), with
    their name and state."""
    alive = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            alive[pid] = stat[stat.index("(") + 1 : stat.rindex(")") + 3]
    return alive


def _answers(http: httpx.Client, path: str) -> bool:
    try:
        return http.get(path).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def var_dir():
    """A var folder in a folder anyone may pass through: as root, the
    embedded PostgreSQL runs as postgres (or nobody), who must reach it, and
    pytest's own temporary folders are closed to other users."""
    parent = Path(tempfile.mkdtemp(prefix="boxoffice-make-run-"))
    parent.chmod(0o755)
    yield parent / "var"
    shutil.rmtree(parent, ignore_errors=True)


# What make manage finds while make run runs: the database's kind and version.
DATABASE_SEEN = """
import json
from django.db import connection
print(json.dumps({"vendor": connection.vendor, "major": connection.pg_version // 10000}))
"""


def _ctrl_c(proc: subprocess.Popen, var_dir: Path, seen: set[int]) -> dict[int, str]:
    """Ctrl-C (the terminal signals the foreground process group); what is
    left of the processes seen, and of any with this BOXOFFICE_VAR_DIR."""
    seen.update(_pids_of(var_dir))
    os.killpg(proc.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    # A process orphaned on the way out may still be exiting: it has half a
    # second to go (polled: a stop that left nothing does not wait).
    poll(lambda: not _alive(seen | _pids_of(var_dir)), timeout=0.5, every=0.05)
    return _alive(seen | _pids_of(var_dir))


def _kill_leftovers(proc: subprocess.Popen, var_dir: Path) -> None:
    stop_group(proc, grace=1)
    for pid in _pids_of(var_dir):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _serving(http: httpx.Client, log: Path) -> None:
    wait_until(
        lambda: _answers(http, "/api/events/"),
        "make run to serve /api/events/",
        timeout=60,
        detail=lambda: log.read_text()[-4000:],
    )


def _token(http: httpx.Client, username: str) -> str:
    answer = http.post("/api/auth/token/", json={"username": username, "password": "boxoffice"})
    return answer.json()["token"]


def _problems(proc: subprocess.Popen, output: str, left: dict[int, str]) -> list[str]:
    """What a start and a Ctrl-C must not show: an exit code, an ERROR line,
    kombu's hostname warning, a django.request line printed twice, a process
    left behind."""
    lines = output.splitlines()
    failures = []
    if proc.returncode != 0:
        failures.append(f"exit code {proc.returncode}")
    failures += [f"ERROR line: {line}" for line in lines if ERROR_LINE.search(line)]
    failures += [f"hostname: {line}" for line in lines if "No hostname was supplied" in line]
    requests = [m.group(1) for line in lines if (m := DJANGO_REQUEST.search(line))]
    failures += [
        f"printed {n} times: {text}"
        for text in requests
        if (n := sum(text in line for line in lines)) != 1
    ]
    if left:
        failures.append(f"processes left behind: {left}")
    return failures


@pytest.mark.e2e
def test_a_start_two_stalled_purchases_and_ctrl_c_print_no_error(tmp_path, var_dir):
    log = tmp_path / "make-run.log"
    port = free_port()
    env = _clean_env(
        var_dir,
        PORT=str(port),
        # Not 5433: a make run of this machine may be using it.
        EMBEDDED_PG_PORT=str(free_port()),
        WORKER_CONCURRENCY="2",
        # The first reconcile probe 2 s after the timeout, not 60 s.
        RECONCILE_BACKOFF_SECONDS="2,2,2,2,2,2",
    )
    proc = spawn([str(RUN_SH)], log=log, env=env)
    seen: set[int] = set()
    receiver = Receiver()
    webhooks: list = []
    database: dict = {}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            _serving(http, log)
            auth = {"Authorization": f"Token {_token(http, 'alice')}"}
            endpoint = http.post(
                "/api/webhook-endpoints/",
                headers={"Authorization": f"Token {_token(http, 'admin')}"},
                json={
                    "url": receiver.url(),
                    "events": ["purchase.confirmed"],
                    "description": "a receiver started by hand",
                },
            )
            assert endpoint.status_code == 201, endpoint.text
            secret = endpoint.json()["secret"]
            # The fake stalls on both: answers 200 after the client gave up
            # (timeout_charged), or 504 (timeout_not_charged's first call).
            bought = []
            for seat, method in (
                ("A1", "pm_card_timeout_charged"),
                ("A2", "pm_card_timeout_not_charged"),
            ):
                answer = http.post(
                    "/api/purchases/",
                    headers={**auth, "Idempotency-Key": seat},
                    json={"event": 1, "seats": [seat], "payment_method": method},
                )
                assert answer.status_code == 202, answer.text
                bought.append(answer.headers["Location"])
            # A 404: one django.request line.
            assert http.get("/api/no-such-page/").status_code == 404

            def confirmed() -> bool:
                seen.update(_pids_of(var_dir))
                return all(
                    http.get(url, headers=auth).json()["status"] == "CONFIRMED" for url in bought
                )

            poll(confirmed, timeout=25, every=0.5)
            states = [http.get(url, headers=auth).json()["status"] for url in bought]
            poll(lambda: len(receiver.requests) >= 2, timeout=20, every=0.2)
            webhooks = sorted(
                (r.verify(secret)["type"], r.verify(secret)["data"]["purchase"]["id"])
                for r in receiver.requests
            )
            # make manage, from a second shell: the same database, PostgreSQL.
            shown = subprocess.run(
                [str(MANAGE_SH), "shell", "-c", DATABASE_SEEN],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert shown.returncode == 0, shown.stderr
            database = json.loads(shown.stdout.strip().splitlines()[-1])
            # ... which it left running.
            assert http.get("/api/events/").status_code == 200
        left = _ctrl_c(proc, var_dir, seen)
    finally:
        receiver.close()
        _kill_leftovers(proc, var_dir)

    output = log.read_text(errors="replace")
    failures = _problems(proc, output, left)
    if database != {"vendor": "postgresql", "major": 18}:
        failures.append(f"make manage found the database {database}, not PostgreSQL 18")
    if "(embedded PostgreSQL, data in " not in output:
        failures.append("the banner names no embedded PostgreSQL")
    if states != ["CONFIRMED", "CONFIRMED"]:
        failures.append(f"purchases {states}")
    ids = sorted(url.rstrip("/").rsplit("/", 1)[-1] for url in bought)
    if webhooks != sorted(("purchase.confirmed", saga) for saga in ids):
        failures.append(
            f"webhooks received {webhooks}, expected one purchase.confirmed for each of {ids}"
        )
    if not any(DJANGO_REQUEST.search(line) for line in output.splitlines()):
        failures.append("no django.request line (the 404 should log one)")
    assert not failures, (
        "\n".join(failures) + "\n--- make run's output (tail) ---\n" + output[-6000:]
    )

    # make run again, on the same var/: the purchases are still there.
    log = tmp_path / "make-run-again.log"
    proc = spawn([str(RUN_SH)], log=log, env=env)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            _serving(http, log)
            auth = {"Authorization": f"Token {_token(http, 'alice')}"}
            again = [http.get(url, headers=auth).json()["status"] for url in bought]
        left = _ctrl_c(proc, var_dir, seen)
    finally:
        _kill_leftovers(proc, var_dir)
    output = log.read_text(errors="replace")
    failures = _problems(proc, output, left)
    if again != ["CONFIRMED", "CONFIRMED"]:
        failures.append(f"after a restart the purchases are {again}")
    assert not failures, (
        "\n".join(failures) + "\n--- the second make run's output (tail) ---\n" + output[-6000:]
    )
