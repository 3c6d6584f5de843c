"""The payment gateway port: what the saga may ask a card processor, and the
shapes of the answers. Adapters (HTTP, in-process fake) implement
:class:`PaymentGateway`; nothing else in the code base talks to a processor.

Every call is made *outside* any database transaction (see
``payments.guards.assert_no_transaction``) and every charge carries the saga's
``intent_id`` as its idempotency key.
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


class IntentStatus(enum.StrEnum):
    SUCCEEDED = "succeeded"
    DECLINED = "declined"
    CANCELED = "canceled"
    REFUNDED = "refunded"
    REQUIRES_PAYMENT = "requires_payment"
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


@dataclass(frozen=True)
class ChargeRequest:
    intent_id: str
    amount: int  # minor units
    currency: str  # ISO 4217
    payment_method: str


# Every answer has a ``label``: what it said, normalised and lower-case
# ("succeeded", "not_found", "unknown", ...), as the evidence stores it.


@dataclass(frozen=True)
class ChargeResult:
    outcome: ChargeOutcome
    charge_id: str | None = None
    # A short machine-readable reason ("timeout", "http_503", "declined", ...)
    detail: str = ""
    latency_ms: float = 0.0

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


@dataclass(frozen=True)
class GatewayCharge:
    id: str
    amount: int
    status: str  # "succeeded" | "refunded"
    created: str


class PaymentGateway(Protocol):
    def charge(self, request: ChargeRequest) -> ChargeResult: ...

    def retrieve(self, intent_id: str) -> IntentLookup: ...

    def cancel(self, intent_id: str) -> CancelResult: ...

    def refund(self, intent_id: str, *, idempotency_key: str) -> RefundResult: ...

    def list_charges(self, intent_id: str) -> list[GatewayCharge]: ...
