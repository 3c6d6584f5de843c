"""What a buyer reads in ``GET /api/purchases/{id}/`` history (docs/api.md,
"Purchases"): one sentence written for the buyer per move, derived from the
move itself; operators' notes, their names and internal diagnostics stay in
the admin, which keeps the full history. Money given back to a confirmed
purchase is no move (docs/refunds.md, "The rows"): the history stays the
purchase's, and each refund is told in ``refunds`` by the sentence written
for its buyer, never the seller's or the operator's reason."""

from __future__ import annotations

import contextlib
import json

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from freezegun import freeze_time

from purchases.models import PurchaseSaga, Refund
from purchases.ops.runbook import Action, ActionRefused, action_run
from purchases.saga.states import TRANSITIONS, SagaState
from purchases.services import (
    organizer_refund,
    saga_charge,
    saga_compensate,
    saga_drive,
    saga_expire_hold,
    saga_transition,
)

from .conftest import drain_outbox, start_purchase
from .factories import UserFactory
from .late_charge import charged_while_undone

pytestmark = pytest.mark.django_db

NOTE = "Called the bank, ref 4711"
OPERATOR = "carol"
# The organizer's own reason for a refund: the seller's, never the buyer's to read.
SELLER_REASON = "Pillar in front, complaint 8823"
# Nothing of the operator, their note, the seller's reason or the system's
# internals in the body.
FORBIDDEN = (
    "4711",
    "called the bank",
    "carol",
    "operator",
    "resumer",
    "system",
    "pillar",
    "8823",
)

STARTED = "Purchase received; your seats are held while we take the payment"
CHARGING = "We are taking the payment"
BOOKED = "Payment received; your seats are booked"
DECLINED = "Your payment was declined"
CONFIRMING = "We are confirming the payment with the bank"
CANCELLING = "We are cancelling the purchase and releasing your seats"
REFUNDED = "Your payment was refunded and the purchase cancelled"
NOT_CHARGED = "Purchase cancelled; nothing was charged"
# The buyer's sentences of refund rows (purchases/refunds/requests.py).
BY_CUSTOMER_SERVICE = "Our customer service refunded your purchase."
BY_THE_ORGANIZER = "The organizer refunded A2."


def detail(client, saga) -> dict:
    response = client.get(f"/api/purchases/{saga.pk}/")
    assert response.status_code == 200, response.content
    return response.json()


def _state(saga) -> str:
    return PurchaseSaga.objects.get(pk=saga.pk).state


# --- sagas where each runbook action is allowed, with the gateway agreeing -----------


def _unknown(alice, event, gw, payment_method="pm_card_timeout_charged"):
    saga = saga_charge(saga_id=start_purchase(alice, event, payment_method=payment_method).pk)
    assert saga.state == "UNKNOWN"
    return saga


def _reconcile_unknown(alice, event, gw):
    return _unknown(alice, event, gw)


def _resume_pending(alice, event, gw):
    return start_purchase(alice, event)


def _confirm_unknown_expired(alice, event, gw):
    # the charge really landed at the gateway; only its answer was lost
    saga = _unknown(alice, event, gw)
    return saga_transition(
        saga_id=saga.pk, to=SagaState.UNKNOWN_EXPIRED, reason="schedule exhausted"
    )


def _refund_pending(alice, event, gw):
    # A confirmed purchase never moves again: the compensation that owes a
    # refund is that of a charge that landed while the purchase was undone.
    saga = charged_while_undone(alice, event)
    gw.down("refund", times=1)
    saga = saga_compensate(saga_id=saga.pk)
    assert saga.state == "COMPENSATION_PENDING"
    return saga


def _confirm_compensation_pending(alice, event, gw):
    # the refund really landed at the gateway; only its answer was lost
    saga = _refund_pending(alice, event, gw)
    gw.refund(saga.gateway_ref, idempotency_key=f"refund:{saga.intent_id}")
    return saga


def _compensate_unknown_expired(alice, event, gw):
    # never charged: the gateway dropped the only charge call
    saga = _unknown(alice, event, gw, payment_method="pm_card_timeout_not_charged")
    return saga_transition(
        saga_id=saga.pk, to=SagaState.UNKNOWN_EXPIRED, reason="schedule exhausted"
    )


def _compensate_compensation_pending(alice, event, gw):
    return _refund_pending(alice, event, gw)


def _refund_confirmed(alice, event, gw):
    return saga_charge(saga_id=start_purchase(alice, event).pk)


