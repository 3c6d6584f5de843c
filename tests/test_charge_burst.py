"""Charges in bursts (purchases/saga/burst.py): a charge task's saga charged
with its event's other PENDING sagas, one commit before the processor is
asked and one after, the calls concurrent; every answer recorded as the
one-saga step records it; a crash between the commits leaves each saga
where the resumer finishes it. Real commits on PostgreSQL (a row's ``xmin``
names the transaction that wrote it), the fake processor over HTTP on the
live server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from django.core import mail
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import LedgerEntry
from outbox.handover import delivered_here
from outbox.models import OutboxMessage
from payments.fake_gateway.models import FakeCharge
from payments.gateway import HttpPaymentGateway
from purchases import availability, lock_objects
from purchases.errors import IllegalTransition
from purchases.models import (
    GatewayAnswer,
    PurchaseSaga,
    Reservation,
    ReservationSeat,
    SagaHistory,
    Seat,
)
from purchases.saga import burst
from purchases.saga.driver import saga_drive
from purchases.saga.states import TRANSITIONS
from webhooks.models import WebhookDelivery
from webhooks.services import webhook_endpoint_create

from .conftest import start_purchase
from .factories import EventFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

SEATS = [f"A{n}" for n in range(1, 9)]


@pytest.fixture
def bursts(settings):
    settings.CHARGE_BURST_SIZE = 8
    settings.CHARGE_BURST_CONCURRENCY = 4
    return settings


@pytest.fixture
def processor_url(live_server, settings) -> str:
    # The live server (threaded) serves the fake processor's URLs.
    settings.ROOT_URLCONF = "tests.fake_gateway_urls"
    settings.FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS = 1.0
    settings.FAKE_GATEWAY_LATENCY_MS = 0
    return f"{live_server.url}/fake-gateway/v1"


class TogetherGateway(HttpPaymentGateway):
    """The HTTP adapter, whose charges wait for each other: ``together``
    calls must be in flight at once, or the barrier breaks (asked one after
    another, the first waits alone and times out)."""

    def __init__(self, *, together: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.barrier = threading.Barrier(together, timeout=10)
        self.threads: set[str] = set()

    def charge(self, request):
        self.threads.add(threading.current_thread().name)
        self.barrier.wait()
        return super().charge(request)


@pytest.fixture
def processor(processor_url) -> Iterator[HttpPaymentGateway]:
    gateway = HttpPaymentGateway(base_url=processor_url, timeout=0.5)
    yield gateway
    gateway.close()


def _buy(event, methods: list[str], *, seats=SEATS) -> list[PurchaseSaga]:
    return [
        start_purchase(UserFactory(), event, seats=[seat], payment_method=method)
        for seat, method in zip(seats, methods, strict=False)
    ]


def _states(sagas) -> list[str]:
    by_id = dict(
        PurchaseSaga.objects.filter(pk__in=[s.pk for s in sagas]).values_list("pk", "state")
    )
    return [by_id[s.pk] for s in sagas]


def _writers(sagas, **moved) -> set[int]:
    """The transactions (``xmin``) that wrote the sagas' history rows of a move."""
    ids = [s.pk for s in sagas]
    rows = SagaHistory.objects.filter(saga_id__in=ids, **moved).values_list("saga_id", flat=True)
    assert sorted(rows) == sorted(ids), f"each saga moved once: {moved}"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT xmin::text FROM {SagaHistory._meta.db_table}"
            " WHERE saga_id = ANY(%s) AND from_state = %s AND to_state = %s",
            [ids, moved["from_state"], moved["to_state"]],
        )
        return {int(x) for (x,) in cursor.fetchall()}


