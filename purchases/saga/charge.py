"""The charge: mark CHARGING and commit, call the gateway with the saga's
intent id as the idempotency key, record the answer (docs/design.md, "The
saga").

Three outcomes: SUCCEEDED confirms; DECLINED compensates; UNKNOWN (timeout,
5xx, connection lost) arms the first reconcile probe. A charge never starts
after the hold ran out: that saga is settled as the expiry would.

A processor whose intents are its own objects (Stripe) is first asked to
create one, no money moving; its id is recorded in a commit, and only then
is it confirmed (docs/stripe.md, "The charge"). A fourth outcome,
REQUIRES_ACTION, waits for the buyer's authentication (3-D Secure): probes
on the reconcile schedule (and the processor's events, sooner) look it up,
and the hold's expiry ends an abandoned one.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction

from outbox.services import timer_schedule
from payments.interface import (
    CancelOutcome,
    ChargeOutcome,
    ChargeRequest,
    CreateOutcome,
    CreateResult,
    PaymentGateway,
    creates_intent,
)

from .. import lock_objects
from ..models import PurchaseSaga
from .alerts import raise_operator_alert
from .compensate import saga_compensate
from .confirm import confirm
from .expiry import saga_expire_hold
from .states import SagaState
from .step import Ask, Next, ask_and_record, gateway_or_default, gateway_step, record_answer
from .topics import Topic
from .transition import SYSTEM, Backoff, By, clock, log_extra, move, note_decision

logger = logging.getLogger(__name__)

S = SagaState

# The history's reason of a confirmation by the charge's own answer.
CONFIRMED_REASON = "charge succeeded"

# The states in which the seats are released, or being released.
RELEASED = frozenset(
    {S.EXPIRED, S.PAYMENT_FAILED, S.COMPENSATING, S.COMPENSATION_PENDING, S.COMPENSATED}
)


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
        if getattr(saga, "event_cancelled", False):
            # Its start read the event just before its cancellation committed:
            # no charge may land after the cancellation (docs/refunds.md,
            # "Event cancellation").
            logger.warning("charge refused: the event is cancelled", **log_extra(saga))
            return lambda: saga_expire_hold(
                saga_id=saga_id, gateway=gateway, now=now, why="event cancelled"
            )
        move(saga, S.CHARGING, reason="charge started", at=at, by=by, count_attempt=True)
        return first_ask(saga, gateway)

    return gateway_step(
        step="charge",
        saga_id=saga_id,
        decide=decide,
        call=charge_call(gateway),
        record=charge_record(gateway, now=now, by=by),
        now=now,
    )


def first_ask(saga: PurchaseSaga, gateway: PaymentGateway) -> Ask:
    """What a charge asks first: to create the intent at a processor whose
    intents are its own objects and where none is recorded yet, else the
    charge itself."""
    if creates_intent(gateway) and not saga.processor_ref:
        return Ask("create", saga.version)
    return Ask("charge", saga.version)


def charge_again(
    saga: PurchaseSaga, *, probes: int, gateway: PaymentGateway, now: datetime | None, by: By
) -> PurchaseSaga:
    """The charge retried by a reconciliation that found no charge (its own
    commit moved the saga to CHARGING). ``probes`` is how many look-ups the
    saga has had: the retry keeps its place in the backoff schedule."""
    return ask_and_record(
        saga=saga,
        ask=first_ask(saga, gateway),
        call=charge_call(gateway),
        record=charge_record(gateway, now=now, by=by, probes=probes),
        now=now,
    )


def hold_ran_out(saga: PurchaseSaga, at: datetime) -> bool:
    return at >= saga.reservation.hold_expires_at


def charge_call(gateway: PaymentGateway):
    def call(saga: PurchaseSaga, ask: Ask):
        request = ChargeRequest(
            intent_id=saga.intent_id,
            amount=saga.amount,
            currency=saga.currency,
            payment_method=saga.payment_method,
            processor_ref=saga.processor_ref,
            purchase_id=str(saga.pk),
            reservation=saga.reservation.ref,
            attempt=saga.attempts,
        )
        if ask.asked == "create":
            return gateway.create(request)  # type: ignore[attr-defined]  # first_ask checked it
        return gateway.charge(request)

    return call


def charge_record(gateway: PaymentGateway, *, now: datetime | None, by: By, probes: int = 0):
    def record(saga: PurchaseSaga, ask: Ask, result, at: datetime) -> Next:
        if ask.asked == "create":
            return _created(saga, ask, result, at, gateway=gateway, now=now, by=by, probes=probes)
        if saga.state != S.CHARGING or saga.version != ask.version:
            # Someone else moved it while we were on the wire (the hold expiry
            # after a definitive gateway answer, or a reconcile). Their verdict
            # stands; ours is kept as evidence.
            logger.warning(
                "charge answer arrived for a saga that moved on",
                **log_extra(saga, outcome=result.outcome, expected_version=ask.version),
            )
            if result.outcome == ChargeOutcome.SUCCEEDED and saga.state in RELEASED:
                # Money taken for seats already released: never silent.
                raise_operator_alert(
                    saga,
                    why=f"a charge ({result.charge_id}) landed after the purchase was released",
                    now=at,
                    once_per="late_charge",
                )
            return None
        if result.outcome == ChargeOutcome.SUCCEEDED:
            confirm(saga, charge_id=result.charge_id or "", reason=CONFIRMED_REASON, at=at, by=by)
            return None
        if result.outcome == ChargeOutcome.DECLINED:
            move(saga, S.PAYMENT_FAILED, reason=f"charge declined ({result.detail})", at=at, by=by)
            return lambda: saga_compensate(saga_id=saga.pk, gateway=gateway, now=now, by=by)
        if result.outcome == ChargeOutcome.REQUIRES_ACTION:
            await_authentication(saga, secret=result.action_secret, probe=probes + 1, at=at, by=by)
            return None
        move(saga, S.UNKNOWN, reason=f"charge outcome unknown ({result.detail})", at=at, by=by)
        next_probe_or_escalate(saga, probe=probes + 1, at=at, by=by)
        return None

    return record


def _created(
    saga: PurchaseSaga,
    ask: Ask,
    result: CreateResult,
    at: datetime,
    *,
    gateway: PaymentGateway,
    now: datetime | None,
    by: By,
    probes: int,
) -> Next:
    """The processor's answer to the create, under the saga's lock: record
    the intent's id (this commit), then confirm it after the commit."""
    if saga.state != S.CHARGING or saga.version != ask.version:
        # Moved on while we were on the wire (the hold expiry found no intent
        # and released the seats): the intent just made must never be charged.
        logger.warning("create answered for a saga that moved on", **log_extra(saga))
        if result.outcome == CreateOutcome.CREATED:
            ref = result.processor_ref
            return lambda: cancel_stray_intent(saga_id=saga.pk, ref=ref, gateway=gateway, now=now)
        return None
    if result.outcome == CreateOutcome.CREATED:
        record_processor_ref(saga, result.processor_ref)
        if hold_ran_out(saga, at):
            # No first charge after the hold: settle it as the expiry would,
            # by canceling the intent just recorded.
            note_decision(saga, at=at, by=by, reason="intent created as the hold ran out")
            return lambda: saga_expire_hold(saga_id=saga.pk, gateway=gateway, now=now)
        then = Ask("charge", saga.version)
        return lambda: ask_and_record(
            saga=saga,
            ask=then,
            call=charge_call(gateway),
            record=charge_record(gateway, now=now, by=by, probes=probes),
            now=now,
        )
    if result.outcome == CreateOutcome.DECLINED:
        move(saga, S.PAYMENT_FAILED, reason=f"payment refused ({result.detail})", at=at, by=by)
        return lambda: saga_compensate(saga_id=saga.pk, gateway=gateway, now=now, by=by)
    move(saga, S.UNKNOWN, reason=f"intent creation unknown ({result.detail})", at=at, by=by)
    next_probe_or_escalate(saga, probe=probes + 1, at=at, by=by)
    return None


