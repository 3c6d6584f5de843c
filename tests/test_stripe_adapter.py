"""The Stripe adapter (payments/stripe/) against a real localstripe, through
the fault proxy for lost answers, timeouts and 500s, and against a stub for
the answers localstripe cannot give (docs/stripe.md, "Testing against localstripe")."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from django.db import transaction

from payments.guards import NetworkCallInTransaction
from payments.interface import (
    CancelOutcome,
    ChargeOutcome,
    ChargeRequest,
    CreateOutcome,
    GatewayUnavailable,
    IntentStatus,
    RefundOutcome,
)
from payments.stripe.adapter import API_VERSION, StripePaymentGateway

from .stripe_harness import (  # noqa: F401 - the fixtures, used by name
    CARD_3DS,
    CARD_DECLINED_AT_CHARGE,
    CARD_VISA,
    FaultProxy,
    Localstripe,
    StubStripe,
    fault_proxy,
    gateway_at,
    localstripe,
    localstripe_url,
    payment_intent,
    stripe_error,
    stripe_gateway,
    stub_fixture,
)

# The stripe library hands httpx its form as ``data=<str>``, which httpx
# deprecates (the library's doing, not ours): not this file's concern.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Use 'content=<...>' to upload raw bytes/text content.:DeprecationWarning"
)


def new_intent_id() -> str:
    # The saga's shape (purchases.saga.start.intent_id_for): it starts with
    # pi_ too, which is why the adapter cannot tell ours from Stripe's by it.
    return f"pi_R{uuid.uuid4().hex[:12].upper()}1F"


def request_for(
    intent_id: str, payment_method: str = CARD_VISA, *, ref: str = "", attempt: int = 1
) -> ChargeRequest:
    return ChargeRequest(
        intent_id=intent_id,
        amount=4200,
        currency="EUR",
        payment_method=payment_method,
        processor_ref=ref,
        purchase_id="7b0f4c4e-0000-4000-8000-000000000042",
        reservation=intent_id.removeprefix("pi_"),
        attempt=attempt,
    )


def created(gateway: StripePaymentGateway, intent_id: str, pm: str = CARD_VISA) -> str:
    result = gateway.create(request_for(intent_id, pm))
    assert result.outcome == CreateOutcome.CREATED, result
    return result.processor_ref


def charged(gateway: StripePaymentGateway, intent_id: str, pm: str = CARD_VISA) -> str:
    ref = created(gateway, intent_id, pm)
    result = gateway.charge(request_for(intent_id, pm, ref=ref))
    assert result.outcome == ChargeOutcome.SUCCEEDED, result
    return ref


def statuses(api: Localstripe, intent_id: str) -> list[str]:
    return sorted(pi["status"] for pi in api.payment_intents_of(intent_id))


# --- against localstripe ---------------------------------------------------------


def test_a_visa_card_is_created_then_charged_and_retrieve_says_succeeded(
    stripe_gateway,  # noqa: F811 - the fixture imported above
    localstripe,  # noqa: F811
):
    intent_id = new_intent_id()

    made = stripe_gateway.create(request_for(intent_id))

    assert made.outcome == CreateOutcome.CREATED
    assert made.processor_ref.startswith("pi_") and made.processor_ref != intent_id
    pi = localstripe.payment_intent(made.processor_ref)
    assert (pi["status"], pi["amount"], pi["currency"]) == ("requires_confirmation", 4200, "eur")
    assert pi["metadata"] == {
        "intent_id": intent_id,
        "purchase_id": "7b0f4c4e-0000-4000-8000-000000000042",
        "reservation": intent_id.removeprefix("pi_"),
    }

    charge = stripe_gateway.charge(request_for(intent_id, ref=made.processor_ref))

    assert charge.outcome == ChargeOutcome.SUCCEEDED
    assert charge.charge_id and charge.charge_id.startswith("ch_")
    lookup = stripe_gateway.retrieve(made.processor_ref)
    assert (lookup.status, lookup.charge_id) == (IntentStatus.SUCCEEDED, charge.charge_id)
    assert lookup.raw == {
        "id": made.processor_ref,
        "status": "succeeded",
        "amount": 4200,
        "currency": "eur",
    }
    by_ours = stripe_gateway.retrieve(intent_id)
    assert (by_ours.status, by_ours.processor_ref) == (IntentStatus.SUCCEEDED, made.processor_ref)
    [listed] = stripe_gateway.list_charges(made.processor_ref)
    assert (listed.id, listed.amount, listed.status) == (charge.charge_id, 4200, "succeeded")
    assert listed.created.endswith("+00:00")


def test_a_card_declined_at_the_charge_is_declined_and_retrieve_says_so(
    stripe_gateway,  # noqa: F811
):
    intent_id = new_intent_id()
    ref = created(stripe_gateway, intent_id, CARD_DECLINED_AT_CHARGE)

    charge = stripe_gateway.charge(request_for(intent_id, CARD_DECLINED_AT_CHARGE, ref=ref))

    assert (charge.outcome, charge.detail) == (ChargeOutcome.DECLINED, "card_declined")
    lookup = stripe_gateway.retrieve(ref)
    assert (lookup.status, lookup.detail) == (IntentStatus.DECLINED, "card_declined")
    assert stripe_gateway.list_charges(ref) == []


def test_a_create_with_an_unknown_payment_method_is_declined(
    stripe_gateway,  # noqa: F811
    localstripe,  # noqa: F811
):
    intent_id = new_intent_id()

    made = stripe_gateway.create(request_for(intent_id, "pm_no_such_method"))

    assert made.outcome == CreateOutcome.DECLINED and made.detail
    assert localstripe.payment_intents_of(intent_id) == []


def test_a_3ds_card_requires_action_and_an_authenticated_buyer_is_charged(
    stripe_gateway,  # noqa: F811
    localstripe,  # noqa: F811
):
    intent_id = new_intent_id()
    pm = localstripe.card(CARD_3DS)
    ref = created(stripe_gateway, intent_id, pm)

    charge = stripe_gateway.charge(request_for(intent_id, pm, ref=ref))

    assert charge.outcome == ChargeOutcome.REQUIRES_ACTION
    secret = localstripe.payment_intent(ref)["client_secret"]
    assert charge.action_secret == secret and charge.charge_id is None
    waiting = stripe_gateway.retrieve(ref)
    assert (waiting.status, waiting.action_secret) == (IntentStatus.REQUIRES_ACTION, secret)

    localstripe.authenticate(ref, charge.action_secret, success=True)

    lookup = stripe_gateway.retrieve(ref)
    assert lookup.status == IntentStatus.SUCCEEDED and lookup.charge_id


def test_a_failed_authentication_is_declined_with_nothing_charged(
    stripe_gateway,  # noqa: F811
    localstripe,  # noqa: F811
):
    intent_id = new_intent_id()
    pm = localstripe.card(CARD_3DS)
    ref = created(stripe_gateway, intent_id, pm)
    charge = stripe_gateway.charge(request_for(intent_id, pm, ref=ref))

    localstripe.authenticate(ref, charge.action_secret, success=False)

    lookup = stripe_gateway.retrieve(ref)
    assert (lookup.status, lookup.detail) == (
        IntentStatus.DECLINED,
        "payment_intent_authentication_failure",
    )
    assert stripe_gateway.list_charges(ref) == []


def test_cancelling_an_intent_waiting_for_authentication_ends_it(
    stripe_gateway,  # noqa: F811
    localstripe,  # noqa: F811
):
    intent_id = new_intent_id()
    pm = localstripe.card(CARD_3DS)
    ref = created(stripe_gateway, intent_id, pm)
    charge = stripe_gateway.charge(request_for(intent_id, pm, ref=ref))

    result = stripe_gateway.cancel(ref)

    assert result.outcome == CancelOutcome.CANCELED
    assert localstripe.payment_intent(ref)["status"] == "canceled"
    with pytest.raises(httpx.HTTPStatusError):  # the buyer is too late
        localstripe.authenticate(ref, charge.action_secret, success=True)
    assert stripe_gateway.retrieve(ref).status == IntentStatus.CANCELED
    assert stripe_gateway.cancel(ref).outcome == CancelOutcome.CANCELED  # again: the same


def test_cancelling_a_charged_intent_says_already_charged(
    stripe_gateway,  # noqa: F811
):
    intent_id = new_intent_id()
    ref = charged(stripe_gateway, intent_id)
    charge_id = stripe_gateway.retrieve(ref).charge_id

    result = stripe_gateway.cancel(ref)

    assert (result.outcome, result.charge_id) == (CancelOutcome.ALREADY_CHARGED, charge_id)


def test_a_refund_refunds_once_however_often_it_is_asked(
    stripe_gateway,  # noqa: F811
    localstripe,  # noqa: F811
):
    intent_id = new_intent_id()
    ref = charged(stripe_gateway, intent_id)

    first = stripe_gateway.refund(ref, idempotency_key=f"{intent_id}:refund")
    second = stripe_gateway.refund(ref, idempotency_key=f"{intent_id}:refund")

    assert (first.outcome, second.outcome) == (RefundOutcome.REFUNDED, RefundOutcome.REFUNDED)
    [refund] = localstripe.refunds_of(ref)
    assert (refund["amount"], refund["status"]) == (4200, "succeeded")
    assert stripe_gateway.retrieve(ref).status == IntentStatus.REFUNDED
    [listed] = stripe_gateway.list_charges(ref)
    assert listed.status == "refunded"


def test_a_refund_of_an_intent_never_charged_says_not_charged(
    stripe_gateway,  # noqa: F811
    localstripe,  # noqa: F811
):
    intent_id = new_intent_id()
    ref = created(stripe_gateway, intent_id)

    result = stripe_gateway.refund(ref, idempotency_key=f"{intent_id}:refund")

    assert result.outcome == RefundOutcome.NOT_CHARGED
    assert localstripe.payment_intent(ref)["status"] == "requires_confirmation"


def test_an_intent_stripe_never_saw_is_not_found_and_cannot_be_charged(
    stripe_gateway,  # noqa: F811
):
    intent_id = new_intent_id()

    assert stripe_gateway.retrieve(intent_id).status == IntentStatus.NOT_FOUND
    assert stripe_gateway.cancel(intent_id).outcome == CancelOutcome.CANCELED
    assert (
        stripe_gateway.refund(intent_id, idempotency_key="k").outcome == RefundOutcome.NOT_CHARGED
    )
    assert stripe_gateway.list_charges(intent_id) == []


def test_a_charge_needs_the_recorded_payment_intent(stripe_gateway):  # noqa: F811
    with pytest.raises(ValueError, match="processor_ref"):
        stripe_gateway.charge(request_for(new_intent_id()))


def test_no_call_is_made_inside_a_transaction(db, stripe_gateway, fault_proxy):  # noqa: F811
    intent_id = new_intent_id()

    with transaction.atomic(), pytest.raises(NetworkCallInTransaction):
        stripe_gateway.create(request_for(intent_id))

    assert fault_proxy.exchanges == []


# --- lost answers, through the fault proxy ----------------------------------------


def test_a_create_whose_answer_was_lost_is_found_by_our_intent_id_and_charged(
    stripe_gateway,  # noqa: F811
    fault_proxy,  # noqa: F811
    localstripe,  # noqa: F811
):
    intent_id = new_intent_id()
    fault_proxy.fault("POST", r"/v1/payment_intents", "drop")

    lost = stripe_gateway.create(request_for(intent_id))

    assert (lost.outcome, lost.detail) == (CreateOutcome.UNKNOWN, "connection_error")
    [pi] = localstripe.payment_intents_of(intent_id)  # it reached Stripe
    found = stripe_gateway.retrieve(intent_id)
    assert (found.status, found.processor_ref) == (IntentStatus.REQUIRES_PAYMENT, pi["id"])
    charge = stripe_gateway.charge(request_for(intent_id, ref=found.processor_ref))
    assert charge.outcome == ChargeOutcome.SUCCEEDED
    assert statuses(localstripe, intent_id) == ["succeeded"]


def test_a_lost_create_made_again_leaves_one_chargeable_payment_intent(
    stripe_gateway,  # noqa: F811
    fault_proxy,  # noqa: F811
    localstripe,  # noqa: F811
):
    # localstripe keeps no idempotency: the second create makes a second
    # PaymentIntent, as Stripe would after its 24 hours.
    intent_id = new_intent_id()
    fault_proxy.fault("POST", r"/v1/payment_intents", "drop")
    assert stripe_gateway.create(request_for(intent_id)).outcome == CreateOutcome.UNKNOWN
    assert stripe_gateway.create(request_for(intent_id)).outcome == CreateOutcome.CREATED
    assert statuses(localstripe, intent_id) == ["requires_confirmation"] * 2

    found = stripe_gateway.retrieve(intent_id)

    assert found.status == IntentStatus.REQUIRES_PAYMENT
    assert statuses(localstripe, intent_id) == ["canceled", "requires_confirmation"]
    kept = next(
        pi for pi in localstripe.payment_intents_of(intent_id) if pi["status"] != "canceled"
    )
    assert found.processor_ref == kept["id"]
    # Asked again, it keeps the same one.
    assert stripe_gateway.retrieve(intent_id).processor_ref == kept["id"]
    charge = stripe_gateway.charge(request_for(intent_id, ref=found.processor_ref))
    assert charge.outcome == ChargeOutcome.SUCCEEDED
    assert statuses(localstripe, intent_id) == ["canceled", "succeeded"]
    assert [c.id for c in stripe_gateway.list_charges(intent_id)] == [charge.charge_id]


def test_a_confirm_whose_answer_was_lost_is_read_back_and_never_charged_twice(
    stripe_gateway,  # noqa: F811
    fault_proxy,  # noqa: F811
    localstripe,  # noqa: F811
):
    intent_id = new_intent_id()
    ref = created(stripe_gateway, intent_id)
    fault_proxy.fault("POST", rf"/v1/payment_intents/{ref}/confirm", "drop")

    lost = stripe_gateway.charge(request_for(intent_id, ref=ref))

    assert (lost.outcome, lost.detail) == (ChargeOutcome.UNKNOWN, "connection_error")
    lookup = stripe_gateway.retrieve(ref)
    assert lookup.status == IntentStatus.SUCCEEDED and lookup.charge_id
    # Confirmed again (the next attempt): Stripe refuses, the answer is the truth.
    again = stripe_gateway.charge(request_for(intent_id, ref=ref, attempt=2))
    assert (again.outcome, again.charge_id) == (ChargeOutcome.SUCCEEDED, lookup.charge_id)
    assert len(stripe_gateway.list_charges(ref)) == 1


def test_a_retrieve_whose_answer_was_lost_is_asked_again(
    stripe_gateway,  # noqa: F811
    fault_proxy,  # noqa: F811
):
    intent_id = new_intent_id()
    ref = charged(stripe_gateway, intent_id)
    fault_proxy.fault("GET", rf"/v1/payment_intents/{ref}", "drop")
    fault_proxy.fault("GET", r"/v1/payment_intents/search", "drop")

    assert stripe_gateway.retrieve(ref).status == IntentStatus.UNKNOWN
    assert stripe_gateway.retrieve(intent_id).status == IntentStatus.UNKNOWN

    assert stripe_gateway.retrieve(ref).status == IntentStatus.SUCCEEDED
    assert stripe_gateway.retrieve(intent_id).status == IntentStatus.SUCCEEDED


def test_a_cancel_whose_answer_was_lost_is_asked_again(
    stripe_gateway,  # noqa: F811
    fault_proxy,  # noqa: F811
    localstripe,  # noqa: F811
):
    intent_id = new_intent_id()
    ref = created(stripe_gateway, intent_id)
    fault_proxy.fault("POST", rf"/v1/payment_intents/{ref}/cancel", "drop")

    lost = stripe_gateway.cancel(ref)

    assert lost.outcome == CancelOutcome.UNKNOWN
    assert localstripe.payment_intent(ref)["status"] == "canceled"  # it landed
    assert stripe_gateway.cancel(ref).outcome == CancelOutcome.CANCELED
    assert stripe_gateway.retrieve(ref).status == IntentStatus.CANCELED


def test_a_refund_whose_answer_was_lost_is_not_made_twice(
    stripe_gateway,  # noqa: F811
    fault_proxy,  # noqa: F811
    localstripe,  # noqa: F811
):
    intent_id = new_intent_id()
    ref = charged(stripe_gateway, intent_id)
    fault_proxy.fault("POST", r"/v1/refunds", "drop")

    lost = stripe_gateway.refund(ref, idempotency_key=f"{intent_id}:refund")

    assert lost.outcome == RefundOutcome.UNKNOWN
    assert len(localstripe.refunds_of(ref)) == 1  # it landed
    again = stripe_gateway.refund(ref, idempotency_key=f"{intent_id}:refund")
    assert again.outcome == RefundOutcome.REFUNDED
    assert len(localstripe.refunds_of(ref)) == 1


def test_list_charges_without_an_answer_raises(
    stripe_gateway,  # noqa: F811
    fault_proxy,  # noqa: F811
):
    intent_id = new_intent_id()
    ref = charged(stripe_gateway, intent_id)
    fault_proxy.fault("GET", rf"/v1/payment_intents/{ref}", "error500")

    with pytest.raises(GatewayUnavailable, match="http_500"):
        stripe_gateway.list_charges(ref)


# --- every call: a timeout or a 500 is UNKNOWN -------------------------------------


@dataclass(frozen=True)
class Call:
    """One port call, on an intent set up for it, and the request to fault."""

    setup: Callable[[StripePaymentGateway, str], str]  # -> the reference
    method: str
    path: Callable[[str], str]
    call: Callable[[StripePaymentGateway, str, str], Any]


CALLS = {
    "create": Call(
        lambda gw, intent_id: "",
        "POST",
        lambda ref: r"/v1/payment_intents",
        lambda gw, intent_id, ref: gw.create(request_for(intent_id)),
    ),
    "charge": Call(
        created,
        "POST",
        lambda ref: rf"/v1/payment_intents/{ref}/confirm",
        lambda gw, intent_id, ref: gw.charge(request_for(intent_id, ref=ref)),
    ),
    "retrieve": Call(
        charged,
        "GET",
        lambda ref: rf"/v1/payment_intents/{ref}",
        lambda gw, intent_id, ref: gw.retrieve(ref),
    ),
    "cancel": Call(
        created,
        "POST",
        lambda ref: rf"/v1/payment_intents/{ref}/cancel",
        lambda gw, intent_id, ref: gw.cancel(ref),
    ),
    "refund": Call(
        charged,
        "POST",
        lambda ref: r"/v1/refunds",
        lambda gw, intent_id, ref: gw.refund(ref, idempotency_key=f"{intent_id}:refund"),
    ),
}


@pytest.mark.parametrize(("fault", "detail"), [("delay", "timeout"), ("error500", "http_500")])
@pytest.mark.parametrize("name", list(CALLS))
def test_a_call_without_a_usable_answer_is_unknown(
    name,
    fault,
    detail,
    stripe_gateway,  # noqa: F811
    fault_proxy,  # noqa: F811
):
    call = CALLS[name]
    intent_id = new_intent_id()
    ref = call.setup(stripe_gateway, intent_id)
    fault_proxy.fault(call.method, call.path(ref), fault)

    result = call.call(stripe_gateway, intent_id, ref)

    assert (result.label, result.detail) == ("unknown", detail)
    assert [e.fault for e in fault_proxy.faults_met()] == [fault]


def test_a_500_reached_nothing_and_the_create_is_made_again(
    stripe_gateway,  # noqa: F811
    fault_proxy,  # noqa: F811
    localstripe,  # noqa: F811
):
    intent_id = new_intent_id()
    fault_proxy.fault("POST", r"/v1/payment_intents", "error500")
    assert stripe_gateway.create(request_for(intent_id)).detail == "http_500"

    assert stripe_gateway.retrieve(intent_id).status == IntentStatus.NOT_FOUND
    assert stripe_gateway.create(request_for(intent_id)).outcome == CreateOutcome.CREATED
    assert statuses(localstripe, intent_id) == ["requires_confirmation"]


# --- what localstripe cannot say: a stub ------------------------------------------


IN_USE = stripe_error(
    "invalid_request_error",
    "There is currently another in-progress request using this Idempotent Key.",
    code="idempotency_key_in_use",
)


@pytest.mark.parametrize(
    ("status", "body", "detail"),
    [
        (409, IN_USE, "idempotency_key_in_use"),
        (429, stripe_error("invalid_request_error", "Too many requests"), "rate_limited"),
        (
            400,
            stripe_error("idempotency_error", "Keys for idempotent requests…"),
            "idempotency_error",
        ),
        (401, stripe_error("invalid_request_error", "Invalid API Key"), "authentication_error"),
        (503, stripe_error("api_error", "Service unavailable"), "http_503"),
    ],
)
def test_answers_that_leave_a_charge_in_doubt_are_unknown(stub, status, body, detail):
    server, gateway = stub((status, body))

    result = gateway.charge(request_for(new_intent_id(), ref="pi_3Stub"))

    assert (result.outcome, result.detail) == (ChargeOutcome.UNKNOWN, detail)
    assert len(server.asked) == 1  # the library never retries on its own


def test_the_requests_name_our_keys_version_and_metadata(stub):
    intent_id = new_intent_id()
    server, gateway = stub(
        (200, payment_intent("pi_3Stub", "requires_confirmation")),
        (200, payment_intent("pi_3Stub", "succeeded", latest_charge="ch_3Stub")),
    )

    gateway.create(request_for(intent_id))
    charge = gateway.charge(request_for(intent_id, ref="pi_3Stub", attempt=2))

    create, confirm = server.asked
    assert (create.method, create.path) == ("POST", "/v1/payment_intents")
    assert create.headers["idempotency-key"] == f"{intent_id}:create"
    assert create.headers["stripe-version"] == API_VERSION
    assert create.form["amount"] == ["4200"] and create.form["currency"] == ["eur"]
    assert create.form["payment_method_types[0]"] == ["card"]
    assert create.form["metadata[intent_id]"] == [intent_id]
    assert "confirm" not in create.form
    assert (confirm.method, confirm.path) == ("POST", "/v1/payment_intents/pi_3Stub/confirm")
    assert confirm.headers["idempotency-key"] == f"{intent_id}:confirm:2"
    assert "payment_method" not in confirm.form
    assert (charge.outcome, charge.charge_id) == (ChargeOutcome.SUCCEEDED, "ch_3Stub")


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (
            stripe_error(
                "card_error",
                "Insufficient funds.",
                code="card_declined",
                decline_code="insufficient_funds",
            ),
            "insufficient_funds",
        ),
        (stripe_error("card_error", "Expired card.", code="expired_card"), "expired_card"),
    ],
)
def test_a_card_error_is_declined_with_its_code(stub, body, detail):
    server, gateway = stub((402, body))

    result = gateway.charge(request_for(new_intent_id(), ref="pi_3Stub"))

    assert (result.outcome, result.detail) == (ChargeOutcome.DECLINED, detail)


def test_a_create_naming_a_missing_payment_method_is_declined(stub):
    missing = stripe_error(
        "invalid_request_error",
        "No such PaymentMethod: 'pm_gone'",
        code="resource_missing",
        param="payment_method",
    )
    server, gateway = stub((400, missing))

    result = gateway.create(request_for(new_intent_id(), "pm_gone"))

    assert (result.outcome, result.detail) == (CreateOutcome.DECLINED, "resource_missing")


def test_a_create_refused_for_another_reason_than_the_card_is_unknown(stub):
    # Our request, not the buyer's card (here: an API version that no longer
    # takes payment_method_types): no buyer is told "declined" for it.
    refused = stripe_error(
        "invalid_request_error",
        "payment_method_types is no longer supported.",
        code="payment_method_types_no_longer_supported",
        param="payment_method_types",
    )
    server, gateway = stub((400, refused))

    result = gateway.create(request_for(new_intent_id()))

    assert (result.outcome, result.detail) == (
        CreateOutcome.UNKNOWN,
        "payment_method_types_no_longer_supported",
    )


def test_a_create_in_doubt_is_unknown(stub):
    server, gateway = stub((409, IN_USE))

    result = gateway.create(request_for(new_intent_id()))

    assert (result.outcome, result.detail) == (CreateOutcome.UNKNOWN, "idempotency_key_in_use")


def test_a_confirm_refused_as_already_succeeded_answers_from_the_intent(stub):
    unexpected = stripe_error(
        "invalid_request_error",
        "This PaymentIntent's status is succeeded.",
        code="payment_intent_unexpected_state",
    )
    charged_pi = payment_intent(
        "pi_3Stub", "succeeded", latest_charge={"id": "ch_3Stub", "object": "charge"}
    )
    server, gateway = stub((400, unexpected), (200, charged_pi))

    result = gateway.charge(request_for(new_intent_id(), ref="pi_3Stub", attempt=2))

    assert (result.outcome, result.charge_id) == (ChargeOutcome.SUCCEEDED, "ch_3Stub")
    assert [(a.method, a.path) for a in server.asked] == [
        ("POST", "/v1/payment_intents/pi_3Stub/confirm"),
        ("GET", "/v1/payment_intents/pi_3Stub"),
    ]


def test_a_processing_intent_is_unknown_until_it_settles(stub):
    server, gateway = stub(
        (200, payment_intent("pi_3Stub", "processing")),
        (200, payment_intent("pi_3Stub", "processing")),
        (200, payment_intent("pi_3Stub", "processing")),
    )

    charge = gateway.charge(request_for(new_intent_id(), ref="pi_3Stub"))
    lookup = gateway.retrieve("pi_3Stub")
    cancel = gateway.cancel("pi_3Stub")

    assert (charge.outcome, charge.detail) == (ChargeOutcome.UNKNOWN, "processing")
    assert (lookup.status, lookup.detail) == (IntentStatus.UNKNOWN, "processing")
    assert (cancel.outcome, cancel.detail) == (CancelOutcome.UNKNOWN, "processing")


def _succeeded(pi_id: str = "pi_3Stub") -> dict[str, Any]:
    return payment_intent(
        pi_id,
        "succeeded",
        latest_charge={
            "id": "ch_3Stub",
            "object": "charge",
            "status": "succeeded",
            "amount": 4200,
            "refunded": False,
            "created": 1_760_000_000,
        },
    )


def _refunds(*refunds: dict[str, Any]) -> dict[str, Any]:
    return {"object": "list", "url": "/v1/refunds", "has_more": False, "data": list(refunds)}


def _refund(status: str, amount: int = 4200) -> dict[str, Any]:
    return {"id": "re_3Stub", "object": "refund", "amount": amount, "status": status}


def test_a_pending_refund_is_not_yet_done_and_is_not_made_again(stub):
    server, gateway = stub((200, _succeeded()), (200, _refunds(_refund("pending"))))

    result = gateway.refund("pi_3Stub", idempotency_key="k")

    assert (result.outcome, result.detail) == (RefundOutcome.UNKNOWN, "refund_pending")
    assert [a.method for a in server.asked] == ["GET", "GET"]  # no POST /v1/refunds


@pytest.mark.parametrize(
    ("status", "outcome", "detail"),
    [
        ("succeeded", RefundOutcome.REFUNDED, ""),
        ("pending", RefundOutcome.UNKNOWN, "refund_pending"),
        ("failed", RefundOutcome.UNKNOWN, "refund_failed"),
    ],
)
def test_a_new_refund_reads_as_its_status(stub, status, outcome, detail):
    server, gateway = stub(
        (200, _succeeded()),
        (200, _refunds(_refund("failed"))),  # a failed one does not count
        (200, _refund(status)),
    )

    result = gateway.refund("pi_3Stub", idempotency_key="pi_R1:refund")

    assert (result.outcome, result.detail) == (outcome, detail)
    made = server.asked[-1]
    assert (made.method, made.path) == ("POST", "/v1/refunds")
    assert made.form["payment_intent"] == ["pi_3Stub"]
    assert made.headers["idempotency-key"] == "pi_R1:refund"


def test_our_intent_id_is_searched_for_by_its_metadata(stub):
    intent_id = new_intent_id()
    missing = stripe_error(
        "invalid_request_error", "No such payment_intent", code="resource_missing"
    )
    found = {
        "object": "search_result",
        "url": "/v1/payment_intents/search",
        "has_more": False,
        "next_page": None,
        "data": [_succeeded("pi_3Found")],
    }
    server, gateway = stub((404, missing), (200, found))

    lookup = gateway.retrieve(intent_id)

    assert (lookup.status, lookup.processor_ref) == (IntentStatus.SUCCEEDED, "pi_3Found")
    search = server.asked[1]
    assert (search.method, search.path) == ("GET", "/v1/payment_intents/search")
    assert search.query["query"] == [f"metadata['intent_id']:'{intent_id}'"]
