"""The payment gateway port: what the saga may ask a card processor, and the
shapes of the answers. Adapters (the fake's HTTP, in-process fakes, Stripe)
implement :class:`PaymentGateway`; nothing else in the code base talks to a
processor.

Every call is made *outside* any database transaction (see
``payments.guards.assert_no_transaction``) and every charge carries the saga's
``intent_id`` as (or as the root of) its idempotency key.

An intent is named to the port by a *reference*: the processor's own id of
it once the saga has recorded one (Stripe's ``pi_…``), else the saga's
``intent_id`` (the fake gateway's intents are named by it; a processor that
names its own finds them by the ``intent_id`` in their metadata).

A processor whose intents are its own objects (:class:`IntentCreatingGateway`,
``creates_intent = True``) is asked to ``create`` the intent first, no money
moving; the saga records the reference in a commit, then charges (confirms)
it (docs/design.md, "The saga").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol


class GatewayUnavailable(RuntimeError):
    """The gateway gave no usable answer (timeout, lost connection, 5xx, bad
    body) where the caller needs one: raised by ``list_charges`` only (the
    other calls answer UNKNOWN instead)."""


class ChargeOutcome(enum.StrEnum):
    SUCCEEDED = "SUCCEEDED"
    DECLINED = "DECLINED"
    # Timeout, 5xx, connection lost: the charge may or may not have landed.
    UNKNOWN = "UNKNOWN"
    # The buyer must authenticate (3-D Secure) before any money moves.
    REQUIRES_ACTION = "REQUIRES_ACTION"


class IntentStatus(enum.StrEnum):
    SUCCEEDED = "succeeded"
    DECLINED = "declined"
    CANCELED = "canceled"
    REFUNDED = "refunded"
    REQUIRES_PAYMENT = "requires_payment"
    # Waiting for the buyer's authentication (3-D Secure): nothing charged yet.
    REQUIRES_ACTION = "requires_action"
    NOT_FOUND = "not_found"
    # We could not get an answer (timeout, 5xx, connection lost).
    UNKNOWN = "unknown"


class CancelOutcome(enum.StrEnum):
    CANCELED = "canceled"  # no charge can land on this intent any more
    ALREADY_CHARGED = "already_charged"
    UNKNOWN = "unknown"


class RefundOutcome(enum.StrEnum):
    REFUNDED = "refunded"
    NOT_CHARGED = "not_charged"
    UNKNOWN = "unknown"


class CreateOutcome(enum.StrEnum):
    CREATED = "created"  # the intent exists; nothing is charged
    DECLINED = "declined"  # refused outright (an unusable payment method)
    UNKNOWN = "unknown"  # no usable answer: it may exist


@dataclass(frozen=True)
class ChargeRequest:
    intent_id: str
    amount: int  # minor units
    currency: str  # ISO 4217
    payment_method: str
    # The processor's id of the intent, once recorded ("" before, and always
    # for the fake gateway).
    processor_ref: str = ""
    # For the processor's metadata: the purchase (saga) id and the reservation.
    purchase_id: str = ""
    reservation: str = ""
    # The saga's charge attempt (1-based): a processor whose confirm is keyed
    # per attempt derives the key from it.
    attempt: int = 1


# Every answer has a ``label``: what it said, normalised and lower-case
# ("succeeded", "not_found", "unknown", ...), as the evidence stores it.


@dataclass(frozen=True)
class CreateResult:
    outcome: CreateOutcome
    processor_ref: str = ""  # with CREATED
    detail: str = ""
    latency_ms: float = 0.0

    @property
    def label(self) -> str:
        return self.outcome.value


@dataclass(frozen=True)
class ChargeResult:
    outcome: ChargeOutcome
    charge_id: str | None = None
    # A short machine-readable reason ("timeout", "http_503", "declined", ...)
    detail: str = ""
    latency_ms: float = 0.0
    # With REQUIRES_ACTION: what the buyer's browser completes the
    # authentication with (Stripe's client secret).
    action_secret: str = ""

    @property
    def label(self) -> str:
        return self.outcome.lower()


@dataclass(frozen=True)
class IntentLookup:
    status: IntentStatus
    detail: str = ""
    latency_ms: float = 0.0
    raw: dict = field(default_factory=dict)
    # The processor's reference of the charge it holds, when it names one.
    charge_id: str | None = None
    # The processor's id of the intent it found, when it was asked by our
    # intent id (a create whose answer was lost): the saga records it.
    processor_ref: str = ""
    # With REQUIRES_ACTION: as ChargeResult.action_secret.
    action_secret: str = ""

    @property
    def label(self) -> str:
        return self.status.value


@dataclass(frozen=True)
class CancelResult:
    outcome: CancelOutcome
    detail: str = ""
    latency_ms: float = 0.0
    # With ALREADY_CHARGED: the charge that made the cancel impossible.
    charge_id: str | None = None

    @property
    def label(self) -> str:
        return self.outcome.value


@dataclass(frozen=True)
class RefundResult:
    outcome: RefundOutcome
    detail: str = ""
    latency_ms: float = 0.0

    @property
    def label(self) -> str:
        return self.outcome.value


class RefundState(enum.StrEnum):
    """What the processor says of one refund (a part or the whole of a
    charge), made by :meth:`PaymentGateway.create_refund` or read by
    :meth:`PaymentGateway.retrieve_refund`."""

    SUCCEEDED = "succeeded"  # the money is on its way back
    PENDING = "pending"  # accepted, not settled yet: look it up later
    FAILED = "failed"  # refused, definitively: nothing was refunded
    NOT_FOUND = "not_found"  # (a look-up) no refund was made under this id
    UNKNOWN = "unknown"  # no usable answer: it may or may not exist


@dataclass(frozen=True)
class RefundRequest:
    """One refund of a charged intent, named by our refund row's id: its
    idempotency key at the processor is :attr:`idempotency_key`, so every
    retry of it, from any process, is the same request."""

    refund_id: str  # ours (purchases.models.Refund.pk)
    intent_ref: str  # the saga's gateway_ref (the processor's id, or ours)
    intent_id: str  # the saga's intent id (for the processor's metadata)
    amount: int  # minor units, > 0
    currency: str
    # The processor's id of this refund once recorded (Stripe's re_…), "" before.
    processor_ref: str = ""

    @property
    def idempotency_key(self) -> str:
        return f"refund:{self.refund_id}"


@dataclass(frozen=True)
class RefundAnswer:
    state: RefundState
    processor_ref: str = ""  # the processor's id of the refund, when it names one
    detail: str = ""  # why, for FAILED and UNKNOWN ("amount_too_large", "timeout", ...)
    latency_ms: float = 0.0

    @property
    def label(self) -> str:
        return self.state.value


@dataclass(frozen=True)
class GatewayRefund:
    """A refund the processor holds on an intent (auditors count them)."""

    id: str  # the processor's
    refund_id: str  # ours, from its metadata ("" when made elsewhere)
    amount: int
    status: str  # "succeeded" | "pending" | "failed"


@dataclass(frozen=True)
class GatewayCharge:
    id: str
    amount: int
    status: str  # "succeeded" | "refunded"
    created: str


class PaymentGateway(Protocol):
    """``ref`` below: the intent's reference (the module docstring)."""

    def charge(self, request: ChargeRequest) -> ChargeResult: ...

    def retrieve(self, intent_id: str) -> IntentLookup: ...

    def cancel(self, intent_id: str) -> CancelResult: ...

    def refund(self, intent_id: str, *, idempotency_key: str) -> RefundResult: ...

    def list_charges(self, intent_id: str) -> list[GatewayCharge]: ...

    # Refunds of a part (or all) of a charge, each a row of ours
    # (docs/refunds.md): made once under its key, then only looked up.
    def create_refund(self, request: RefundRequest) -> RefundAnswer: ...

    def retrieve_refund(self, request: RefundRequest) -> RefundAnswer: ...

    def list_refunds(self, intent_ref: str) -> list[GatewayRefund]: ...


class IntentCreatingGateway(PaymentGateway, Protocol):
    """A processor whose intents are its own objects: ``create`` makes one
    (no money moves), keyed by the saga's intent id, and ``charge`` confirms
    the one the saga recorded (``ChargeRequest.processor_ref``)."""

    creates_intent: bool  # True

    def create(self, request: ChargeRequest) -> CreateResult: ...


def creates_intent(gateway: PaymentGateway) -> bool:
    """Whether the saga must ``create`` the intent before charging it."""
    return bool(getattr(gateway, "creates_intent", False))


def calls_concurrently(gateway: PaymentGateway) -> bool:
    """Whether the gateway may be asked from several threads at once (a
    charge burst's calls: purchases/saga/burst.py). Only a gateway that says
    so: the in-process fake, for one, answers on the caller's database
    connection."""
    return bool(getattr(gateway, "concurrent_calls", False))
