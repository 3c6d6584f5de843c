"""docker-compose.yml, read and checked without a Docker engine.

The fake gateway is the demo's card processor: in the Compose stack it is its
own service on an internal network with its own database, never mounted on
the web service the world can reach. Each app service is checked against what
``config/settings.py`` really reads, and the gateway service's own command and
healthcheck are run here against an empty PostgreSQL database of their own.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import environ
import psycopg
import pytest
import yaml
from django.core.management import get_commands
from django.urls import resolve

from purchases.ops.health import CHECKS, readyz_view

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
APP_SERVICES = ("web", "worker", "webhooks", "refunds", "admission", "relay", "beat")
IMAGE = SERVICES["web"]["image"]
GATEWAY_PREFIX = "/fake-gateway/v1"


def _interpolate(value: str) -> str:
    """Compose's ``${NAME:-default}`` / ``${NAME-default}`` / ``${NAME}``, as in
    a shell that sets none of them."""
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", value)


def _env(service: str) -> dict[str, str]:
    raw = SERVICES[service].get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {k: _interpolate(str(v)) for k, v in raw.items()}


def _argv(service: str) -> list[str]:
    command = SERVICES[service].get("command")
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def _words(service: str) -> list[str]:
    """Every word of the command, also inside ``sh -c "..."``."""
    argv = _argv(service)
    if argv[:2] == ["sh", "-c"]:
        return shlex.split(argv[2])
    return argv


def _truthy(value: str) -> bool:
    return value.strip().lower() in environ.Env.BOOLEAN_TRUE_STRINGS


def _networks(service: str) -> list[str]:
    networks = SERVICES[service].get("networks")
    if networks is None:
        return ["default"]
    return list(networks)


def _internal(network: str) -> bool:
    return bool(((COMPOSE.get("networks") or {}).get(network) or {}).get("internal"))


def _image_services() -> list[str]:
    """The services that run this project's image."""
    return [name for name, s in SERVICES.items() if s.get("image") == IMAGE or "build" in s]


def _gateway_service() -> str:
    host = urlsplit(_env("worker")["PAYMENT_GATEWAY_URL"]).hostname
    assert host is not None and host in SERVICES, (
        f"PAYMENT_GATEWAY_URL names {host!r}, which is no service"
    )
    return host


# --- the fake gateway is not on web ------------------------------------------


@pytest.mark.parametrize("service", APP_SERVICES)
def test_no_app_service_enables_the_fake_gateway(service):
    env = _env(service)
    assert "FAKE_GATEWAY_ENABLED" in env, "say it: DEBUG is off, but be explicit"
    assert not _truthy(env["FAKE_GATEWAY_ENABLED"])


@pytest.mark.parametrize("service", APP_SERVICES)
def test_every_app_service_calls_the_gateway_service(service):
    url = urlsplit(_env(service)["PAYMENT_GATEWAY_URL"])
    assert url.hostname not in APP_SERVICES
    assert url.hostname == _gateway_service()
    assert url.path.rstrip("/") == GATEWAY_PREFIX


def test_the_gateway_service_serves_the_fake_and_accepts_its_own_name():
    name = _gateway_service()
    env = _env(name)
    assert _truthy(env["FAKE_GATEWAY_ENABLED"])
    assert name in env["ALLOWED_HOSTS"].split(",")
    # The app's own image.
    assert SERVICES[name].get("image") == IMAGE


def test_the_gateway_service_is_reachable_only_on_internal_networks():
    name = _gateway_service()
    assert "ports" not in SERVICES[name]
    networks = _networks(name)
    assert networks and all(_internal(n) for n in networks), networks
    # ...one of which every app service is on.
    shared = set(networks)
    for service in APP_SERVICES:
        assert shared & {n for n in _networks(service) if _internal(n)}, service


def test_web_stays_reachable_from_the_host():
    assert any(str(p).split(":")[-1] == "8000" for p in SERVICES["web"]["ports"])
    assert any(not _internal(n) for n in _networks("web"))