ACTIONS = [
    (Action.RECONCILE_NOW, _reconcile_unknown),
    (Action.RESUME_NOW, _resume_pending),
    (Action.CONFIRM_MANUAL, _confirm_unknown_expired),
    (Action.CONFIRM_MANUAL, _confirm_compensation_pending),
    (Action.COMPENSATE_MANUAL, _compensate_unknown_expired),
    (Action.COMPENSATE_MANUAL, _compensate_compensation_pending),
    (Action.REFUND, _refund_confirmed),
]


@pytest.mark.parametrize(
    ("action", "given"),
    ACTIONS,
    ids=[f"{a.value}-from-{g.__name__.split('_', 2)[-1]}" for a, g in ACTIONS],
)
def test_no_operator_note_or_name_reaches_the_buyer_after_a_runbook_action(
    alice, alice_api, event, faulty_gateway, action, given
):
    # given
    saga = given(alice, event, faulty_gateway)

    # when: the operator acts with a note (a refusal by the gateway check is
    # fine here: the note is on the record either way), and what the action
    # left to do is done (a refund's row is asked of the processor)
    with contextlib.suppress(ActionRefused):
        action_run(saga_id=saga.pk, action=action, operator=OPERATOR, reason=NOTE)
    drain_outbox()
    body = json.dumps(detail(alice_api, saga)).lower()

    # then
    assert [word for word in FORBIDDEN if word in body] == []


def test_a_move_by_the_resumer_does_not_say_who_made_it(alice, alice_api, event, gateway):
    saga = start_purchase(alice, event)

    assert saga_drive(saga_id=saga.pk).state == "CONFIRMED"

    body = json.dumps(detail(alice_api, saga)).lower()
    assert [word for word in FORBIDDEN if word in body] == []
    assert all(
        set(entry) == {"from", "to", "at", "reason", "times"}
        for entry in json.loads(body)["history"]
    )


# --- the history is made of buyer sentences -------------------------------------------


def _moves(data) -> list[tuple]:
    return [(h["from"], h["to"], h["reason"]) for h in data["history"]]


def test_a_visa_purchase_reads_as_buyer_sentences_without_notes(alice, alice_api, event, gateway):
    # given: confirmed, then a late hold expiry that is refused (a note)
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    saga_expire_hold(saga_id=saga.pk)

    # when
    data = detail(alice_api, saga)

    # then
    assert _moves(data) == [
        (None, "PENDING", STARTED),
        ("PENDING", "CHARGING", CHARGING),
        ("CHARGING", "CONFIRMED", BOOKED),
    ]


def test_a_declined_purchase_reads_as_buyer_sentences(alice, alice_api, event, gateway):
    saga = saga_charge(
        saga_id=start_purchase(alice, event, payment_method="pm_card_chargeDeclined").pk
    )
    assert saga.state == "COMPENSATED"

    data = detail(alice_api, saga)

    assert _moves(data) == [
        (None, "PENDING", STARTED),
        ("PENDING", "CHARGING", CHARGING),
        ("CHARGING", "PAYMENT_FAILED", DECLINED),
        ("PAYMENT_FAILED", "COMPENSATING", CANCELLING),
        ("COMPENSATING", "COMPENSATED", NOT_CHARGED),
    ]


def test_a_timeout_then_reconciled_purchase_reads_as_buyer_sentences(
    alice, alice_api, event, gateway, settings
):
    # given: the charge's answer is lost; the first reconcile probe finds it
    settings.PURCHASE_HOLD_SECONDS = 4 * 3600
    settings.RECONCILE_BACKOFF_SECONDS = [60, 120, 240]
    with freeze_time("2026-12-02 12:00:00") as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
        assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"
        clock.tick(60)
        drain_outbox()
    assert _state(saga) == "CONFIRMED"

    # when
    data = detail(alice_api, saga)

    # then
    assert _moves(data) == [
        (None, "PENDING", STARTED),
        ("PENDING", "CHARGING", CHARGING),
        ("CHARGING", "UNKNOWN", CONFIRMING),
        ("UNKNOWN", "CONFIRMED", BOOKED),
    ]


def _refunds(data) -> list[tuple]:
    return [
        (r["amount"], r["currency"], r["status"], r["seats"], r["reason"]) for r in data["refunds"]
    ]


