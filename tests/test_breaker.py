"""The circuit breaker on the processor (purchases/breaker.py): opened by
answers that say nothing (timeouts), never by declines; while open, a new
purchase is refused with 503 payments_paused before any seat is held; the
first answer after the reset time is the trial; shared by every process
through the cache."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pybreaker
import pytest
from django.core.cache import cache
from django.test import Client, override_settings
from freezegun import freeze_time

from config.metrics import ALERTS
from devtools.processes import free_port
from purchases import breaker, cache_outage
from purchases.breaker_storage import CacheStorage
from purchases.errors import PaymentsPaused
from purchases.models import PurchaseSaga
from purchases.saga.states import SagaState
from purchases.services import purchase_refund, saga_charge

from .conftest import drain_outbox, new_key, purchase_body, row_counts, start_purchase
from .factories import EventFactory
from .test_cache_down import _unavailable

pytestmark = pytest.mark.django_db

FAILURES = 3
RESET = 30
TIMEOUT, DECLINED, VISA = "pm_card_timeout_charged", "pm_card_chargeDeclined", "pm_card_visa"
KEYS = [breaker.STATE, breaker.FAILURES, breaker.SUCCESSES, breaker.OPENED_AT]
T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


@pytest.fixture
def breaker_on(settings):
    settings.PAYMENT_BREAKER_ENABLED = True
    settings.PAYMENT_BREAKER_FAILURES = FAILURES
    settings.PAYMENT_BREAKER_RESET_SECONDS = RESET
    cache.delete_many(KEYS)
    yield
    cache.delete_many(KEYS)


@pytest.fixture
def big_event(db):
    return EventFactory(seats=[f"A{n}" for n in range(1, 21)])


class Buyer:
    """Purchases of one seat each, charged at once through the fake."""

    def __init__(self, user, event):
        self.user, self.event, self.seat = user, event, 0

    def charged(self, method: str) -> PurchaseSaga:
        self.seat += 1
        saga = start_purchase(self.user, self.event, seats=[f"A{self.seat}"], payment_method=method)
        return saga_charge(saga_id=saga.pk)


def alerts() -> float:
    return ALERTS.labels(kind="payments_paused")._value.get()


def test_the_webs_name_of_open_is_pybreakers():
    assert breaker.OPEN == pybreaker.STATE_OPEN
    assert breaker.HALF_OPEN == pybreaker.STATE_HALF_OPEN


def test_the_cache_storage_implements_every_method_of_pybreakers_storage():
    """``CacheStorage`` implements pybreaker's storage base; a method the
    library adds to it would be left to the base's no-op: this fails first."""
    wanted = {name for name in vars(pybreaker.CircuitBreakerStorage) if not name.startswith("_")}

    assert wanted - {"name"} <= set(vars(CacheStorage))


def test_declines_never_open_it_and_break_a_run_of_timeouts(breaker_on, alice, big_event, gateway):
    buyer = Buyer(alice, big_event)
    for _ in range(FAILURES + 2):
        assert buyer.charged(DECLINED).state == SagaState.COMPENSATED
    assert breaker.breaker_state()["state"] == "closed"

    for _ in range(FAILURES - 1):
        assert buyer.charged(TIMEOUT).state == SagaState.UNKNOWN
    buyer.charged(DECLINED)  # an answer: the run starts again
    for _ in range(FAILURES - 1):
        buyer.charged(TIMEOUT)

    assert breaker.breaker_state() | {"opened_at": None} == {
        "enabled": True,
        "state": "closed",
        "failures": FAILURES - 1,
        "opened_at": None,
    }
    assert breaker.payments_paused() is None


def test_timeouts_open_it_and_a_new_purchase_is_refused_before_any_seat_is_held(
    breaker_on, alice, alice_api, big_event, gateway, caplog
):
    buyer = Buyer(alice, big_event)
    before = alerts()
    replayed_key = new_key()
    first = alice_api.post(
        "/api/purchases/",
        purchase_body(big_event, seats=["A20"]),
        format="json",
        headers={"Idempotency-Key": replayed_key},
    )
    assert first.status_code == 202
    in_flight = start_purchase(alice, big_event, seats=["A18"], payment_method=TIMEOUT)

    with caplog.at_level(logging.ERROR, logger="purchases.breaker"):
        for _ in range(FAILURES):
            buyer.charged(TIMEOUT)

    assert breaker.breaker_state()["state"] == "open"
    assert alerts() - before == 1
    (line,) = [r for r in caplog.records if getattr(r, "alert", "") == "payments_paused"]
    assert "payments paused" in line.getMessage() and line.detail == "timeout"
    counts = row_counts()
    refused = alice_api.post(
        "/api/purchases/",
        purchase_body(big_event, seats=["A19"]),
        format="json",
        headers={"Idempotency-Key": new_key()},
    )
    assert refused.status_code == 503, refused.json()
    body = refused.json()
    assert (body["code"], body["retry_after"]) == ("payments_paused", int(refused["Retry-After"]))
    assert 1 <= body["retry_after"] <= RESET
    assert row_counts() == counts  # nothing held, nothing written
    # A replay of a key that started a purchase still answers, as it did.
    again = alice_api.post(
        "/api/purchases/",
        purchase_body(big_event, seats=["A20"]),
        format="json",
        headers={"Idempotency-Key": replayed_key},
    )
    assert (again.status_code, again.json()) == (202, first.json())
    # A purchase started before goes on being charged; while open, its
    # answer is not judged: no new alert.
    assert saga_charge(saga_id=in_flight.pk).state == SagaState.UNKNOWN
    assert alerts() - before == 1


