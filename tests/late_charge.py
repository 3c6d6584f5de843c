"""A purchase the processor charged while it was being undone: the one
compensation that owes a refund.

A confirmed purchase never moves again (its money goes back as refund rows:
purchases/refunds/), so the compensation's refund (``refund:<intent_id>``,
purchases/saga/compensate.py) is only ever owed for a charge that landed on
a purchase that did not confirm: a cancel answered "already charged" (a
browser completed the payment while the hold ran out), the charge written
to the ledger, then refunded. Tests of that path (a refund the gateway does
not confirm, COMPENSATION_PENDING, its retries, the chaser, the runbook's
verdicts on it) start from here.

:func:`charged_while_undone` leaves the purchase as that path does before
its refund, without the late-charge alert (so that a test counts only the
alerts of what it does): the processor (the in-process fake's tables)
holding the charge, the saga PAYMENT_FAILED, the charge in the ledger. Its
compensation (``saga_compensate``) then asks for the refund.
"""

from __future__ import annotations

from django.db import transaction

from ledger.models import EntryKind
from ledger.services import ledger_record
from payments.fake_gateway import services as processor
from purchases import lock_objects
from purchases.models import PurchaseSaga
from purchases.saga.states import SagaState
from purchases.saga.transition import clock, move

from .conftest import start_purchase


def charged_while_undone(
    user, event, *, seats=("A1",), payment_method="pm_card_visa", now=None
) -> PurchaseSaga:
    saga = start_purchase(user, event, seats=seats, payment_method=payment_method, now=now)
    answer = processor.intent_charge(
        intent_id=saga.intent_id,
        idempotency_key=saga.intent_id,
        amount=saga.amount,
        currency=saga.currency,
        payment_method=payment_method,
    )
    assert answer.status_code == 200 and answer.body["status"] == "succeeded", answer
    at = clock(now)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga.pk)
        move(saga, SagaState.CHARGING, reason="charge started", at=at)
        move(saga, SagaState.PAYMENT_FAILED, reason="charge declined (test)", at=at)
        ledger_record(
            intent_id=saga.intent_id,
            kind=EntryKind.CHARGE,
            amount=saga.amount,
            currency=saga.currency,
            saga_id=saga.pk,
            event_id=saga.event_id,
            now=at,
            gateway_reference=answer.body.get("charge_id") or "",
            note="charged while the purchase was being undone; refunded by its compensation",
        )
    return saga