def test_the_gateway_has_its_own_database_and_migrates_it_before_serving():
    name = _gateway_service()
    app_db = urlsplit(_env("web")["DATABASE_URL"])
    gateway_db = urlsplit(_env(name)["DATABASE_URL"])
    assert (gateway_db.hostname, gateway_db.path) != (app_db.hostname, app_db.path)
    words = _words(name)
    assert "migrate" in words and "gunicorn" in words
    assert words.index("migrate") < words.index("gunicorn")
    # Its database server is a service it waits for.
    if gateway_db.hostname != app_db.hostname:
        db_service = gateway_db.hostname
        assert db_service is not None
        assert SERVICES[name]["depends_on"][db_service]["condition"] == "service_healthy"
        assert "ports" not in SERVICES[db_service]
        assert all(_internal(n) for n in _networks(db_service))


@pytest.mark.parametrize("service", ["worker", "relay", "beat"])
def test_the_back_office_waits_for_a_healthy_gateway(service):
    name = _gateway_service()
    assert "test" in SERVICES[name]["healthcheck"]
    assert SERVICES[service]["depends_on"][name]["condition"] == "service_healthy"


# --- shared throttle counts ---------------------------------------------------


@pytest.mark.parametrize("service", APP_SERVICES)
def test_every_app_service_counts_throttles_in_redis(service):
    url = _env(service).get("CACHE_URL")
    assert url, "without CACHE_URL every process counts on its own"
    config = environ.Env.cache_url_config(url)
    assert config["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    assert urlsplit(config["LOCATION"]).hostname == "redis"
    # Not the broker's database.
    assert urlsplit(url).path != urlsplit(_env(service)["CELERY_BROKER_URL"]).path


# --- commands and variables exist ---------------------------------------------


def test_each_manage_py_command_exists():
    commands = get_commands()
    seen = 0
    for service in _image_services():
        words = _words(service)
        for i, word in enumerate(words[:-1]):
            if word == "manage.py":
                assert words[i + 1] in commands, f"{service}: manage.py {words[i + 1]}"
                seen += 1
    assert seen >= 4  # web: migrate + seed_demo, relay: run_relay, gateway: migrate


def test_celery_services_use_the_project_app_and_its_queue():
    for service in ("worker", "beat"):
        words = _words(service)
        assert words[:3] == ["celery", "-A", "config"], service
    queues = [w.split("=", 1)[1] for w in _words("worker") if w.startswith("--queues=")]
    assert queues == [_env("worker")["CELERY_TASK_DEFAULT_QUEUE"]]


def test_webhook_attempts_have_their_own_worker_on_their_own_queue():
    """The relay sends webhook attempts to CELERY_WEBHOOK_QUEUE
    (OUTBOX_TOPIC_QUEUES): a service must consume it, and only it."""
    words = _words("webhooks")
    assert words[:4] == ["celery", "-A", "config", "worker"]
    queues = [w.split("=", 1)[1] for w in words if w.startswith("--queues=")]
    assert queues == [_env("webhooks")["CELERY_WEBHOOK_QUEUE"]]
    assert queues != [_env("webhooks")["CELERY_TASK_DEFAULT_QUEUE"]]


def test_money_back_has_its_own_worker_of_one_process_on_its_own_queue():
    """The relay sends refunds asked, chased, settled and a cancellation's ticks to
    CELERY_REFUND_QUEUE (OUTBOX_TOPIC_QUEUES): a service must consume it,
    and only it, one process by default (docs/refunds.md)."""
    words = _words("refunds")
    assert words[:4] == ["celery", "-A", "config", "worker"]
    queues = [w.split("=", 1)[1] for w in words if w.startswith("--queues=")]
    assert queues == [_env("refunds")["CELERY_REFUND_QUEUE"]]
    assert queues != [_env("refunds")["CELERY_TASK_DEFAULT_QUEUE"]]
    assert "--concurrency=${REFUND_WORKER_CONCURRENCY:-1}" in words
    # a small CPU weight: contended, the sales' containers get the cores first
    assert SERVICES["refunds"]["cpu_shares"] < SERVICES["worker"].get("cpu_shares", 1024)


def test_the_rooms_ticks_have_their_own_worker_on_their_own_queue(settings):
    """Beat's waiting-room ticks go to CELERY_ADMISSION_QUEUE (CELERY_TASK_ROUTES),
    never behind the charges on the worker's queue: a service must consume it,
    and only it (docs/waiting-room.md)."""
    words = _words("admission")
    assert words[:4] == ["celery", "-A", "config", "worker"]
    queues = [w.split("=", 1)[1] for w in words if w.startswith("--queues=")]
    assert queues == [_env("admission")["CELERY_ADMISSION_QUEUE"]]
    assert queues != [_env("admission")["CELERY_TASK_DEFAULT_QUEUE"]]
    assert settings.CELERY_ADMISSION_QUEUE == f"{settings.CELERY_TASK_DEFAULT_QUEUE}-admission"
    route = settings.CELERY_TASK_ROUTES["purchases.waiting_rooms_tick"]
    assert route == {"queue": settings.CELERY_ADMISSION_QUEUE}


def test_the_relay_routes_money_back_to_its_queue_and_the_rest_to_the_default(settings):
    from outbox.handover import queue_of  # the relay's own routing

    refund_queue = settings.CELERY_REFUND_QUEUE
    assert refund_queue == f"{settings.CELERY_TASK_DEFAULT_QUEUE}-refunds"
    for topic in ("refund.execute", "refund.chase", "refund.settled", "event.cancellation_tick"):
        assert queue_of(topic) == refund_queue, topic
    # the compensation's retry drives a saga that never confirmed: the saga's pool
    for topic in ("purchase.refund_retry", "purchase.confirmed", "purchase.hold_expired"):
        assert queue_of(topic) is None, topic


def test_make_run_starts_a_webhook_worker_on_the_default_webhook_queue():
    procfile = dict(
        line.split(": ", 1)
        for line in (ROOT / "Procfile").read_text().splitlines()
        if line and not line.startswith("#")
    )
    default_queue = "boxoffice"  # config/settings.py's CELERY_TASK_DEFAULT_QUEUE default
    assert f"--queues={default_queue} " in procfile["worker"]
    assert f"--queues={default_queue}-webhooks " in procfile["webhooks"]
    assert f"--queues={default_queue}-refunds " in procfile["refunds"]
    assert f"--queues={default_queue}-admission " in procfile["admission"]
    # No nice in front: the pool lowers itself (config/cpu_priority.py,
    # tests/test_cpu_priority.py), as honcho's own session would undo nice.
    assert procfile["refunds"].startswith("exec celery ")


SETTINGS_TEXT = (ROOT / "config" / "settings.py").read_text()
SETTINGS_NAMES = set(
    re.findall(r'\b(?:env|environ\.Env\(\))\.\w+\(\s*"([A-Z][A-Z0-9_]*)"', SETTINGS_TEXT)
) | set(re.findall(r'"([A-Z][A-Z0-9_]*)" in env\b', SETTINGS_TEXT))


def test_the_settings_names_were_found():
    assert {"DEBUG", "DATABASE_URL", "CELERY_BROKER_URL", "CACHE_URL"} <= SETTINGS_NAMES


@pytest.mark.parametrize("service", sorted({*APP_SERVICES, "gateway"}))
def test_every_variable_set_for_the_app_is_read_by_the_settings(service):
    if service not in SERVICES:
        service = _gateway_service()
    unknown = set(_env(service)) - SETTINGS_NAMES
    assert not unknown, f"{service} sets {sorted(unknown)}, which config/settings.py never reads"


# --- the settings each service really gets ------------------------------------

PROBE = """
import json
import django
django.setup()
from django.conf import settings
from django.test import Client
from django.urls import Resolver404, resolve

def resolves(path):
    try:
        resolve(path)
    except Resolver404:
        return False
    return True

host = {host!r}
answer = Client().get("/fake-gateway/v1/healthcheck", HTTP_HOST=host) if host else None
print(json.dumps({{
    "debug": settings.DEBUG,
    "fake_enabled": settings.FAKE_GATEWAY_ENABLED,
    "fake_mounted": resolves("/fake-gateway/v1/charges"),
    "api_mounted": resolves("/api/events/"),
    "admin_mounted": resolves("/admin/"),
    "cache": settings.CACHES["default"]["BACKEND"],
    "timeout": settings.PAYMENT_GATEWAY_TIMEOUT_SECONDS,
    "fake_timeout_delay": settings.FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS,
    "answer": [answer.status_code, answer.content.decode()] if answer else None,
}}))
"""


@pytest.fixture
def empty_database():
    """The URL of a new, empty database on the test session's PostgreSQL
    (no migrations), dropped afterwards."""
    server = urlsplit(os.environ["DATABASE_URL"])
    name = f"boxoffice_compose_{os.getpid()}_{time.monotonic_ns()}"
    admin = server._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield server._replace(path=f"/{name}").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _settings_of(service: str, tmp_path: Path, host: str = "", **overrides: str) -> dict:
    env = {
        "PATH": os.environ["PATH"],
        **_env(service),
        **overrides,
        # Where the container writes; here a temporary folder.
        "BOXOFFICE_VAR_DIR": str(tmp_path / "var"),
    }
    if "PROMETHEUS_MULTIPROC_DIR" in env:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "metrics")
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(host=host)],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_web_settings_from_compose(tmp_path):
    got = _settings_of("web", tmp_path)
    assert got["debug"] is False
    assert got["fake_enabled"] is False and got["fake_mounted"] is False
    assert got["api_mounted"] and got["admin_mounted"]
    assert got["cache"] == "django.core.cache.backends.redis.RedisCache"  # Django's own