def test_a_start_refused_while_paused_spends_nothing_of_the_throttle(
    breaker_on, tight_throttle, alice_api, big_event
):
    for _ in range(FAILURES):
        breaker.observe(asked="charge", label="unknown", detail="timeout")

    answers = [
        alice_api.post(
            "/api/purchases/",
            purchase_body(big_event, seats=["A1"]),
            format="json",
            headers={"Idempotency-Key": new_key()},
        ).status_code
        for _ in range(5)  # the throttle allows 3 a minute
    ]

    assert answers == [503] * 5


def test_the_page_says_payments_are_paused_and_when_to_try_again(breaker_on, alice, big_event):
    with freeze_time(T0):
        for _ in range(FAILURES):
            breaker.observe(asked="charge", label="unknown", detail="timeout")
        page = Client()
        page.force_login(alice)
        counts = row_counts()

        response = page.post(
            f"/events/{big_event.pk}/",
            {"idempotency_key": f"page-{new_key()}", "seats": ["A1"], "payment_method": VISA},
        )

    assert response.status_code == 503
    assert response["Retry-After"] == str(RESET)
    text = response.content.decode()
    assert 'data-error="payments_paused"' in text
    assert f"Nothing was held or charged. Please try again in {RESET} seconds." in text
    assert row_counts() == counts


def test_past_the_reset_time_purchases_wait_for_the_trials_answer(
    breaker_on, alice, big_event, faulty_gateway, settings
):
    buyer = Buyer(alice, big_event)
    with freeze_time(T0) as clock:
        for _ in range(FAILURES):
            buyer.charged(TIMEOUT)
        before = alerts()
        faulty_gateway.calls.clear()
        assert breaker.payments_paused() == RESET
        assert breaker.breaker_trial() is None  # not due yet: nothing asked
        assert faulty_gateway.calls == []
        clock.tick(RESET - 1)
        assert breaker.payments_paused() == 1

        # Past the reset time no purchase is let in as the trial: they wait
        # for the trial's interval, and beat's trial fails: open again for a
        # whole reset time, with an alert of its own.
        clock.tick(2)
        assert breaker.payments_paused() == settings.PAYMENT_BREAKER_TRIAL_SECONDS
        faulty_gateway.down("retrieve", times=1)
        assert breaker.breaker_trial() == "unknown"
        assert faulty_gateway.calls == [("retrieve", breaker.TRIAL_INTENT_ID)]
        assert breaker.breaker_state()["state"] == "open"
        assert breaker.breaker_state()["opened_at"] == T0 + timedelta(seconds=RESET + 1)
        assert breaker.payments_paused() == RESET
        assert alerts() - before == 1

        # The next trial is answered ("not found" is an answer): closed.
        clock.tick(RESET)
        assert breaker.breaker_trial() == "not_found"
        assert breaker.breaker_state()["state"] == "closed"
        assert breaker.payments_paused() is None
        assert breaker.breaker_trial() is None  # closed: nothing to try
        assert buyer.charged(VISA).state == SagaState.CONFIRMED
        assert alerts() - before == 1


def test_an_answer_in_flight_past_the_reset_time_is_a_trial_too(
    breaker_on, alice, big_event, gateway
):
    buyer = Buyer(alice, big_event)
    with freeze_time(T0) as clock:
        in_flight = start_purchase(alice, big_event, seats=["A20"], payment_method=VISA)
        for _ in range(FAILURES):
            buyer.charged(TIMEOUT)
        clock.tick(RESET + 1)

        assert saga_charge(saga_id=in_flight.pk).state == SagaState.CONFIRMED

        assert breaker.breaker_state()["state"] == "closed"
        assert breaker.payments_paused() is None


def test_refunds_that_time_out_open_it_too(breaker_on, alice, big_event, faulty_gateway):
    buyer = Buyer(alice, big_event)
    sagas = [buyer.charged(VISA) for _ in range(FAILURES)]
    assert {saga.state for saga in sagas} == {SagaState.CONFIRMED}
    faulty_gateway.down("create_refund")
    for saga in sagas:
        purchase_refund(saga_id=saga.pk, reason="customer asked")

    drain_outbox()

    assert faulty_gateway.calls.count(("create_refund", sagas[0].intent_id)) == 1
    assert breaker.breaker_state()["state"] == "open"


