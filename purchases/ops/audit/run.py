"""The invariant auditor: checks every invariant (docs/design.md,
"Invariants and where they are enforced") across sagas, seats, ledger,
outbox and the gateway's own records, and leaves an
:class:`~purchases.models.AuditRun` behind.

It only reads, except for that one row (and the sweep heartbeat). The gateway
is read through its port only (``list_charges``, one call per intent that may
hold money), never through the fake's tables, and never inside a transaction.

Reads are not one snapshot: a saga may move while the auditor looks at it.
Every saga is read with its version, and re-read after its chunk's gateway
calls; a saga whose version changed meanwhile is skipped for this run (counted
in ``sagas_skipped``) rather than reported on a mix of before and after. The
seat checks are single statements, each consistent on its own, because every
transaction that touches seats also settles the reservation in the same commit.

Time-based verdicts use one threshold, ``stuck_after_seconds`` (default
``RESUME_AFTER_SECONDS`` plus the longest hold of any event, its own
``hold_seconds`` or ``PURCHASE_HOLD_SECONDS``): a saga still moving or an
email still on its way is not a violation while it is younger than that.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from payments.interface import GatewayCharge, GatewayRefund, PaymentGateway
from payments.registry import get_gateway

from ...models import AuditRun, Event, PurchaseSaga
from ...saga.states import TERMINAL, SagaState
from ..heartbeats import heartbeat
from .cancelled_events import check_cancelled_events
from .context import AuditContext
from .emails import check_emails, email_messages
from .event_reports import check_event_reports
from .liveness import COMPENSATION_STATES, check_stuck, compensated_blind, live_signals
from .money import (
    Ledger,
    charged,
    check_entries,
    check_ledger_without_saga,
    check_money,
    ledger_for,
)
from .refunds import (
    SagaRefunds,
    check_ledger_not_negative,
    check_refund_entries,
    check_refund_totals,
    check_refund_twice,
    check_refunds_alive,
    fingerprint,
    in_flight,
    read_refund_entries,
    refund_alerts,
    refund_fingerprints,
    refunds_for,
)
from .report import UNKNOWN_NEVER_COMPENSATED_BLIND, AuditReport
from .seats import check_seats
from .webhooks import Endpoint, check_webhooks, webhook_endpoints, webhook_facts

logger = logging.getLogger(__name__)

S = SagaState

DEFAULT_CHUNK_SIZE = 500


def audit_run(
    *,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
    stuck_after_seconds: int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> AuditReport:
    """Check every invariant; record the run as an :class:`AuditRun`.

    Never raises for a violation (they are the report) nor for a gateway that
    cannot answer about an intent: that intent is *unverified* and the run
    incomplete, which is not a violation (nothing is known to be wrong).
    """
    gateway = gateway if gateway is not None else get_gateway()
    started = time.perf_counter()
    now = now or timezone.now()
    if stuck_after_seconds is None:
        stuck_after_seconds = settings.RESUME_AFTER_SECONDS + _longest_hold_seconds()
    audit = AuditContext(
        gateway=gateway, now=now, cutoff=now - timedelta(seconds=stuck_after_seconds)
    )

    with heartbeat("audit_sagas", now=now) as pulse:
        check_seats(audit)
        check_sagas(audit, chunk_size=chunk_size)
        check_ledger_without_saga(audit)
        check_event_reports(audit)
        check_cancelled_events(audit)
        report = audit.report
        report.finished_at = now + timedelta(seconds=time.perf_counter() - started)
        pulse.seen = report.sagas_checked
        pulse.acted = len(report.violations)
        run = _record_run(report)
        report.run_id = run.pk

    _log_report(report, run)
    return report


def _record_run(report: AuditReport) -> AuditRun:
    # A short transaction at the end: no gateway call is made inside it.
    with transaction.atomic(durable=True):
        return AuditRun.objects.create(
            started_at=report.started_at,
            finished_at=report.finished_at,
            sagas_checked=report.sagas_checked,
            violations=len(report.violations),
            report=[v.as_dict() for v in report.violations],
            unverified=len(report.unverified),
            unverified_report=[u.as_dict() for u in report.unverified],
            gateway_url=report.gateway_url,
        )


def _log_report(report: AuditReport, run: AuditRun) -> None:
    for v in report.violations:
        logger.error(
            "audit violation %s: %s",
            v.invariant,
            v.detail,
            extra={
                "alert": "audit_violation",
                "invariant": v.invariant,
                "saga_id": v.saga_id,
                "intent_id": v.intent_id,
            },
        )
    for f in report.findings:
        logger.warning(
            "audit finding %s: %s",
            f.name,
            f.detail,
            extra={"finding": f.name, "saga_id": f.saga_id},
        )
    if report.unverified:
        logger.warning(
            "audit incomplete: the gateway at %s gave no answer about %d intent(s)",
            report.gateway_url,
            len(report.unverified),
            extra={"audit_run": run.pk, "unverified": len(report.unverified)},
        )
    logger.info(
        "audit finished",
        extra={
            "audit_run": run.pk,
            "sagas_checked": report.sagas_checked,
            "sagas_skipped": report.sagas_skipped,
            "violations": len(report.violations),
            "unverified": len(report.unverified),
            "findings": len(report.findings),
        },
    )


def check_sagas(ctx: AuditContext, *, chunk_size: int) -> None:
    endpoints = webhook_endpoints()
    sagas = (
        PurchaseSaga.objects.order_by("pk")
        .only(
            "id",
            "intent_id",
            "processor_ref",
            "state",
            "amount",
            "event_id",
            "version",
            "updated_at",
            "compensation_started_at",
        )
        .iterator(chunk_size=chunk_size)
    )
    for chunk in _batched(sagas, chunk_size):
        check_chunk(ctx, chunk, endpoints=endpoints)


def check_chunk(ctx: AuditContext, chunk: list[PurchaseSaga], *, endpoints: list[Endpoint]) -> None:
    ids = [s.pk for s in chunk]
    # The refund rows before the ledger: a refund's entry is written in the
    # commit that marks its row succeeded (refunds.py).
    refunds = refunds_for(chunk)
    ledger = ledger_for([s.intent_id for s in chunk])
    read_refund_entries(chunk, refunds)
    messages = email_messages(ids)
    live = [s.pk for s in chunk if s.state not in TERMINAL]
    alerts, driven = live_signals(ctx, live)
    refund_alerted = refund_alerts(ctx, refunds)
    blind = compensated_blind([s.pk for s in chunk if s.state in COMPENSATION_STATES])
    webhooks = webhook_facts(chunk, endpoints)

    # The gateway, outside any transaction, after the database reads.
    gateway = _ask_the_gateway(ctx, chunk, ledger)

    current = dict(PurchaseSaga.objects.filter(pk__in=ids).values_list("pk", "version"))
    moved = refund_fingerprints(ids)
    for saga in chunk:
        mine = refunds.get(saga.pk, SagaRefunds())
        if current.get(saga.pk) != saga.version or moved.get(saga.pk, set()) != fingerprint(mine):
            ctx.report.sagas_skipped += 1
            continue
        ctx.report.sagas_checked += 1
        entries = ledger.get(saga.intent_id, Ledger())
        if saga.intent_id in gateway:
            _check_against_gateway(ctx, saga, entries, mine, *gateway[saga.intent_id])
        check_entries(ctx, saga, entries)
        check_refund_entries(ctx, saga, mine)
        check_ledger_not_negative(ctx, saga, entries.net)
        check_refunds_alive(ctx, saga, mine, refund_alerted)
        check_emails(ctx, saga, messages.get(saga.pk, {}), mine)
        check_webhooks(ctx, saga, webhooks, entries, mine)
        if saga.state not in TERMINAL:
            check_stuck(ctx, saga, alerts.get(saga.pk, []), saga.pk in driven)
        if saga.pk in blind:
            ctx.flag(UNKNOWN_NEVER_COMPENSATED_BLIND, saga.pk, saga.intent_id, blind[saga.pk])


def _ask_the_gateway(ctx: AuditContext, chunk: list[PurchaseSaga], ledger: dict) -> dict:
    """intent id -> (its charges, its refunds), each None when unanswered:
    the charges of every saga that may hold money, and the refunds of those
    whose charges show money captured (no capture, nothing to refund)."""
    asked: dict[str, tuple] = {}
    for saga in chunk:
        if saga.state == S.PENDING and saga.intent_id not in ledger:
            continue
        charges = ctx.list_charges(saga.intent_id, ref=saga.gateway_ref)
        refunds: list[GatewayRefund] | None = []
        if charges and charged(charges):
            refunds = ctx.list_refunds(saga.intent_id, ref=saga.gateway_ref)
        asked[saga.intent_id] = (charges, refunds)
    return asked


def _check_against_gateway(
    ctx: AuditContext,
    saga: PurchaseSaga,
    entries: Ledger,
    mine: SagaRefunds,
    charges: list[GatewayCharge] | None,
    refunds: list[GatewayRefund] | None,
) -> None:
    # A live saga in the middle of a step may legitimately disagree for a
    # moment (charged, answer not yet recorded), and so may a confirmed one
    # whose refund is in flight; an old one may not.
    settled = (saga.state in TERMINAL or saga.updated_at <= ctx.cutoff) and not in_flight(ctx, mine)
    named = False
    if charges is not None and refunds is not None:
        check_refund_twice(ctx, saga, refunds)
        # A second charge (and its refund) is one_charge_per_intent's to name.
        if settled and len(charges) <= 1:
            named = check_refund_totals(ctx, saga, mine, refunds)
    # The refunds' disagreement named, the net's would say it again.
    check_money(ctx, saga, entries, charges, refunds, settled=settled and not named)


def _batched(items: Iterable, size: int) -> Iterator[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _longest_hold_seconds() -> int:
    """The longest hold a saga may be in: an event may hold its seats longer
    than ``PURCHASE_HOLD_SECONDS`` (its ``hold_seconds``), and a saga inside
    its hold is not stuck."""
    longest = Event.objects.aggregate(longest=Max("hold_seconds"))["longest"] or 0
    return max(settings.PURCHASE_HOLD_SECONDS, longest)