def _organizer_refunds_a2(saga, event) -> None:
    """The organizer's finance refunds A2 and puts it back on sale (its
    reason the seller's); the processor settles it."""
    organizer_refund(
        organizer=event.organizer,
        saga_id=saga.pk,
        user=UserFactory(),
        reason=SELLER_REASON,
        seats=["A2"],
        release_seats=True,
    )
    drain_outbox()


def _refunded_twice(alice, event) -> PurchaseSaga:
    """A1 and A2 bought (2500 each); the organizer refunds A2 and puts it
    back on sale (its reason the seller's), then customer service refunds
    the rest (its note the operator's), each settled by the processor."""
    saga = saga_charge(saga_id=start_purchase(alice, event, seats=["A1", "A2"]).pk)
    _organizer_refunds_a2(saga, event)
    action_run(saga_id=saga.pk, action=Action.REFUND, operator=OPERATOR, reason=NOTE)
    drain_outbox()
    return saga


def test_a_refunded_purchase_keeps_its_history_and_tells_each_refund_in_buyer_sentences(
    alice, alice_api, event, gateway
):
    # given: part refunded by the organizer
    saga = saga_charge(saga_id=start_purchase(alice, event, seats=["A1", "A2"]).pk)
    _organizer_refunds_a2(saga, event)
    partly = detail(alice_api, saga)
    # then the rest by customer service
    action_run(saga_id=saga.pk, action=Action.REFUND, operator=OPERATOR, reason=NOTE)
    drain_outbox()

    # when
    data = detail(alice_api, saga)

    # then: a refund is a row, never a move: the history is the purchase's
    assert _state(saga) == "CONFIRMED"
    booked = [
        (None, "PENDING", STARTED),
        ("PENDING", "CHARGING", CHARGING),
        ("CHARGING", "CONFIRMED", BOOKED),
    ]
    assert _moves(partly) == _moves(data) == booked
    assert all(h["from"] != h["to"] for h in data["history"])
    # each refund, oldest first, in the sentence written for the buyer
    assert _refunds(partly) == [(2500, "EUR", "succeeded", ["A2"], BY_THE_ORGANIZER)]
    assert _refunds(data) == [
        (2500, "EUR", "succeeded", ["A2"], BY_THE_ORGANIZER),
        (2500, "EUR", "succeeded", ["A1"], BY_CUSTOMER_SERVICE),
    ]
    assert (partly["payment"]["status"], partly["refunded"]["amount"]) == (
        "partially_refunded",
        2500,
    )
    assert (data["payment"]["status"], data["refunded"]["amount"]) == ("refunded", 5000)
    # the seller's reason and the operator's note are on the rows, not in the answer
    reasons = list(Refund.objects.filter(saga_id=saga.pk).values_list("reason", flat=True))
    assert any(SELLER_REASON in r for r in reasons) and any(NOTE in r for r in reasons)
    for answer in (partly, data):
        assert [word for word in FORBIDDEN if word in json.dumps(answer).lower()] == []


def test_a_purchase_undone_after_a_late_charge_reads_as_refunded(alice, alice_api, event, gateway):
    # given: the one compensation that refunds (a charge that landed on a
    # purchase that did not confirm)
    saga = charged_while_undone(alice, event)
    assert saga_compensate(saga_id=saga.pk).state == "COMPENSATED"

    # when
    data = detail(alice_api, saga)

    # then: the ledger's refund decides the last sentence; no refund row
    assert _moves(data) == [
        (None, "PENDING", STARTED),
        ("PENDING", "CHARGING", CHARGING),
        ("CHARGING", "PAYMENT_FAILED", DECLINED),
        ("PAYMENT_FAILED", "COMPENSATING", CANCELLING),
        ("COMPENSATING", "COMPENSATED", REFUNDED),
    ]
    assert data["payment"]["status"] == "refunded"
    assert data["refunded"] == {"amount": 2500, "currency": "EUR"}
    assert data["refunds"] == []


# --- the table is total ---------------------------------------------------------------


def test_every_move_the_table_allows_has_a_buyer_sentence():
    from purchases.buyer_history import SENTENCES, ByRefund, buyer_sentence

    moves = [(None, SagaState.PENDING)] + [
        (source, target) for source, targets in TRANSITIONS.items() for target in targets
    ]
    missing = [move for move in moves if move not in SENTENCES]
    assert missing == []
    for source, target in moves:
        for refunded in (False, True):
            sentence = buyer_sentence(source, target, refunded=refunded)
            assert sentence and sentence[0].isupper(), (source, target)
            assert not any(word in sentence.lower() for word in FORBIDDEN), sentence
    # only the end of a compensation depends on the money, and it tells both;
    # a confirmed purchase's refund is no move, so it has no sentence here
    assert {move for move, s in SENTENCES.items() if isinstance(s, ByRefund)} == {
        (SagaState.COMPENSATING, SagaState.COMPENSATED),
        (SagaState.COMPENSATION_PENDING, SagaState.COMPENSATED),
    }
    assert set(SENTENCES) == set(moves)  # nothing dead in the table


