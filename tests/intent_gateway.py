"""An in-process processor whose intents are its own objects, shaped like
Stripe's PaymentIntents (``pi_…`` ids, metadata, create then confirm,
``requires_action`` for 3-D Secure), for the saga's unit tests.

It is a stand-in for an external processor, not for our database: the
Stripe adapter itself is proven against localstripe (tests/test_stripe_*).
What it adds is control: a hook at the moment of each call, and answers
that never arrive although the processor acted (``lose``), so a test can put
the hold's expiry exactly inside a create, or lose a create's answer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from payments.guards import assert_no_transaction
from payments.interface import (
    CancelOutcome,
    CancelResult,
    ChargeOutcome,
    ChargeRequest,
    ChargeResult,
    CreateOutcome,
    CreateResult,
    GatewayCharge,
    GatewayRefund,
    IntentLookup,
    IntentStatus,
    RefundAnswer,
    RefundOutcome,
    RefundRequest,
    RefundResult,
    RefundState,
)

# Payment methods: this one asks for authentication, this one is declined
# at the charge, this one cannot be used at all (refused at the create).
THREE_D_SECURE = "pm_card_threeDSecure2Required"
DECLINED = "pm_card_chargeDeclined"
UNUSABLE = "pm_does_not_exist"


@dataclass
class Refund:
    id: str  # re_…
    refund_id: str  # ours ("" for the whole-charge refund)
    amount: int
    status: str = "succeeded"


@dataclass
class Intent:
    id: str
    intent_id: str
    amount: int
    payment_method: str
    status: str = "requires_confirmation"
    charge: str | None = None
    refunded: bool = False
    failure: str = ""
    client_secret: str = ""
    metadata: dict = field(default_factory=dict)
    refunds: list[Refund] = field(default_factory=list)

    @property
    def left_to_refund(self) -> int:
        return self.amount - sum(r.amount for r in self.refunds if r.status != "failed")


class InProcessIntentGateway:
    creates_intent = True
    # As Stripe's search: 0 here unless a test says otherwise (``hide``).
    search_settles_seconds = 0

    def __init__(self) -> None:
        self.intents: dict[str, Intent] = {}
        self.calls: list[tuple[str, str]] = []
        # method -> hook(ref) run before the processor acts
        self.before: dict[str, Callable[[str], None]] = {}
        # method -> how many upcoming answers are lost after the processor acted
        self.lose: dict[str, int] = {}
        self.hidden: dict[str, Intent] = {}
        self._ids = itertools.count(1)

    # --- what a test does as the buyer or the processor ---------------------------

    def authenticate(self, ref: str, *, success: bool) -> None:
        """The buyer's 3-D Secure, completed in the browser."""
        pi = self.intents[ref]
        assert pi.status == "requires_action", pi.status
        if success:
            pi.status, pi.charge = "succeeded", f"ch_{pi.id[3:]}"
        else:
            pi.status, pi.failure = "requires_payment_method", "authentication_failure"

    def of(self, intent_id: str) -> list[Intent]:
        return [pi for pi in self.intents.values() if pi.intent_id == intent_id]

    def hide(self, ref: str) -> Intent:
        """Keep an intent out of look-ups by our intent id (a search that has
        not caught up yet); ``show`` puts it back."""
        self.hidden[ref] = self.intents[ref]
        return self.hidden[ref]

    def show(self, pi: Intent) -> None:
        self.hidden.pop(pi.id, None)

    # --- the port -------------------------------------------------------------------

    def create(self, request: ChargeRequest) -> CreateResult:
        self._called("create", request.intent_id)
        if request.payment_method == UNUSABLE:
            return CreateResult(CreateOutcome.DECLINED, detail="resource_missing")
        pi = Intent(
            id=f"pi_{next(self._ids):06d}",
            intent_id=request.intent_id,
            amount=request.amount,
            payment_method=request.payment_method,
            metadata={"purchase_id": request.purchase_id, "reservation": request.reservation},
        )
        pi.client_secret = f"{pi.id}_secret_x"
        self.intents[pi.id] = pi
        if self._lost("create"):
            return CreateResult(CreateOutcome.UNKNOWN, detail="timeout")
        return CreateResult(CreateOutcome.CREATED, processor_ref=pi.id)

    def charge(self, request: ChargeRequest) -> ChargeResult:
        self._called("charge", request.processor_ref)
        pi = self.intents[request.processor_ref]
        if pi.status == "requires_confirmation":
            if pi.payment_method == THREE_D_SECURE:
                pi.status = "requires_action"
            elif pi.payment_method == DECLINED:
                pi.status, pi.failure = "requires_payment_method", "card_declined"
            else:
                pi.status, pi.charge = "succeeded", f"ch_{pi.id[3:]}"
        if self._lost("charge"):
            return ChargeResult(ChargeOutcome.UNKNOWN, detail="timeout")
        if pi.status == "succeeded":
            return ChargeResult(ChargeOutcome.SUCCEEDED, charge_id=pi.charge)
        if pi.status == "requires_action":
            return ChargeResult(ChargeOutcome.REQUIRES_ACTION, action_secret=pi.client_secret)
        return ChargeResult(ChargeOutcome.DECLINED, detail=pi.failure)

    def retrieve(self, ref: str) -> IntentLookup:
        self._called("retrieve", ref)
        pi = self._find(ref)
        if self._lost("retrieve"):
            return IntentLookup(IntentStatus.UNKNOWN, detail="timeout")
        if pi is None:
            return IntentLookup(IntentStatus.NOT_FOUND)
        status = {
            "succeeded": IntentStatus.REFUNDED if pi.refunded else IntentStatus.SUCCEEDED,
            "requires_confirmation": IntentStatus.REQUIRES_PAYMENT,
            "requires_action": IntentStatus.REQUIRES_ACTION,
            "requires_payment_method": IntentStatus.DECLINED,
            "canceled": IntentStatus.CANCELED,
        }[pi.status]
        return IntentLookup(
            status,
            detail=pi.failure,
            charge_id=pi.charge,
            processor_ref=pi.id if ref != pi.id else "",
            action_secret=pi.client_secret if pi.status == "requires_action" else "",
        )

    def cancel(self, ref: str) -> CancelResult:
        self._called("cancel", ref)
        pi = self._find(ref)
        if pi is not None and pi.status == "succeeded":
            return CancelResult(CancelOutcome.ALREADY_CHARGED, charge_id=pi.charge)
        if pi is not None:
            pi.status = "canceled"
        if self._lost("cancel"):
            return CancelResult(CancelOutcome.UNKNOWN, detail="timeout")
        # As the Stripe adapter says it: nothing found is "canceled", not_found.
        return CancelResult(CancelOutcome.CANCELED, detail="" if pi else "not_found")

    def refund(self, ref: str, *, idempotency_key: str) -> RefundResult:
        self._called("refund", ref)
        pi = self._find(ref)
        if pi is None or pi.status != "succeeded":
            return RefundResult(RefundOutcome.NOT_CHARGED)
        if pi.left_to_refund > 0:  # what is left after refunds of parts
            pi.refunds.append(Refund(f"re_{next(self._ids):06d}", "", pi.left_to_refund))
        pi.refunded = True
        return RefundResult(RefundOutcome.REFUNDED)

    def create_refund(self, request: RefundRequest) -> RefundAnswer:
        """As Stripe: refused (FAILED) when the intent holds no charge or
        the amount is more than is left; made again under the same refund
        id, the same refund (Stripe's idempotency)."""
        self._called("create_refund", request.intent_ref)
        pi = self._find(request.intent_ref)
        made = self._refund_named(pi, request.refund_id)
        if pi is None or pi.status != "succeeded":
            answer = RefundAnswer(RefundState.FAILED, detail="not_charged")
        elif made is None and request.amount > pi.left_to_refund:
            answer = RefundAnswer(RefundState.FAILED, detail="amount_too_large")
        else:
            if made is None:
                made = Refund(f"re_{next(self._ids):06d}", request.refund_id, request.amount)
                pi.refunds.append(made)
                pi.refunded = pi.left_to_refund == 0
            answer = RefundAnswer(RefundState(made.status), processor_ref=made.id)
        if self._lost("create_refund"):
            return RefundAnswer(RefundState.UNKNOWN, detail="timeout")
        return answer

    def retrieve_refund(self, request: RefundRequest) -> RefundAnswer:
        self._called("retrieve_refund", request.intent_ref)
        if self._lost("retrieve_refund"):
            return RefundAnswer(RefundState.UNKNOWN, detail="timeout")
        pi = self._find(request.intent_ref)
        made = self._refund_named(pi, request.refund_id, request.processor_ref)
        if made is None:
            return RefundAnswer(RefundState.NOT_FOUND)
        return RefundAnswer(RefundState(made.status), processor_ref=made.id)

    def list_refunds(self, intent_ref: str) -> list[GatewayRefund]:
        self._called("list_refunds", intent_ref)
        pi = self._find(intent_ref)
        return [
            GatewayRefund(id=r.id, refund_id=r.refund_id, amount=r.amount, status=r.status)
            for r in (pi.refunds if pi is not None else [])
        ]

    def list_charges(self, ref: str) -> list[GatewayCharge]:
        self._called("list_charges", ref)
        pi = self._find(ref)
        if pi is None or pi.charge is None:
            return []
        status = "refunded" if pi.refunded else "succeeded"
        return [GatewayCharge(id=pi.charge, amount=pi.amount, status=status, created="")]

    # --- inside -----------------------------------------------------------------------

    def _called(self, method: str, ref: str) -> None:
        assert_no_transaction(method)
        self.calls.append((method, ref))
        hook = self.before.pop(method, None)
        if hook is not None:
            hook(ref)

    def _lost(self, method: str) -> bool:
        if self.lose.get(method, 0) > 0:
            self.lose[method] -= 1
            return True
        return False

    @staticmethod
    def _refund_named(pi: Intent | None, refund_id: str, ref: str = "") -> Refund | None:
        for made in pi.refunds if pi is not None else []:
            if (ref and made.id == ref) or (not ref and made.refund_id == refund_id):
                return made
        return None

    def _find(self, ref: str) -> Intent | None:
        """By the processor's id, or by our intent id (the oldest one)."""
        if ref in self.intents:
            return self.intents[ref]
        found = [pi for pi in self.of(ref) if pi.id not in self.hidden]
        return found[0] if found else None
