"""Security: who may see and do what, throttling, size limits, JSON-only
Celery, and production settings that pass Django's deployment checks."""

import os
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core.cache import cache
from django.db import transaction
from kombu import Connection, Producer
from rest_framework.test import APIClient

from organizers.roles import Role
from outbox.models import InboxEntry, OutboxMessage
from outbox.services import outbox_publish
from purchases.models import IdempotencyRecord, PurchaseSaga
from purchases.services import saga_charge

from .conftest import _client_for, purchase_body, start_purchase
from .factories import EventFactory, MembershipFactory, OrganizerFactory, UserFactory
from .stack import Stack

ROOT = Path(__file__).resolve().parent.parent


# --- the authorization matrix -------------------------------------------------------


@pytest.fixture
def people(db):
    staff = UserFactory(username="staff", is_staff=True)
    operator = UserFactory(username="operator", is_staff=True)
    operator.user_permissions.add(
        Permission.objects.get(codename="run_saga_runbook"),
        Permission.objects.get(codename="view_purchasesaga"),
    )
    staff.user_permissions.add(Permission.objects.get(codename="view_purchasesaga"))
    return {
        "anonymous": None,
        "alice": UserFactory(username="alice"),
        "bob": UserFactory(username="bob"),
        "staff": staff,
        "operator": operator,
    }


def _api(user):
    from rest_framework.test import APIClient

    return APIClient() if user is None else _client_for(user)


@pytest.mark.django_db
def test_api_authorization_matrix(people, gateway):
    event = EventFactory(seats=["A1", "A2", "A3", "A4", "A5", "A6"])
    alices = saga_charge(saga_id=start_purchase(people["alice"], event, seats=["A1"]).pk)
    detail = f"/api/purchases/{alices.pk}/"
    seats = iter(["A2", "A3", "A4", "A5", "A6"])
    expected = {
        # who: (events, seats, list, alice's purchase, create)
        "anonymous": (200, 200, 401, 401, 401),
        "alice": (200, 200, 200, 200, 202),
        "bob": (200, 200, 200, 404, 202),
        "staff": (200, 200, 200, 404, 202),  # staff get no API powers over others
        "operator": (200, 200, 200, 404, 202),
    }
    for who, want in expected.items():
        client = _api(people[who])
        got = (
            client.get("/api/events/").status_code,
            client.get(f"/api/events/{event.pk}/seats/").status_code,
            client.get("/api/purchases/").status_code,
            client.get(detail).status_code,
            client.post(
                "/api/purchases/",
                purchase_body(event, seats=[next(seats)]),
                format="json",
                HTTP_IDEMPOTENCY_KEY=f"k-{who}",
            ).status_code,
        )
        assert got == want, who
        if who not in ("anonymous", "alice"):
            listed = client.get("/api/purchases/").json()["results"]
            assert str(alices.pk) not in [p["id"] for p in listed], who


@pytest.mark.django_db
def test_admin_authorization_matrix(people, gateway, client):
    event = EventFactory(seats=["A1"])
    saga = saga_charge(saga_id=start_purchase(people["alice"], event).pk)
    changelist = "/admin/purchases/purchasesaga/"
    expected = {"anonymous": 302, "alice": 302, "bob": 302, "staff": 200, "operator": 200}
    for who, status in expected.items():
        client.logout()
        if people[who] is not None:
            client.force_login(people[who])
        assert client.get(changelist).status_code == status, who
        assert client.get(f"{changelist}{saga.pk}/change/").status_code == status, who
        if status == 200:
            page = client.get(changelist).content.decode()
            assert ("refund" in page) is (who == "operator"), who

    # a forged action POST by staff without the permission does nothing
    client.force_login(people["staff"])
    client.post(
        changelist,
        {
            "action": "refund",
            "_selected_action": [str(saga.pk)],
            "confirm": "yes",
            "reason": "forged",
        },
    )
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "CONFIRMED"


@pytest.mark.django_db
def test_idempotency_keys_are_scoped_per_user(people):
    event = EventFactory(seats=["A1", "A2"])
    first = _api(people["alice"]).post(
        "/api/purchases/",
        purchase_body(event, seats=["A1"]),
        format="json",
        HTTP_IDEMPOTENCY_KEY="shared",
    )
    other = _api(people["bob"]).post(
        "/api/purchases/",
        purchase_body(event, seats=["A2"]),
        format="json",
        HTTP_IDEMPOTENCY_KEY="shared",
    )
    assert (first.status_code, other.status_code) == (202, 202)
    assert first.json()["id"] != other.json()["id"]
    assert IdempotencyRecord.objects.filter(key="shared").count() == 2


