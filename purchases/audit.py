"""The invariant auditor: checks every invariant of DESIGN.md across sagas,
seats, ledger, outbox and the gateway's own records, and leaves an
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
``RESUME_AFTER_SECONDS + PURCHASE_HOLD_SECONDS``): a saga still moving or an
email still on its way is not a violation while it is younger than that.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q, Sum
from django.utils import timezone

from ledger.models import EntryKind, LedgerEntry
from outbox.models import InboxEntry, OutboxMessage
from payments.gateway import GatewayUnavailable
from payments.interface import GatewayCharge, PaymentGateway

from . import services
from .models import (
    Actor,
    AuditRun,
    PurchaseSaga,
    ReconciliationProbe,
    ReservationSeat,
    ReservationStatus,
    SagaHistory,
    Seat,
    SeatStatus,
)
from .states import TERMINAL, SagaState

logger = logging.getLogger(__name__)

S = SagaState

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

INVARIANTS = (
    SEAT_SOLD_ONCE,
    ONE_CHARGE_PER_INTENT,
    LEDGER_EQUALS_GATEWAY,
    CONFIRMED_HAS_ONE_CHARGE_ENTRY,
    EMAILS_EXACTLY_ONCE,
    NO_SILENT_STUCK,
    UNKNOWN_NEVER_COMPENSATED_BLIND,
    OVERRIDE_AGREES_WITH_GATEWAY,
)

CONFIRMATION_EMAIL = "purchases.consumers.confirmation_email"
CANCELLATION_EMAIL = "purchases.consumers.cancellation_email"

# Rows whose delivery drives a live saga forward (the hold-expiry timer is not
# one of them: on a saga older than the threshold it is long overdue).
DRIVING_TOPICS = (
    services.TOPIC_RECONCILE,
    services.TOPIC_REFUND_RETRY,
    services.TOPIC_HOLD_RECHECK,
)
ESCALATED = (S.UNKNOWN_EXPIRED, S.COMPENSATION_PENDING)
COMPENSATION_UNFINISHED = (S.COMPENSATING, S.COMPENSATION_PENDING)
COMPENSATION_STATES = (S.COMPENSATING, S.COMPENSATION_PENDING, S.COMPENSATED)
UNKNOWN_STATES = (S.UNKNOWN, S.UNKNOWN_EXPIRED)

# Gateway answers that settle whether a charge landed (or can still land).
DEFINITIVE_PROBES = (
    Q(asked="retrieve", answer__in=["succeeded", "declined", "not_found", "requires_payment",
                                    "canceled"])
    | Q(asked="cancel", answer="canceled")
    | Q(asked="refund", answer="refunded")
)

DEFAULT_CHUNK_SIZE = 500
# After this many answerless look-ups in a row the gateway is taken for down:
# the remaining intents are reported unverified without waiting out a timeout
# each (a nightly audit must not hang for hours on a dead processor).
GATEWAY_FAILURES_BEFORE_GIVING_UP = 5


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


@dataclass
class AuditReport:
    started_at: datetime
    finished_at: datetime | None = None
    sagas_checked: int = 0
    # Moved while the auditor looked at them; checked by the next run.
    sagas_skipped: int = 0
    # list_charges calls made (one per intent).
    intents_checked: int = 0
    violations: list[Violation] = field(default_factory=list)
    unverified: list[Unverified] = field(default_factory=list)
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
        }


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
    from .sweeps import heartbeat

    if gateway is None:
        from payments.gateway import get_gateway

        gateway = get_gateway()
    started = time.perf_counter()
    now = now or timezone.now()
    if stuck_after_seconds is None:
        stuck_after_seconds = settings.RESUME_AFTER_SECONDS + settings.PURCHASE_HOLD_SECONDS
    audit = _Audit(gateway=gateway, now=now, cutoff=now - timedelta(seconds=stuck_after_seconds))
    audit.report.gateway_url = str(getattr(gateway, "base_url", "") or type(gateway).__name__)

    with heartbeat("audit_sagas", now=now) as pulse:
        audit.check_seats()
        audit.check_sagas(chunk_size=chunk_size)
        audit.check_ledger_without_saga()
        report = audit.report
        report.finished_at = now + timedelta(seconds=time.perf_counter() - started)
        pulse.seen = report.sagas_checked
        pulse.acted = len(report.violations)
        # A short transaction at the end: no gateway call is made inside it.
        with transaction.atomic(durable=True):
            run = AuditRun.objects.create(
                started_at=report.started_at,
                finished_at=report.finished_at,
                sagas_checked=report.sagas_checked,
                violations=len(report.violations),
                report=[v.as_dict() for v in report.violations],
                unverified=len(report.unverified),
                unverified_report=[u.as_dict() for u in report.unverified],
                gateway_url=report.gateway_url,
            )
        report.run_id = run.pk

    for v in report.violations:
        logger.error(
            "audit violation %s: %s", v.invariant, v.detail,
            extra={"alert": "audit_violation", "invariant": v.invariant,
                   "saga_id": v.saga_id, "intent_id": v.intent_id},
        )
    if report.unverified:
        logger.warning(
            "audit incomplete: the gateway at %s gave no answer about %d intent(s)",
            report.gateway_url, len(report.unverified),
            extra={"audit_run": run.pk, "unverified": len(report.unverified)},
        )
    logger.info(
        "audit finished",
        extra={"audit_run": run.pk, "sagas_checked": report.sagas_checked,
               "sagas_skipped": report.sagas_skipped, "violations": len(report.violations),
               "unverified": len(report.unverified)},
    )
    return report


# --------------------------------------------------------------------------------


def _batched(items: Iterable, size: int) -> Iterator[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


@dataclass
class _Ledger:
    net: int = 0
    charges: int = 0
    refunds: int = 0
    others: int = 0
    overrides: int = 0


class _Audit:
    def __init__(self, *, gateway: PaymentGateway, now: datetime, cutoff: datetime) -> None:
        self.gateway = gateway
        self.now = now
        self.cutoff = cutoff
        self.report = AuditReport(started_at=now)
        self.compensation_deadline = timedelta(seconds=settings.COMPENSATION_DEADLINE_SECONDS)
        # intent id -> why the gateway gave no answer about it
        self.unanswered: dict[str, str] = {}
        self.failures_in_a_row = 0

    def flag(self, invariant: str, saga_id, intent_id: str | None, detail: str) -> None:
        self.report.violations.append(
            Violation(invariant, str(saga_id) if saga_id else None, intent_id or None, detail)
        )

    def age(self, at: datetime) -> str:
        return f"{int((self.now - at).total_seconds())}s"

    # --- seats: set-based, over the whole table ---------------------------------

    def check_seats(self) -> None:
        live = ReservationSeat.objects.filter(released_at__isnull=True)
        doubled = list(
            live.values("seat_id").annotate(n=Count("id")).filter(n__gt=1)
            .values_list("seat_id", flat=True)
        )
        if doubled:
            links = defaultdict(list)
            for row in live.filter(seat_id__in=doubled).values(
                "seat_id", "seat__ref", "reservation__ref", "reservation__saga__id",
                "reservation__saga__intent_id",
            ).order_by("seat_id", "id"):
                links[row["seat_id"]].append(row)
            for rows in links.values():
                latest = rows[-1]
                self.flag(
                    SEAT_SOLD_ONCE, latest["reservation__saga__id"],
                    latest["reservation__saga__intent_id"],
                    f"seat {latest['seat__ref']} is held by {len(rows)} live reservations: "
                    + ", ".join(r["reservation__ref"] for r in rows),
                )

        fields = ("seat__ref", "seat__status", "released_at", "reservation__ref",
                  "reservation__status", "reservation__saga__id",
                  "reservation__saga__intent_id")
        for row in (
            live.filter(seat__status=SeatStatus.SOLD)
            .exclude(reservation__status=ReservationStatus.CONFIRMED)
            .values(*fields)
        ):
            self.flag(
                SEAT_SOLD_ONCE, row["reservation__saga__id"], row["reservation__saga__intent_id"],
                f"seat {row['seat__ref']} is sold but its reservation {row['reservation__ref']} "
                f"is {row['reservation__status']}",
            )
        for row in (
            ReservationSeat.objects.filter(reservation__status=ReservationStatus.CONFIRMED)
            .filter(Q(released_at__isnull=False) | ~Q(seat__status=SeatStatus.SOLD))
            .values(*fields)
        ):
            what = "was released" if row["released_at"] else f"is {row['seat__status']}"
            self.flag(
                SEAT_SOLD_ONCE, row["reservation__saga__id"], row["reservation__saga__intent_id"],
                f"confirmed reservation {row['reservation__ref']}: seat {row['seat__ref']} "
                f"{what}",
            )
        for row in (
            Seat.objects.filter(status=SeatStatus.SOLD)
            .exclude(Exists(live.filter(seat_id=OuterRef("pk"))))
            .values("ref", "event_id")
        ):
            self.flag(SEAT_SOLD_ONCE, None, None,
                      f"seat {row['ref']} of event {row['event_id']} is sold to no reservation")
        # A paid purchase whose reservation was let go: its seats can be sold again.
        for row in (
            PurchaseSaga.objects.filter(state=S.CONFIRMED)
            .exclude(reservation__status=ReservationStatus.CONFIRMED)
            .values("pk", "intent_id", "reservation__ref", "reservation__status")
        ):
            self.flag(
                SEAT_SOLD_ONCE, row["pk"], row["intent_id"],
                f"saga is CONFIRMED but its reservation {row['reservation__ref']} is "
                f"{row['reservation__status']}",
            )

    # --- sagas, in chunks -----------------------------------------------------------

    def check_sagas(self, *, chunk_size: int) -> None:
        sagas = (
            PurchaseSaga.objects.order_by("pk")
            .only("id", "intent_id", "state", "version", "updated_at", "compensation_started_at")
            .iterator(chunk_size=chunk_size)
        )
        for chunk in _batched(sagas, chunk_size):
            self._check_chunk(chunk)

    def _check_chunk(self, chunk: list[PurchaseSaga]) -> None:
        ids = [s.pk for s in chunk]
        ledger = self._ledger_for([s.intent_id for s in chunk])
        messages = self._email_messages(ids)
        live = [s.pk for s in chunk if s.state not in TERMINAL]
        alerts: dict = defaultdict(list)
        driven: set = set()
        if live:
            for saga_id, at in OutboxMessage.objects.filter(
                saga_id__in=live, topic=services.TOPIC_NEEDS_OPERATOR
            ).values_list("saga_id", "created_at"):
                alerts[saga_id].append(at)
            # A pending row overdue by more than the threshold drives nothing
            # (a stalled relay or a message that fails on every delivery).
            driven = set(
                OutboxMessage.objects.filter(
                    saga_id__in=live, topic__in=DRIVING_TOPICS, completed_at__isnull=True,
                    cancelled_at__isnull=True, available_at__gt=self.cutoff,
                ).values_list("saga_id", flat=True)
            )
        blind = self._compensated_blind([s.pk for s in chunk if s.state in COMPENSATION_STATES])

        # The gateway, outside any transaction, after the database reads.
        charges: dict[str, list[GatewayCharge] | None] = {}
        for saga in chunk:
            if saga.state != S.PENDING or saga.intent_id in ledger:
                charges[saga.intent_id] = self._list_charges(saga.intent_id)

        current = dict(PurchaseSaga.objects.filter(pk__in=ids).values_list("pk", "version"))
        for saga in chunk:
            if current.get(saga.pk) != saga.version:
                self.report.sagas_skipped += 1
                continue
            self.report.sagas_checked += 1
            entries = ledger.get(saga.intent_id, _Ledger())
            if saga.intent_id in charges:
                self._check_money(saga, entries, charges[saga.intent_id])
            self._check_entries(saga, entries)
            self._check_emails(saga, messages.get(saga.pk, {}))
            if saga.state not in TERMINAL:
                self._check_stuck(saga, alerts.get(saga.pk, []), saga.pk in driven)
            if saga.pk in blind:
                self.flag(UNKNOWN_NEVER_COMPENSATED_BLIND, saga.pk, saga.intent_id, blind[saga.pk])

    def _ledger_for(self, intent_ids: list[str]) -> dict[str, _Ledger]:
        ledger: dict[str, _Ledger] = defaultdict(_Ledger)
        for intent_id, kind, n, total, overrides in (
            LedgerEntry.objects.filter(intent_id__in=intent_ids)
            .values("intent_id", "kind")
            .annotate(n=Count("id"), total=Sum("amount"),
                      overrides=Count("id", filter=Q(override=True)))
            .values_list("intent_id", "kind", "n", "total", "overrides")
        ):
            entry = ledger[intent_id]
            entry.net += total or 0
            entry.overrides += overrides
            if kind == EntryKind.CHARGE:
                entry.charges += n
            elif kind == EntryKind.REFUND:
                entry.refunds += n
            else:
                entry.others += n
        return dict(ledger)

    def _email_messages(self, saga_ids: list) -> dict:
        """saga id -> topic -> [(created_at, sent)] for the two email topics."""
        out: dict = defaultdict(lambda: defaultdict(list))
        sent = {
            services.TOPIC_CONFIRMED: CONFIRMATION_EMAIL,
            services.TOPIC_CANCELLED: CANCELLATION_EMAIL,
        }
        rows = (
            OutboxMessage.objects.filter(saga_id__in=saga_ids, topic__in=list(sent))
            .annotate(
                confirmation_sent=Exists(InboxEntry.objects.filter(
                    message=OuterRef("pk"), consumer=CONFIRMATION_EMAIL)),
                cancellation_sent=Exists(InboxEntry.objects.filter(
                    message=OuterRef("pk"), consumer=CANCELLATION_EMAIL)),
            )
            .values_list("saga_id", "topic", "created_at", "confirmation_sent",
                         "cancellation_sent")
        )
        for saga_id, topic, created_at, confirmation_sent, cancellation_sent in rows:
            is_sent = confirmation_sent if topic == services.TOPIC_CONFIRMED else cancellation_sent
            out[saga_id][topic].append((created_at, is_sent))
        return out

    def _list_charges(self, intent_id: str) -> list[GatewayCharge] | None:
        """The intent's charges, or None (the reason in ``self.unanswered``)."""
        if self.failures_in_a_row >= GATEWAY_FAILURES_BEFORE_GIVING_UP:
            self.unanswered[intent_id] = (
                f"not asked: the gateway gave no answer {self.failures_in_a_row} times in a row")
            return None
        self.report.intents_checked += 1
        try:
            charges = self.gateway.list_charges(intent_id)
        except GatewayUnavailable as exc:
            self.failures_in_a_row += 1
            self.unanswered[intent_id] = str(exc)
            logger.warning("audit: gateway unavailable", extra={"intent_id": intent_id,
                                                                "detail": str(exc)})
            return None
        self.failures_in_a_row = 0
        return charges

    def _unverified(self, saga_id, intent_id: str, *, override: bool = False) -> None:
        waiting = "; an operator's override awaits the gateway's records" if override else ""
        self.report.unverified.append(
            Unverified(str(saga_id) if saga_id else None, intent_id,
                       f"money of this intent not verified ({self.unanswered[intent_id]})"
                       f"{waiting}"))

    # --- per-saga verdicts ------------------------------------------------------------

    def _check_money(self, saga: PurchaseSaga, entries: _Ledger,
                     charges: list[GatewayCharge] | None) -> None:
        if charges is None:
            self._unverified(saga.pk, saga.intent_id, override=bool(entries.overrides))
            return
        captured = sum(c.amount for c in charges if c.status == "succeeded")
        if entries.overrides and captured != entries.net:
            # Named for what it is (not a plain ledger mismatch): money an
            # operator wrote on their own word, which the gateway contradicts.
            self.flag(OVERRIDE_AGREES_WITH_GATEWAY, saga.pk, saga.intent_id,
                      f"an operator's override wrote ledger net {entries.net}; the gateway's "
                      f"net captured is {captured} (saga {saga.state})")
            return
        if len(charges) > 1:
            self.flag(ONE_CHARGE_PER_INTENT, saga.pk, saga.intent_id,
                      f"{len(charges)} charges at the gateway: "
                      + ", ".join(f"{c.id} {c.amount} {c.status}" for c in charges))
        # A live saga in the middle of a step may legitimately disagree for a
        # moment (charged, answer not yet recorded); an old one may not.
        settled = saga.state in TERMINAL or saga.updated_at <= self.cutoff
        if settled and captured != entries.net:
            self.flag(LEDGER_EQUALS_GATEWAY, saga.pk, saga.intent_id,
                      f"ledger net {entries.net} != gateway net captured {captured} "
                      f"(saga {saga.state})")

    def _check_entries(self, saga: PurchaseSaga, entries: _Ledger) -> None:
        if saga.state == S.CONFIRMED and (entries.charges != 1 or entries.refunds
                                          or entries.others):
            self.flag(CONFIRMED_HAS_ONE_CHARGE_ENTRY, saga.pk, saga.intent_id,
                      f"CONFIRMED with {entries.charges} charge, {entries.refunds} refund and "
                      f"{entries.others} other ledger entries")
        elif saga.state == S.COMPENSATED and entries.net != 0:
            self.flag(CONFIRMED_HAS_ONE_CHARGE_ENTRY, saga.pk, saga.intent_id,
                      f"COMPENSATED but the ledger nets {entries.net}")

    def _check_emails(self, saga: PurchaseSaga, messages: dict) -> None:
        confirmed = messages.get(services.TOPIC_CONFIRMED, [])
        cancelled = messages.get(services.TOPIC_CANCELLED, [])
        for topic, rows in ((services.TOPIC_CONFIRMED, confirmed),
                            (services.TOPIC_CANCELLED, cancelled)):
            if len(rows) > 1:
                self.flag(EMAILS_EXACTLY_ONCE, saga.pk, saga.intent_id,
                          f"{len(rows)} {topic} messages")
        if saga.state == S.CONFIRMED:
            self._one_sent(saga, services.TOPIC_CONFIRMED, confirmed, CONFIRMATION_EMAIL)
            if cancelled:
                self.flag(EMAILS_EXACTLY_ONCE, saga.pk, saga.intent_id,
                          f"CONFIRMED but a {services.TOPIC_CANCELLED} message exists")
        elif saga.state == S.COMPENSATED:
            self._one_sent(saga, services.TOPIC_CANCELLED, cancelled, CANCELLATION_EMAIL)

    def _one_sent(self, saga: PurchaseSaga, topic: str, rows: list, consumer: str) -> None:
        if not rows:
            self.flag(EMAILS_EXACTLY_ONCE, saga.pk, saga.intent_id,
                      f"{saga.state} without a {topic} message")
            return
        for created_at, sent in rows:
            if not sent and created_at <= self.cutoff:
                self.flag(EMAILS_EXACTLY_ONCE, saga.pk, saga.intent_id,
                          f"{topic} not processed by {consumer} after {self.age(created_at)}")

    def _check_stuck(self, saga: PurchaseSaga, alerts: list[datetime], driven: bool) -> None:
        started = saga.compensation_started_at
        if (
            saga.state in COMPENSATION_UNFINISHED
            and started is not None
            and started + self.compensation_deadline <= self.cutoff
        ):
            # Past its deadline (with the usual grace) a compensation must be
            # named by an alert raised since it started, however busy its
            # retries keep it: being driven is not being settled.
            if not any(at >= started for at in alerts):
                self.flag(NO_SILENT_STUCK, saga.pk, saga.intent_id,
                          f"{saga.state}: compensation started {self.age(started)} ago, past "
                          "its deadline, and no alert names it")
            return
        if saga.updated_at > self.cutoff or driven:
            return
        # The alert must name the saga in its current state, not an earlier one.
        if saga.state in ESCALATED and any(at >= saga.updated_at for at in alerts):
            return
        why = "no alert names it" if saga.state in ESCALATED else "no timer drives it"
        self.flag(NO_SILENT_STUCK, saga.pk, saga.intent_id,
                  f"{saga.state} for {self.age(saga.updated_at)}, {why}")

    def _compensated_blind(self, saga_ids: list) -> dict:
        """saga id -> detail, for compensations decided without a definitive
        gateway answer after the charge outcome became unknown."""
        if not saga_ids:
            return {}
        history: dict = defaultdict(list)
        for row in SagaHistory.objects.filter(saga_id__in=saga_ids).order_by(
            "saga_id", "at", "id"
        ).values("saga_id", "to_state", "at", "actor", "actor_name"):
            history[row["saga_id"]].append(row)
        moves = {}
        for saga_id, rows in history.items():
            unknown_at = None
            for row in rows:
                if row["to_state"] in UNKNOWN_STATES:
                    unknown_at = row["at"]
                elif row["to_state"] == S.CONFIRMED:
                    unknown_at = None  # settled: a later refund compensates a known charge
                elif row["to_state"] == S.COMPENSATING and unknown_at is not None:
                    moves[saga_id] = (unknown_at, row)
                    break
        if not moves:
            return {}
        evidence: dict = defaultdict(list)
        for saga_id, at in ReconciliationProbe.objects.filter(
            DEFINITIVE_PROBES, saga_id__in=list(moves)
        ).values_list("saga_id", "at"):
            evidence[saga_id].append(at)
        blind = {}
        for saga_id, (unknown_at, move) in moves.items():
            if move["actor"] == Actor.OPERATOR:
                continue
            if any(unknown_at <= at <= move["at"] for at in evidence[saga_id]):
                continue
            blind[saga_id] = (
                f"moved to COMPENSATING by {move['actor']} at {move['at'].isoformat()} after "
                f"an unknown charge outcome ({unknown_at.isoformat()}) without a definitive "
                "gateway answer"
            )
        return blind

    # --- ledger rows that belong to no saga -----------------------------------------

    def check_ledger_without_saga(self) -> None:
        orphans: dict[str, dict] = {}
        for intent_id, saga_id, total in (
            LedgerEntry.objects.exclude(intent_id__in=PurchaseSaga.objects.values("intent_id"))
            .values("intent_id", "saga_id").annotate(total=Sum("amount"))
            .values_list("intent_id", "saga_id", "total")
        ):
            row = orphans.setdefault(intent_id, {"saga_id": saga_id, "net": 0})
            row["net"] += total or 0
        for intent_id, row in orphans.items():
            charges = self._list_charges(intent_id)
            if charges is None:
                self._unverified(row["saga_id"], intent_id)
                continue
            if len(charges) > 1:
                self.flag(ONE_CHARGE_PER_INTENT, row["saga_id"], intent_id,
                          f"{len(charges)} charges at the gateway")
            captured = sum(c.amount for c in charges if c.status == "succeeded")
            if captured != row["net"]:
                self.flag(LEDGER_EQUALS_GATEWAY, row["saga_id"], intent_id,
                          f"ledger net {row['net']} != gateway net captured {captured} "
                          "(ledger entries of an intent no saga has)")
