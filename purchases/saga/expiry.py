"""The hold ran out: an obligation delivered by the relay (the timer armed in
the start transaction), whose consumer re-reads the saga under its lock and
decides from its state (docs/design.md, "The saga").

CONFIRMED: refuse (recorded). A charge outcome that is not definitive
(REQUIRES_ACTION too: an authentication never completed): cancel the intent
at the gateway first, so that no charge can land later, and only then
release the seats; if the gateway says it was charged, confirm instead. The
seats are never released on an assumption.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from outbox.services import timer_schedule
from payments.interface import CancelOutcome, PaymentGateway, creates_intent

from ..models import PurchaseSaga
from .alerts import raise_operator_alert
from .compensate import saga_compensate
from .confirm import confirm
from .states import SagaState
from .step import Ask, Next, gateway_or_default, gateway_step
from .topics import Topic
from .transition import Backoff, move, note_decision

S = SagaState

NEEDS_DEFINITIVE_ANSWER = frozenset(
    {S.PENDING, S.CHARGING, S.UNKNOWN, S.UNKNOWN_EXPIRED, S.REQUIRES_ACTION}
)
# A cancel's detail when the processor found no intent to cancel (by our
# intent id): "canceled" because nothing exists that could be charged.
NONE_FOUND = "not_found"
# A compensation that stalled: the expiry pushes it along (idempotent).
_STALLED_COMPENSATION = frozenset({S.PAYMENT_FAILED, S.EXPIRED, S.COMPENSATING})


def saga_expire_hold(
    *,
    saga_id,
    attempt: int = 0,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
    why: str = "hold expired",
) -> PurchaseSaga:
    """Settle a saga whose hold ran out. ``attempt`` counts the re-asks after
    a cancel the gateway did not answer (0: the hold's own timer). ``why``
    heads the reasons on its record: the hold, or an event's cancellation
    cutting it short (docs/refunds.md, "Event cancellation")."""
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
        return Ask("cancel", saga.version, attempt=attempt, ref=saga.gateway_ref)

    return gateway_step(
        step="expire_hold",
        saga_id=saga_id,
        decide=decide,
        call=lambda saga, ask: gateway.cancel(ask.ref),
        record=_expiry_record(saga_id=saga_id, attempt=attempt, gateway=gateway, now=now, why=why),
        now=now,
    )


def _expiry_record(
    *, saga_id, attempt: int, gateway: PaymentGateway, now: datetime | None, why: str
):
    def compensate() -> PurchaseSaga:
        return saga_compensate(saga_id=saga_id, gateway=gateway, now=now)

    def record(saga: PurchaseSaga, ask: Ask, answer, at: datetime) -> Next:
        if saga.version != ask.version and saga.state not in NEEDS_DEFINITIVE_ANSWER:
            return None  # moved on while we asked; the answer stays as evidence
        if saga.gateway_ref != ask.ref:
            # The processor's intent was recorded while we asked by our own id
            # (a create answered meanwhile): our answer is not about it. Ask
            # again, about that one.
            note_decision(
                saga, reason="expiry: an intent was recorded meanwhile; asking again", at=at
            )
            return lambda: saga_expire_hold(
                saga_id=saga_id, attempt=attempt, gateway=gateway, now=now, why=why
            )
        if (
            answer.outcome == CancelOutcome.CANCELED
            and answer.detail == NONE_FOUND
            and _search_may_lag(saga, gateway, at)
        ):
            # "None found" by our intent id, so soon after a create that
            # Stripe's search may not show it yet: not definitive.
            _ask_again_later(
                saga, attempt=attempt, at=at, why="no intent found yet; the search may lag"
            )
            return None
        if answer.outcome == CancelOutcome.CANCELED:
            move(saga, S.EXPIRED, reason=f"{why}; intent canceled at the gateway", at=at)
            return compensate
        if answer.outcome == CancelOutcome.ALREADY_CHARGED:
            confirm(
                saga,
                charge_id=answer.charge_id or "",
                reason=f"{why} but the gateway had charged",
                at=at,
            )
            return None
        _ask_again_later(saga, attempt=attempt, at=at, why=f"gateway unreachable ({answer.detail})")
        return None

    return record


def _search_may_lag(saga: PurchaseSaga, gateway: PaymentGateway, at: datetime) -> bool:
    """Whether a cancel that found no intent by our intent id (none recorded)
    may have missed one the processor made moments ago: its look-up by
    metadata settles ``search_settles_seconds`` after the create, which went
    out no earlier than the saga's last move (to CHARGING, or to UNKNOWN
    when its answer was lost)."""
    settles = getattr(gateway, "search_settles_seconds", 0)
    if saga.processor_ref or not settles or not creates_intent(gateway):
        return False
    return at < saga.updated_at + timedelta(seconds=settles)


def _ask_again_later(saga: PurchaseSaga, *, attempt: int, at: datetime, why: str) -> None:
    """The gateway's answer is not definitive yet (``why``): re-check on the
    backoff schedule (the last delay repeats), and alert once the schedule
    is spent."""
    backoff = Backoff()
    recheck = attempt + 1
    if backoff.is_spent(recheck + 1):
        raise_operator_alert(saga, why="hold expired and the gateway cannot be reached", now=at)
    note_decision(saga, at=at, reason=f"expiry: {why}; will ask again")
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