def test_gateway_settings_from_compose(tmp_path):
    name = _gateway_service()
    got = _settings_of(name, tmp_path, host=f"{name}:8000")
    assert got["debug"] is False
    assert got["fake_enabled"] is True and got["fake_mounted"] is True
    # The processor's process serves the processor, not the product.
    assert not got["api_mounted"] and not got["admin_mounted"]
    # The adapter gives up before the fake's simulated timeout answers.
    app = _settings_of("worker", tmp_path)
    assert got["fake_timeout_delay"] > app["timeout"]
    # Called by its service name, it answers (Django checks the Host header).
    status, body = got["answer"]
    assert status == 404 and json.loads(body)["code"] == "unknown_endpoint", body


def test_the_gateway_urlconf_still_obeys_fake_gateway_enabled(tmp_path):
    got = _settings_of(_gateway_service(), tmp_path, FAKE_GATEWAY_ENABLED="false")
    assert got["fake_mounted"] is False and got["api_mounted"] is False


# --- the gateway service's own command and healthcheck, run here --------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthcheck_argv(service: str, port: int) -> list[str]:
    test = SERVICES[service]["healthcheck"]["test"]
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    kind, *argv = test
    argv = [
        a.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace(
            "localhost:8000", f"localhost:{port}"
        )
        for a in argv
    ]
    return ["sh", "-c", argv[0]] if kind == "CMD-SHELL" else argv


