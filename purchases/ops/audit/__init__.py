"""The invariant auditor (docs/operations.md, "Management commands"): one module per
family of invariants (``seats``, ``money``, ``emails``, ``liveness``,
``webhooks``), run in chunks by ``run``."""

from .emails import CANCELLATION_EMAIL, CONFIRMATION_EMAIL
from .report import (
    CONFIRMED_HAS_ONE_CHARGE_ENTRY,
    EMAILS_EXACTLY_ONCE,
    FINDINGS,
    INVARIANTS,
    LEDGER_EQUALS_GATEWAY,
    NO_SILENT_STUCK,
    ONE_CHARGE_PER_INTENT,
    OVERRIDE_AGREES_WITH_GATEWAY,
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
    "CONFIRMATION_EMAIL",
    "CONFIRMED_HAS_ONE_CHARGE_ENTRY",
    "EMAILS_EXACTLY_ONCE",
    "FINDINGS",
    "INVARIANTS",
    "LEDGER_EQUALS_GATEWAY",
    "NO_SILENT_STUCK",
    "ONE_CHARGE_PER_INTENT",
    "OVERRIDE_AGREES_WITH_GATEWAY",
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
