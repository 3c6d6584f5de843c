"""Refunds racing each other on real concurrent connections (docs/refunds.md,
"A refund's life"): the saga's lock decides the refunds of one purchase one
at a time, the refund row's lock decides its own steps, so whatever the
interleaving no money and no seat is given back twice, and what is given
back never exceeds what was paid."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.db.models import Sum

from ledger.models import LedgerEntry
from outbox.delivery import message_deliver
from outbox.models import OutboxMessage
from payments.fake_gateway.models import FakeRefund, FakeRequest
from purchases.errors import SalesClosed
from purchases.models import (
    CancellationStatus,
    EventCancellation,
    IdempotencyRecord,
    PurchaseSaga,
    Refund,
    Seat,
)
from purchases.refunds.errors import RefundError, RefundExceedsPaid
from purchases.services import (
    cancellation_tick,
    event_cancel,
    organizer_refund,
    purchase_cancel,
    refund_execute,
    saga_charge,
)

from .conftest import drain_outbox, race, start_purchase
from .factories import EventFactory, UserFactory

RUNS = 20
UNTIL = datetime(2099, 1, 1, tzinfo=UTC)  # buyers may cancel


def _confirmed(user, event, seats) -> PurchaseSaga:
    saga = saga_charge(saga_id=start_purchase(user, event, seats=seats).pk)
    assert saga.state == "CONFIRMED"
    return saga


def _drain() -> None:
    for _ in range(5):
        drain_outbox()


def _given_back(saga) -> tuple[int, int, int]:
    """What went back for the purchase: by our refund rows, in our ledger,
    and at the processor."""
    rows = (
        Refund.objects.filter(saga_id=saga.pk, status="succeeded").aggregate(n=Sum("amount"))["n"]
        or 0
    )
    ledger = (
        LedgerEntry.objects.filter(saga_id=saga.pk, kind="refund").aggregate(n=Sum("amount"))["n"]
        or 0
    )
    processor = (
        FakeRefund.objects.filter(intent_id=saga.gateway_ref, status="succeeded").aggregate(
            n=Sum("amount")
        )["n"]
        or 0
    )
    return rows, -ledger, processor


@pytest.mark.django_db(transaction=True)
def test_the_buyers_cancel_and_the_organizers_refund_of_the_same_seats_make_one_refund(
    gateway,
):
    buyer, finance = UserFactory(username="buyer"), UserFactory(username="finance")
    wins: dict[str, int] = {"buyer": 0, "organizer": 0}
    for run in range(RUNS):
        event = EventFactory(seats=["A1", "A2"], buyer_can_cancel_until=UNTIL)
        saga = _confirmed(buyer, event, ["A1", "A2"])

        def attempt(i, saga=saga, event=event, run=run):
            time.sleep(0.001 * ((i + run) % 3))  # every order gets its turn
            if i == 0:
                return purchase_cancel(
                    saga_id=saga.pk, user=buyer, seats=["A1"], request_key=f"cancel-{run}"
                )
            return organizer_refund(
                organizer=event.organizer,
                saga_id=saga.pk,
                user=finance,
                reason="broken seat",
                seats=["A1"],
                release_seats=True,
                request_key=f"refund-{run}",
            )

        results = race(2, attempt)
        made = [r for r in results if isinstance(r, Refund)]
        refused = [r for r in results if isinstance(r, Exception)]
        assert len(made) == 1 and len(refused) == 1, f"run {run}: {results!r}"
        assert isinstance(refused[0], RefundError), f"run {run}: {refused[0]!r}"
        wins[made[0].source] += 1
        _drain()
        assert Refund.objects.filter(saga_id=saga.pk).count() == 1, f"run {run}"
        assert _given_back(saga) == (2500, 2500, 2500), f"run {run}"
        assert Seat.objects.get(event=event, ref="A1").status == "available"
        assert Seat.objects.get(event=event, ref="A2").status == "sold"
    print(wins)


@pytest.mark.django_db(transaction=True)
def test_concurrent_refunds_never_give_back_more_than_was_paid(gateway):
    buyer, finance = UserFactory(username="buyer"), UserFactory(username="finance")
    event = EventFactory(seats=["A1", "A2"])
    saga = _confirmed(buyer, event, ["A1", "A2"])  # 5000

    def attempt(i):
        return organizer_refund(
            organizer=event.organizer,
            saga_id=saga.pk,
            user=finance,
            reason="goodwill",
            amount=2000,  # 40 %
            request_key=f"refund-{i}",
        )

    results = race(8, attempt)
    made = [r for r in results if isinstance(r, Refund)]
    refused = [r for r in results if not isinstance(r, Refund)]
    assert len(made) == 2, results
    assert all(isinstance(r, RefundExceedsPaid) and r.refundable == 1000 for r in refused), results
    _drain()
    assert _given_back(saga) == (4000, 4000, 4000)
    assert FakeRefund.objects.filter(intent_id=saga.gateway_ref).count() == 2


@pytest.mark.django_db(transaction=True)
def test_two_deliveries_of_one_refunds_message_at_once_make_one_refund(gateway):
    buyer, finance = UserFactory(username="buyer"), UserFactory(username="finance")
    for run in range(RUNS):
        event = EventFactory(seats=["A1"])
        saga = _confirmed(buyer, event, ["A1"])
        refund = organizer_refund(
            organizer=event.organizer, saga_id=saga.pk, user=finance, reason="x", amount=1000
        )
        message = OutboxMessage.objects.get(key=f"refund-execute:{refund.pk}")

        def attempt(i, refund=refund, message=message, event=event):
            if i < 2:  # two workers handed the same message (the lease decides)
                return message_deliver(message_id=message.pk)
            # two more past the lease (a redelivery after a crash)
            return refund_execute(refund_id=refund.pk, event_id=event.pk)

        results = race(4, attempt)
        assert not [r for r in results if isinstance(r, Exception)], f"run {run}: {results!r}"
        assert sorted(r for r in results[:2]) == ["delivered", "skipped"], f"run {run}"
        _drain()
        refund.refresh_from_db()
        assert refund.status == "succeeded", f"run {run}"
        made = FakeRefund.objects.filter(intent_id=saga.gateway_ref)
        assert made.count() == 1, f"run {run}"
        # The processor made it once; any second create was its key's replay.
        creates = FakeRequest.objects.filter(endpoint="create_refund", refund_id=str(refund.pk))
        assert creates.count() <= 2, f"run {run}"
        assert _given_back(saga) == (1000, 1000, 1000), f"run {run}"


@pytest.mark.django_db(transaction=True)
def test_a_buyers_cancel_racing_the_events_cancellation_is_one_refund(gateway):
    buyer, owner = UserFactory(username="buyer"), UserFactory(username="owner")
    outcomes: dict[str, int] = {}
    for run in range(RUNS):
        event = EventFactory(seats=["A1", "A2"], buyer_can_cancel_until=UNTIL)
        saga = _confirmed(buyer, event, ["A1", "A2"])

        def attempt(i, saga=saga, event=event, run=run):
            time.sleep(0.001 * ((i + run) % 3))
            if i == 0:
                return purchase_cancel(
                    saga_id=saga.pk, user=buyer, seats=None, request_key=f"cancel-{run}"
                )
            event_cancel(organizer=event.organizer, event_id=event.pk, reason="storm", user=owner)
            return cancellation_tick(event_id=event.pk)

        results = race(2, attempt)
        # The buyer's cancel is refused cleanly, or wins; the tick never fails.
        assert not isinstance(results[1], Exception), f"run {run}: {results!r}"
        assert isinstance(results[0], Refund | RefundError), f"run {run}: {results!r}"
        for _ in range(30):
            if EventCancellation.objects.get(event_id=event.pk).status == CancellationStatus.DONE:
                # Done means none of its refunds is pending (docs/refunds.md).
                pending = Refund.objects.filter(event_id=event.pk, status="pending")
                assert not pending.exists(), f"run {run}: done with {list(pending.values())}"
                break
            time.sleep(0.01)
            cancellation_tick(event_id=event.pk)
            _drain()
        assert EventCancellation.objects.get(event_id=event.pk).status == "done", f"run {run}"
        sources = list(Refund.objects.filter(saga_id=saga.pk).values_list("source", flat=True))
        assert len(sources) == 1, f"run {run}: {sources}"
        outcomes[sources[0]] = outcomes.get(sources[0], 0) + 1
        assert _given_back(saga) == (5000, 5000, 5000), f"run {run}"
        ledger = LedgerEntry.objects.filter(event_id=event.pk).aggregate(n=Sum("amount"))["n"]
        assert ledger == 0, f"run {run}"
    print(outcomes)


def _waiting_on_a_lock(timeout: float = 10.0) -> None:
    """Until some other connection of this database waits on a lock (a row's,
    or another transaction's insert of the same unique key)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0]:
                return
        time.sleep(0.01)
    raise AssertionError("no connection ever waited on a lock")


@pytest.mark.django_db(transaction=True)
def test_a_purchase_started_as_the_event_is_cancelled_is_never_charged_and_kept(gateway):
    """The start reads the event's status without a lock (docs/refunds.md:
    "every purchase's start reads it in its own transaction"): one that read
    "on sale" before the cancel committed, and commits after the run looked
    for purchases in flight, must still end with no money kept."""
    buyer, owner = UserFactory(username="buyer"), UserFactory(username="owner")
    event = EventFactory(seats=["A1"])
    key = "key-the-double-click"
    locked, release = threading.Event(), threading.Event()
    started: list = []

    def claim_the_key():
        # The buyer's double click, its key claimed and not committed: the
        # start (which reads the event's status first) waits on the key's
        # unique index, the one place it waits (a seat another start holds is
        # passed over, not waited for). Rolled back, it lets the start on.
        try:
            with transaction.atomic():
                IdempotencyRecord.objects.create(
                    user=buyer,
                    key=key,
                    request_hash="the other click",
                    response_body={},
                    saga_id=uuid.uuid4(),
                    created_at=datetime.now(UTC),
                )
                locked.set()
                release.wait(20)
                transaction.set_rollback(True)
        finally:
            connection.close()

    def start():
        try:
            started.append(start_purchase(buyer, event, seats=["A1"], key=key))
        except Exception as exc:  # noqa: BLE001 - the verdict is the result
            started.append(exc)
        finally:
            connection.close()

    holder = threading.Thread(target=claim_the_key)
    holder.start()
    assert locked.wait(10)
    starter = threading.Thread(target=start)
    starter.start()
    _waiting_on_a_lock()  # the start read "on sale" and waits for the key

    event_cancel(organizer=event.organizer, event_id=event.pk, reason="storm", user=owner)
    assert cancellation_tick(event_id=event.pk) == "done"  # nothing in flight it can see

    release.set()
    holder.join(20)
    starter.join(20)
    [saga] = started
    if isinstance(saga, Exception):
        assert isinstance(saga, SalesClosed), saga  # refused after the wait: fine
        return
    saga_charge(saga_id=saga.pk)  # its charge task, as enqueued on its commit
    for _ in range(10):
        cancellation_tick(event_id=event.pk)
        _drain()
    saga = PurchaseSaga.objects.get(pk=saga.pk)
    charged = LedgerEntry.objects.filter(saga_id=saga.pk).aggregate(n=Sum("amount"))["n"] or 0
    assert charged == 0, f"a purchase of a cancelled event kept its money ({saga.state})"