def test_the_gateway_command_migrates_serves_and_passes_its_healthcheck(tmp_path, empty_database):
    name = _gateway_service()
    port = _free_port()
    argv = [a.replace("0.0.0.0:8000", f"127.0.0.1:{port}") for a in _argv(name)]
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        **_env(name),
        # Its own database, here a new empty one.
        "DATABASE_URL": empty_database,
        "BOXOFFICE_VAR_DIR": str(tmp_path / "var"),
    }
    health = _healthcheck_argv(name, port)
    base = f"http://127.0.0.1:{port}{GATEWAY_PREFIX}"
    # given the command of the compose file, on a free port
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stderr is not None  # (PIPE)
    try:
        # when it has had the time to migrate and start
        deadline = time.monotonic() + 60
        while True:
            check = subprocess.run(health, cwd=ROOT, env=env, capture_output=True, timeout=30)
            if check.returncode == 0:
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, check.stderr.decode()
            time.sleep(0.3)
        # then it charges (its tables exist) ...
        request = urllib.request.Request(
            f"{base}/payment_intents/pi_compose_test/charge",
            method="POST",
            data=json.dumps(
                {"amount": 5000, "currency": "EUR", "payment_method": "pm_card_visa"}
            ).encode(),
            headers={
                "Idempotency-Key": "pi_compose_test",
                "Content-Type": "application/json",
                "Host": name,
            },
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.load(response)["status"] == "succeeded"
        # ... and serves nothing of the product
        for path in ("/api/events/", "/admin/login/", "/metrics"):
            with pytest.raises(urllib.error.HTTPError) as excinfo:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10)
            assert excinfo.value.code == 404, path
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        proc.stderr.close()
    # and the healthcheck fails once it is gone
    assert (
        subprocess.run(health, cwd=ROOT, env=env, capture_output=True, timeout=30).returncode != 0
    )


