"""The hold ran out: an obligation delivered by the relay (the timer armed in
the start transaction), whose consumer re-reads the saga under its lock and
decides from its state (docs/design.md, "The saga").

CONFIRMED: refuse (recorded). A charge outcome that is not definitive:
cancel the intent at the gateway first, so that no charge can land later,
and only then release the seats; if the gateway says it was charged,
confirm instead. The seats are never released on an assumption.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from outbox.services import timer_schedule
from payments.interface import CancelOutcome, PaymentGateway

from ..models import PurchaseSaga
from .alerts import raise_operator_alert
from .compensate import saga_compensate
from .confirm import confirm
from .states import SagaState
from .step import Ask, Next, gateway_or_default, gateway_step
from .topics import Topic
from .transition import Backoff, move, note_decision

S = SagaState

NEEDS_DEFINITIVE_ANSWER = frozenset({S.PENDING, S.CHARGING, S.UNKNOWN, S.UNKNOWN_EXPIRED})
# A compensation that stalled: the expiry pushes it along (idempotent).
_STALLED_COMPENSATION = frozenset({S.PAYMENT_FAILED, S.EXPIRED, S.COMPENSATING})


def saga_expire_hold(
    *,
    saga_id,
    attempt: int = 0,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
) -> PurchaseSaga:
    """Settle a saga whose hold ran out. ``attempt`` counts the re-asks after
    a cancel the gateway did not answer (0: the hold's own timer)."""
    gateway = gateway_or_default(gateway)

    def compensate() -> PurchaseSaga:
        return saga_compensate(saga_id=saga_id, gateway=gateway, now=now)

    def decide(saga: PurchaseSaga, at: datetime) -> Ask | Next:
        state = SagaState(saga.state)
        if state == S.CONFIRMED:
            note_decision(saga, reason="expiry refused: confirmed", at=at)
            return None
        if state not in NEEDS_DEFINITIVE_ANSWER:
            note_decision(saga, reason=f"expiry: nothing to do in {state}", at=at)
            return compensate if state in _STALLED_COMPENSATION else None
        return Ask("cancel", saga.version, attempt=attempt)

    def record(saga: PurchaseSaga, ask: Ask, answer, at: datetime) -> Next:
        if saga.version != ask.version and saga.state not in NEEDS_DEFINITIVE_ANSWER:
            return None  # moved on while we asked; the answer stays as evidence
        if answer.outcome == CancelOutcome.CANCELED:
            move(saga, S.EXPIRED, reason="hold expired; intent canceled at the gateway", at=at)
            return compensate
        if answer.outcome == CancelOutcome.ALREADY_CHARGED:
            confirm(
                saga,
                charge_id=answer.charge_id or "",
                reason="hold expired but the gateway had charged",
                at=at,
            )
            return None
        _ask_again_later(saga, attempt=attempt, answer=answer, at=at)
        return None

    return gateway_step(
        step="expire_hold",
        saga_id=saga_id,
        decide=decide,
        call=lambda saga, ask: gateway.cancel(saga.intent_id),
        record=record,
        now=now,
    )


def _ask_again_later(saga: PurchaseSaga, *, attempt: int, answer, at: datetime) -> None:
    """The gateway could not be reached: re-check on the backoff schedule
    (the last delay repeats), and alert once the schedule is spent."""
    backoff = Backoff()
    recheck = attempt + 1
    if backoff.is_spent(recheck + 1):
        raise_operator_alert(saga, why="hold expired and the gateway cannot be reached", now=at)
    note_decision(
        saga, at=at, reason=f"expiry: gateway unreachable ({answer.detail}); will ask again"
    )
    timer_schedule(
        key=f"hold:{saga.pk}:retry:{recheck}",
        topic=Topic.HOLD_RECHECK,
        payload={"saga_id": str(saga.pk), "attempt": recheck},
        due_at=at + timedelta(seconds=backoff.delay(recheck)),
        event_id=saga.event_id,
        saga_id=saga.pk,
        now=at,
        # A redelivered recheck (its worker died before the inbox entry)
        # finds its successor armed already.
        if_absent=True,
    )