def test_another_process_opens_it_and_this_one_refuses(breaker_on):
    """The breaker lives in the cache every process shares: a worker's
    timeouts pause this (web) process's purchases."""
    code = (
        "import django; django.setup()\n"
        "from purchases import breaker\n"
        f"for _ in range({FAILURES}): "
        "breaker.observe(asked='charge', label='unknown', detail='timeout')\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PAYMENT_BREAKER_ENABLED": "true",
        "PAYMENT_BREAKER_FAILURES": str(FAILURES),
        "PAYMENT_BREAKER_RESET_SECONDS": str(RESET),
    }
    assert breaker.payments_paused() is None

    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)

    assert breaker.payments_paused() is not None
    assert breaker.breaker_state()["state"] == "open"


def test_off_it_counts_nothing_and_refuses_nothing(breaker_on, settings):
    settings.PAYMENT_BREAKER_ENABLED = False
    for _ in range(FAILURES + 1):
        breaker.observe(asked="charge", label="unknown", detail="timeout")

    assert breaker.breaker_state()["state"] == "closed"
    assert breaker.payments_paused() is None


def test_with_the_cache_down_it_reads_closed_and_purchases_start(
    breaker_on, settings, alice_api, big_event
):
    before = _unavailable("breaker")
    config = settings.CACHES["default"]
    # The cache pointed at a closed port for the block (as tests/test_cache_down.py's).
    with override_settings(
        CACHES={"default": {**config, "LOCATION": f"redis://127.0.0.1:{free_port()}/15"}}
    ):
        for _ in range(FAILURES + 1):
            breaker.observe(asked="charge", label="unknown", detail="timeout")

        assert breaker.payments_paused() is None
        started = alice_api.post(
            "/api/purchases/",
            purchase_body(big_event, seats=["A1"]),
            format="json",
            headers={"Idempotency-Key": new_key()},
        )
        assert started.status_code == 202
        assert _unavailable("breaker") > before
        cache_outage.cache_answered()


def test_a_start_reads_the_breaker_as_it_is_now_not_as_this_process_last_saw_it(breaker_on):
    """Figure 17 counted two purchases accepted while open: a web process
    remembered "closed" for a second after another process opened it."""
    with freeze_time(T0):
        assert breaker.payments_paused() is None
        # Another process opens it (pybreaker's writes, as its storage makes them).
        cache.set_many({breaker.STATE: breaker.OPEN, breaker.OPENED_AT: T0.timestamp()})

        assert breaker.payments_paused() == RESET


def test_while_a_trial_is_half_open_no_purchase_is_let_in_and_a_stuck_one_is_tried_again(
    breaker_on, alice, big_event, gateway
):
    """pybreaker writes half-open for the length of the trial's call, then
    open or closed: a start reading it meanwhile must still be refused (the
    whole bench's figure 17 counted one purchase accepted while the
    processor was down). A process killed in that window leaves it half-open:
    beat's trial settles it."""
    cache.set_many({breaker.STATE: pybreaker.STATE_HALF_OPEN, breaker.OPENED_AT: T0.timestamp()})

    with freeze_time(T0 + timedelta(seconds=RESET + 1)):
        assert breaker.payments_paused() == settings_trial_seconds()
        with pytest.raises(PaymentsPaused):
            start_purchase(alice, big_event, seats=["A1"])
        assert breaker.breaker_trial() == "not_found"
    assert breaker.breaker_state()["state"] == "closed"
    assert breaker.payments_paused() is None


def settings_trial_seconds() -> int:
    from django.conf import settings

    return math.ceil(settings.PAYMENT_BREAKER_TRIAL_SECONDS)


def test_a_bursts_answers_count_as_one_then_each_failure(breaker_on, monkeypatch):
    """Calls in flight together (a charge burst's): their answers reset the
    run once, then each failure counts; two cache calls for the answers
    however many (purchases/breaker.py, observe_many)."""
    calls = []
    real = cache_outage.cache_call

    def counted(use, call):
        calls.append(use)
        return real(use, call)

    monkeypatch.setattr("purchases.breaker_storage.cache_call", counted)
    for _ in range(FAILURES - 1):
        breaker.observe(asked="charge", label="unknown", detail="timeout")
    calls.clear()

    breaker.observe_many(asked="charge", answers=[("succeeded", "")] * 12)

    assert breaker.breaker_state()["failures"] == 0
    assert len(calls) == 2, calls
    breaker.observe_many(
        asked="charge",
        answers=[("unknown", "timeout"), ("declined", ""), ("unknown", "timeout")]
        + [("unknown", "timeout")] * (FAILURES - 2),
    )
    assert breaker.breaker_state()["state"] == "open"
