"""Operators' verdicts, as saga steps (docs/design.md, "Operators' steps").

The runbook (``purchases/ops/runbook/``) decides whether an operator may act:
a reason and a name, a state the action may start from, the gateway's
records weighed against the operator's word. What the verdict then does to
the saga is a step here, made with the step helper like every other step,
and each mirrors one: the look-up of an escalated saga is the
reconciliation's probe; the confirmation after a manual check is the
confirming commit, or the compensation's last commit with its refund entry;
the compensation after a manual check is the hold expiry's cancel, then the
compensation. The runbook calls them through ``purchases.services``: the
moves, the ledger entries and the history rows are the saga's own.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from ledger.services import ledger_has_charge
from payments.interface import CancelOutcome, IntentStatus, PaymentGateway

from ..errors import DomainError, IllegalTransition
from ..models import PurchaseSaga
from .compensate import finish_compensation, record_refund, saga_compensate
from .confirm import confirm
from .states import SagaState
from .step import Ask, Next, gateway_or_default, gateway_step
from .transition import By, note_decision

S = SagaState

# The states nothing automatic settles: only an operator's verdict does.
AWAITING_A_VERDICT = frozenset({S.UNKNOWN_EXPIRED, S.COMPENSATION_PENDING})
OVERRIDE_MARK = " [override: the gateway could not be asked]"

# What the runbook holds against an operator's verdict, weighed against the
# saga as the step's lock finds it ("" for nothing).
Objection = Callable[[PurchaseSaga], str]


class ActionRefused(DomainError):
    """An operator's action refused: by the runbook's checks, or by what the
    gateway answered the step."""

    code = "action_refused"


def saga_note(*, saga_id, reason: str, by: By, now: datetime | None = None) -> PurchaseSaga:
    """A decision on the saga's record in its own commit, before anything
    moves (an operator's reason for an action, whatever follows)."""

    def decide(saga: PurchaseSaga, at: datetime) -> Next:
        note_decision(saga, reason=reason, at=at, by=by)
        return None

    return gateway_step(step="note", saga_id=saga_id, decide=decide, now=now)


def saga_look_up_escalated(
    *,
    saga_id,
    note: str,
    by: By,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
) -> PurchaseSaga:
    """An operator's fresh look-up of an escalated (UNKNOWN_EXPIRED) saga.
    Only "charged" settles it by itself; any other answer is noted, and the
    verdict stays the operator's (confirm / compensate after a manual check)."""
    gateway = gateway_or_default(gateway)

    def decide(saga: PurchaseSaga, at: datetime) -> Ask | Next:
        return Ask("retrieve", saga.version)

    def record(saga: PurchaseSaga, ask: Ask, lookup, at: datetime) -> Next:
        if saga.state != S.UNKNOWN_EXPIRED:
            return None
        if lookup.status == IntentStatus.SUCCEEDED:
            confirm(
                saga,
                charge_id=lookup.charge_id or "",
                reason=f"reconciled by operator: {note}",
                at=at,
                by=by,
            )
        else:
            note_decision(saga, reason=f"operator look-up: {lookup.status.value}", at=at, by=by)
        return None

    return gateway_step(
        step="look_up_escalated",
        saga_id=saga_id,
        decide=decide,
        call=lambda saga, ask: gateway.retrieve(saga.gateway_ref),
        record=record,
        now=now,
    )


def saga_confirm_manual(
    *,
    saga_id,
    note: str,
    by: By,
    charge_id: str | None,
    objection: Objection,
    override: bool = False,
    now: datetime | None = None,
) -> PurchaseSaga:
    """The operator saw the charge (UNKNOWN_EXPIRED: the confirming commit)
    or the refund (COMPENSATION_PENDING: its ledger entry and the
    compensation's last commit) at the processor. One commit.

    Money is never written on the operator's word alone: the runbook asked
    the gateway first (outside any transaction); ``charge_id`` is the charge
    it holds for exactly this purchase, and ``objection`` weighs its answer
    against the saga under the lock. ``override``: the gateway could not be
    asked and the operator vouched anyway; the ledger entry and the history
    say so (docs/operations.md, "Runbook").
    """

    def decide(saga: PurchaseSaga, at: datetime) -> Next:
        if saga.state not in AWAITING_A_VERDICT:
            raise IllegalTransition(saga.state, S.CONFIRMED)
        if why := objection(saga):
            raise ActionRefused(why)
        verdict = f"{note}{OVERRIDE_MARK if override else ''}"
        if saga.state == S.COMPENSATION_PENDING:
            _refund_seen(saga, verdict=verdict, override=override, at=at, by=by)
            return None
        if charge_id is None and not override:
            raise ActionRefused("the gateway holds no charge for this purchase to confirm")
        confirm(
            saga,
            charge_id=charge_id or "manual-override",
            reason=f"confirmed after manual check: {verdict}",
            at=at,
            by=by,
            note=f"manual confirmation: {verdict}",
            override=override,
        )
        return None

    return gateway_step(step="confirm_manual", saga_id=saga_id, decide=decide, now=now)


def _refund_seen(saga: PurchaseSaga, *, verdict: str, override: bool, at: datetime, by: By) -> None:
    """The compensation's last commit on an operator's word that the refund
    landed: the refund entry (the one the compensation writes), then seats,
    reservation, event and state."""
    if not ledger_has_charge(intent_id=saga.intent_id):
        raise ActionRefused("no charge in the ledger: nothing to confirm as refunded")
    why = f"refund confirmed after manual check: {verdict}"
    reference = "manual-override" if override else "manual"
    record_refund(saga, at=at, reference=reference, note=why, override=override)
    finish_compensation(saga, at=at, by=by, refunded=True, reason=why)


def saga_compensate_manual(
    *,
    saga_id,
    note: str,
    by: By,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
) -> PurchaseSaga:
    """The operator saw no charge (UNKNOWN_EXPIRED: the intent is cancelled
    first, as the hold expiry does, so that none can land later) or retries
    the refund now (COMPENSATION_PENDING); then the compensation."""
    gateway = gateway_or_default(gateway)

    def compensate() -> PurchaseSaga:
        return saga_compensate(
            saga_id=saga_id,
            gateway=gateway,
            now=now,
            by=by,
            reason=f"compensated after manual check: {note}",
            may_start_from=frozenset({S.UNKNOWN_EXPIRED}),
        )

    def decide(saga: PurchaseSaga, at: datetime) -> Ask | Next:
        # Never release a seat on an assumption, even an operator's.
        return Ask("cancel", saga.version) if saga.state == S.UNKNOWN_EXPIRED else compensate

    def record(saga: PurchaseSaga, ask: Ask, answer, at: datetime) -> Next:
        # The answer is kept as evidence whatever it says; a refusal is
        # raised after that commit.
        if answer.outcome == CancelOutcome.ALREADY_CHARGED:
            return _refuse("the gateway says the intent was charged: confirm instead")
        if answer.outcome != CancelOutcome.CANCELED:
            return _refuse(f"the gateway did not confirm the cancel ({answer.detail})")
        return compensate

    return gateway_step(
        step="compensate_manual",
        saga_id=saga_id,
        decide=decide,
        call=lambda saga, ask: gateway.cancel(saga.gateway_ref),
        record=record,
        now=now,
    )


def _refuse(why: str) -> Next:
    def refuse() -> PurchaseSaga:
        raise ActionRefused(why)

    return refuse
