"""Disputes (docs/stripe.md, "Disputes"; the contract's "Paying with Stripe"):
a ``charge.dispute.*`` event makes the worker read the dispute from Stripe
(with its PaymentIntent, whose metadata names the purchase) and record it:
the row, the ledger when the funds move (``dispute`` negative, then
``dispute_reversal`` if won, each once), one alert, and the organizer's
``purchase.disputed`` webhook.

localstripe has no disputes: Stripe's documented Dispute object is served
by the stub of tests/test_stripe_events.py, which the test scripts; events
are signed as Stripe signs them. The sagas are confirmed by the in-process
fake gateway, then given a Stripe PaymentIntent id (what the Stripe adapter
records), since only the dispute's path is under test here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.test import Client

from ledger.models import EntryKind, LedgerEntry
from outbox.models import OutboxMessage
from purchases.disputes import DisputeFacts, dispute_record
from purchases.models import Dispute, PurchaseSaga
from purchases.ops.audit.run import audit_run
from purchases.ops.verdict import saga_verdict
from purchases.services import saga_charge
from stripe_events.models import StripeEvent
from webhooks.models import WebhookDelivery
from webhooks.services import webhook_endpoint_create

from .conftest import drain_outbox, race, start_purchase
from .test_stripe_events import (
    StripeStub,
    event_object,
    payment_intent_object,
    post_event,
    stripe_stub,
    use_webhook_secret,
)
from .webhook_receiver import Receiver

PI = "pi_3QpLbE2eZvKYlo2C0xYzAbCd"
DP = "dp_1QpMcF2eZvKYlo2CqRsTuVwX"
CH = "ch_3QpLbE2eZvKYlo2C1aB2cD3e"
STRIPE_TOPIC = "stripe.event"


def balance_transaction(amount: int, *, fee: int = 0) -> dict:
    """Stripe's BalanceTransaction as a dispute lists it: a withdrawal
    (negative, with the dispute fee) or a reinstatement (positive)."""
    withdrawal = amount < 0
    return {
        "id": f"txn_{'w' if withdrawal else 'r'}1QpMcF2eZvKYlo2C",
        "object": "balance_transaction",
        "amount": amount,
        "available_on": int(time.time()),
        "created": int(time.time()),
        "currency": "eur",
        "description": f"Chargeback {'withdrawal' if withdrawal else 'reversal'} for {CH}",
        "exchange_rate": None,
        "fee": fee,
        "fee_details": [
            {"amount": fee, "currency": "eur", "description": "Dispute fee", "type": "stripe_fee"}
        ]
        if fee
        else [],
        "net": amount - fee,
        "reporting_category": "dispute" if withdrawal else "dispute_reversal",
        "source": DP,
        "status": "available",
        "type": "adjustment",
    }


def dispute_object(
    saga: PurchaseSaga | None,
    *,
    status: str = "needs_response",
    moves: tuple[int, ...] = (-2500,),
    amount: int = 2500,
    reason: str = "fraudulent",
    expanded: bool = True,
) -> dict:
    """Stripe's Dispute object, its PaymentIntent expanded as we ask for it."""
    intent = payment_intent_object(
        PI, purchase_id=str(saga.pk) if saga else "", intent_id=saga.intent_id if saga else ""
    )
    return {
        "id": DP,
        "object": "dispute",
        "amount": amount,
        "balance_transactions": [balance_transaction(m, fee=1500 if m < 0 else 0) for m in moves],
        "charge": CH,
        "created": int(time.time()),
        "currency": "eur",
        "enhanced_eligibility_types": [],
        "evidence": {
            "access_activity_log": None,
            "billing_address": None,
            "customer_email_address": None,
            "product_description": None,
            "receipt": None,
            "uncategorized_text": None,
        },
        "evidence_details": {
            "due_by": int(time.time()) + 14 * 86400,
            "has_evidence": False,
            "past_due": False,
            "submission_count": 0,
        },
        "is_charge_refundable": False,
        "livemode": False,
        "metadata": {},
        "network_reason_code": "10.4",
        "payment_intent": intent if expanded else PI,
        "payment_method_details": {
            "card": {"brand": "visa", "network_reason_code": "10.4"},
            "type": "card",
        },
        "reason": reason,
        "status": status,
    }


