"""The invariant auditor (docs/operations.md, "Management commands"): one module per
family of invariants (``seats``, ``money``, ``refunds``, ``cancelled_events``,
``emails``, ``liveness``, ``webhooks``, ``event_reports``), run in chunks by
``run``."""

from .emails import CANCELLATION_EMAIL, CONFIRMATION_EMAIL
from .report import (
    CANCELLED_EVENT_NOT_REFUNDED,
    CONFIRMED_HAS_ONE_CHARGE_ENTRY,
    EMAILS_EXACTLY_ONCE,
    FINDINGS,
    INVARIANTS,
    LEDGER_EQUALS_GATEWAY,
    NO_SILENT_STUCK,
    ONE_CHARGE_PER_INTENT,
    OVERRIDE_AGREES_WITH_GATEWAY,
    REFUND_ENTRY_MISMATCH,
    REFUND_EXCEEDS_CHARGE,
    REFUND_TWICE_AT_PROCESSOR,
    SEAT_SOLD_ONCE,
    UNKNOWN_NEVER_COMPENSATED_BLIND,
    WEBHOOK_CONTRADICTS,
    WEBHOOK_FAILED,
    WEBHOOK_MISSING,
    AuditReport,
    Finding,
    Unverified,
    Violation,
)
from .run import audit_run

__all__ = [
    "CANCELLATION_EMAIL",
    "CANCELLED_EVENT_NOT_REFUNDED",
    "CONFIRMATION_EMAIL",
    "CONFIRMED_HAS_ONE_CHARGE_ENTRY",
    "EMAILS_EXACTLY_ONCE",
    "FINDINGS",
    "INVARIANTS",
    "LEDGER_EQUALS_GATEWAY",
    "NO_SILENT_STUCK",
    "ONE_CHARGE_PER_INTENT",
    "OVERRIDE_AGREES_WITH_GATEWAY",
    "REFUND_ENTRY_MISMATCH",
    "REFUND_EXCEEDS_CHARGE",
    "REFUND_TWICE_AT_PROCESSOR",
    "SEAT_SOLD_ONCE",
    "UNKNOWN_NEVER_COMPENSATED_BLIND",
    "WEBHOOK_CONTRADICTS",
    "WEBHOOK_FAILED",
    "WEBHOOK_MISSING",
    "AuditReport",
    "Finding",
    "Unverified",
    "Violation",
    "audit_run",
]
