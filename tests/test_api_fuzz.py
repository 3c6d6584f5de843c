"""Fuzzing the public API against its own OpenAPI schema (schemathesis).

Every operation of ``/api/schema/`` is called through the WSGI application
(``config.wsgi.application``, the whole middleware stack) with data generated
from the schema, as a real user (``Authorization: Token ...``) and, for a few
cases, without credentials. Each response must not be a server error and must
conform to the schema: a documented status code, the documented content type,
the documented headers and a body that matches the documented shape (enums
included). Schemathesis generates the required ``Idempotency-Key`` header
itself.

The WSGI app commits for real (``django_db(transaction=True)``): a request
runs on the same thread's connection, and Django's request signals would
close a connection held inside a test transaction. The purchase's Celery
enqueue is replaced by a recorder (nothing is left in Redis).

    FUZZ_EXAMPLES      examples per operation (default 50)
    FUZZ_DERANDOMIZE   1 (default): the same cases every run; 0: fresh ones
    FUZZ_STATS         1: print the status codes seen per operation (with -s)
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from .factories import EventFactory, UserFactory

# Status codes answered per operation (printed with FUZZ_STATS=1 and -s).
SEEN: Counter = Counter()
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "50"))
DERANDOMIZE = os.environ.get("FUZZ_DERANDOMIZE", "1") != "0"
UNAUTHENTICATED_EXAMPLES = max(5, EXAMPLES // 5)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    # The headers the schema declares (Location on 202, Retry-After on 429).
    response_headers_conformance,
]


# Real ids, so that generated requests also reach past "no such event": the
# hooks below swap them in for some of the generated values.
WORLD: dict = {}
SEATS = [f"A{n}" for n in range(1, 11)]
PAYMENT_METHODS = ["pm_card_visa", "pm_card_chargeDeclined", "pm_card_unreachable"]


@pytest.fixture
def api_world(transactional_db, monkeypatch):
    """A user with a token and a purchase, someone else's purchase, an event
    with seats, and no broker. Returns the user's auth header."""
    from purchases.saga import start as saga_start
    from purchases.services import purchase_start

    enqueued: list[str] = []
    monkeypatch.setattr(saga_start, "publish_charge", enqueued.append)
    user, other = UserFactory(username="fuzzer"), UserFactory(username="someone-else")
    token, _ = Token.objects.get_or_create(user=user)
    event = EventFactory(seats=SEATS)

    def start(buyer, seat):
        return purchase_start(
            user=buyer,
            idempotency_key=f"seed-{seat}",
            event_id=event.pk,
            seat_refs=[seat],
            payment_method="pm_card_visa",
        ).saga_id

    WORLD.clear()
    WORLD.update(event_id=event.pk, sagas=[start(user, "A1"), start(other, "A2")])
    yield {"Authorization": f"Token {token.key}"}
    WORLD.clear()


def _load_schema():
    # Loaded once, at collection: the schema view needs no database.
    # (schemathesis.pytest.from_fixture would load it per test, but its lazy
    # loader sets ``item._nodeid``, which pytest 9 no longer has.)
    from config.wsgi import application

    loaded = schemathesis.openapi.from_wsgi("/api/schema/", application)
    loaded.config.generation.update(max_examples=EXAMPLES, deterministic=DERANDOMIZE)
    return loaded


schema = _load_schema()


def _is(context, method: str, path: str) -> bool:
    operation = context.operation
    return operation is not None and operation.method.upper() == method and operation.path == path


@schema.hook
def flatmap_path_parameters(context, path_parameters):
    if not WORLD or not isinstance(path_parameters, dict):
        return st.just(path_parameters)
    real = dict(path_parameters)
    if "event_id" in real:
        real["event_id"] = WORLD["event_id"]
    if "saga_id" in real:
        return st.sampled_from([path_parameters, *({**real, "saga_id": s} for s in WORLD["sagas"])])
    return st.sampled_from([path_parameters, real])


@schema.hook
def flatmap_body(context, body):
    if not WORLD or not isinstance(body, dict) or not _is(context, "POST", "/api/purchases/"):
        return st.just(body)
    # Named seats or best available (a quantity): exactly one of the two.
    real = st.one_of(
        st.fixed_dictionaries(
            {"seats": st.lists(st.sampled_from(SEATS), min_size=1, max_size=3, unique=True)}
        ),
        # Up to all the seats: two are taken from the start, so some answer
        # 409 not_enough_seats.
        st.fixed_dictionaries({"quantity": st.integers(min_value=1, max_value=len(SEATS))}),
    ).flatmap(
        lambda chosen: st.fixed_dictionaries(
            {
                "event": st.just(WORLD["event_id"]),
                "payment_method": st.sampled_from(PAYMENT_METHODS),
            }
        ).map(
            lambda valid: {
                **{k: v for k, v in body.items() if k not in ("seats", "quantity")},
                **chosen,
                **valid,
            }
        )
    )
    return st.one_of(st.just(body), real)


@schema.hook
def flatmap_headers(context, headers):
    # Often a key of our own, now and then one used before, so that replays
    # and reuses happen too.
    if not isinstance(headers, dict) or "Idempotency-Key" not in headers:
        return st.just(headers)
    keys = st.one_of(st.sampled_from(["k1", "k2"]), st.uuids().map(str))
    return st.one_of(st.just(headers), keys.map(lambda key: {**headers, "Idempotency-Key": key}))


_SETTINGS = settings(
    deadline=None,
    database=None,
    derandomize=DERANDOMIZE,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)


def _seen(case, response) -> None:
    code = ""
    if response.status_code >= 400:
        try:
            code = f" {response.json().get('code')}"
        except Exception:  # noqa: BLE001 - not JSON: counted without a code
            code = " (not json)"
    operation = f"{case.operation.method.upper()} {case.operation.path}"
    SEEN[f"{operation} -> {response.status_code}{code}"] += 1


@pytest.fixture(scope="module", autouse=True)
def _print_seen():
    yield
    if os.environ.get("FUZZ_STATS") == "1":
        for what, n in sorted(SEEN.items()):
            print(f"{n:6d}  {what}")


@schema.parametrize()
@_SETTINGS
def test_api_conforms_to_its_schema(case, api_world):
    _seen(case, case.call_and_validate(headers=api_world, checks=CHECKS))


@schema.parametrize()
@settings(_SETTINGS, max_examples=UNAUTHENTICATED_EXAMPLES)
def test_api_without_valid_credentials_conforms_to_its_schema(case, api_world):
    # Without credentials, then with a token that does not exist: the public
    # catalog answers, the purchases answer 401 (whatever else is wrong with
    # the request), and every answer is one the schema documents.
    case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    _seen(case, case.call_and_validate(checks=CHECKS))
    _seen(
        case, case.call_and_validate(headers={"Authorization": "Token not-a-token"}, checks=CHECKS)
    )