@pytest.fixture(autouse=True)
def _webhook_secret(settings):
    use_webhook_secret(settings)


@pytest.fixture
def stripe_api(settings) -> Iterator[StripeStub]:
    with stripe_stub(settings) as stub:
        yield stub


@pytest.fixture
def receiver(settings):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def endpoint(receiver):
    return webhook_endpoint_create(
        url=receiver.url("/hook"),
        events=["purchase.disputed", "purchase.needs_attention"],
        description="the seller's system",
    )


@pytest.fixture
def confirmed(alice, event, gateway) -> PurchaseSaga:
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    assert saga.state == "CONFIRMED"
    PurchaseSaga.objects.filter(pk=saga.pk).update(processor="stripe", processor_ref=PI)
    saga.refresh_from_db()
    return saga


def _send(type_: str, obj: dict, *, evt: str | None = None) -> dict:
    stripe_event = event_object(type_, obj, evt=evt)
    assert post_event(Client(), stripe_event).status_code == 200
    return stripe_event


def _entries(saga) -> list[tuple[str, int, str]]:
    return list(
        LedgerEntry.objects.filter(saga_id=saga.pk)
        .order_by("id")
        .values_list("kind", "amount", "gateway_reference")
    )


def _alerts(saga) -> list[OutboxMessage]:
    return list(OutboxMessage.objects.filter(saga_id=saga.pk, topic="purchase.needs_operator"))


# --- the story ------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_dispute_is_recorded_from_stripes_read_withdrawn_in_the_ledger_alerted_and_announced(
    confirmed, stripe_api, endpoint, receiver
):
    # given: the event's body says "warning_needs_response" and no money moved;
    # Stripe, asked, says the funds are withdrawn
    stripe_api.objects[f"/v1/disputes/{DP}"] = dispute_object(confirmed)
    stale_body = dispute_object(None, status="warning_needs_response", moves=(), expanded=False)

    # when
    _send("charge.dispute.created", stale_body)
    drain_outbox()

    # then: the read, not the body, was recorded
    (request,) = stripe_api.requests
    assert request.path == f"/v1/disputes/{DP}"
    assert request.query == {"expand[0]": ["payment_intent"]}  # the library's encoding
    assert request.authorization == "Bearer sk_test_4eC39HqLyjWDarjtT1zdp7dc"
    dispute = Dispute.objects.get()
    assert (dispute.saga_id, dispute.event_id, dispute.processor_ref) == (
        confirmed.pk,
        confirmed.event_id,
        DP,
    )
    assert (dispute.status, dispute.amount, dispute.currency, dispute.reason) == (
        "needs_response",
        2500,
        "EUR",
        "fraudulent",
    )
    assert _entries(confirmed) == [("charge", 2500, _charge_ref(confirmed)), ("dispute", -2500, DP)]
    (alert,) = _alerts(confirmed)
    assert alert.key == f"needs_operator:{confirmed.pk}:dispute:{DP}"
    assert DP in alert.payload["why"] and "fraudulent" in alert.payload["why"]
    confirmed.refresh_from_db()
    assert confirmed.state == "CONFIRMED"  # the saga does not move
    # the organizer is told, once, with the dispute in the purchase
    disputed = [r for r in receiver.requests if r.json["type"] == "purchase.disputed"]
    (sent,) = disputed
    body = sent.verify(endpoint.secret)
    assert body["data"]["purchase"]["id"] == str(confirmed.pk)
    assert body["data"]["purchase"]["status"] == "CONFIRMED"
    assert body["data"]["purchase"]["dispute"] == {
        "status": "needs_response",
        "amount": {"amount": 2500, "currency": "EUR"},
        "reason": "fraudulent",
    }
    row = StripeEvent.objects.get()
    assert (
        row.outcome
        == f"dispute {DP} needs_response on purchase {confirmed.pk} (opened); ledger dispute"
    )


def _charge_ref(saga) -> str:
    return LedgerEntry.objects.get(saga_id=saga.pk, kind=EntryKind.CHARGE).gateway_reference