def record_processor_ref(saga: PurchaseSaga, ref: str) -> None:
    """Record the processor's id of the saga's intent, inside the caller's
    commit (under the saga's lock). Once recorded it never changes: every
    later call names that intent."""
    if saga.processor_ref or not ref:
        return
    PurchaseSaga.objects.filter(pk=saga.pk, event_id=saga.event_id).update(processor_ref=ref)
    saga.processor_ref = ref


def cancel_stray_intent(*, saga_id, ref: str, gateway: PaymentGateway, now: datetime | None):
    """Cancel an intent the processor made for a saga that had already
    moved on, so that no second intent can ever be charged; the answer is
    kept as evidence, and one that is not "canceled" raises an alert."""
    answer = gateway.cancel(ref)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        at = clock(now)
        record_answer(saga, asked="cancel", answer=answer, at=at)
        note_decision(saga, reason=f"stray intent {ref}: cancel answered {answer.label}", at=at)
        if answer.outcome != CancelOutcome.CANCELED:
            raise_operator_alert(
                saga, why=f"a stray intent ({ref}) could not be canceled", now=at, once_per=ref
            )
    return saga


def await_authentication(
    saga: PurchaseSaga, *, secret: str, probe: int, at: datetime, by: By
) -> None:
    """The processor asks the buyer to authenticate (3-D Secure): move to
    REQUIRES_ACTION (from CHARGING or UNKNOWN) with what the browser needs,
    and arm the look-up that finds how it ended. The hold is not extended:
    its expiry ends an authentication never completed."""
    if saga.state != S.REQUIRES_ACTION:
        move(
            saga,
            S.REQUIRES_ACTION,
            reason="the bank asks the buyer to authenticate (3-D Secure)",
            at=at,
            by=by,
            action_secret=secret,
        )
    next_authentication_probe(saga, probe=probe, at=at, by=by)


def next_authentication_probe(saga: PurchaseSaga, *, probe: int, at: datetime, by: By) -> None:
    """Arm the ``probe``-th look-up of an authentication; with the schedule
    spent, none: nothing is owed but the hold's expiry, which is armed."""
    backoff = Backoff()
    if backoff.is_spent(probe):
        note_decision(
            saga, at=at, by=by, reason="no more look-ups: the hold's expiry ends the authentication"
        )
        return
    _arm_probe(saga, probe=probe, at=at, backoff=backoff)


def next_probe_or_escalate(saga: PurchaseSaga, *, probe: int, at: datetime, by: By) -> None:
    """Arm the ``probe``-th reconcile look-up, or, with the schedule spent,
    escalate to UNKNOWN_EXPIRED with an alert (inside the caller's commit)."""
    backoff = Backoff()
    if not backoff.is_spent(probe):
        _arm_probe(saga, probe=probe, at=at, backoff=backoff)
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


def _arm_probe(saga: PurchaseSaga, *, probe: int, at: datetime, backoff: Backoff) -> None:
    timer_schedule(
        key=f"reconcile:{saga.pk}:{saga.version}:{probe}",
        topic=Topic.RECONCILE,
        payload={"saga_id": str(saga.pk), "attempt": probe, "version": saga.version},
        due_at=at + timedelta(seconds=backoff.delay(probe)),
        event_id=saga.event_id,
        saga_id=saga.pk,
        now=at,
        # The resumer (or a processor's event) may drive a probe whose
        # successor is already armed.
        if_absent=True,
    )