def test_a_burst_of_mixed_outcomes_records_each_as_alone_in_one_commit(bursts, processor_url):
    event = EventFactory(seats=SEATS)
    visa, visa2, declined, unknown = sagas = _buy(
        event,
        ["pm_card_visa", "pm_card_visa", "pm_card_chargeDeclined", "pm_card_timeout_charged"],
    )
    gateway = TogetherGateway(together=4, base_url=processor_url, timeout=0.5)
    try:
        own = burst.saga_charge_burst(saga_id=visa.pk, gateway=gateway)
    finally:
        gateway.close()

    # the calls were in flight together, from the burst's threads
    assert len(gateway.threads) == 4 and all(t.startswith("charge-burst") for t in gateway.threads)
    assert own.pk == visa.pk and own.state == "CONFIRMED"
    # each recorded as the one-saga step records it
    assert _states(sagas) == ["CONFIRMED", "CONFIRMED", "COMPENSATED", "UNKNOWN"]
    for saga in (visa, visa2):
        entry = LedgerEntry.objects.get(intent_id=saga.intent_id)
        assert (entry.kind, entry.amount) == ("charge", saga.amount)
        assert Reservation.objects.get(pk=saga.reservation_id).status == "CONFIRMED"
        assert OutboxMessage.objects.get(key=f"hold:{saga.pk}").cancelled_at is not None
        assert OutboxMessage.objects.filter(topic="purchase.confirmed", saga_id=saga.pk).count()
    assert {s.status for s in Seat.objects.filter(event=event, ref__in=["A1", "A2"])} == {"sold"}
    assert Seat.objects.get(event=event, ref="A3").status == "available"
    assert OutboxMessage.objects.filter(topic="purchase.reconcile", saga_id=unknown.pk).exists()
    assert not LedgerEntry.objects.filter(intent_id__in=[declined.intent_id, unknown.intent_id])
    for saga in sagas:  # each intent charged (or asked) once, with its own key
        assert FakeCharge.objects.filter(intent_id=saga.intent_id).count() == (
            0 if saga is declined else 1
        )
    # one commit moved all four to CHARGING, one recorded all four answers
    assert len(_writers(sagas, from_state="PENDING", to_state="CHARGING")) == 1
    answered = [
        ("CHARGING", "CONFIRMED", [visa, visa2]),
        ("CHARGING", "PAYMENT_FAILED", [declined]),
        ("CHARGING", "UNKNOWN", [unknown]),
    ]
    writers = set()
    for source, to, which in answered:
        writers |= _writers(which, from_state=source, to_state=to)
    assert len(writers) == 1
    # and not the commit that moved them to CHARGING
    assert writers != _writers(sagas, from_state="PENDING", to_state="CHARGING")


def test_a_bursts_confirmations_are_delivered_in_place_with_one_closing_commit(bursts, processor):
    bursts.OUTBOX_HAND_OVER_ON_COMMIT = True  # as deployed (tests/settings.py turns it off)
    event = EventFactory(seats=SEATS)
    sagas = _buy(event, ["pm_card_visa"] * 3)

    with delivered_here():  # as the charge task runs it
        burst.saga_charge_burst(saga_id=sagas[0].pk, gateway=processor)

    confirmed = OutboxMessage.objects.filter(
        topic="purchase.confirmed", saga_id__in=[s.pk for s in sagas]
    )
    assert confirmed.count() == 3 and all(m.completed_at for m in confirmed)
    # each buyer's email sent once
    assert sorted(m.to[0] for m in mail.outbox) == sorted(s.buyer.email for s in sagas)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT xmin::text FROM {OutboxMessage._meta.db_table} WHERE id = ANY(%s)",
            [[m.pk for m in confirmed]],
        )
        assert len(cursor.fetchall()) == 1, "the three completed by one commit"


def test_a_bursts_confirmations_move_the_events_availability_once(bursts, processor, monkeypatch):
    bursts.AVAILABILITY_CACHE = True
    event = EventFactory(seats=SEATS)
    sagas = _buy(event, ["pm_card_visa"] * 3)
    moved: list[int] = []
    monkeypatch.setattr(availability, "availability_bump", moved.append)

    burst.saga_charge_burst(saga_id=sagas[0].pk, gateway=processor)

    assert _states(sagas) == ["CONFIRMED"] * 3
    assert moved == [event.pk]  # once, after the commit that sold the three