@pytest.mark.django_db
def test_a_dispute_won_is_reversed_once_and_alerted_and_announced_once(
    confirmed, stripe_api, endpoint
):
    stripe_api.objects[f"/v1/disputes/{DP}"] = dispute_object(confirmed)
    _send("charge.dispute.created", dispute_object(None, expanded=False))
    drain_outbox()

    # when: won; Stripe's dispute now lists both balance transactions
    stripe_api.objects[f"/v1/disputes/{DP}"] = dispute_object(
        confirmed, status="won", moves=(-2500, 2500)
    )
    _send("charge.dispute.closed", dispute_object(None, status="won", expanded=False))
    drain_outbox()

    # then
    assert Dispute.objects.get().status == "won"
    assert _entries(confirmed)[1:] == [("dispute", -2500, DP), ("dispute_reversal", 2500, DP)]
    assert sum(e[1] for e in _entries(confirmed)) == confirmed.amount
    assert len(_alerts(confirmed)) == 1
    assert (
        WebhookDelivery.objects.filter(saga_id=confirmed.pk, event_type="purchase.disputed").count()
        == 1
    )
    assert StripeEvent.objects.filter(acted_at__isnull=False).count() == 2


@pytest.mark.django_db
def test_a_dispute_lost_without_a_withdrawal_seen_before_is_withdrawn_at_its_close(
    confirmed, stripe_api
):
    # given: when it opened, Stripe had not withdrawn anything yet
    stripe_api.objects[f"/v1/disputes/{DP}"] = dispute_object(confirmed, moves=())
    _send("charge.dispute.created", dispute_object(None, expanded=False))
    drain_outbox()
    assert [e[0] for e in _entries(confirmed)] == ["charge"]

    # when
    stripe_api.objects[f"/v1/disputes/{DP}"] = dispute_object(
        confirmed, status="lost", moves=(-2500,)
    )
    _send("charge.dispute.closed", dispute_object(None, status="lost", expanded=False))
    drain_outbox()

    # then
    assert _entries(confirmed)[1:] == [("dispute", -2500, DP)]
    assert Dispute.objects.get().status == "lost"


@pytest.mark.django_db
def test_an_inquiry_is_recorded_and_alerted_but_moves_no_money(confirmed, stripe_api):
    stripe_api.objects[f"/v1/disputes/{DP}"] = dispute_object(
        confirmed, status="warning_needs_response", moves=(), reason="product_not_received"
    )

    _send("charge.dispute.created", dispute_object(None, expanded=False))
    drain_outbox()

    assert Dispute.objects.get().status == "warning_needs_response"
    assert [e[0] for e in _entries(confirmed)] == ["charge"]
    assert len(_alerts(confirmed)) == 1


@pytest.mark.django_db
def test_a_partial_dispute_withdraws_its_own_amount(confirmed, stripe_api):
    stripe_api.objects[f"/v1/disputes/{DP}"] = dispute_object(
        confirmed, amount=1000, moves=(-1000,)
    )

    _send("charge.dispute.created", dispute_object(None, expanded=False))
    drain_outbox()

    assert _entries(confirmed)[1:] == [("dispute", -1000, DP)]


# --- replays and retries --------------------------------------------------------------


@pytest.mark.django_db
def test_the_same_dispute_event_replayed_is_read_and_recorded_once(confirmed, stripe_api):
    stripe_api.objects[f"/v1/disputes/{DP}"] = dispute_object(confirmed)
    body = dispute_object(None, expanded=False)

    _send("charge.dispute.created", body, evt="evt_1QpMcG2eZvKYlo2CdEfGhIjK")
    drain_outbox()
    _send("charge.dispute.created", body, evt="evt_1QpMcG2eZvKYlo2CdEfGhIjK")
    drain_outbox()

    assert len(stripe_api.requests) == 1
    assert StripeEvent.objects.count() == 1
    assert [e[0] for e in _entries(confirmed)] == ["charge", "dispute"]