# --- throttling and limits ---------------------------------------------------------------


@pytest.mark.django_db
def test_purchase_starts_are_throttled_per_user_with_retry_after(people, tight_throttle):
    event = EventFactory(seats=[f"A{n}" for n in range(1, 9)])
    alice, bob = _api(people["alice"]), _api(people["bob"])

    answers = [
        alice.post(
            "/api/purchases/",
            purchase_body(event, seats=[f"A{n}"]),
            format="json",
            HTTP_IDEMPOTENCY_KEY=f"t{n}",
        )
        for n in range(1, 5)
    ]

    assert [a.status_code for a in answers] == [202, 202, 202, 429]
    assert answers[-1].json()["code"] == "throttled"
    assert 0 < int(answers[-1]["Retry-After"]) <= 60
    assert PurchaseSaga.objects.count() == 3
    # another user is not affected, and reading is not throttled
    assert (
        bob.post(
            "/api/purchases/",
            purchase_body(event, seats=["A8"]),
            format="json",
            HTTP_IDEMPOTENCY_KEY="b1",
        ).status_code
        == 202
    )
    assert alice.get("/api/purchases/").status_code == 200


@pytest.mark.django_db
def test_token_requests_are_throttled_per_address_and_ignore_a_stale_token(people, settings):
    settings.AUTH_TOKEN_THROTTLE_RATE = "3/min"
    cache.clear()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token stale-token-from-last-week")
    try:
        answers = [
            client.post("/api/auth/token/", {"username": "alice", "password": guess}, format="json")
            for guess in ("a", "b", "c", "d")
        ]
    finally:
        cache.clear()

    assert [a.status_code for a in answers] == [400, 400, 400, 429]
    assert answers[-1].json()["code"] == "throttled"
    assert 0 < int(answers[-1]["Retry-After"]) <= 60


@pytest.mark.django_db
def test_an_oversized_body_is_refused_before_parsing(people, settings):
    settings.MAX_REQUEST_BYTES = 1024
    event = EventFactory(seats=["A1"])
    body = purchase_body(event) | {"padding": "x" * 2048}

    answer = _api(people["alice"]).post(
        "/api/purchases/", body, format="json", HTTP_IDEMPOTENCY_KEY="big"
    )

    assert answer.status_code == 413
    assert answer.json()["code"] == "payload_too_large"
    assert PurchaseSaga.objects.count() == 0


@pytest.mark.django_db
def test_a_route_may_take_larger_bodies_and_no_other_does(people, settings):
    # The seller's seat map routes declare max_request_bytes (seller/apis.py);
    # every other route keeps MAX_REQUEST_BYTES.
    settings.MAX_REQUEST_BYTES = 1024
    organizer = OrganizerFactory(slug="big-maps")
    MembershipFactory(organizer=organizer, user=people["alice"], role=Role.OWNER)
    seats = [{"ref": f"A{n}", "number": n, "category": "c"} for n in range(1, 200)]
    body = {
        "name": "Large",
        "starts_at": "2027-01-01T20:00:00Z",
        "currency": "EUR",
        "price_categories": [{"code": "c", "name": "C", "price": {"amount": 1, "currency": "EUR"}}],
        "seat_map": {"sections": [{"rows": [{"label": "A", "seats": seats}]}]},
    }
    client = _api(people["alice"])

    created = client.post("/api/organizers/big-maps/events/", body, format="json")
    elsewhere = client.post("/api/organizers/", {"slug": "x" * 2000, "name": "x"}, format="json")

    assert created.status_code == 201, created.content
    assert created.json()["seats"] == 199
    assert (elsewhere.status_code, elsewhere.json()["code"]) == (413, "payload_too_large")


@pytest.mark.django_db
def test_more_seats_than_allowed_is_refused(people, settings):
    settings.MAX_SEATS_PER_PURCHASE = 2
    event = EventFactory(seats=["A1", "A2", "A3"])
    answer = _api(people["alice"]).post(
        "/api/purchases/",
        purchase_body(event, seats=["A1", "A2", "A3"]),
        format="json",
        HTTP_IDEMPOTENCY_KEY="many",
    )
    assert answer.status_code == 400 and answer.json()["field"] == "seats"


# --- no pickle anywhere in Celery -------------------------------------------------------


def test_celery_speaks_json_only():
    from config.celery import app

    assert app.conf.task_serializer == "json"
    assert app.conf.result_serializer == "json"
    assert list(app.conf.accept_content) == ["json"]
    assert app.conf.event_serializer == "json"


