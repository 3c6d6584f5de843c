"""Reconciliation of an UNKNOWN charge: look the intent up, never compensate
blind (docs/design.md, "The saga").

A processor replays the first answer for a key, errors included, so sending
the charge again proves nothing: only a look-up does. ``succeeded`` confirms;
``declined`` compensates; ``not_found`` / ``requires_payment`` (no charge
landed) charges again with the same key, unless the hold ran out meanwhile;
no answer arms the next probe, or escalates when the schedule is spent.

The same look-up follows a buyer's authentication (REQUIRES_ACTION, 3-D
Secure): ``succeeded`` confirms, ``declined`` (the authentication failed)
compensates with nothing charged, ``requires_action`` waits for the next
probe; the hold's expiry ends one never completed. A processor's event
(docs/stripe.md, "Stripe's events") is this probe, sooner.
"""

from __future__ import annotations

import logging
from datetime import datetime

from payments.interface import IntentStatus, PaymentGateway

from ..models import GatewayAnswer, PurchaseSaga
from .alerts import raise_operator_alert
from .charge import (
    await_authentication,
    charge_again,
    hold_ran_out,
    next_authentication_probe,
    next_probe_or_escalate,
    record_processor_ref,
)
from .compensate import saga_compensate
from .confirm import confirm
from .expiry import saga_expire_hold
from .states import SagaState
from .step import Ask, Next, gateway_or_default, gateway_step
from .transition import SYSTEM, By, log_extra, move, note_decision

logger = logging.getLogger(__name__)

S = SagaState

NO_CHARGE_LANDED = frozenset({IntentStatus.NOT_FOUND, IntentStatus.REQUIRES_PAYMENT})
# Only we cancel or refund an intent: seeing either on an unsettled saga means
# a step of ours committed at the gateway and died before recording it.
SETTLED_BEHIND_OUR_BACK = frozenset({IntentStatus.CANCELED, IntentStatus.REFUNDED})
# The states whose charge outcome a look-up may settle.
PROBED = frozenset({S.UNKNOWN, S.CHARGING, S.REQUIRES_ACTION})


def saga_reconcile(
    *,
    saga_id,
    attempt: int = 1,
    expected_version: int | None = None,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
    by: By = SYSTEM,
) -> PurchaseSaga:
    """Probe the gateway about an UNKNOWN (or CHARGING: its answer was lost)
    saga and act on a definitive answer. ``attempt`` is the probe's 1-based
    place in the backoff schedule; ``expected_version`` the version its timer
    was armed at (a probe of an older episode does nothing)."""
    gateway = gateway_or_default(gateway)
    return gateway_step(
        step="reconcile",
        saga_id=saga_id,
        decide=_reconcile_decide(attempt=attempt, expected_version=expected_version),
        call=lambda saga, ask: gateway.retrieve(saga.gateway_ref),
        record=_reconcile_record(gateway, attempt=attempt, now=now, by=by),
        now=now,
    )


def _reconcile_decide(*, attempt: int, expected_version: int | None):
    def decide(saga: PurchaseSaga, at: datetime) -> Ask | Next:
        if saga.state not in PROBED or (
            expected_version is not None and saga.version != expected_version
        ):
            logger.info("reconcile skipped: saga has moved on", **log_extra(saga))
            return None
        return Ask("retrieve", saga.version, attempt=attempt)

    return decide


def _reconcile_record(gateway: PaymentGateway, *, attempt: int, now: datetime | None, by: By):
    def record(saga: PurchaseSaga, ask: Ask, lookup, at: datetime) -> Next:
        if saga.version != ask.version:
            return None
        # A create whose answer was lost, found by our intent id.
        record_processor_ref(saga, lookup.processor_ref)
        if saga.state == S.REQUIRES_ACTION:
            return _authentication_answered(
                saga, lookup=lookup, attempt=attempt, at=at, gateway=gateway, now=now, by=by
            )
        if saga.state == S.CHARGING:
            # A charge whose answer was lost (worker died): treat as unknown.
            move(saga, S.UNKNOWN, reason="charge answer lost; reconciling", at=at, by=by)
        status = lookup.status
        if status == IntentStatus.SUCCEEDED:
            confirm(
                saga,
                charge_id=lookup.charge_id or "",
                reason="reconciled: charged at the gateway",
                at=at,
                by=by,
            )
            return None
        if status == IntentStatus.DECLINED:
            move(saga, S.PAYMENT_FAILED, reason="reconciled: declined at the gateway", at=at, by=by)
            return lambda: saga_compensate(saga_id=saga.pk, gateway=gateway, now=now, by=by)
        if status in NO_CHARGE_LANDED:
            return _charge_again_unless_the_hold_ran_out(
                saga, status=status, attempt=attempt, at=at, gateway=gateway, now=now, by=by
            )
        if status == IntentStatus.REQUIRES_ACTION:
            await_authentication(saga, secret=lookup.action_secret, probe=attempt + 1, at=at, by=by)
            return None
        if status == IntentStatus.CANCELED and _we_canceled(saga):
            return _expired_by_our_cancel(saga, at=at, gateway=gateway, now=now, by=by)
        if status in SETTLED_BEHIND_OUR_BACK:
            _escalate_settled_behind_our_back(saga, status=status, at=at, by=by)
            return None
        note_decision(
            saga, at=at, by=by, reason=f"reconcile probe {attempt}: no answer ({lookup.detail})"
        )
        next_probe_or_escalate(saga, probe=attempt + 1, at=at, by=by)
        return None

    return record


