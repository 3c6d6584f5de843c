"""What a buyer reads in ``GET /api/purchases/{id}/`` history (docs/api.md,
"Purchases"): one sentence written for the buyer per move, derived from the
move itself; operators' notes, their names and internal diagnostics stay in
the admin, which keeps the full history."""

from __future__ import annotations

import contextlib
import json

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from freezegun import freeze_time

from purchases.models import PurchaseSaga
from purchases.ops.runbook import Action, ActionRefused, action_run
from purchases.saga.states import TRANSITIONS, SagaState
from purchases.services import saga_charge, saga_drive, saga_expire_hold, saga_transition

from .conftest import drain_outbox, start_purchase
from .factories import UserFactory

pytestmark = pytest.mark.django_db

NOTE = "Called the bank, ref 4711"
OPERATOR = "carol"
# Nothing of the operator, their note or the system's internals in the body.
FORBIDDEN = ("4711", "called the bank", "carol", "operator", "resumer", "system")

STARTED = "Purchase received; your seats are held while we take the payment"
CHARGING = "We are taking the payment"
BOOKED = "Payment received; your seats are booked"
DECLINED = "Your payment was declined"
CONFIRMING = "We are confirming the payment with the bank"
CANCELLING = "We are cancelling the purchase and releasing your seats"
REFUNDING = "We are cancelling the purchase and refunding your payment"
REFUNDED = "Your payment was refunded and the purchase cancelled"
NOT_CHARGED = "Purchase cancelled; nothing was charged"


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
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    gw.down("refund", times=1)
    saga = action_run(saga_id=saga.pk, action=Action.REFUND, operator=OPERATOR, reason=NOTE)
    assert saga.state == "COMPENSATION_PENDING"
    return saga


def _confirm_compensation_pending(alice, event, gw):
    # the refund really landed at the gateway; only its answer was lost
    saga = _refund_pending(alice, event, gw)
    gw.refund(saga.intent_id, idempotency_key=f"refund:{saga.intent_id}")
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
    # fine here: the note is on the record either way)
    with contextlib.suppress(ActionRefused):
        action_run(saga_id=saga.pk, action=action, operator=OPERATOR, reason=NOTE)
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


def test_a_refunded_purchase_reads_as_buyer_sentences_without_the_operators_note(
    alice, alice_api, event, gateway
):
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    action_run(saga_id=saga.pk, action=Action.REFUND, operator=OPERATOR, reason=NOTE)
    assert _state(saga) == "COMPENSATED"

    data = detail(alice_api, saga)

    assert _moves(data) == [
        (None, "PENDING", STARTED),
        ("PENDING", "CHARGING", CHARGING),
        ("CHARGING", "CONFIRMED", BOOKED),
        ("CONFIRMED", "COMPENSATING", REFUNDING),
        ("COMPENSATING", "COMPENSATED", REFUNDED),
    ]
    assert data["payment"]["status"] == "refunded"
    assert all(h["from"] != h["to"] for h in data["history"])


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
    # only the end of a compensation depends on the money, and it tells both
    assert {move for move, s in SENTENCES.items() if isinstance(s, ByRefund)} == {
        (SagaState.COMPENSATING, SagaState.COMPENSATED),
        (SagaState.COMPENSATION_PENDING, SagaState.COMPENSATED),
    }
    assert set(SENTENCES) == set(moves)  # nothing dead in the table


def test_the_buyer_history_reads_the_same_without_the_selectors_prefetch(alice, event, gateway):
    from purchases.buyer_history import buyer_history
    from purchases.selectors import purchase_get

    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    action_run(saga_id=saga.pk, action=Action.REFUND, operator=OPERATOR, reason=NOTE)

    plain = buyer_history(PurchaseSaga.objects.get(pk=saga.pk))

    mine = purchase_get(user=alice, saga_id=saga.pk)
    assert mine is not None
    assert plain == buyer_history(mine)
    assert [m.reason for m in plain][-2:] == [REFUNDING, REFUNDED]


# --- the detail stays cheap, the schema says what is served --------------------------


def test_the_detail_costs_as_many_queries_whatever_the_history(alice, alice_api, event, gateway):
    # given: a new purchase, and a refunded one with notes
    fresh = start_purchase(alice, event, seats=["A1"])
    busy = saga_charge(saga_id=start_purchase(alice, event, seats=["A2"]).pk)
    saga_expire_hold(saga_id=busy.pk)
    action_run(saga_id=busy.pk, action=Action.REFUND, operator=OPERATOR, reason=NOTE)

    detail(alice_api, fresh)  # the token is read once, then remembered

    # when
    with CaptureQueriesContext(connection) as one:
        detail(alice_api, fresh)
    with CaptureQueriesContext(connection) as many:
        assert len(detail(alice_api, busy)["history"]) == 5

    # then
    assert len(many) == len(one)


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
    client.force_login(staff)

    # when
    response = client.get(f"/admin/purchases/purchasesaga/{saga.pk}/change/")

    # then
    assert response.status_code == 200
    html = response.content.decode()
    assert NOTE in html and f"(by {OPERATOR})" in html
    notes = [h for h in response.context["history"] if h.from_state == h.to_state]
    assert [(h.actor, h.actor_name) for h in notes] == [("operator", OPERATOR)]