# --- health checks: /readyz for web, `manage.py probe` for the others ------------

# The services that serve no HTTP: their healthcheck is `manage.py probe`.
PROBE_SERVICES = ("worker", "webhooks", "relay", "beat")
HEALTH_URL = re.compile(r"https?://(?:127\.0\.0\.1|localhost):8000(/[^'\"\s]*)")


def _health_test(service: str) -> list[str]:
    """The healthcheck's command, as words (after CMD / CMD-SHELL)."""
    test = SERVICES[service]["healthcheck"]["test"]
    if isinstance(test, str):
        return shlex.split(test)
    kind, *argv = test
    return shlex.split(argv[0]) if kind == "CMD-SHELL" else [str(a) for a in argv]


def _probe_checks(service: str) -> list[str]:
    words = _health_test(service)
    at = words.index("manage.py")
    assert words[at + 1] == "probe", words
    return words[at + 2 :]


@pytest.mark.parametrize("service", APP_SERVICES)
def test_every_app_service_has_a_healthcheck(service):
    check = SERVICES[service].get("healthcheck") or {}
    assert check.get("test") and not check.get("disable"), service


def test_web_is_healthy_when_its_readyz_answers_200_without_the_heartbeats():
    text = " ".join(_health_test("web"))
    (path,) = HEALTH_URL.findall(text)
    url = urlsplit(path)
    assert resolve(url.path).func is readyz_view
    excluded = parse_qs(url.query).get("exclude", [])
    assert set(excluded) <= set(CHECKS)
    # The relay and beat start once web is healthy: web's readiness must not
    # wait for their heartbeats (nor go down when the relay stops).
    assert {"relay", "beat"} <= set(excluded)
    waiting = [
        name
        for name, s in SERVICES.items()
        if (s.get("depends_on") or {}).get("web", {}).get("condition") == "service_healthy"
    ]
    assert {"relay", "beat"} <= set(waiting)


@pytest.mark.parametrize("service", PROBE_SERVICES)
def test_each_back_office_service_probes_its_dependencies_and_its_own_heartbeat(service):
    assert "probe" in get_commands()
    checks = _probe_checks(service)
    assert set(checks) <= set(CHECKS), checks
    assert {"database", "broker"} <= set(checks)
    # Its own heartbeat, never another process's (a stopped beat must not
    # mark the relay unhealthy).
    own = {"relay": {"relay"}, "beat": {"beat"}}.get(service, set())
    assert set(checks) & {"relay", "beat"} == own