def _written(saga: PurchaseSaga) -> dict:
    """Every row a purchase's charge wrote, its own names and instants
    taken out: what must be the same whichever driver charged it."""
    saga.refresh_from_db()
    mine = {
        "saga_id": str(saga.pk),
        "intent_id": saga.intent_id,
        "reservation": saga.reservation.ref,
        "buyer_id": saga.buyer_id,
    }

    def plain(payload: dict) -> dict:
        return {
            k: f"<{k}>" if k in mine and v == mine[k] else v
            for k, v in payload.items()
            if k not in ("seats", "buyer")  # each purchase's own seat and buyer
        }

    charges = LedgerEntry.objects.filter(saga_id=saga.pk).values()
    return {
        "saga": (saga.state, saga.version, saga.attempts, saga.action_secret),
        "history": list(
            saga.history.order_by("version").values_list(
                "from_state", "to_state", "reason", "actor", "actor_name", "version"
            )
        ),
        "ledger": [
            (e["kind"], e["amount"], e["currency"], e["note"], e["override"], e["refund_id"])
            + (e["gateway_reference"].startswith("ch_"), e["event_id"])
            for e in charges
        ],
        "answers": list(
            GatewayAnswer.objects.filter(saga_id=saga.pk).values_list("asked", "answer", "attempt")
        ),
        "outbox": sorted(
            (
                m.topic,
                (m.key or "")
                .replace(str(saga.pk), "<saga>")
                .replace(f":{m.payload.get('delivery_id')}:", ":<delivery>:"),
                plain(m.payload)
                | ({"delivery_id": "<delivery>"} if "delivery_id" in m.payload else {}),
                m.cancelled_at is not None,
                m.completed_at is not None,
            )
            for m in OutboxMessage.objects.filter(saga_id=saga.pk)
        ),
        # the facts' own buyer and seats are the purchase's
        "facts": [
            (
                m.payload["buyer"] == {"username": saga.buyer.username, "email": saga.buyer.email},
                m.payload["seats"]
                == sorted(
                    ReservationSeat.objects.filter(reservation_id=saga.reservation_id).values_list(
                        "seat__ref", flat=True
                    )
                ),
            )
            for m in OutboxMessage.objects.filter(saga_id=saga.pk, topic="purchase.confirmed")
        ],
        "webhooks": sorted(
            (
                d.endpoint_id,
                d.event_type,
                d.status,
                d.armed_attempt,
                json.loads(d.body)["data"]["purchase"]["id"] == str(saga.pk),
                {k: v for k, v in json.loads(d.body)["data"].items() if k != "purchase"},
                sorted(json.loads(d.body)["data"]["purchase"]),
            )
            for d in WebhookDelivery.objects.filter(saga_id=saga.pk)
        ),
        "reservation": Reservation.objects.get(pk=saga.reservation_id).status,
        "seats": sorted(
            Seat.objects.filter(
                pk__in=ReservationSeat.objects.filter(reservation_id=saga.reservation_id).values(
                    "seat_id"
                )
            ).values_list("status", flat=True)
        ),
    }


def test_a_bursts_confirmations_write_what_one_sagas_confirmation_writes(bursts, processor):
    event = EventFactory(seats=SEATS)
    bursts.WEBHOOK_ALLOW_LOCAL_URLS = True
    for path in ("/a", "/b"):  # each confirmation announced to both
        webhook_endpoint_create(url=f"http://127.0.0.1:9{path}", events=["purchase.confirmed"])
    webhook_endpoint_create(url="http://127.0.0.1:9/c", events=["purchase.failed"])
    alone, *together = _buy(event, ["pm_card_visa"] * 4)
    bursts.CHARGE_BURST_SIZE = 1
    burst.saga_charge_burst(saga_id=alone.pk, gateway=processor)  # the one-saga driver
    bursts.CHARGE_BURST_SIZE = 8

    burst.saga_charge_burst(saga_id=together[0].pk, gateway=processor)

    expected = _written(alone)
    assert expected["saga"][0] == "CONFIRMED" and expected["seats"] == ["sold"]
    assert len(expected["webhooks"]) == 2 and expected["webhooks"][0][4] is True
    assert expected["facts"] == [(True, True)]
    for saga in together:
        assert _written(saga) == expected
    # the three confirmed by one statement per table (one transaction wrote them all)
    assert len(_writers(together, from_state="CHARGING", to_state="CONFIRMED")) == 1


def test_a_saga_alone_is_charged_alone_as_before(bursts, processor):
    event = EventFactory(seats=SEATS)
    (saga,) = _buy(event, ["pm_card_visa"])

    done = burst.saga_charge_burst(saga_id=saga.pk, gateway=processor)

    assert done.state == "CONFIRMED"
    assert list(done.history.order_by("version").values_list("to_state", flat=True)) == [
        "PENDING",
        "CHARGING",
        "CONFIRMED",
    ]


