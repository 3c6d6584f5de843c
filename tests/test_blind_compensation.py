"""The seed's red test: a charge whose answer was lost, compensated blind.

The card was charged (``pm_card_timeout_charged``: the charge lands at the
gateway, its answer times out, the saga is UNKNOWN). A naive saga takes the
timeout for a failure and undoes the purchase without asking the gateway: the
customer's money stays at the processor with no ledger entry to refund it
from, and the seat they paid for is sold to somebody else. docs/design.md forbids
exactly this ("UNKNOWN is reconciled, never compensated blind").

The same setup through the real path (a look-up at the gateway, directly or
by the reconcile timer the relay fires) keeps the money in the ledger and the
seat with the buyer who paid for it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import Sum
from django.utils import timezone
from freezegun import freeze_time

from ledger.services import ledger_net
from payments.fake_gateway.models import FakeCharge
from purchases.models import PurchaseSaga, ReservationSeat, Seat
from purchases.saga.states import TERMINAL, SagaState
from purchases.services import saga_charge, saga_compensate, saga_reconcile, saga_transition

from .conftest import drain_outbox, new_key, purchase_body, start_purchase
from .factories import EventFactory


def blind_compensate(*, saga_id) -> PurchaseSaga:
    """THE BUG docs/design.md FORBIDS, kept here to show what it costs.

    A naive saga reads a charge that timed out as a charge that failed: it
    moves UNKNOWN -> PAYMENT_FAILED -> COMPENSATING -> COMPENSATED and frees
    the seats, and never asks the gateway what happened to the charge. The
    ledger has no charge entry (the answer never arrived), so there is nothing
    to refund either. Every step is a legal move of the transition table; the
    sin is the missing look-up.
    """
    saga_transition(
        saga_id=saga_id, to=SagaState.PAYMENT_FAILED, reason="charge timed out: assume it failed"
    )
    return saga_compensate(saga_id=saga_id, reason="compensating a timed-out charge")


def _captured(saga) -> int:
    """What the gateway holds of the customer's money for this intent."""
    charges = FakeCharge.objects.filter(intent_id=saga.intent_id, status="succeeded")
    return charges.aggregate(n=Sum("amount"))["n"] or 0


def _live_holders(event, ref="A1") -> list[str]:
    """Who holds the seat now (buyers of its live reservations)."""
    return list(
        ReservationSeat.objects.filter(
            seat__event=event, seat__ref=ref, released_at__isnull=True
        ).values_list("reservation__buyer__username", flat=True)
    )


def _buy(client, event):
    return client.post(
        "/api/purchases/",
        purchase_body(event, seats=["A1"]),
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_key(),
    )


@pytest.fixture
def charged_but_unknown(alice, gateway):
    """Alice's purchase of A1: charged at the gateway, the answer lost."""
    event = EventFactory(seats=["A1"])
    saga = saga_charge(
        saga_id=start_purchase(
            alice, event, seats=["A1"], payment_method="pm_card_timeout_charged"
        ).pk
    )
    assert saga.state == "UNKNOWN"
    assert _captured(saga) == saga.amount == 2500  # it landed; we only did not hear
    assert ledger_net(intent_id=saga.intent_id) == 0
    return event, saga


@pytest.mark.django_db
def test_a_blind_compensation_of_a_charge_that_landed_loses_the_money_and_sells_the_seat_twice(
    charged_but_unknown, gateway, bob_api
):
    event, saga = charged_but_unknown
    asked_before = list(gateway.calls)

    # when: the timed-out charge is compensated blind
    blind_compensate(saga_id=saga.pk)

    # then: the gateway was never asked, the saga ended "cleanly"...
    assert gateway.calls == asked_before
    saga = PurchaseSaga.objects.get(pk=saga.pk)
    assert saga.state == "COMPENSATED"
    # ...and the money is lost: captured at the gateway, nothing in the ledger
    assert _captured(saga) == 2500
    assert ledger_net(intent_id=saga.intent_id) == 0
    assert ledger_net(intent_id=saga.intent_id) != _captured(saga)
    # ...and the seat alice paid for is sold again, to bob
    answer = _buy(bob_api, event)
    assert answer.status_code == 202, answer.json()
    bobs = saga_charge(saga_id=answer.json()["id"])
    assert bobs.state == "CONFIRMED"
    assert Seat.objects.get(event=event, ref="A1").status == "sold"
    assert _live_holders(event) == ["bob"]
    assert ledger_net(intent_id=bobs.intent_id) == _captured(bobs) == 2500


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["saga_reconcile", "relay"])
def test_the_real_path_reconciles_the_same_charge_and_keeps_money_and_seat(
    charged_but_unknown, gateway, bob, bob_api, how
):
    event, saga = charged_but_unknown

    # when: the saga is reconciled, by a look-up now or by the reconcile timer
    if how == "saga_reconcile":
        saga_reconcile(saga_id=saga.pk)
    else:
        with freeze_time(timezone.now()) as clock:
            for _ in range(60):  # minute by minute, whatever the probe schedule
                if PurchaseSaga.objects.get(pk=saga.pk).state in TERMINAL:
                    break
                clock.tick(timedelta(minutes=1))
                drain_outbox()

    # then: the money is kept: the ledger says what the gateway holds, charged once
    saga = PurchaseSaga.objects.get(pk=saga.pk)
    assert ledger_net(intent_id=saga.intent_id) == _captured(saga) == 2500
    assert FakeCharge.objects.filter(intent_id=saga.intent_id).count() == 1
    # the seat is alice's, sold once; bob is refused
    answer = _buy(bob_api, event)
    assert answer.status_code == 409, answer.json()
    assert answer.json()["code"] == "seat_unavailable" and answer.json()["seats"] == ["A1"]
    assert Seat.objects.get(event=event, ref="A1").status == "sold"
    assert _live_holders(event) == ["alice"]
    assert PurchaseSaga.objects.filter(buyer=bob).count() == 0
    # because the gateway was asked, and said charged
    assert saga.state == "CONFIRMED"
    assert ("retrieve", saga.intent_id) in gateway.calls
    assert saga.gateway_answers.filter(asked="retrieve", answer="succeeded").exists()