def test_the_buyer_history_reads_the_same_without_the_selectors_prefetch(alice, event, gateway):
    from purchases.buyer_history import buyer_history
    from purchases.selectors import purchase_get

    undone = charged_while_undone(alice, event, seats=["A1"])
    saga_compensate(saga_id=undone.pk)  # refunded: the ledger decides the sentence
    declined = saga_charge(
        saga_id=start_purchase(
            alice, event, seats=["A2"], payment_method="pm_card_chargeDeclined"
        ).pk
    )  # nothing charged
    refunded = _refunded_twice(alice, event)  # refund rows, no move

    told = {}
    for saga in (undone, declined, refunded):
        plain = buyer_history(PurchaseSaga.objects.get(pk=saga.pk))
        mine = purchase_get(user=alice, saga_id=saga.pk)
        assert mine is not None
        assert plain == buyer_history(mine)
        told[saga.pk] = [m.reason for m in plain]

    assert told[undone.pk][-2:] == [CANCELLING, REFUNDED]
    assert told[declined.pk][-2:] == [CANCELLING, NOT_CHARGED]
    assert told[refunded.pk] == [STARTED, CHARGING, BOOKED]


# --- the detail stays cheap, the schema says what is served --------------------------


def test_the_detail_costs_as_many_queries_whatever_the_history_and_the_refunds(
    alice, alice_api, event, gateway
):
    # given: a new purchase; one undone after a late charge (five moves);
    # one refunded twice (two refund rows), with notes
    fresh = start_purchase(alice, event, seats=["A3"])
    undone = charged_while_undone(alice, event, seats=["A4"])
    saga_compensate(saga_id=undone.pk)
    busy = _refunded_twice(alice, event)
    saga_expire_hold(saga_id=busy.pk)  # refused: a note

    detail(alice_api, fresh)  # the token is read once, then remembered

    # when
    with CaptureQueriesContext(connection) as one:
        assert detail(alice_api, fresh)["refunds"] == []
    with CaptureQueriesContext(connection) as moves:
        assert len(detail(alice_api, undone)["history"]) == 5
    with CaptureQueriesContext(connection) as refunds:
        assert len(detail(alice_api, busy)["refunds"]) == 2

    # then
    assert len(moves) == len(refunds) == len(one)


def test_the_schema_describes_the_history_entry_served(anon_api):
    schema = json.loads(anon_api.get("/api/schema/", {"format": "json"}).content)

    detail_schema = schema["components"]["schemas"]["PurchaseDetail"]["properties"]
    ref = detail_schema["history"]["items"]["$ref"].rsplit("/", 1)[-1]
    entry = schema["components"]["schemas"][ref]
    assert set(entry["properties"]) == {"from", "to", "at", "reason", "times"}
    assert set(entry["required"]) == {"from", "to", "at", "reason", "times"}
    assert entry["properties"]["times"]["type"] == "integer"
    assert entry["properties"]["times"]["minimum"] == 1


# --- the admin keeps everything -------------------------------------------------------


def test_the_admin_saga_page_still_shows_the_operators_note_and_name(client, alice, event, gateway):
    # given
    staff = UserFactory(username="dave", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="purchases", codename="view_purchasesaga"
        )
    )
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    action_run(saga_id=saga.pk, action=Action.REFUND, operator=OPERATOR, reason=NOTE)
    drain_outbox()
    client.force_login(staff)

    # when
    response = client.get(f"/admin/purchases/purchasesaga/{saga.pk}/change/")

    # then
    assert response.status_code == 200
    html = response.content.decode()
    assert NOTE in html and f"(by {OPERATOR})" in html
    notes = [h for h in response.context["history"] if h.from_state == h.to_state]
    # the action's note, then the refund it opened (the saga does not move)
    assert [(h.actor, h.actor_name) for h in notes] == [("operator", OPERATOR)] * 2
    assert [NOTE in h.reason for h in notes] == [True, True]