REFUSED = "Received invalid task message: Refusing to deserialize untrusted content of type pickle"


def _publish_task(producer, queue, *, task: str, args: list, serializer: str) -> str:
    """A task message as Celery's protocol 2 lays it out (headers carry the
    routing facts, the body is ``(args, kwargs, embed)``), in ``serializer``."""
    task_id = str(uuid.uuid4())
    headers = {
        "lang": "py",
        "task": task,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": repr(args),
        "kwargsrepr": "{}",
        "origin": "test-security",
        "ignore_result": True,
    }
    body: tuple = (args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})
    producer.publish(
        body,
        serializer=serializer,
        headers=headers,
        exchange=queue.exchange,
        routing_key=queue.routing_key,
        correlation_id=task_id,
        retry=True,
    )
    return task_id


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_our_worker_refuses_a_pickled_task_message_and_runs_the_json_one(tmp_path, broker_queue):
    # A real worker, started as the E2E stories start it, on this session's
    # queue. Two messages for outbox.deliver, whose run completes an outbox
    # row: the first pickled (the bytes a forged message would carry), the
    # second JSON. The worker takes them in order, one at a time.
    from django.conf import settings

    from config.celery import app

    with transaction.atomic():
        pickled_row = outbox_publish(topic="test.pickle_probe", payload={})
        json_row = outbox_publish(topic="test.pickle_probe", payload={})
    stack = Stack(gateway_url="http://127.0.0.1:9/unused", workdir=tmp_path)
    stack.start_worker(concurrency=1)
    try:
        stack.wait_ready()
        queue = app.amqp.queues[settings.CELERY_TASK_DEFAULT_QUEUE]
        with Connection(settings.CELERY_BROKER_URL) as conn:
            channel = conn.default_channel
            queue(channel).declare()
            producer = Producer(channel)
            pickled_id = _publish_task(
                producer, queue, task="outbox.deliver", args=[pickled_row.pk], serializer="pickle"
            )
            json_id = _publish_task(
                producer, queue, task="outbox.deliver", args=[json_row.pk], serializer="json"
            )

        def done(row):
            return OutboxMessage.objects.filter(pk=row.pk, completed_at__isnull=False).exists()

        def worker_log() -> str:
            return (tmp_path / "worker.log").read_text(errors="replace")

        json_ran = f"Task outbox.deliver[{json_id}] succeeded"
        stack.wait_for(
            lambda: done(json_row) and json_ran in worker_log(), "the JSON task to run", timeout=30
        )
        # One worker process, one message at a time, in order: the pickled
        # message was taken before the JSON one, so its fate is settled.
        ran_pickled = done(pickled_row)
        stack.check_alive()
        log = worker_log()
    finally:
        stack.stop()

    # the pickled message was refused before it became a task: never run
    assert not ran_pickled, "the worker ran a pickled task message"
    assert not InboxEntry.objects.filter(message=pickled_row).exists()
    assert f"[{pickled_id}]" not in log, log[-6000:]
    assert f"{REFUSED} (application/x-python-serialize)" in log, log[-6000:]


# --- production settings -------------------------------------------------------------------


def _manage(*args, **env):
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DEBUG", "SECRET_KEY", "DJANGO_SETTINGS_MODULE")
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**clean, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        timeout=60,
    )


def test_debug_is_off_and_a_secret_key_required_by_default():
    without_key = _manage("check")
    assert without_key.returncode != 0
    assert "SECRET_KEY must be set" in without_key.stderr

    probe = _manage(
        "shell",
        "-c",
        "from django.conf import settings; print(settings.DEBUG)",
        SECRET_KEY="x" * 60,
    )
    assert probe.stdout.strip().splitlines()[-1] == "False", probe.stderr


def test_check_deploy_passes_under_production_settings():
    result = _manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        SECRET_KEY=secrets.token_urlsafe(60),
        ALLOWED_HOSTS="tickets.example.com",
        SECURE_SSL_REDIRECT="true",
        SECURE_HSTS_SECONDS="31536000",
        SECURE_HSTS_INCLUDE_SUBDOMAINS="true",
        SECURE_HSTS_PRELOAD="true",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_the_fake_gateway_is_not_mounted_in_production():
    result = _manage(
        "shell",
        "-c",
        "from django.urls import resolve, Resolver404\n"
        "try:\n    resolve('/fake-gateway/v1/charges')\n    print('mounted')\n"
        "except Resolver404:\n    print('absent')",
        SECRET_KEY="x" * 60,
        FAKE_GATEWAY_ENABLED="",
    )
    assert result.stdout.strip().splitlines()[-1] == "absent", result.stderr