@pytest.mark.parametrize("service", PROBE_SERVICES)
def test_probe_healthchecks_leave_no_metrics_file_behind(service):
    """A probe is a new process every interval; with PROMETHEUS_MULTIPROC_DIR
    set it would leave a file there each time, read by /metrics forever."""
    if "PROMETHEUS_MULTIPROC_DIR" in _env(service):
        assert _health_test(service)[:3] == ["env", "-u", "PROMETHEUS_MULTIPROC_DIR"]


@pytest.mark.parametrize("service", PROBE_SERVICES)
def test_the_probe_healthchecks_run(service, tmp_path, empty_database):
    # given the service's environment, on a new empty database (no
    # migrations: no heartbeat table) and the test session's Redis
    argv = _health_test(service)
    metrics_dir = tmp_path / "metrics"
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        **_env(service),
        "DATABASE_URL": empty_database,
        "CELERY_BROKER_URL": os.environ["CELERY_BROKER_URL"],
        "BOXOFFICE_VAR_DIR": str(tmp_path / "var"),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }
    metrics_dir.mkdir()
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    body = json.loads(result.stdout)
    checks = _probe_checks(service)
    assert list(body["checks"]) == checks
    assert body["checks"]["database"]["ok"] and body["checks"]["broker"]["ok"], body
    heartbeats = [c for c in checks if c in ("relay", "beat")]
    # then it exits 0 when every check passes, 1 when one fails (here: the
    # heartbeats, which a database without migrations cannot hold)
    assert body["failed"] == heartbeats
    assert result.returncode == (1 if heartbeats else 0), result.stderr
    assert list(metrics_dir.iterdir()) == []


@pytest.mark.django_db(transaction=True)
def test_the_web_healthcheck_passes_on_200_and_fails_on_503(live_server, monkeypatch):
    port = urlsplit(live_server.url).port
    health = _healthcheck_argv("web", port)
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    # No heartbeat anywhere: web's check excludes them.
    check = subprocess.run(health, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    # A broker that does not answer: /readyz answers 503, the check fails.
    monkeypatch.setenv("CELERY_BROKER_URL", f"redis://127.0.0.1:{_free_port()}/0")
    check = subprocess.run(health, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert check.returncode != 0 and "503" in check.stderr, check.stderr


def _image_files(tmp_path: Path) -> Path:
    """The source tree as the Dockerfile copies it into /app: its COPY lines
    (but the dependency layer's), applied to an empty folder."""
    app = tmp_path / "app"
    app.mkdir()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if not words or words[0] != "COPY" or "requirements.lock" in words:
            continue
        *sources, target = words[1:]
        for source in sources:
            src = ROOT / source.rstrip("/")
            dest = app / target.rstrip("/") if target not in ("./", ".") else app / src.name
            if src.is_dir():
                subprocess.run(["cp", "-r", str(src), str(dest)], check=True)
            else:
                subprocess.run(["cp", str(src), str(dest)], check=True)
    return app


def test_the_image_holds_every_package_the_app_imports(tmp_path):
    # The image's code is what its COPY lines name, folder by folder: a new
    # app (or a package the apps import) without its line breaks every
    # container at start-up. What the Dockerfile itself runs next
    # (collectstatic) must work from that tree alone, and so must a check.
    app = _image_files(tmp_path)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DATABASE_", "CELERY_", "PYTHON"))
    }
    env.update(
        DEBUG="false",
        SECRET_KEY="image-check-only",
        # Parsed, never connected to: neither command opens the database.
        DATABASE_URL="postgres://image-check@127.0.0.1:1/unused",
        STATIC_ROOT=str(tmp_path / "static"),
        BOXOFFICE_VAR_DIR=str(tmp_path / "var"),
        DJANGO_SETTINGS_MODULE="config.settings",
    )
    for argv in (["check"], ["collectstatic", "--no-input"]):
        done = subprocess.run(
            [sys.executable, "manage.py", *argv],
            cwd=app,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"manage.py {argv[0]} in the image's tree:\n{done.stderr}"
