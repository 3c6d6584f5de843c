# ruff: noqa: F811 - the harness's fixtures are imported by name and asked for by name
"""The saga in Stripe mode against localstripe, through the fault proxy:
whichever call loses its answer (create, confirm, retrieve, cancel, refund),
each purchase ends with exactly one succeeded PaymentIntent if it is
CONFIRMED and none left charged (or chargeable) if it is COMPENSATED
(docs/stripe.md, "Testing against localstripe").

Timers are driven by ``drain_outbox(now=…)`` a little in the future; the
calls themselves go to a real localstripe over HTTP."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import LedgerEntry
from payments.registry import override_gateway
from purchases.models import PurchaseSaga, Refund, Seat
from purchases.saga.states import SagaState
from purchases.services import purchase_processor_event, purchase_refund, saga_charge

from .conftest import drain_outbox, start_purchase
from .stripe_harness import (  # noqa: F401 - the fixtures, used by name
    CARD_3DS,
    CARD_DECLINED_AT_CHARGE,
    CARD_VISA,
    fault_proxy,
    localstripe,
    localstripe_url,
    stripe_gateway,
)

S = SagaState
PI = r"/v1/payment_intents"
ONE = r"/v1/payment_intents/[^/]+"


@pytest.fixture
def stripe_mode(settings, stripe_gateway):
    settings.PAYMENT_GATEWAY = "stripe"
    settings.PURCHASE_HOLD_SECONDS = 600
    settings.RECONCILE_BACKOFF_SECONDS = [60, 120, 240]
    with override_gateway(stripe_gateway):
        yield stripe_gateway


def _saga(saga) -> PurchaseSaga:
    return PurchaseSaga.objects.get(pk=saga.pk)


def _later(seconds: float):
    return timezone.now() + timedelta(seconds=seconds)


def _settle(*, after: float = 0, rounds: int = 6, step: float = 61) -> None:
    """Fire what falls due over the next few probe delays."""
    for k in range(rounds):
        drain_outbox(now=_later(after + k * step))


def _ledger_net(saga) -> int:
    return sum(
        LedgerEntry.objects.filter(intent_id=saga.intent_id).values_list("amount", flat=True)
    )


def _processor(localstripe, saga) -> dict[str, list[str]]:
    """The purchase's PaymentIntents by status, and their refunds."""
    found: dict[str, list[str]] = {}
    for pi in localstripe.payment_intents_of(saga.intent_id):
        found.setdefault(pi["status"], []).append(pi["id"])
        if pi["status"] != "succeeded":
            continue  # nothing to refund (localstripe answers 500 to the question)
        for refund in localstripe.refunds_of(pi["id"]):
            found.setdefault(f"refund_{refund['status']}", []).append(refund["id"])
    return found


def _ends_right(localstripe, saga) -> None:
    """One succeeded PaymentIntent for a confirmed purchase, none charged and
    none left chargeable (a browser holding a client secret could confirm
    one) for a compensated one; the ledger agrees."""
    done = _saga(saga)
    found = _processor(localstripe, saga)
    chargeable = {"requires_confirmation", "requires_action", "requires_payment_method"}
    assert not chargeable & set(found), found
    if done.state == S.CONFIRMED:
        assert len(found.get("succeeded", [])) == 1, found
        assert done.processor_ref == found["succeeded"][0]
        assert _ledger_net(saga) == done.amount
    else:
        assert done.state == S.COMPENSATED, done.state
        succeeded = found.get("succeeded", [])
        refunded = found.get("refund_succeeded", [])
        assert len(succeeded) == len(refunded), found
        assert _ledger_net(saga) == 0


@pytest.mark.django_db
def test_a_visa_purchase_is_created_recorded_and_confirmed(
    alice,
    event,
    stripe_mode,
    localstripe,
):
    saga = start_purchase(alice, event, payment_method=CARD_VISA)
    saga_charge(saga_id=saga.pk)

    done = _saga(saga)
    assert done.state == S.CONFIRMED
    assert done.processor_ref.startswith("pi_")
    [pi] = localstripe.payment_intents_of(saga.intent_id)
    assert pi["metadata"]["purchase_id"] == str(saga.pk)
    assert (pi["amount"], pi["currency"]) == (done.amount, done.currency.lower())
    _ends_right(localstripe, saga)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "action"),
    [
        ("POST", PI, "drop"),  # the create reached Stripe, its answer did not come back
        ("POST", PI, "error500"),  # the create never reached Stripe
        ("POST", ONE + "/confirm", "drop"),
        ("POST", ONE + "/confirm", "delay"),
        ("POST", ONE + "/confirm", "error500"),
    ],
)
def test_a_lost_answer_ends_in_one_charge(
    alice,
    event,
    stripe_mode,
    fault_proxy,
    localstripe,
    method,
    path,
    action,
):
    fault_proxy.fault(method, path, action)
    saga = start_purchase(alice, event, payment_method=CARD_VISA)

    saga_charge(saga_id=saga.pk)
    first = _saga(saga).state
    _settle(after=61)

    assert fault_proxy.faults_met(), "the fault never happened"
    assert first == S.UNKNOWN
    assert _saga(saga).state == S.CONFIRMED
    _ends_right(localstripe, saga)


