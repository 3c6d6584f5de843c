"""What the auditor reports: the invariants by name, violations, intents it
could not verify, findings, and the run's report."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime

# --- invariant names (used in output, in AuditRun.report and in tests) ----------

SEAT_SOLD_ONCE = "seat_sold_once"
ONE_CHARGE_PER_INTENT = "one_charge_per_intent"
LEDGER_EQUALS_GATEWAY = "ledger_equals_gateway"
CONFIRMED_HAS_ONE_CHARGE_ENTRY = "confirmed_has_one_charge_entry"
EMAILS_EXACTLY_ONCE = "emails_exactly_once"
NO_SILENT_STUCK = "no_silent_stuck"
UNKNOWN_NEVER_COMPENSATED_BLIND = "unknown_never_compensated_blind"
# Money an operator wrote while the gateway could not be asked must match the
# gateway's records once it can be.
OVERRIDE_AGREES_WITH_GATEWAY = "override_agrees_with_gateway"
# Outgoing webhooks (docs/api.md, "Webhooks"): a finished saga owes each
# endpoint subscribed when it ended one delivery of the type its end calls
# for, and no delivery announces another end.
WEBHOOK_MISSING = "webhook_missing"
WEBHOOK_CONTRADICTS = "webhook_contradicts"
# The seller's report of an event (docs/api.md, "Sales and reports") equals
# the ledger: purchases/ops/audit/event_reports.py.
REPORT_EQUALS_LEDGER = "report_equals_ledger"
# Money back to a confirmed purchase (docs/refunds.md; purchases/ops/audit/refunds.py):
# the ledger's refund entries are its succeeded refund rows', once each; its
# refunds never give back more than was paid; the processor holds at most one
# refund per refund id of ours; a cancelled event's purchases net zero.
REFUND_ENTRY_MISMATCH = "refund_entry_mismatch"
REFUND_EXCEEDS_CHARGE = "refund_exceeds_charge"
REFUND_TWICE_AT_PROCESSOR = "refund_twice_at_processor"
CANCELLED_EVENT_NOT_REFUNDED = "cancelled_event_not_refunded"

# --- finding names: reported, not violations ------------------------------------

# A delivery that ran out of attempts: its own alert (``webhook_failed``) was
# raised when the schedule ran out; the audit lists it until someone resends it.
WEBHOOK_FAILED = "webhook_failed"

INVARIANTS = (
    SEAT_SOLD_ONCE,
    ONE_CHARGE_PER_INTENT,
    LEDGER_EQUALS_GATEWAY,
    CONFIRMED_HAS_ONE_CHARGE_ENTRY,
    EMAILS_EXACTLY_ONCE,
    NO_SILENT_STUCK,
    UNKNOWN_NEVER_COMPENSATED_BLIND,
    OVERRIDE_AGREES_WITH_GATEWAY,
    WEBHOOK_MISSING,
    WEBHOOK_CONTRADICTS,
    REPORT_EQUALS_LEDGER,
    REFUND_ENTRY_MISMATCH,
    REFUND_EXCEEDS_CHARGE,
    REFUND_TWICE_AT_PROCESSOR,
    CANCELLED_EVENT_NOT_REFUNDED,
)
FINDINGS = (WEBHOOK_FAILED,)


@dataclass(frozen=True)
class Violation:
    invariant: str
    saga_id: str | None
    intent_id: str | None
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Unverified:
    """An intent whose money the audit could not check: the gateway gave no
    answer. Not a violation (nothing is known to be wrong); it makes the run
    incomplete."""

    saga_id: str | None
    intent_id: str
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Finding:
    """Something an operator should know that breaks no invariant (it was
    alerted on when it happened): listed by the run, not counted as a
    violation."""

    name: str
    saga_id: str | None
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class AuditReport:
    started_at: datetime
    finished_at: datetime | None = None
    sagas_checked: int = 0
    # Moved while the auditor looked at them; checked by the next run.
    sagas_skipped: int = 0
    # list_charges calls made (one per intent; list_refunds follows one that
    # found money captured).
    intents_checked: int = 0
    violations: list[Violation] = field(default_factory=list)
    unverified: list[Unverified] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    # Where the gateway was asked (its base URL), for "could not check".
    gateway_url: str = ""
    run_id: int | None = None

    @property
    def counts(self) -> dict[str, int]:
        found = Counter(v.invariant for v in self.violations)
        return {name: found.get(name, 0) for name in INVARIANTS}

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def complete(self) -> bool:
        return not self.unverified

    def as_dict(self) -> dict:
        return {
            "run_id": self.run_id,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "sagas_checked": self.sagas_checked,
            "sagas_skipped": self.sagas_skipped,
            "intents_checked": self.intents_checked,
            "counts": self.counts,
            "violations": [v.as_dict() for v in self.violations],
            "complete": self.complete,
            "gateway_url": self.gateway_url,
            "unverified": [u.as_dict() for u in self.unverified],
            "findings": [f.as_dict() for f in self.findings],
        }