def test_a_saga_another_transaction_holds_is_left_to_it(bursts, processor):
    event = EventFactory(seats=SEATS)
    first, held, free = _buy(event, ["pm_card_visa"] * 3)
    db = connection.settings_dict
    other = psycopg.connect(
        host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"]
    )
    try:
        other.execute(
            f"SELECT 1 FROM {PurchaseSaga._meta.db_table} WHERE id = %s FOR UPDATE", [held.pk]
        )
        burst.saga_charge_burst(saga_id=first.pk, gateway=processor)
        # (the burst did not wait for the lock: this line was reached)
        assert _states([first, held, free]) == ["CONFIRMED", "PENDING", "CONFIRMED"]
    finally:
        other.close()
    # its own task, later, charges it
    assert burst.saga_charge_burst(saga_id=held.pk, gateway=processor).state == "CONFIRMED"


def test_sagas_whose_hold_ran_out_are_not_claimed(bursts, processor):
    event = EventFactory(seats=SEATS)
    first, late = _buy(event, ["pm_card_visa"] * 2)
    Reservation.objects.filter(pk=late.reservation_id).update(
        hold_expires_at=timezone.now() - timedelta(seconds=1)
    )

    burst.saga_charge_burst(saga_id=first.pk, gateway=processor)

    assert _states([first, late]) == ["CONFIRMED", "PENDING"]
    assert not FakeCharge.objects.filter(intent_id=late.intent_id).exists()


def test_a_saga_that_moved_on_is_skipped_without_a_call(bursts, processor):
    event = EventFactory(seats=SEATS)
    first, second = _buy(event, ["pm_card_visa"] * 2)
    burst.saga_charge_burst(saga_id=first.pk, gateway=processor)  # charges both

    again = burst.saga_charge_burst(saga_id=second.pk, gateway=processor)

    assert again.state == "CONFIRMED"
    assert FakeCharge.objects.filter(intent_id=second.intent_id).count() == 1


def test_a_task_whose_saga_a_burst_charged_reads_it_without_a_lock_then_claims(bursts, processor):
    event = EventFactory(seats=SEATS)
    first, second = _buy(event, ["pm_card_visa"] * 2)
    burst.saga_charge_burst(saga_id=first.pk, gateway=processor)  # charges both

    with CaptureQueriesContext(connection) as queries:
        assert burst.saga_charge_burst(saga_id=second.pk, gateway=processor).state == "CONFIRMED"

    # its saga read without the lock (3 statements with it on the code before
    # the read), then the event's due charges claimed: none left
    read, begin, claim, commit = [q["sql"] for q in queries.captured_queries]
    assert "FOR UPDATE" not in read and (begin, commit) == ("BEGIN", "COMMIT")
    assert "SKIP LOCKED" in claim
    # what makes the read enough: no saga ever comes back to PENDING
    assert not [source for source, targets in TRANSITIONS.items() if "PENDING" in targets]


# --- wake-ups: one task for the purchases of a busy event ----------------------


def _published(broker_queue) -> list[str]:
    return [m["args"][0] for m in broker_queue.messages() if m["task"] == "purchases.charge"]


def test_a_purchase_rides_the_wake_up_its_event_owes_and_the_task_charges_it(
    bursts, processor, broker_queue
):
    event = EventFactory(seats=SEATS)
    other_event = EventFactory(seats=SEATS)
    first, rider, rider2 = _buy(event, ["pm_card_visa"] * 3)
    (elsewhere,) = _buy(other_event, ["pm_card_visa"])

    # one task for the event (the first purchase's), one for the other event
    assert _published(broker_queue) == [str(first.pk), str(elsewhere.pk)]
    # the first purchase's saga taken by another burst meanwhile: its task
    # still charges the purchases that rode its wake-up
    PurchaseSaga.objects.filter(pk=first.pk).update(state="EXPIRED")
    assert burst.saga_charge_burst(saga_id=first.pk, gateway=processor).state == "EXPIRED"
    assert _states([rider, rider2]) == ["CONFIRMED", "CONFIRMED"]
    # the flag was cleared by the task: the event's next purchase has a task
    (later,) = _buy(event, ["pm_card_visa"], seats=["A8"])
    assert _published(broker_queue) == [str(later.pk)]