@pytest.mark.django_db
def test_two_events_of_the_same_dispute_write_its_money_and_alert_once(confirmed, stripe_api):
    """Events of one dispute with the same state behind them (Stripe sent
    created twice under two ids, or a closed one is read before its own
    event arrives): each is read, the second writes nothing."""
    stripe_api.objects[f"/v1/disputes/{DP}"] = dispute_object(confirmed)

    _send("charge.dispute.created", dispute_object(None, expanded=False))
    _send("charge.dispute.created", dispute_object(None, expanded=False))
    drain_outbox()

    assert len(stripe_api.requests) == 2
    assert Dispute.objects.count() == 1
    assert [e[0] for e in _entries(confirmed)] == ["charge", "dispute"]
    assert len(_alerts(confirmed)) == 1


@pytest.mark.django_db
def test_an_unanswered_read_is_retried_by_the_outbox_and_records_nothing_meanwhile(
    confirmed, stripe_api
):
    stripe_api.objects[f"/v1/disputes/{DP}"] = dispute_object(confirmed)
    stripe_api.failures = [500]

    # when: Stripe answers 500 (one pass of the relay: the delivery fails)
    _send("charge.dispute.created", dispute_object(None, expanded=False))
    drain_outbox(max_rounds=1)

    # then: nothing recorded, the obligation still owed, and why
    assert Dispute.objects.count() == 0
    owed = OutboxMessage.objects.get(topic=STRIPE_TOPIC)
    assert owed.completed_at is None
    assert "StripeUnanswered" in owed.last_error and "500" in owed.last_error
    assert StripeEvent.objects.get().acted_at is None

    # when: it is handed over again
    drain_outbox()

    # then
    assert len(stripe_api.requests) == 2
    assert Dispute.objects.get().status == "needs_response"
    assert [e[0] for e in _entries(confirmed)] == ["charge", "dispute"]
    assert OutboxMessage.objects.get(topic=STRIPE_TOPIC).completed_at is not None


@pytest.mark.django_db
def test_a_dispute_stripe_does_not_have_or_not_on_our_purchase_records_nothing(
    confirmed, stripe_api
):
    # A dispute of a PaymentIntent that is not ours (no purchase_id, an unknown pi_…).
    foreign = dispute_object(None)
    foreign["id"] = "dp_someone_elses"
    foreign["payment_intent"]["id"] = "pi_someone_elses"
    stripe_api.objects["/v1/disputes/dp_someone_elses"] = foreign

    _send("charge.dispute.created", {**dispute_object(None, expanded=False), "id": "dp_missing"})
    _send(
        "charge.dispute.created", {**dispute_object(None, expanded=False), "id": "dp_someone_elses"}
    )
    drain_outbox()

    assert Dispute.objects.count() == 0
    assert [e[0] for e in _entries(confirmed)] == ["charge"]
    outcomes = set(StripeEvent.objects.values_list("outcome", flat=True))
    assert outcomes == {
        "no dispute dp_missing at Stripe",
        "dispute dp_someone_elses: no purchase for pi_someone_elses",
    }


# --- the service ------------------------------------------------------------------------


def _facts(status: str, *, withdrawn: bool = True, reinstated: bool = False) -> DisputeFacts:
    return DisputeFacts(
        processor_ref=DP,
        status=status,
        amount=2500,
        currency="EUR",
        reason="fraudulent",
        funds_withdrawn=withdrawn,
        funds_reinstated=reinstated,
    )


@pytest.mark.django_db
def test_an_older_read_committed_last_does_not_reopen_a_closed_dispute(confirmed):
    # Two consumers read the dispute at different moments; the older read commits last.
    dispute_record(saga_id=confirmed.pk, facts=_facts("won", reinstated=True), why="newer read")
    recorded = dispute_record(saga_id=confirmed.pk, facts=_facts("under_review"), why="older read")

    assert recorded.dispute.status == "won"
    assert not recorded.status_changed and recorded.entries == ()
    assert Dispute.objects.get().status == "won"
    assert [e[0] for e in _entries(confirmed)] == ["charge", "dispute", "dispute_reversal"]


@pytest.mark.django_db
def test_no_reversal_without_its_withdrawal(confirmed):
    # Won, and Stripe never withdrew anything (nothing to give back).
    recorded = dispute_record(
        saga_id=confirmed.pk, facts=_facts("won", withdrawn=False, reinstated=True), why="test"
    )

    assert recorded.entries == ()
    assert [e[0] for e in _entries(confirmed)] == ["charge"]


