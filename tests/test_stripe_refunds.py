"""Refunds of a part (or all) of a charge by the Stripe adapter: against a
real localstripe, through a fault proxy for lost answers, and against a stub
for the answers localstripe cannot give (docs/stripe.md, "Refunds").

localstripe refunds any amount, more than the charge included; Stripe
refuses one over what is left. :class:`StripeRefundLimits` (the one place
this file stands in for Stripe) answers those refusals as Stripe does."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import transaction

from payments.guards import NetworkCallInTransaction
from payments.interface import (
    ChargeOutcome,
    ChargeRequest,
    CreateOutcome,
    GatewayRefund,
    GatewayUnavailable,
    IntentStatus,
    RefundOutcome,
    RefundRequest,
    RefundState,
)
from payments.stripe.adapter import API_VERSION, StripePaymentGateway

from .stripe_harness import (  # noqa: F401 - the fixtures, used by name
    CARD_VISA,
    FaultProxy,
    Localstripe,
    StubStripe,
    _Answer,
    gateway_at,
    localstripe,
    localstripe_url,
    payment_intent,
    stripe_error,
    stub_fixture,
)

# The stripe library hands httpx its form as ``data=<str>``, which httpx
# deprecates (the library's doing, not ours).
pytestmark = pytest.mark.filterwarnings(
    "ignore:Use 'content=<...>' to upload raw bytes/text content.:DeprecationWarning"
)

CHARGED = 4200


# --- Stripe's refund limits, which localstripe lacks ---------------------------------


class StripeRefundLimits(FaultProxy):
    """The fault proxy, answering ``POST /v1/refunds`` as Stripe does where
    localstripe does not: an amount over what is left of the charge is
    refused (400, ``param: amount``, no code, Stripe's message), and any
    refund of a charge refunded in full too (400 ``charge_already_refunded``).
    Everything else reaches localstripe."""

    def _forward(self, method: str, target: str, headers: dict[str, str], body: bytes) -> _Answer:
        if method == "POST" and urlsplit(target).path == "/v1/refunds":
            refusal = self._refusal(headers, parse_qs(body.decode()))
            if refusal is not None:
                return refusal
        return super()._forward(method, target, headers, body)

    def _refusal(self, headers: dict[str, str], form: dict[str, list[str]]) -> _Answer | None:
        pi_id = form.get("payment_intent", [""])[0]
        asked = {k: v for k, v in headers.items() if k.lower() in ("authorization",)}
        pi = json.loads(super()._forward("GET", f"/v1/payment_intents/{pi_id}", asked, b"").body)
        charge = pi.get("latest_charge")
        if not isinstance(charge, dict) or charge.get("status") != "succeeded":
            return None  # not this class's business: localstripe answers
        left = charge["amount"] - charge.get("amount_refunded", 0)
        amount = int(form.get("amount", [str(left)])[0])
        if left <= 0:
            error = stripe_error(
                "invalid_request_error",
                f"Charge {charge['id']} has already been refunded.",
                code="charge_already_refunded",
            )
        elif amount > left:
            error = stripe_error(
                "invalid_request_error",
                f"Refund amount ({amount}) is greater than unrefunded amount on charge ({left})",
                param="amount",
            )
        else:
            return None
        return _Answer(400, "application/json", json.dumps(error).encode())


@pytest.fixture
def proxy(localstripe_url: str) -> Iterator[StripeRefundLimits]:  # noqa: F811
    made = StripeRefundLimits(localstripe_url)
    yield made
    made.close()


@pytest.fixture
def gw(proxy: StripeRefundLimits) -> Iterator[StripePaymentGateway]:
    gateway = gateway_at(proxy.url)
    yield gateway
    gateway.close()


# --- helpers ------------------------------------------------------------------------


def new_intent_id() -> str:
    return f"pi_R{uuid.uuid4().hex[:12].upper()}1F"


def charged(gateway: StripePaymentGateway, intent_id: str) -> str:
    """A PaymentIntent of ``intent_id``, charged CHARGED: its id."""
    request = ChargeRequest(
        intent_id=intent_id, amount=CHARGED, currency="EUR", payment_method=CARD_VISA
    )
    made = gateway.create(request)
    assert made.outcome == CreateOutcome.CREATED, made
    paid = gateway.charge(
        ChargeRequest(
            intent_id=intent_id,
            amount=CHARGED,
            currency="EUR",
            payment_method=CARD_VISA,
            processor_ref=made.processor_ref,
        )
    )
    assert paid.outcome == ChargeOutcome.SUCCEEDED, paid
    return made.processor_ref


def ask(ref: str, amount: int, *, intent_id: str = "", refund_id: str = "", re: str = ""):
    return RefundRequest(
        refund_id=refund_id or str(uuid.uuid4()),
        intent_ref=ref,
        intent_id=intent_id or "pi_Rintent",
        amount=amount,
        currency="EUR",
        processor_ref=re,
    )


def amounts(api: Localstripe, ref: str) -> list[int]:
    return sorted(r["amount"] for r in api.refunds_of(ref))


# --- against localstripe ------------------------------------------------------------


def test_a_part_then_the_rest_are_refunded_and_found_by_either_id(gw, localstripe):  # noqa: F811
    intent_id = new_intent_id()
    ref = charged(gw, intent_id)
    part = ask(ref, 1000, intent_id=intent_id)

    made = gw.create_refund(part)

    assert made.state == RefundState.SUCCEEDED and made.processor_ref.startswith("re_")
    [held] = localstripe.refunds_of(ref)
    assert (held["id"], held["amount"]) == (made.processor_ref, 1000)
    assert held["metadata"] == {"refund_id": part.refund_id, "intent_id": intent_id}
    assert gw.retrieve(ref).status == IntentStatus.SUCCEEDED  # a part only
    by_ref = gw.retrieve_refund(ask(ref, 1000, refund_id=part.refund_id, re=made.processor_ref))
    by_ours = gw.retrieve_refund(part)
    assert (by_ref.state, by_ref.processor_ref) == (RefundState.SUCCEEDED, made.processor_ref)
    assert (by_ours.state, by_ours.processor_ref) == (RefundState.SUCCEEDED, made.processor_ref)

    rest = ask(ref, CHARGED - 1000, intent_id=intent_id)
    rest_made = gw.create_refund(rest)

    assert rest_made.state == RefundState.SUCCEEDED
    assert gw.retrieve(ref).status == IntentStatus.REFUNDED
    assert sorted(gw.list_refunds(ref), key=lambda r: r.amount) == [
        GatewayRefund(made.processor_ref, part.refund_id, 1000, "succeeded"),
        GatewayRefund(rest_made.processor_ref, rest.refund_id, CHARGED - 1000, "succeeded"),
    ]
    [charge] = gw.list_charges(ref)
    assert charge.status == "refunded"


def test_a_whole_refund_in_one(gw, localstripe):  # noqa: F811
    ref = charged(gw, new_intent_id())

    made = gw.create_refund(ask(ref, CHARGED))

    assert made.state == RefundState.SUCCEEDED
    assert amounts(localstripe, ref) == [CHARGED]
    assert gw.retrieve(ref).status == IntentStatus.REFUNDED


def test_more_than_is_left_is_failed_and_refunds_nothing(gw, localstripe):  # noqa: F811
    ref = charged(gw, new_intent_id())
    gw.create_refund(ask(ref, 1000))

    over = gw.create_refund(ask(ref, CHARGED))

    assert (over.state, over.detail, over.processor_ref) == (
        RefundState.FAILED,
        "amount_too_large",
        "",
    )
    assert amounts(localstripe, ref) == [1000]
    gw.create_refund(ask(ref, CHARGED - 1000))
    again = gw.create_refund(ask(ref, 1))
    assert (again.state, again.detail) == (RefundState.FAILED, "charge_already_refunded")
    assert amounts(localstripe, ref) == [1000, CHARGED - 1000]


def test_the_whole_charge_refund_after_a_part_refunds_only_the_rest(gw, localstripe):  # noqa: F811
    intent_id = new_intent_id()
    ref = charged(gw, intent_id)
    gw.create_refund(ask(ref, 1000))

    result = gw.refund(ref, idempotency_key=f"{intent_id}:refund")

    assert result.outcome == RefundOutcome.REFUNDED
    assert amounts(localstripe, ref) == [1000, CHARGED - 1000]


def test_a_refund_nobody_made_is_not_found(gw):
    ref = charged(gw, new_intent_id())
    gw.create_refund(ask(ref, 1000))

    assert gw.retrieve_refund(ask(ref, 1000)).state == RefundState.NOT_FOUND
    assert gw.retrieve_refund(ask(ref, 1000, re="re_NoSuchRefund")).state == RefundState.NOT_FOUND


def test_an_intent_without_a_charge_holds_no_refunds(gw):
    never_charged = gw.create(
        ChargeRequest(
            intent_id=new_intent_id(), amount=CHARGED, currency="EUR", payment_method=CARD_VISA
        )
    ).processor_ref

    assert gw.list_refunds(never_charged) == []
    assert gw.list_refunds(new_intent_id()) == []  # Stripe knows no such intent
    assert gw.retrieve_refund(ask(never_charged, 100)).state == RefundState.NOT_FOUND


def test_refunds_are_found_by_our_intent_id_too(gw):
    intent_id = new_intent_id()
    ref = charged(gw, intent_id)
    part = ask(ref, 1000, intent_id=intent_id)
    made = gw.create_refund(part)

    by_ours = ask(intent_id, 1000, intent_id=intent_id, refund_id=part.refund_id)

    assert gw.retrieve_refund(by_ours).processor_ref == made.processor_ref
    assert [r.id for r in gw.list_refunds(intent_id)] == [made.processor_ref]


# --- lost answers, through the fault proxy --------------------------------------------


def test_a_lost_answer_is_unknown_and_the_look_up_finds_the_refund(
    gw,
    proxy,
    localstripe,  # noqa: F811
):
    intent_id = new_intent_id()
    ref = charged(gw, intent_id)
    request = ask(ref, 1000, intent_id=intent_id)
    proxy.fault("POST", r"/v1/refunds", "drop")

    lost = gw.create_refund(request)

    assert (lost.state, lost.detail) == (RefundState.UNKNOWN, "connection_error")
    [landed] = localstripe.refunds_of(ref)  # it reached Stripe
    found = gw.retrieve_refund(request)
    assert (found.state, found.processor_ref) == (RefundState.SUCCEEDED, landed["id"])


@pytest.mark.parametrize(
    ("fault", "detail", "landed"), [("delay", "timeout", 1), ("error500", "http_500", 0)]
)
def test_a_refund_without_a_usable_answer_is_unknown(
    gw,
    proxy,
    localstripe,  # noqa: F811
    fault,
    detail,
    landed,
):
    ref = charged(gw, new_intent_id())
    request = ask(ref, 1000)
    proxy.fault("POST", r"/v1/refunds", fault)

    result = gw.create_refund(request)

    assert (result.state, result.detail) == (RefundState.UNKNOWN, detail)
    assert len(localstripe.refunds_of(ref)) == landed
    expected = RefundState.SUCCEEDED if landed else RefundState.NOT_FOUND
    assert gw.retrieve_refund(request).state == expected


def test_look_ups_without_an_answer_are_unknown_and_a_list_raises(gw, proxy):
    ref = charged(gw, new_intent_id())
    made = gw.create_refund(ask(ref, 1000))
    proxy.fault("GET", r"/v1/refunds/re_\w+", "error500")
    proxy.fault("GET", r"/v1/refunds", "delay", call=None)

    by_ref = gw.retrieve_refund(ask(ref, 1000, re=made.processor_ref))
    by_ours = gw.retrieve_refund(ask(ref, 1000))

    assert (by_ref.state, by_ref.detail) == (RefundState.UNKNOWN, "http_500")
    assert (by_ours.state, by_ours.detail) == (RefundState.UNKNOWN, "timeout")
    with pytest.raises(GatewayUnavailable, match="list refunds: timeout"):
        gw.list_refunds(ref)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "call",
    [
        lambda gw: gw.create_refund(ask("pi_x", 1)),
        lambda gw: gw.retrieve_refund(ask("pi_x", 1)),
        lambda gw: gw.list_refunds("pi_x"),
    ],
)
def test_no_refund_call_inside_a_transaction(gw, proxy, call):
    with transaction.atomic(), pytest.raises(NetworkCallInTransaction):
        call(gw)

    assert proxy.exchanges == []


# --- what localstripe cannot say: a stub ------------------------------------------------


def _refund(status: str, re: str = "re_3Stub", **fields: Any) -> dict[str, Any]:
    return {
        "id": re,
        "object": "refund",
        "amount": 1000,
        "currency": "eur",
        "status": status,
        "payment_intent": "pi_3Stub",
        "metadata": {},
        **fields,
    }


def _page(*refunds: dict[str, Any], has_more: bool = False) -> dict[str, Any]:
    return {"object": "list", "url": "/v1/refunds", "has_more": has_more, "data": list(refunds)}


def _charged_pi() -> dict[str, Any]:
    return payment_intent(
        "pi_3Stub",
        "succeeded",
        latest_charge={
            "id": "ch_3Stub",
            "object": "charge",
            "status": "succeeded",
            "amount": CHARGED,
            "refunded": False,
            "created": 1_760_000_000,
        },
    )


def test_the_create_names_the_intent_the_amount_our_ids_and_our_key(stub):
    server, gateway = stub((200, _refund("succeeded")))
    request = ask("pi_3Stub", 1000, intent_id="pi_Rours")

    made = gateway.create_refund(request)

    assert (made.state, made.processor_ref) == (RefundState.SUCCEEDED, "re_3Stub")
    [asked] = server.asked
    assert (asked.method, asked.path) == ("POST", "/v1/refunds")
    assert asked.form["payment_intent"] == ["pi_3Stub"]
    assert asked.form["amount"] == ["1000"]
    assert asked.form["metadata[refund_id]"] == [request.refund_id]
    assert asked.form["metadata[intent_id]"] == ["pi_Rours"]
    assert asked.headers["idempotency-key"] == f"refund:{request.refund_id}"
    assert asked.headers["stripe-version"] == API_VERSION


@pytest.mark.parametrize(
    ("refund", "state", "detail"),
    [
        (_refund("succeeded"), RefundState.SUCCEEDED, ""),
        (_refund("pending"), RefundState.PENDING, ""),
        (_refund("requires_action"), RefundState.PENDING, "requires_action"),
        (
            _refund("failed", failure_reason="expired_or_canceled_card"),
            RefundState.FAILED,
            "expired_or_canceled_card",
        ),
        (_refund("failed"), RefundState.FAILED, "failed"),
        (_refund("canceled"), RefundState.FAILED, "canceled"),
        (_refund("something_new"), RefundState.UNKNOWN, "refund_something_new"),
    ],
)
def test_a_refund_reads_as_its_status(stub, refund, state, detail):
    server, gateway = stub((200, refund), (200, refund))

    made = gateway.create_refund(ask("pi_3Stub", 1000))
    found = gateway.retrieve_refund(ask("pi_3Stub", 1000, re="re_3Stub"))

    assert (made.state, made.detail, made.processor_ref) == (state, detail, "re_3Stub")
    assert (found.state, found.detail) == (state, detail)
    assert (server.asked[1].method, server.asked[1].path) == ("GET", "/v1/refunds/re_3Stub")


IN_USE = stripe_error(
    "invalid_request_error",
    "There is currently another in-progress request using this Idempotent Key.",
    code="idempotency_key_in_use",
)


@pytest.mark.parametrize(
    ("status", "body", "state", "detail"),
    [
        (
            400,
            stripe_error("invalid_request_error", "Refund amount…", code="amount_too_large"),
            RefundState.FAILED,
            "amount_too_large",
        ),
        (
            400,
            stripe_error("invalid_request_error", "Refund amount…", param="amount"),
            RefundState.FAILED,
            "amount_too_large",
        ),
        (
            400,
            stripe_error("invalid_request_error", "Charge…", code="charge_already_refunded"),
            RefundState.FAILED,
            "charge_already_refunded",
        ),
        (
            400,
            stripe_error(
                "invalid_request_error", "No such payment_intent", code="resource_missing"
            ),
            RefundState.FAILED,
            "resource_missing",
        ),
        (409, IN_USE, RefundState.UNKNOWN, "idempotency_key_in_use"),
        (
            400,
            stripe_error("idempotency_error", "Keys for idempotent requests…"),
            RefundState.UNKNOWN,
            "idempotency_error",
        ),
        (
            429,
            stripe_error("invalid_request_error", "Too many requests"),
            RefundState.UNKNOWN,
            "rate_limited",
        ),
        (
            401,
            stripe_error("invalid_request_error", "Invalid API Key"),
            RefundState.UNKNOWN,
            "authentication_error",
        ),
        (503, stripe_error("api_error", "Service unavailable"), RefundState.UNKNOWN, "http_503"),
    ],
)
def test_a_refused_or_doubtful_create(stub, status, body, state, detail):
    server, gateway = stub((status, body))

    made = gateway.create_refund(ask("pi_3Stub", 1000))

    assert (made.state, made.detail) == (state, detail)
    assert len(server.asked) == 1  # the library never retries on its own


def test_a_look_up_by_a_refund_id_stripe_does_not_know_is_not_found(stub):
    missing = stripe_error("invalid_request_error", "No such refund", code="resource_missing")
    server, gateway = stub((404, missing))

    found = gateway.retrieve_refund(ask("pi_3Stub", 1000, re="re_gone"))

    assert (found.state, found.processor_ref) == (RefundState.NOT_FOUND, "")


def test_a_look_up_by_our_id_reads_every_page_of_the_intents_refunds(stub):
    request = ask("pi_3Stub", 1000)
    ours = _refund("pending", re="re_ours", metadata={"refund_id": request.refund_id})
    server, gateway = stub(
        (200, _charged_pi()),
        (200, _page(_refund("succeeded", re="re_other"), has_more=True)),
        (200, _page(ours)),
    )

    found = gateway.retrieve_refund(request)

    assert (found.state, found.processor_ref) == (RefundState.PENDING, "re_ours")
    get_pi, first, second = server.asked
    assert (get_pi.path, first.path, second.path) == (
        "/v1/payment_intents/pi_3Stub",
        "/v1/refunds",
        "/v1/refunds",
    )
    assert first.query["payment_intent"] == ["pi_3Stub"] and first.query["limit"] == ["100"]
    assert second.query["starting_after"] == ["re_other"]


def test_the_list_shows_every_refund_with_its_status_and_our_id(stub):
    server, gateway = stub(
        (200, _charged_pi()),
        (
            200,
            _page(
                _refund("requires_action", re="re_1", metadata={"refund_id": "r1"}),
                _refund("canceled", re="re_2", metadata={"refund_id": "r2"}),
                _refund("succeeded", re="re_3"),  # made in Stripe's dashboard
            ),
        ),
    )

    assert gateway.list_refunds("pi_3Stub") == [
        GatewayRefund("re_1", "r1", 1000, "pending"),
        GatewayRefund("re_2", "r2", 1000, "failed"),
        GatewayRefund("re_3", "", 1000, "succeeded"),
    ]
