"""The hold-expiry timer against the confirming commit, on real concurrent
connections: whoever wins, a sold seat is never released and a released seat
was never charged."""

import threading
import time
from collections import Counter

import pytest
from django.db import connection
from django.db.models import Sum

from ledger.models import LedgerEntry
from outbox.delivery import message_deliver
from outbox.models import OutboxMessage
from outbox.relay import relay_tick
from payments.fake_gateway.models import FakeCharge
from purchases.models import PurchaseSaga, Seat
from purchases.services import saga_charge

from .conftest import start_purchase
from .factories import EventFactory, UserFactory

RUNS = 30


def _both(first, second):
    barrier = threading.Barrier(2)
    errors = []

    def run(fn):
        try:
            barrier.wait()
            fn()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(fn,)) for fn in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errors


@pytest.mark.django_db(transaction=True)
def test_fire_and_cancel_race_never_releases_a_sold_seat(gateway, settings):
    settings.PURCHASE_HOLD_SECONDS = 0  # the hold timer is due at once
    buyer = UserFactory(username="racer")
    outcomes: Counter[str] = Counter()
    for run in range(RUNS):
        event = EventFactory(seats=["A1"])
        saga = start_purchase(buyer, event)

        # Stagger the two sides differently on each run (0-8 ms either way)
        # so that every interleaving gets its turn.
        lead, lag = divmod(run % 10, 5)
        delay_charge, delay_fire = (0.002 * lag, 0) if lead else (0, 0.002 * lag)

        def charge(saga=saga, delay=delay_charge):
            time.sleep(delay)
            saga_charge(saga_id=saga.pk)

        def fire(delay=delay_fire):
            time.sleep(delay)
            relay_tick(dispatch=lambda mid: message_deliver(message_id=mid))

        errors = _both(charge, fire)
        # anything the relay handed over late is delivered now
        relay_tick(dispatch=lambda mid: message_deliver(message_id=mid))

        assert errors == [], f"run {run}: {errors!r}"
        stored = PurchaseSaga.objects.get(pk=saga.pk)
        seat = Seat.objects.get(event=event, ref="A1").status
        charges = FakeCharge.objects.filter(intent_id=saga.intent_id, status="succeeded").count()
        ledger = (
            LedgerEntry.objects.filter(intent_id=saga.intent_id).aggregate(n=Sum("amount"))["n"]
            or 0
        )
        timer = OutboxMessage.objects.get(key=f"hold:{saga.pk}")
        if stored.state == "CONFIRMED":
            assert (seat, charges, ledger) == ("sold", 1, 2500), f"run {run}"
            if timer.fired_at is None:
                outcomes["cancelled before fire"] += 1
            else:
                refused = stored.history.filter(reason="expiry refused: confirmed").exists()
                outcomes["fired and refused" if refused else "fired, then charged: confirmed"] += 1
        else:
            # The expiry won before any charge could land: the gateway
            # cancelled the intent, so the seat went back unpaid.
            assert stored.state == "COMPENSATED", f"run {run}: {stored.state}"
            assert (seat, charges, ledger) == ("available", 0, 0), f"run {run}"
            outcomes["expired before charge"] += 1
    print(dict(outcomes))
    assert sum(outcomes.values()) == RUNS