def test_a_task_charges_its_events_purchases_in_bursts_until_a_claim_comes_back_short(
    bursts, processor, broker_queue
):
    bursts.CHARGE_BURST_SIZE = 2
    event = EventFactory(seats=SEATS)
    sagas = _buy(event, ["pm_card_visa"] * 5)
    assert _published(broker_queue) == [str(sagas[0].pk)]

    burst.saga_charge_burst(saga_id=sagas[0].pk, gateway=processor)

    # its own burst (2, full), the event's (2, full), then 1: a claim short
    assert _states(sagas) == ["CONFIRMED"] * 5
    moves = _writers(sagas, from_state="PENDING", to_state="CHARGING")
    assert len(moves) == 3
    assert _published(broker_queue) == []


def test_a_task_leaves_a_busy_events_rest_to_a_task_of_its_own(
    bursts, processor, broker_queue, monkeypatch
):
    bursts.CHARGE_BURST_SIZE = 2
    monkeypatch.setattr(burst, "BURSTS_PER_TASK", 1)
    event = EventFactory(seats=SEATS)
    sagas = _buy(event, ["pm_card_visa"] * 6)
    assert _published(broker_queue) == [str(sagas[0].pk)]

    burst.saga_charge_burst(saga_id=sagas[0].pk, gateway=processor)

    # its own burst and one of the event's, both full: the rest is a new task's
    assert _states(sagas) == ["CONFIRMED"] * 4 + ["PENDING"] * 2
    (next_task,) = _published(broker_queue)
    burst.saga_charge_burst(saga_id=next_task, gateway=processor)
    assert _states(sagas) == ["CONFIRMED"] * 6


def test_with_the_cache_down_or_bursts_off_every_purchase_publishes_its_task(
    bursts, processor, broker_queue, monkeypatch
):
    event = EventFactory(seats=SEATS)
    monkeypatch.setattr(burst, "cache_call", lambda use, call: (False, None))
    down = _buy(event, ["pm_card_visa"] * 2)
    assert _published(broker_queue) == [str(s.pk) for s in down]
    monkeypatch.undo()

    bursts.CHARGE_BURST_SIZE = 1
    off = [start_purchase(UserFactory(), event, seats=[seat]) for seat in ["A5", "A6"]]
    assert _published(broker_queue) == [str(s.pk) for s in off]


def test_a_purchase_whose_task_could_not_be_published_clears_the_wake_up(
    bursts, processor, broker_queue, monkeypatch
):
    event = EventFactory(seats=SEATS)

    def refused(saga_id):
        raise ConnectionError("broker down")

    monkeypatch.setattr("purchases.saga.start.publish_charge", refused)
    (lost,) = _buy(event, ["pm_card_visa"])  # its 202 kept (robust on-commit)
    monkeypatch.undo()

    (later,) = _buy(event, ["pm_card_visa"], seats=["A8"])
    assert _published(broker_queue) == [str(later.pk)]
    burst.saga_charge_burst(saga_id=later.pk, gateway=processor)
    assert _states([lost, later]) == ["CONFIRMED", "CONFIRMED"]


def test_no_saga_of_a_cancelled_event_is_claimed(bursts, processor):
    event = EventFactory(seats=SEATS)
    first, rider = _buy(event, ["pm_card_visa"] * 2)
    PurchaseSaga.objects.filter(pk=first.pk).update(state="EXPIRED")
    type(event).objects.filter(pk=event.pk).update(status="cancelled")

    burst.saga_charge_burst(saga_id=first.pk, gateway=processor)

    assert _states([rider]) == ["PENDING"]
    assert not FakeCharge.objects.filter(intent_id=rider.intent_id).exists()


def test_a_recording_that_fails_for_one_saga_records_the_others_alone(bursts, processor):
    event = EventFactory(seats=SEATS)
    first, broken, third = _buy(event, ["pm_card_visa"] * 3)
    # the invariant broken behind the saga's back: its seat is no longer held
    Seat.objects.filter(event=event, ref="A2").update(status="available")

    with pytest.raises(Exception, match="CONFIRMED with seats not held"):
        burst.saga_charge_burst(saga_id=first.pk, gateway=processor)

    # the one-commit recording was rolled back whole, then each recorded alone
    assert _states([first, broken, third]) == ["CONFIRMED", "CHARGING", "CONFIRMED"]
    assert len(_writers([first, third], from_state="CHARGING", to_state="CONFIRMED")) == 2
    # the broken one is left as the one-saga step's same error leaves it: in
    # CHARGING, its charge at the processor, the resumer's look-up refusing
    # to confirm it without its seat (an operator's, by the auditor)
    assert not LedgerEntry.objects.filter(intent_id=broken.intent_id).exists()
    with pytest.raises(IllegalTransition):
        saga_drive(saga_id=broken.pk, gateway=processor)


