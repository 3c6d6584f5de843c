"""The saga with a processor whose intents are its own objects (Stripe's
shape): the intent is created and its id recorded in a commit before it is
confirmed; 3-D Secure is REQUIRES_ACTION, settled by a look-up (a
processor's event is one, sooner) or ended by the hold's expiry after the
intent is canceled; a lost create is found by our intent id, and an intent
made for a saga that had moved on is canceled (docs/stripe.md).

The processor is tests/intent_gateway.py; the adapter itself is proven
against localstripe elsewhere."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from freezegun import freeze_time

from ledger.models import LedgerEntry
from outbox.models import OutboxMessage
from payments.registry import override_gateway
from purchases.models import GatewayAnswer, PurchaseSaga, SagaHistory, Seat
from purchases.ops.audit import audit_run
from purchases.saga.states import SagaState
from purchases.services import (
    purchase_processor_event,
    saga_charge,
    saga_compensate,
    saga_drive,
    saga_expire_hold,
    saga_reconcile,
    saga_transition,
)

from .conftest import drain_outbox, start_purchase
from .intent_gateway import DECLINED, THREE_D_SECURE, UNUSABLE, InProcessIntentGateway

T0 = "2026-12-06 12:00:00"
S = SagaState


@pytest.fixture
def processor(settings):
    settings.PURCHASE_HOLD_SECONDS = 600
    settings.RECONCILE_BACKOFF_SECONDS = [60, 120, 240]
    settings.PAYMENT_GATEWAY = "stripe"
    gw = InProcessIntentGateway()
    with override_gateway(gw):
        yield gw


def _saga(saga) -> PurchaseSaga:
    return PurchaseSaga.objects.get(pk=saga.pk)


def _seat(event, ref="A1") -> str:
    return Seat.objects.get(event=event, ref=ref).status


def _ledger(saga) -> list[tuple[str, int]]:
    return list(
        LedgerEntry.objects.filter(intent_id=saga.intent_id)
        .order_by("pk")
        .values_list("kind", "amount")
    )


@pytest.mark.django_db
def test_the_intent_is_created_and_recorded_before_it_is_confirmed(alice, event, processor):
    recorded_when_confirmed = []
    processor.before["charge"] = lambda ref: recorded_when_confirmed.append(
        PurchaseSaga.objects.get(intent_id=processor.intents[ref].intent_id).processor_ref
    )
    with freeze_time(T0):
        saga = start_purchase(alice, event)
        saga_charge(saga_id=saga.pk)

    done = _saga(saga)
    [pi] = processor.of(saga.intent_id)
    assert done.state == S.CONFIRMED
    assert done.processor == "stripe"
    assert done.processor_ref == pi.id
    # The id was committed before the confirm went out.
    assert recorded_when_confirmed == [pi.id]
    assert [c[0] for c in processor.calls] == ["create", "charge"]
    assert pi.metadata["purchase_id"] == str(saga.pk)
    assert list(
        GatewayAnswer.objects.filter(saga=saga).order_by("pk").values_list("asked", "answer")
    ) == [("create", "created"), ("charge", "succeeded")]
    assert _ledger(saga) == [("charge", done.amount)]


@pytest.mark.django_db
def test_three_d_secure_waits_then_confirms_on_the_processors_event(
    alice, alice_api, event, processor
):
    # Not under freeze_time: the API's throttle (DRF's, first imported by
    # this request in some runs) would keep freezegun's clock as its timer.
    saga = start_purchase(alice, event, payment_method=THREE_D_SECURE)
    saga_charge(saga_id=saga.pk)
    waiting = _saga(saga)
    [pi] = processor.of(saga.intent_id)
    answer = alice_api.get(f"/api/purchases/{saga.pk}/").json()

    processor.authenticate(pi.id, success=True)
    purchase_processor_event(saga_id=saga.pk, why="test: payment_intent.succeeded")

    assert waiting.state == S.REQUIRES_ACTION
    assert waiting.action_secret == pi.client_secret
    assert answer["status"] == "REQUIRES_ACTION"
    assert answer["next_action"] == {
        "type": "authenticate",
        "processor": "stripe",
        "client_secret": pi.client_secret,
    }
    assert answer["payment"]["processor_ref"] == pi.id
    assert answer["payment"]["status"] == "requires_action"
    # A look-up is armed behind the authentication, on the reconcile schedule.
    assert OutboxMessage.objects.filter(key__startswith=f"reconcile:{saga.pk}:").exists()
    done = _saga(saga)
    assert done.state == S.CONFIRMED
    assert done.action_secret == ""
    assert _seat(event) == "sold"
    assert _ledger(saga) == [("charge", done.amount)]


@pytest.mark.django_db
def test_the_armed_look_up_settles_an_authentication_without_any_event(alice, event, processor):
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method=THREE_D_SECURE)
        saga_charge(saga_id=saga.pk)
        [pi] = processor.of(saga.intent_id)
        clock.tick(30)
        drain_outbox()  # the first look-up is not due yet
        still = _saga(saga).state
        processor.authenticate(pi.id, success=True)
        clock.tick(31)
        drain_outbox()

    assert still == S.REQUIRES_ACTION
    assert _saga(saga).state == S.CONFIRMED


@pytest.mark.django_db
def test_a_failed_authentication_compensates_with_nothing_charged(alice, event, processor):
    with freeze_time(T0):
        saga = start_purchase(alice, event, payment_method=THREE_D_SECURE)
        saga_charge(saga_id=saga.pk)
        [pi] = processor.of(saga.intent_id)
        processor.authenticate(pi.id, success=False)
        purchase_processor_event(saga_id=saga.pk, why="test: payment_intent.payment_failed")
        drain_outbox()

    done = _saga(saga)
    assert done.state == S.COMPENSATED
    assert _seat(event) == "available"
    assert _ledger(saga) == []
    assert "refund" not in [c[0] for c in processor.calls]
    reasons = list(SagaHistory.objects.filter(saga=saga).values_list("to_state", flat=True))
    assert reasons[:4] == ["PENDING", "CHARGING", "REQUIRES_ACTION", "PAYMENT_FAILED"]


@pytest.mark.django_db
def test_an_abandoned_authentication_is_canceled_at_the_processor_before_the_seats_go(
    alice, event, processor
):
    seen_at_cancel = []
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method=THREE_D_SECURE)
        saga_charge(saga_id=saga.pk)
        [pi] = processor.of(saga.intent_id)
        processor.before["cancel"] = lambda ref: seen_at_cancel.append(_seat(event))
        clock.tick(601)
        drain_outbox()

    assert seen_at_cancel == ["held"]  # canceled first, released after
    assert pi.status == "canceled"
    assert _saga(saga).state == S.COMPENSATED
    assert _seat(event) == "available"
    assert _ledger(saga) == []
    assert ("cancel", pi.id) in processor.calls


@pytest.mark.django_db
def test_an_authentication_completed_as_the_hold_ran_out_confirms(alice, event, processor):
    with freeze_time(T0):
        saga = start_purchase(alice, event, payment_method=THREE_D_SECURE)
        saga_charge(saga_id=saga.pk)
        [pi] = processor.of(saga.intent_id)
        processor.authenticate(pi.id, success=True)  # its event not yet arrived
        saga_expire_hold(saga_id=saga.pk)

    done = _saga(saga)
    assert done.state == S.CONFIRMED
    assert pi.status == "succeeded"
    assert _ledger(saga) == [("charge", done.amount)]


@pytest.mark.django_db
def test_a_lost_create_is_found_by_our_intent_id_and_confirmed_once(alice, event, processor):
    processor.lose["create"] = 1
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)
        saga_charge(saga_id=saga.pk)
        unknown = _saga(saga)
        clock.tick(61)
        drain_outbox()

    done = _saga(saga)
    [pi] = processor.of(saga.intent_id)
    assert unknown.state == S.UNKNOWN and unknown.processor_ref == ""
    assert done.state == S.CONFIRMED
    assert done.processor_ref == pi.id
    # Looked up by our intent id (no id was recorded), then confirmed by its own.
    assert ("retrieve", saga.intent_id) in processor.calls
    assert ("charge", pi.id) in processor.calls
    assert pi.status == "succeeded"


@pytest.mark.django_db
def test_an_intent_created_after_the_hold_released_the_seats_is_canceled(alice, event, processor):
    # given: the hold runs out while the create is on the wire, and the
    # expiry finds no intent at the processor yet
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)
        clock.tick(599)

        def hold_runs_out(ref):
            clock.tick(2)
            saga_expire_hold(saga_id=saga.pk)

        processor.before["create"] = hold_runs_out
        saga_charge(saga_id=saga.pk)
        drain_outbox()

    # then: the late intent is canceled, never confirmed, and an operator
    # has nothing to do
    [pi] = processor.of(saga.intent_id)
    assert pi.status == "canceled"
    assert ("charge", pi.id) not in processor.calls
    assert _saga(saga).state == S.COMPENSATED
    assert _ledger(saga) == []
    assert not OutboxMessage.objects.filter(key__startswith=f"needs_operator:{saga.pk}").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("method", [UNUSABLE, DECLINED])
def test_a_refused_payment_method_compensates_with_nothing_charged(alice, event, processor, method):
    with freeze_time(T0):
        saga = start_purchase(alice, event, payment_method=method)
        saga_charge(saga_id=saga.pk)
        drain_outbox()

    assert _saga(saga).state == S.COMPENSATED
    assert _seat(event) == "available"
    assert _ledger(saga) == []


@pytest.mark.django_db
def test_the_resumer_looks_up_a_saga_waiting_on_authentication(alice, event, processor):
    with freeze_time(T0):
        saga = start_purchase(alice, event, payment_method=THREE_D_SECURE)
        saga_charge(saga_id=saga.pk)
        [pi] = processor.of(saga.intent_id)
        processor.authenticate(pi.id, success=True)
        saga_drive(saga_id=saga.pk)

    assert ("retrieve", pi.id) in processor.calls
    assert _saga(saga).state == S.CONFIRMED


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["CONFIRMED", "CHARGING"])
def test_a_processors_event_about_a_saga_with_nothing_to_learn_asks_nothing(
    alice, event, processor, state
):
    with freeze_time(T0):
        saga = start_purchase(alice, event)
        if state == "CONFIRMED":
            saga_charge(saga_id=saga.pk)
        else:
            PurchaseSaga.objects.filter(pk=saga.pk).update(state=state)
        calls = len(processor.calls)
        purchase_processor_event(saga_id=saga.pk, why="test")

    assert len(processor.calls) == calls
    assert _saga(saga).state == state


@pytest.mark.django_db
def test_a_processors_event_about_no_purchase_of_ours_is_none(processor):
    assert purchase_processor_event(saga_id="00000000-0000-0000-0000-000000000000", why="t") is None


@pytest.mark.django_db
def test_the_auditor_flags_an_authentication_released_without_a_definitive_answer(
    alice, event, processor
):
    # given: a saga waiting on 3-D Secure, moved to be released on an
    # assumption (no cancel at the processor, no look-up, when it was decided)
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method=THREE_D_SECURE)
        saga_charge(saga_id=saga.pk)
        saga_transition(saga_id=saga.pk, to=S.EXPIRED, reason="assumed")
        # The compensation's own cancel comes later than its decision.
        processor.before["cancel"] = lambda ref: clock.tick(1)
        saga_compensate(saga_id=saga.pk)
        drain_outbox()

    # when
    report = audit_run(gateway=processor)

    # then
    assert _saga(saga).state == S.COMPENSATED
    flagged = [(v.invariant, v.saga_id) for v in report.violations]
    assert flagged == [("unknown_never_compensated_blind", str(saga.pk))]


@pytest.mark.django_db
def test_the_auditor_finds_a_settled_authentication_clean(alice, bob, event, processor):
    with freeze_time(T0) as clock:
        abandoned = start_purchase(alice, event, payment_method=THREE_D_SECURE)
        saga_charge(saga_id=abandoned.pk)
        confirmed = start_purchase(bob, event, seats=["A2"], payment_method=THREE_D_SECURE)
        saga_charge(saga_id=confirmed.pk)
        [pi] = processor.of(confirmed.intent_id)
        processor.authenticate(pi.id, success=True)
        purchase_processor_event(saga_id=confirmed.pk, why="test")
        clock.tick(601)
        drain_outbox()

    report = audit_run(gateway=processor)

    assert (_saga(abandoned).state, _saga(confirmed).state) == (S.COMPENSATED, S.CONFIRMED)
    assert report.violations == []


@pytest.mark.django_db(transaction=True)
def test_an_intent_recorded_while_the_expiry_asked_by_our_id_is_canceled_not_charged(
    alice, event, processor
):
    # given: the hold's expiry asks to cancel by our intent id while the
    # create is on the wire, finds nothing, and records its answer only
    # after the create's id was committed and its confirm is about to go
    # out (a reviewer's reproduction of a charge after the release)
    asked, go_on = threading.Event(), threading.Event()
    saga = start_purchase(alice, event)

    def expire():
        try:
            saga_expire_hold(saga_id=saga.pk)
        finally:
            connection.close()

    expiry = threading.Thread(target=expire)

    def cancel_then_wait(ref):
        asked.set()
        assert go_on.wait(10)

    def create_while_the_expiry_asks(ref):
        processor.before["cancel"] = cancel_then_wait
        expiry.start()
        assert asked.wait(10)

    def confirm_after_the_expiry(ref):
        go_on.set()
        expiry.join(10)

    processor.before["create"] = create_while_the_expiry_asks
    processor.before["charge"] = confirm_after_the_expiry

    # when
    saga_charge(saga_id=saga.pk)

    # then: the expiry saw the recorded intent and canceled it; nothing charged
    [pi] = processor.of(saga.intent_id)
    assert not expiry.is_alive()
    assert pi.status == "canceled"
    assert _saga(saga).state == S.COMPENSATED
    assert _ledger(saga) == []
    assert ("cancel", pi.id) in processor.calls


@pytest.mark.django_db
@pytest.mark.parametrize("why", [THREE_D_SECURE, DECLINED])
def test_an_uncharged_intent_is_canceled_before_the_seats_are_released(
    alice, event, processor, why
):
    # A declined or unauthenticated PaymentIntent could still be confirmed
    # by a browser holding its client secret: the compensation cancels it.
    seen_at_cancel = []
    with freeze_time(T0):
        saga = start_purchase(alice, event, payment_method=why)
        processor.before["cancel"] = lambda ref: seen_at_cancel.append(_seat(event))
        saga_charge(saga_id=saga.pk)
        [pi] = processor.of(saga.intent_id)
        if why == THREE_D_SECURE:
            processor.authenticate(pi.id, success=False)
        purchase_processor_event(saga_id=saga.pk, why="test")
        drain_outbox()

    assert seen_at_cancel == ["held"]
    assert pi.status == "canceled"
    assert _saga(saga).state == S.COMPENSATED
    assert _ledger(saga) == []


@pytest.mark.django_db
def test_an_intent_charged_while_the_purchase_was_undone_is_refunded_and_alerted(
    alice, event, processor
):
    with freeze_time(T0):
        saga = start_purchase(alice, event, payment_method=DECLINED)
        [pi_ref] = [None]

        def charged_meanwhile(ref):
            # A browser confirmed it with another card in the meantime.
            pi = processor.intents[ref]
            pi.status, pi.charge = "succeeded", f"ch_{ref[3:]}"

        processor.before["cancel"] = charged_meanwhile
        saga_charge(saga_id=saga.pk)
        drain_outbox()
        [pi] = processor.of(saga.intent_id)
        pi_ref = pi.id

    done = _saga(saga)
    assert pi_ref is not None
    assert done.state == S.COMPENSATED
    assert pi.refunded
    assert _ledger(saga) == [("charge", done.amount), ("refund", -done.amount)]
    assert OutboxMessage.objects.filter(key=f"needs_operator:{saga.pk}:late_charge").exists()


@pytest.mark.django_db
def test_the_expiry_does_not_trust_none_found_so_soon_after_a_create(alice, event, processor):
    # given: a create whose answer was lost just before the hold ran out,
    # and a search that does not show the PaymentIntent yet
    processor.search_settles_seconds = 60
    processor.lose["create"] = 1
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)
        clock.tick(590)
        saga_charge(saga_id=saga.pk)
        [pi] = processor.of(saga.intent_id)
        hidden = processor.hide(pi.id)
        clock.tick(11)
        saga_expire_hold(saga_id=saga.pk)
        waiting = _saga(saga).state
        processor.show(hidden)
        clock.tick(60)
        drain_outbox()

    # then: it asked again once the search had settled, and canceled it
    assert waiting == S.UNKNOWN
    assert pi.status == "canceled"
    assert _saga(saga).state == S.COMPENSATED


@pytest.mark.django_db
def test_an_intent_the_expiry_found_by_our_id_and_canceled_settles_it_without_an_alert(
    alice, event, processor
):
    # given: a create whose answer was lost just before the hold ran out; the
    # search shows the PaymentIntent (found, not hidden) -- the chaos run's
    # false alarm: "none found yet" was assumed of a cancel that found it
    processor.search_settles_seconds = 60
    processor.lose["create"] = 1
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)
        clock.tick(590)
        saga_charge(saga_id=saga.pk)
        clock.tick(11)
        saga_expire_hold(saga_id=saga.pk)
        after_expiry = _saga(saga).state
        clock.tick(65)
        drain_outbox()

    [pi] = processor.of(saga.intent_id)
    assert pi.status == "canceled"
    assert after_expiry == S.COMPENSATED
    alerts = OutboxMessage.objects.filter(topic="purchase.needs_operator", saga_id=saga.pk)
    assert not alerts.exists()


@pytest.mark.django_db
def test_our_cancel_whose_answer_was_lost_is_not_a_cancel_behind_our_back(alice, event, processor):
    # given: a lost create, then the hold's expiry cancels the intent and
    # loses that answer (the chaos run's second false alarm)
    processor.lose["create"] = 1
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event)
        clock.tick(590)
        saga_charge(saga_id=saga.pk)
        processor.lose["cancel"] = 1
        clock.tick(11)
        saga_expire_hold(saga_id=saga.pk)
        waiting = _saga(saga).state
        # when: the reconcile probe (armed by the lost create) reads
        # "canceled", before the expiry asks again
        clock.tick(30)
        saga_reconcile(saga_id=saga.pk, attempt=1)
        drain_outbox()

    # then: settled as the expiry would have, no alert
    [pi] = processor.of(saga.intent_id)
    assert waiting == S.UNKNOWN
    assert pi.status == "canceled"
    assert _saga(saga).state == S.COMPENSATED
    alerts = OutboxMessage.objects.filter(topic="purchase.needs_operator", saga_id=saga.pk)
    assert not alerts.exists()