@pytest.mark.django_db
def test_a_look_up_whose_answer_is_lost_is_asked_again(
    alice,
    event,
    stripe_mode,
    fault_proxy,
    localstripe,
):
    fault_proxy.fault("POST", ONE + "/confirm", "drop")
    fault_proxy.fault("GET", ONE, "drop")
    saga = start_purchase(alice, event, payment_method=CARD_VISA)

    saga_charge(saga_id=saga.pk)
    _settle(after=61)

    assert len(fault_proxy.faults_met()) == 2
    assert _saga(saga).state == S.CONFIRMED
    _ends_right(localstripe, saga)


@pytest.mark.django_db
def test_a_declined_card_is_compensated_with_nothing_charged(
    alice,
    event,
    stripe_mode,
    localstripe,
):
    saga = start_purchase(alice, event, payment_method=CARD_DECLINED_AT_CHARGE)
    saga_charge(saga_id=saga.pk)
    drain_outbox()

    assert _saga(saga).state == S.COMPENSATED
    assert Seat.objects.get(event=event, ref="A1").status == "available"
    _ends_right(localstripe, saga)


def _three_d_secure(alice, event, localstripe):
    saga = start_purchase(alice, event, payment_method=localstripe.card(CARD_3DS))
    saga_charge(saga_id=saga.pk)
    waiting = _saga(saga)
    assert waiting.state == S.REQUIRES_ACTION
    assert waiting.action_secret.startswith(waiting.processor_ref + "_secret_")
    return saga, waiting


@pytest.mark.django_db
@pytest.mark.parametrize("success", [True, False])
def test_three_d_secure_ends_as_the_buyer_authenticates(
    alice,
    event,
    stripe_mode,
    localstripe,
    success,
):
    saga, waiting = _three_d_secure(alice, event, localstripe)

    localstripe.authenticate(waiting.processor_ref, waiting.action_secret, success=success)
    purchase_processor_event(saga_id=saga.pk, why="test: payment_intent event")
    drain_outbox()

    assert _saga(saga).state == (S.CONFIRMED if success else S.COMPENSATED)
    _ends_right(localstripe, saga)


@pytest.mark.django_db
def test_an_abandoned_authentication_is_canceled_at_stripe_even_if_the_cancel_is_lost(
    alice,
    event,
    stripe_mode,
    fault_proxy,
    localstripe,
):
    saga, waiting = _three_d_secure(alice, event, localstripe)
    fault_proxy.fault("POST", ONE + "/cancel", "drop")

    _settle(after=601, rounds=4)

    assert fault_proxy.faults_met()
    assert _saga(saga).state == S.COMPENSATED
    assert localstripe.payment_intent(waiting.processor_ref)["status"] == "canceled"
    _ends_right(localstripe, saga)


@pytest.mark.django_db
def test_a_refund_whose_answer_is_lost_refunds_once(
    alice,
    event,
    stripe_mode,
    fault_proxy,
    localstripe,
):
    saga = start_purchase(alice, event, payment_method=CARD_VISA)
    saga_charge(saga_id=saga.pk)
    fault_proxy.fault("POST", r"/v1/refunds", "drop")

    # A refund row (the purchase stays CONFIRMED): asked once, its answer
    # lost, then looked up, never asked blind again.
    purchase_refund(saga_id=saga.pk, reason="the buyer cannot come")
    drain_outbox()
    pending = Refund.objects.get(saga_id=saga.pk).status
    _settle(after=61)

    assert fault_proxy.faults_met()
    assert pending == "pending"
    refund = Refund.objects.get(saga_id=saga.pk)
    assert refund.status == "succeeded" and refund.processor_ref.startswith("re_")
    assert _saga(saga).state == S.CONFIRMED
    found = _processor(localstripe, saga)
    assert len(found["succeeded"]) == 1, found
    assert found["refund_succeeded"] == [refund.processor_ref], found
    assert _ledger_net(saga) == 0
