"""The saga spine with the in-process fake gateway: charge, confirm, decline,
compensate, and the emails they owe, with every handler delivered twice."""

import pytest
from django.core import mail
from django.db import transaction

from ledger.models import LedgerEntry
from outbox.models import OutboxMessage
from payments.fake_gateway.models import FakeCharge
from payments.guards import NetworkCallInTransaction
from payments.interface import ChargeRequest
from purchases.models import Reservation, Seat
from purchases.services import saga_charge, saga_compensate

from .conftest import drain_outbox, start_purchase


def _seat_status(event, ref):
    return Seat.objects.get(event=event, ref=ref).status


def _charge_calls(gateway):
    return [c for c in gateway.calls if c[0] == "charge"]


@pytest.mark.django_db
def test_a_visa_purchase_confirms(alice, event, gateway):
    saga = start_purchase(alice, event, seats=["A1", "A2"])

    saga = saga_charge(saga_id=saga.pk)

    assert saga.state == "CONFIRMED"
    assert list(saga.history.values_list("to_state", flat=True)) == [
        "PENDING",
        "CHARGING",
        "CONFIRMED",
    ]
    entry = LedgerEntry.objects.get(intent_id=saga.intent_id)
    assert (entry.kind, entry.amount, entry.currency) == ("charge", 5000, "EUR")
    assert FakeCharge.objects.filter(intent_id=saga.intent_id).count() == 1
    assert {_seat_status(event, "A1"), _seat_status(event, "A2")} == {"sold"}
    assert Reservation.objects.get(pk=saga.reservation_id).status == "CONFIRMED"
    timer = OutboxMessage.objects.get(key=f"hold:{saga.pk}")
    assert timer.cancelled_at is not None and timer.fired_at is None
    assert OutboxMessage.objects.filter(topic="purchase.confirmed", saga_id=saga.pk).count() == 1


@pytest.mark.django_db
def test_the_confirmation_email_is_sent_once_whatever_the_deliveries(alice, event, gateway):
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    message = OutboxMessage.objects.get(topic="purchase.confirmed", saga_id=saga.pk)

    drain_outbox()
    from outbox.delivery import message_deliver

    OutboxMessage.objects.filter(pk=message.pk).update(completed_at=None)  # a redelivery
    message_deliver(message_id=message.pk)

    assert len(mail.outbox) == 1
    assert "confirmed" in mail.outbox[0].body
    assert saga.reservation.ref in mail.outbox[0].subject
    assert mail.outbox[0].to == ["alice@example.com"]


@pytest.mark.django_db
def test_an_email_resent_after_a_crash_carries_the_first_ones_message_id(alice, event, gateway):
    # The worker sent the email and died before writing the inbox entry: the
    # redelivery sends again (at least once), as the same message.
    from outbox.delivery import message_deliver
    from outbox.models import InboxEntry

    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    other = saga_charge(
        saga_id=start_purchase(
            alice, event, seats=["A2"], payment_method="pm_card_chargeDeclined"
        ).pk
    )
    drain_outbox()
    message = OutboxMessage.objects.get(topic="purchase.confirmed", saga_id=saga.pk)
    InboxEntry.objects.filter(message=message).delete()
    OutboxMessage.objects.filter(pk=message.pk).update(completed_at=None)

    message_deliver(message_id=message.pk)

    ids = [m.extra_headers["Message-ID"] for m in mail.outbox]
    assert len(ids) == 3
    mine = [m.message()["Message-ID"] for m in mail.outbox if saga.reservation.ref in m.subject]
    assert mine == [f"<confirmed.{saga.pk}@boxoffice.local>"] * 2
    assert len(set(ids)) == 2 and f"<failed.{other.pk}@boxoffice.local>" in ids


@pytest.mark.django_db
def test_a_declined_purchase_is_compensated(alice, event, gateway):
    saga = start_purchase(alice, event, seats=["A1"], payment_method="pm_card_chargeDeclined")

    saga = saga_charge(saga_id=saga.pk)
    drain_outbox()

    assert saga.state == "COMPENSATED"
    assert list(saga.history.values_list("to_state", flat=True)) == [
        "PENDING",
        "CHARGING",
        "PAYMENT_FAILED",
        "COMPENSATING",
        "COMPENSATED",
    ]
    assert FakeCharge.objects.filter(intent_id=saga.intent_id).count() == 0
    assert LedgerEntry.objects.filter(intent_id=saga.intent_id).count() == 0
    assert _seat_status(event, "A1") == "available"
    assert Reservation.objects.get(pk=saga.reservation_id).status == "CANCELLED"
    assert OutboxMessage.objects.filter(topic="purchase.cancelled").count() == 1
    assert OutboxMessage.objects.get(key=f"hold:{saga.pk}").cancelled_at is not None
    assert len(mail.outbox) == 1 and "did not go through" in mail.outbox[0].subject


@pytest.mark.django_db
def test_compensating_twice_changes_nothing_the_second_time(alice, event, gateway):
    saga = saga_charge(
        saga_id=start_purchase(alice, event, payment_method="pm_card_chargeDeclined").pk
    )
    history = list(saga.history.values_list("id", flat=True))

    again = saga_compensate(saga_id=saga.pk)

    assert again.state == "COMPENSATED" and again.version == saga.version
    assert list(again.history.values_list("id", flat=True)) == history
    assert OutboxMessage.objects.filter(topic="purchase.cancelled").count() == 1


@pytest.mark.django_db
def test_the_charge_task_delivered_twice_charges_once(alice, event, gateway):
    saga = start_purchase(alice, event)

    first = saga_charge(saga_id=saga.pk)
    second = saga_charge(saga_id=saga.pk)

    assert first.state == second.state == "CONFIRMED"
    assert len(_charge_calls(gateway)) == 1
    assert LedgerEntry.objects.filter(intent_id=saga.intent_id).count() == 1


@pytest.mark.django_db
def test_a_seat_freed_by_compensation_can_be_bought_again(alice, bob, event, gateway):
    saga_charge(saga_id=start_purchase(alice, event, payment_method="pm_card_chargeDeclined").pk)

    again = saga_charge(saga_id=start_purchase(bob, event).pk)

    assert again.state == "CONFIRMED"
    assert _seat_status(event, "A1") == "sold"


@pytest.mark.django_db
def test_the_gateway_refuses_to_be_called_inside_a_transaction(alice, event, gateway):
    saga = start_purchase(alice, event)
    request = ChargeRequest(
        intent_id=saga.intent_id, amount=1, currency="EUR", payment_method="pm_card_visa"
    )

    with pytest.raises(NetworkCallInTransaction), transaction.atomic():
        gateway.charge(request)

    assert FakeCharge.objects.count() == 0
