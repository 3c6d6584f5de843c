"""Why a refund is refused: each maps to one API answer (docs/api.md,
"Money back: refunds and cancellations")."""

from __future__ import annotations

from ..errors import DomainError


class RefundError(DomainError):
    code = "refund_refused"
    status = 409
    field = ""


class NotRefundable(RefundError):
    """Only a confirmed purchase has money to give back."""

    code = "not_refundable"

    def __init__(self, state: str):
        super().__init__(f"a purchase in {state} has nothing to refund")
        self.state = state


class RefundExceedsPaid(RefundError):
    code = "refund_exceeds_paid"

    def __init__(self, refundable: int, currency: str):
        super().__init__(f"at most {refundable} is left to refund")
        self.refundable = refundable
        self.currency = currency


class CancellationNotAllowed(RefundError):
    code = "cancellation_not_allowed"


class InvalidRefund(RefundError):
    """A bad field (``400 invalid`` naming it)."""

    code = "invalid"
    status = 400

    def __init__(self, field: str, detail: str):
        super().__init__(detail)
        self.field = field


class RefundKeyReused(RefundError):
    """The request's Idempotency-Key made another refund already."""

    code = "idempotency_key_reused"
    status = 422


class EventAlreadyCancelled(RefundError):
    code = "event_cancelled"