class Crash(BaseException):
    """A process killed at this point: nothing after it runs, no handler
    catches it (not an ``Exception``)."""


@pytest.mark.parametrize("at", ["before the calls", "after the calls"])
def test_a_crash_between_the_bursts_commits_leaves_each_saga_to_the_resumer(
    bursts, processor, monkeypatch, at
):
    event = EventFactory(seats=SEATS)
    sagas = _buy(event, ["pm_card_visa", "pm_card_visa", "pm_card_chargeDeclined"])
    if at == "before the calls":

        def crash(*args, **kwargs):
            raise Crash

        monkeypatch.setattr(burst, "_ask_all", crash)
    else:

        def crash(*args, **kwargs):
            raise Crash

        monkeypatch.setattr(lock_objects, "sagas_for_update", crash)

    with pytest.raises(Crash):
        burst.saga_charge_burst(saga_id=sagas[0].pk, gateway=processor)
    assert _states(sagas) == ["CHARGING"] * 3
    charged = 2 if at == "after the calls" else 0
    assert FakeCharge.objects.filter(intent_id__in=[s.intent_id for s in sagas]).count() == charged

    monkeypatch.undo()
    for saga in sagas:  # the resumer: CHARGING is looked up first, never charged blind
        saga_drive(saga_id=saga.pk, gateway=processor)
    for saga in sagas:  # a look-up that found no charge charges again, with the same key
        if PurchaseSaga.objects.get(pk=saga.pk).state not in {"CONFIRMED", "COMPENSATED"}:
            saga_drive(saga_id=saga.pk, gateway=processor)
    assert _states(sagas) == ["CONFIRMED", "CONFIRMED", "COMPENSATED"]
    for saga in sagas[:2]:
        assert FakeCharge.objects.filter(intent_id=saga.intent_id).count() == 1
        assert LedgerEntry.objects.filter(intent_id=saga.intent_id).count() == 1


def test_a_bursts_answers_are_counted_by_the_breaker_together(bursts, processor, monkeypatch):
    bursts.PAYMENT_BREAKER_ENABLED = True
    event = EventFactory(seats=SEATS)
    sagas = _buy(event, ["pm_card_visa"] * 3 + ["pm_card_timeout_charged"])
    counted = []
    monkeypatch.setattr(
        "purchases.breaker.observe", lambda **answer: counted.append(answer["label"])
    )

    burst.saga_charge_burst(saga_id=sagas[0].pk, gateway=processor)

    # the three answers as one, then the failure (one per call before)
    assert counted == ["succeeded", "unknown"]


def test_a_bursts_announcements_are_one_statement_for_the_rows_and_one_for_the_webhooks(
    bursts, processor
):
    event = EventFactory(seats=SEATS)
    bursts.WEBHOOK_ALLOW_LOCAL_URLS = True
    webhook_endpoint_create(url="http://127.0.0.1:9/a", events=["purchase.confirmed"])
    sagas = _buy(event, ["pm_card_visa"] * 6)

    with CaptureQueriesContext(connection) as queries:
        burst.saga_charge_burst(saga_id=sagas[0].pk, gateway=processor)

    confirmed_rows = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("INSERT INTO outbox_outboxmessage")
        and "'purchase.confirmed'" in q["sql"]
    ]
    webhooks = [
        q["sql"]
        for q in queries.captured_queries
        if "INSERT INTO webhooks_webhookdelivery" in q["sql"]
    ]
    # one of each for the six (six of each on the code before)
    assert len(confirmed_rows) == 1 and len(webhooks) == 1, (confirmed_rows, webhooks)
    assert WebhookDelivery.objects.filter(saga_id__in=[s.pk for s in sagas]).count() == 6
    assert (
        OutboxMessage.objects.filter(
            topic="purchase.confirmed", saga_id__in=[s.pk for s in sagas]
        ).count()
        == 6
    )