def _authentication_answered(
    saga: PurchaseSaga,
    *,
    lookup,
    attempt: int,
    at: datetime,
    gateway: PaymentGateway,
    now: datetime | None,
    by: By,
) -> Next:
    """A look-up of a saga waiting on the buyer's authentication."""
    status = lookup.status
    if status == IntentStatus.SUCCEEDED:
        confirm(
            saga,
            charge_id=lookup.charge_id or "",
            reason="authenticated by the buyer and charged",
            at=at,
            by=by,
        )
        return None
    if status == IntentStatus.DECLINED:
        move(
            saga,
            S.PAYMENT_FAILED,
            reason=f"authentication failed or declined ({lookup.detail}); nothing charged",
            at=at,
            by=by,
        )
        return lambda: saga_compensate(saga_id=saga.pk, gateway=gateway, now=now, by=by)
    if status == IntentStatus.CANCELED and _we_canceled(saga):
        return _expired_by_our_cancel(saga, at=at, gateway=gateway, now=now, by=by)
    # Still waiting (or no answer).
    note_decision(saga, at=at, by=by, reason=f"authentication look-up {attempt}: {lookup.label}")
    next_authentication_probe(saga, probe=attempt + 1, at=at, by=by)
    return None


def _we_canceled(saga: PurchaseSaga) -> bool:
    """Whether a step of ours asked the gateway to cancel this saga's intent
    (the hold's expiry, whose answer may have been lost on the way back)."""
    return GatewayAnswer.objects.filter(saga_id=saga.pk, asked="cancel").exists()


def _expired_by_our_cancel(
    saga: PurchaseSaga, *, at: datetime, gateway: PaymentGateway, now: datetime | None, by: By
) -> Next:
    """The intent is canceled, and we asked for it (the hold ran out and the
    expiry's cancel lost its answer): definitive, no charge can land. Not a
    step behind our back: settle it as the expiry would have."""
    move(saga, S.EXPIRED, reason="reconciled: canceled at the gateway at our request", at=at, by=by)
    return lambda: saga_compensate(saga_id=saga.pk, gateway=gateway, now=now, by=by)


def _escalate_settled_behind_our_back(
    saga: PurchaseSaga, *, status: IntentStatus, at: datetime, by: By
) -> None:
    move(
        saga,
        S.UNKNOWN_EXPIRED,
        at=at,
        by=by,
        reason=f"gateway reports {status.value} for an unsettled saga",
    )
    raise_operator_alert(saga, why=f"gateway reports {status.value}", now=at)


def _charge_again_unless_the_hold_ran_out(
    saga: PurchaseSaga,
    *,
    status: IntentStatus,
    attempt: int,
    at: datetime,
    gateway: PaymentGateway,
    now: datetime | None,
    by: By,
) -> Next:
    if hold_ran_out(saga, at):
        # No charge landed, and the hold is over: a retry now would be a first
        # charge for seats no longer held for it.
        note_decision(
            saga,
            at=at,
            by=by,
            reason=f"reconciled: {status.value}; the hold ran out, not charging again",
        )
        return lambda: saga_expire_hold(saga_id=saga.pk, gateway=gateway, now=now)
    move(
        saga,
        S.CHARGING,
        reason=f"reconciled: {status.value}; charging again",
        at=at,
        by=by,
        count_attempt=True,
    )
    return lambda: charge_again(saga, probes=attempt, gateway=gateway, now=now, by=by)


def purchase_processor_event(
    *,
    saga_id,
    why: str,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
) -> PurchaseSaga | None:
    """A processor's event about the saga's intent
    (docs/stripe.md, "Stripe's events"): a faster probe, never a verdict. A saga whose charge
    outcome a look-up may settle is looked up now (the answer, not the
    event, decides); any other is left alone: CHARGING has its step in
    flight (or the resumer's), and a settled one has nothing to learn.
    None when no such saga exists."""
    saga = PurchaseSaga.objects.filter(pk=saga_id).only("state").first()
    if saga is None:
        return None
    if saga.state not in (S.UNKNOWN, S.REQUIRES_ACTION):
        logger.info("processor event: nothing to learn (%s)", why, **log_extra(saga))
        return saga
    logger.info("processor event: looking the intent up (%s)", why, **log_extra(saga))
    probes = GatewayAnswer.objects.filter(saga_id=saga_id, asked="retrieve").count()
    return saga_reconcile(saga_id=saga_id, attempt=probes + 1, gateway=gateway, now=now)
