"""The charge: mark CHARGING and commit, call the gateway with the saga's
intent id as the idempotency key, record the answer (docs/design.md, "The
saga").

Three outcomes: SUCCEEDED confirms; DECLINED compensates; UNKNOWN (timeout,
5xx, connection lost) arms the first reconcile probe. A charge never starts
after the hold ran out: that saga is settled as the expiry would.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from outbox.services import timer_schedule
from payments.interface import ChargeOutcome, ChargeRequest, PaymentGateway

from ..models import PurchaseSaga
from .alerts import raise_operator_alert
from .compensate import saga_compensate
from .confirm import confirm
from .expiry import saga_expire_hold
from .states import SagaState
from .step import Ask, Next, ask_and_record, gateway_or_default, gateway_step
from .topics import Topic
from .transition import SYSTEM, Backoff, By, log_extra, move

logger = logging.getLogger(__name__)

S = SagaState


def saga_charge(
    *,
    saga_id,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
    by: By = SYSTEM,
) -> PurchaseSaga:
    """Charge the card of a PENDING saga.

    Any other state means the saga has moved on (a retry after a definite "no
    charge" comes through the reconciliation): the step returns without
    calling the gateway, so a late or duplicate task never charges a
    released seat.
    """
    gateway = gateway_or_default(gateway)

    def decide(saga: PurchaseSaga, at: datetime) -> Ask | Next:
        if saga.state != S.PENDING:
            logger.info("charge skipped: saga has moved on", **log_extra(saga))
            return None
        if hold_ran_out(saga, at):
            # The relay and the workers were down past the hold: the seats are
            # no longer the buyer's to pay for. Settle it as the expiry would
            # (cancel the intent first), never with a first charge.
            logger.warning("charge refused: the hold ran out first", **log_extra(saga))
            return lambda: saga_expire_hold(saga_id=saga_id, gateway=gateway, now=now)
        move(saga, S.CHARGING, reason="charge started", at=at, by=by, count_attempt=True)
        return Ask("charge", saga.version)

    return gateway_step(
        step="charge",
        saga_id=saga_id,
        decide=decide,
        call=_charge_call(gateway),
        record=_charge_record(gateway, now=now, by=by),
        now=now,
    )


def charge_again(
    saga: PurchaseSaga, *, probes: int, gateway: PaymentGateway, now: datetime | None, by: By
) -> PurchaseSaga:
    """The charge retried by a reconciliation that found no charge (its own
    commit moved the saga to CHARGING). ``probes`` is how many look-ups the
    saga has had: the retry keeps its place in the backoff schedule."""
    return ask_and_record(
        saga=saga,
        ask=Ask("charge", saga.version),
        call=_charge_call(gateway),
        record=_charge_record(gateway, now=now, by=by, probes=probes),
        now=now,
    )


def hold_ran_out(saga: PurchaseSaga, at: datetime) -> bool:
    return at >= saga.reservation.hold_expires_at


def _charge_call(gateway: PaymentGateway):
    def call(saga: PurchaseSaga, ask: Ask):
        return gateway.charge(
            ChargeRequest(
                intent_id=saga.intent_id,
                amount=saga.amount,
                currency=saga.currency,
                payment_method=saga.payment_method,
            )
        )

    return call


def _charge_record(gateway: PaymentGateway, *, now: datetime | None, by: By, probes: int = 0):
    def record(saga: PurchaseSaga, ask: Ask, result, at: datetime) -> Next:
        if saga.state != S.CHARGING or saga.version != ask.version:
            # Someone else moved it while we were on the wire (the hold expiry
            # after a definitive gateway answer, or a reconcile). Their verdict
            # stands; ours is kept as evidence.
            logger.warning(
                "charge answer arrived for a saga that moved on",
                **log_extra(saga, outcome=result.outcome, expected_version=ask.version),
            )
            return None
        if result.outcome == ChargeOutcome.SUCCEEDED:
            confirm(saga, charge_id=result.charge_id or "", reason="charge succeeded", at=at, by=by)
            return None
        if result.outcome == ChargeOutcome.DECLINED:
            move(saga, S.PAYMENT_FAILED, reason=f"charge declined ({result.detail})", at=at, by=by)
            return lambda: saga_compensate(saga_id=saga.pk, gateway=gateway, now=now, by=by)
        move(saga, S.UNKNOWN, reason=f"charge outcome unknown ({result.detail})", at=at, by=by)
        next_probe_or_escalate(saga, probe=probes + 1, at=at, by=by)
        return None

    return record


def next_probe_or_escalate(saga: PurchaseSaga, *, probe: int, at: datetime, by: By) -> None:
    """Arm the ``probe``-th reconcile look-up, or, with the schedule spent,
    escalate to UNKNOWN_EXPIRED with an alert (inside the caller's commit)."""
    backoff = Backoff()
    if not backoff.is_spent(probe):
        timer_schedule(
            key=f"reconcile:{saga.pk}:{saga.version}:{probe}",
            topic=Topic.RECONCILE,
            payload={"saga_id": str(saga.pk), "attempt": probe, "version": saga.version},
            due_at=at + timedelta(seconds=backoff.delay(probe)),
            event_id=saga.event_id,
            saga_id=saga.pk,
            now=at,
            # The resumer may re-drive a probe whose successor is already armed.
            if_absent=True,
        )
        return
    move(
        saga,
        S.UNKNOWN_EXPIRED,
        at=at,
        by=by,
        reason=f"reconcile schedule exhausted after {probe - 1} "
        f"probe{'s' if probe - 1 != 1 else ''}",
    )
    raise_operator_alert(saga, why="reconciliation exhausted", now=at)