@pytest.mark.django_db
def test_a_status_change_is_recorded_in_place(confirmed):
    dispute_record(saga_id=confirmed.pk, facts=_facts("needs_response"), why="created")
    recorded = dispute_record(saga_id=confirmed.pk, facts=_facts("under_review"), why="updated")

    assert recorded.status_changed and not recorded.created
    assert Dispute.objects.get().status == "under_review"
    assert len(_alerts(confirmed)) == 1


@pytest.mark.django_db(transaction=True)
def test_consumers_of_one_dispute_racing_write_it_once(confirmed):
    """Four workers record the same dispute at once, on their own
    connections: the saga's lock queues them, so there is one row, one
    withdrawal, one alert, and none of them fails on a constraint."""
    results = race(
        4,
        lambda i: dispute_record(
            saga_id=confirmed.pk, facts=_facts("needs_response"), why=f"worker {i}"
        ),
    )

    assert not [r for r in results if isinstance(r, Exception)]
    assert sorted(r.created for r in results) == [False, False, False, True]
    assert Dispute.objects.count() == 1
    assert [e[0] for e in _entries(confirmed)] == ["charge", "dispute"]
    assert len(_alerts(confirmed)) == 1


# --- where it shows: the purchase's answer, the admin's verdict -----------------------


@pytest.mark.django_db
def test_the_purchase_answer_shows_its_dispute_or_null(confirmed, alice_api):
    url = f"/api/purchases/{confirmed.pk}/"
    assert alice_api.get(url).json()["dispute"] is None

    dispute_record(saga_id=confirmed.pk, facts=_facts("needs_response"), why="test")

    assert alice_api.get(url).json()["dispute"] == {
        "status": "needs_response",
        "amount": {"amount": 2500, "currency": "EUR"},
        "reason": "fraudulent",
    }


@pytest.mark.django_db
def test_the_admin_verdict_names_the_dispute(confirmed):
    dispute_record(saga_id=confirmed.pk, facts=_facts("lost"), why="test")

    verdict = saga_verdict(confirmed)

    assert verdict.headline.endswith("; DISPUTED (lost, 25.00 EUR)")
    assert any(
        line.startswith(f"dispute {DP} opened ") and "lost" in line for line in verdict.details
    )
    assert any("dispute -25.00 EUR" in line for line in verdict.details)  # the ledger line


@pytest.mark.django_db
def test_the_auditor_takes_a_disputed_purchase_as_it_is(alice, event, gateway):
    """A dispute's entries are the bank's money, not the processor's capture:
    the charge stays captured at the gateway (the fake's, asked by the
    auditor), the seats stay sold."""
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    dispute_record(saga_id=saga.pk, facts=_facts("lost"), why="test")

    assert audit_run().violations == []


@pytest.mark.django_db
def test_a_lost_dispute_revokes_the_purchases_tickets_once(confirmed):
    """The bank took the money back: the seats stay sold, but no ticket of
    the purchase lets anyone in any more (docs/door.md, "Revocations"), and a
    second record of the same loss writes nothing more."""
    from door.keys import ticket_code  # test-local: only this test reads codes
    from door.models import TicketRevocation
    from door.services import checkin
    from purchases.models import ReservationSeat

    link = ReservationSeat.objects.get(reservation_id=confirmed.reservation_id)
    code = ticket_code(
        event_id=confirmed.event_id, seat_id=link.seat_id, ticket_id=link.pk, ticket_version=0
    )
    dispute_record(saga_id=confirmed.pk, facts=_facts("needs_response"), why="test")
    assert not TicketRevocation.objects.filter(ticket_id=link.pk).exists()

    dispute_record(saga_id=confirmed.pk, facts=_facts("lost"), why="test")
    dispute_record(saga_id=confirmed.pk, facts=_facts("lost"), why="test again")

    revocations = TicketRevocation.objects.filter(ticket_id=link.pk)
    assert [(r.version, r.reason) for r in revocations] == [(0, "dispute")]
    assert checkin(confirmed.event_id, code, gate="North")["result"] == "revoked"
