"""The verdict on a saga: what happened, what is owed, what moves it next,
in one or two lines an operator reads at 3 a.m. (the top of the saga page).

It reads the saga's own rows (history, gateway answers, outbox rows and
timers with the inbox, ledger, seats) and nothing else: it never asks the
gateway and writes nothing. :func:`saga_facts` loads the rows (the admin
passes the same facts to its timeline), :func:`verdict_from` is the pure
reading of them, :func:`saga_verdict` both.

What moves a live saga next comes from the armed timers and from the driver
table the resumer uses (``services.DRIVES``). "Needs an operator" is one rule,
written twice side by side: in Python for a saga's facts
(:attr:`Verdict.needs_operator`) and as a query condition for the list
(:func:`needs_operator_condition`).

A confirmed purchase stays CONFIRMED whatever is given back: its refunds are
rows of their own (docs/refunds.md), each listed with its amount, status,
who asked and why, its seats, and what moves it next (its look-up, its
chaser). A refund the processor refused, with no newer refund of the
purchase, and one still pending past its deadline need an operator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from common.money import format_money
from common.time import format_utc_seconds as at_
from ledger.models import EntryKind, LedgerEntry
from outbox.models import InboxEntry, OutboxMessage

from .. import services
from ..models import (
    Actor,
    Dispute,
    GatewayAnswer,
    PurchaseSaga,
    Refund,
    RefundStatus,
    ReservationSeat,
    ReservationStatus,
    SagaHistory,
    SeatStatus,
)
from ..saga.states import TERMINAL, SagaState
from ..saga.topics import CANCELLATION_EMAIL, CONFIRMATION_EMAIL, DRIVING, ROUTING, Topic

S = SagaState

SETTLED = "Nothing: the purchase is settled."

TIMER_TOPICS = frozenset({Topic.HOLD_EXPIRED, *DRIVING})
# A refund's own timers: its look-ups and its chaser (they never move the saga).
REFUND_TIMERS = frozenset({Topic.REFUND_EXECUTE, Topic.REFUND_CHASE})
REFUND_SETTLED = Topic.REFUND_SETTLED
REFUND_EMAIL = ROUTING[Topic.REFUND_SETTLED][0]
# Compensation under way: the seats are not released before it ends.
_COMPENSATING = frozenset({S.PAYMENT_FAILED, S.EXPIRED, S.COMPENSATING, S.COMPENSATION_PENDING})
# A charge outcome that is not definitive: the hold expiry cancels the
# intent before it releases anything.
_IN_DOUBT = frozenset({S.PENDING, S.CHARGING, S.REQUIRES_ACTION, S.UNKNOWN, S.UNKNOWN_EXPIRED})
_ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})")


@dataclass(frozen=True)
class Verdict:
    headline: str  # what happened and what is owed
    details: tuple[str, ...]  # the evidence behind it, one line each
    next_step: str  # what moves the saga next, and when; or what the operator does
    needs_operator: bool


@dataclass
class SagaFacts:
    """A saga's rows, read once (the verdict and the admin's timeline)."""

    saga: PurchaseSaga
    history: list[SagaHistory]
    gateway_answers: list[GatewayAnswer]
    outbox: list[OutboxMessage]
    # outbox message id -> consumer -> when it processed the message
    processed: dict[int, dict[str, datetime]]
    ledger: list[LedgerEntry]
    seat_links: list[ReservationSeat]
    # Chargebacks of its charge, oldest first (purchases/disputes.py).
    disputes: list[Dispute] = field(default_factory=list)
    # Money given back to a confirmed purchase, oldest first (docs/refunds.md).
    refunds: list[Refund] = field(default_factory=list)


def saga_facts(saga: PurchaseSaga) -> SagaFacts:
    outbox = list(OutboxMessage.objects.filter(saga_id=saga.pk).order_by("created_at", "id"))
    processed: dict[int, dict[str, datetime]] = {}
    if outbox:
        for message_id, consumer, when in InboxEntry.objects.filter(
            message_id__in=[m.pk for m in outbox]
        ).values_list("message_id", "consumer", "processed_at"):
            processed.setdefault(message_id, {})[consumer] = when
    return SagaFacts(
        saga=saga,
        history=list(SagaHistory.objects.filter(saga=saga).order_by("at", "id")),
        gateway_answers=list(GatewayAnswer.objects.filter(saga=saga).order_by("at", "id")),
        outbox=outbox,
        processed=processed,
        ledger=list(LedgerEntry.objects.filter(saga_id=saga.pk).order_by("created_at", "id")),
        seat_links=list(
            ReservationSeat.objects.filter(reservation_id=saga.reservation_id)
            .select_related("seat")
            .order_by("seat__row", "seat__number", "id")
        ),
        disputes=list(
            Dispute.objects.filter(saga_id=saga.pk, event_id=saga.event_id).order_by(
                "created_at", "id"
            )
        ),
        refunds=list(
            Refund.objects.filter(saga_id=saga.pk, event_id=saga.event_id)
            .select_related("requested_by")
            .order_by("created_at", "id")
        ),
    )


def saga_verdict(
    saga: PurchaseSaga, *, facts: SagaFacts | None = None, now: datetime | None = None
) -> Verdict:
    """The verdict on ``saga`` (reads its rows unless ``facts`` are given)."""
    return verdict_from(facts or saga_facts(saga), now=now)


def verdict_from(facts: SagaFacts, *, now: datetime | None = None) -> Verdict:
    return _Reading(facts, now or timezone.now()).verdict()


# --- "needs an operator", for the list ------------------------------------------------


def needs_operator_condition() -> Q:
    """:attr:`Verdict.needs_operator` as a condition on a queryset of sagas:
    ``UNKNOWN_EXPIRED``, ``awaiting_operator_since`` set, an alert on a live
    saga that no operator has acted on since it was raised, or a dead letter."""
    # After the alert, strictly: the operator's move that raised it (a refund
    # the gateway refused) is not an answer to it.
    acted_since = SagaHistory.objects.filter(
        saga_id=OuterRef(OuterRef("pk")), actor=Actor.OPERATOR, at__gt=OuterRef("created_at")
    )
    unanswered = OutboxMessage.objects.filter(
        saga_id=OuterRef("pk"), topic=Topic.NEEDS_OPERATOR
    ).exclude(Exists(acted_since))
    dead = OutboxMessage.objects.filter(
        saga_id=OuterRef("pk"),
        dead_at__isnull=False,
        completed_at__isnull=True,
        cancelled_at__isnull=True,
    )
    return (
        Q(state=S.UNKNOWN_EXPIRED)
        | Q(awaiting_operator_since__isnull=False)
        | (~Q(state__in=list(TERMINAL)) & Exists(unanswered))
        | Q(Exists(dead))
        | Q(Exists(_refunds_waiting(now=timezone.now())))
    )


def _refunds_waiting(*, now: datetime):
    """A refund of the saga that needs an operator: refused by the processor
    with no newer refund of the purchase, or still pending past its deadline
    (:meth:`_Reading.refunds_waiting`, the same rule)."""
    newer = Refund.objects.filter(
        saga_id=OuterRef("saga_id"),
        event_id=OuterRef("event_id"),
        created_at__gt=OuterRef("created_at"),
    )
    deadline = now - timedelta(seconds=settings.REFUND_CHASE_SECONDS)
    return Refund.objects.filter(saga_id=OuterRef("pk"), event_id=OuterRef("event_id")).filter(
        (Q(status=RefundStatus.FAILED) & ~Exists(newer))
        | Q(status=RefundStatus.PENDING, created_at__lte=deadline)
    )


# --- reading the reservation and the seats beside the saga ----------------------------


def reservation_reading(saga_state: str, reservation_status: str, *, given_back: int = 0) -> str:
    """The reservation's status read with the saga's, so that the two do not
    look like a contradiction when they are not one; ``given_back``: how many
    of its seats refunds put back on sale (a confirmed purchase's
    reservation stays CONFIRMED: docs/refunds.md)."""
    state, status = SagaState(saga_state), reservation_status
    if status == ReservationStatus.HELD:
        if state == S.UNKNOWN_EXPIRED:
            return f"HELD until an operator settles the purchase (the saga is {state})"
        if state in _COMPENSATING:
            return f"HELD until the compensation releases the seats (the saga is {state})"
        if state not in TERMINAL:
            return f"HELD while the purchase is in flight (the saga is {state})"
    if status == ReservationStatus.CONFIRMED:
        if state == S.CONFIRMED and given_back:
            return (
                f"CONFIRMED: the seats are sold, but for {_plural(given_back, 'seat')} its "
                "refunds gave back (the saga is CONFIRMED)"
            )
        if state == S.CONFIRMED:
            return "CONFIRMED: the seats are sold (the saga is CONFIRMED)"
        if state in (S.COMPENSATING, S.COMPENSATION_PENDING):
            return (
                f"CONFIRMED until the refund is through and the seats are released "
                f"(the saga is {state})"
            )
    if status == ReservationStatus.CANCELLED and state == S.COMPENSATED:
        return "CANCELLED because the saga is COMPENSATED"
    return f"{status} while the saga is {state}: they disagree (run audit_sagas)"


_HELD_BY_IT: dict[str, str] = {
    SeatStatus.HELD: "held for this purchase",
    SeatStatus.SOLD: "sold to this purchase",
}
_AFTER_IT: dict[str, str] = {
    SeatStatus.AVAILABLE: "now available",
    SeatStatus.HELD: "now held by another purchase",
    SeatStatus.SOLD: "now sold to another purchase",
}


def seat_reading(link: ReservationSeat) -> str:
    """One seat of the reservation: its status for this purchase. Once
    released, the seat's status is another purchase's business."""
    status = link.seat.status
    if link.released_at is None:
        return _HELD_BY_IT.get(
            status, f"{status}, yet not released by this purchase (run audit_sagas)"
        )
    now = _AFTER_IT.get(status, f"now {status}")
    return f"released {at_(link.released_at)}; {now}"


# --- the reading ----------------------------------------------------------------------


def _plural(n: int, word: str, plural: str = "") -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def _times_in(text: str) -> str:
    """ISO 8601 times inside a stored text (an alert's why), written the way
    the page writes times."""

    def rewrite(match: re.Match) -> str:
        try:
            return at_(datetime.fromisoformat(match.group(0)))
        except ValueError:
            return match.group(0)

    return _ISO_TIME.sub(rewrite, text)


class _Reading:
    def __init__(self, facts: SagaFacts, now: datetime) -> None:
        self.facts = facts
        self.saga = saga = facts.saga
        self.now = now
        self.state = SagaState(saga.state)
        self.money = format_money(saga.amount, saga.currency)
        self.charge = next((e for e in facts.ledger if e.kind == EntryKind.CHARGE), None)
        self.refund = next((e for e in facts.ledger if e.kind == EntryKind.REFUND), None)
        live = [m for m in facts.outbox if not (m.cancelled_at or m.completed_at or m.dead_at)]
        self.timers = sorted(
            (m for m in live if m.topic in TIMER_TOPICS | REFUND_TIMERS),
            key=lambda m: (m.available_at, m.pk),
        )
        self.driving = next((m for m in self.timers if m.topic in DRIVING), None)
        self.hold_timer = next((m for m in self.timers if m.key == saga.hold_timer_key), None)
        self.dead = [
            m for m in facts.outbox if m.dead_at and not m.completed_at and not m.cancelled_at
        ]
        self.alerts = [m for m in facts.outbox if m.topic == Topic.NEEDS_OPERATOR]
        acted = [h.at for h in facts.history if h.actor == Actor.OPERATOR]
        last_acted = max(acted) if acted else None
        self.unanswered = (
            []
            if self.state in TERMINAL
            else [a for a in self.alerts if last_acted is None or last_acted <= a.created_at]
        )
        self.waiting = self.refunds_waiting()
        # A refund's alert stands while its refund waits for an operator.
        waiting_ids = {str(r.pk) for r in self.waiting}
        self.unanswered += [
            a for a in self.alerts if (a.key or "").rpartition(":")[2] in waiting_ids
        ]

    def refunds_waiting(self) -> list[Refund]:
        """The refunds that need an operator (:func:`_refunds_waiting`, the
        same rule): refused with no newer refund, or pending past the deadline."""
        deadline = self.now - timedelta(seconds=settings.REFUND_CHASE_SECONDS)
        refunds = self.facts.refunds
        return [
            r
            for r in refunds
            if (
                r.status == RefundStatus.FAILED
                and not any(other.created_at > r.created_at for other in refunds)
            )
            or (r.status == RefundStatus.PENDING and r.created_at <= deadline)
        ]

    # --- the whole ------------------------------------------------------------------

    def verdict(self) -> Verdict:
        needs_operator = bool(
            self.state == S.UNKNOWN_EXPIRED
            or self.saga.awaiting_operator_since
            or self.unanswered
            or self.dead
            or self.waiting
        )
        if self.state == S.CONFIRMED:
            headline = self._confirmed() + self._refunded()
            next_step = self._refund_next_step() or self._settled(Topic.CONFIRMED)
        elif self.state == S.COMPENSATED:
            headline, next_step = self._compensated(), self._settled(Topic.CANCELLED)
        else:
            headline = f"{self.state}: {self._operator_prefix()}{self._live_headline()}"
            next_step = self._live_next_step()
        if self.dead:
            replay = (
                "Fix the failing consumer, then replay the dead letter (Outbox → Outbox "
                "messages, “dead letters”)."
            )
            next_step = replay if next_step == SETTLED else f"{next_step} {replay}"
        return Verdict(headline, tuple(self._details()), next_step.strip(), needs_operator)

    # --- settled ------------------------------------------------------------------------

    def _confirmed(self) -> str:
        if self.charge is None:
            return f"CONFIRMED, but the ledger holds no charge of {self.money}: run audit_sagas"
        reference = self.charge.gateway_reference or "no charge id"
        override = " on an operator's override" if self.charge.override else ""
        return (
            f"charged {format_money(self.charge.amount, self.charge.currency)} once "
            f"({reference}){override}, {self._seats()}, {self._email(Topic.CONFIRMED)}"
            f"{self._disputed()}"
        )

    def _refunded(self) -> str:
        """What its refunds gave back, owe, or failed to (none: nothing)."""
        refunds = self.facts.refunds
        if not refunds:
            return ""
        cur = self.saga.currency
        done = sum(r.amount for r in refunds if r.status == RefundStatus.SUCCEEDED)
        owed = sum(r.amount for r in refunds if r.status == RefundStatus.PENDING)
        parts = []
        if done:
            whole = "in full" if done >= self.saga.amount else f"of {self.money}"
            parts.append(f"refunded {format_money(done, cur)} {whole}, {self._refund_emails()}")
        if owed:
            parts.append(f"a refund of {format_money(owed, cur)} pending")
        for r in refunds:
            if r.status == RefundStatus.FAILED:
                parts.append(f"a refund of {format_money(r.amount, cur)} FAILED ({r.detail})")
        return "; " + "; ".join(parts)

    def _refund_mails(self) -> list[tuple[Refund, OutboxMessage | None]]:
        """Each succeeded refund with its email's message (None: none written)."""
        rows = {
            m.payload.get("refund_id"): m for m in self.facts.outbox if m.topic == REFUND_SETTLED
        }
        return [
            (r, rows.get(str(r.pk)))
            for r in self.facts.refunds
            if r.status == RefundStatus.SUCCEEDED
        ]

    def _refund_emails(self) -> str:
        mails = self._refund_mails()
        sent = [self.facts.processed.get(m.pk, {}).get(REFUND_EMAIL) for _, m in mails if m]
        done = [at for at in sent if at is not None]
        if len(done) == len(mails):
            word = "refund email" if len(done) == 1 else f"{len(done)} refund emails"
            return f"{word} sent {at_(max(done))}"
        if any(m is None for _, m in mails):
            return "a refund email never written (run audit_sagas)"
        return "refund email not sent yet"

    def _refund_next_step(self) -> str:
        """What moves its refunds next ("" when none is pending, waits, or
        owes its email)."""
        if self.waiting:
            failed = [r for r in self.waiting if r.status == RefundStatus.FAILED]
            if failed:
                return (
                    f"An operator decides about the refused refund {failed[-1].pk}: a new "
                    "refund (“Refund”), or the money sent back another way; nothing "
                    "automatic retries it."
                )
            return (
                f"The refund {self.waiting[0].pk} is still not settled past its deadline: "
                "check it in the processor's dashboard; its look-ups go on."
            )
        pending = [r for r in self.facts.refunds if r.status == RefundStatus.PENDING]
        if not pending:
            owed = [
                m
                for _, m in self._refund_mails()
                if m is not None
                and m not in self.dead
                and not self.facts.processed.get(m.pk, {}).get(REFUND_EMAIL)
            ]
            if owed:
                return (
                    f"The refund email is owed: the relay hands {REFUND_SETTLED} over "
                    f"(due {at_(owed[0].available_at)})."
                )
            return ""
        timers = [m for m in self.timers if m.topic == Topic.REFUND_EXECUTE]
        step = (
            f"the refund is {self._timer(timers[0])}"
            if timers
            else "the refund is asked of the processor by its message (refund.execute)"
        )
        return f"{step[:1].upper()}{step[1:]}; the chaser alerts if it is not settled in time."

    def _disputed(self) -> str:
        if not self.facts.disputes:
            return ""
        d = self.facts.disputes[-1]
        return f"; DISPUTED ({d.status}, {format_money(d.amount, d.currency)})"

    def _compensated(self) -> str:
        if self.charge is not None and self.refund is None:
            net = format_money(sum(e.amount for e in self.facts.ledger), self.saga.currency)
            return (
                f"COMPENSATED, but the ledger nets {net}: a charge without its refund "
                "(run audit_sagas)"
            )
        if self.refund is not None:
            money = format_money(-self.refund.amount, self.refund.currency)
            return f"refunded {money}, {self._seats()}, {self._email(Topic.CANCELLED)}"
        return f"not charged, {self._seats()}, {self._email(Topic.CANCELLED)}"

    def _settled(self, topic: str) -> str:
        row = self._last(topic)
        if row is None or row in self.dead or self._email_sent(row):
            return SETTLED
        return (
            f"The {self._email_kind(row)} email is owed: the relay hands "
            f"{topic} over (due {at_(row.available_at)})."
        )

    # --- live -----------------------------------------------------------------------

    def _operator_prefix(self) -> str:
        if self.saga.awaiting_operator_since:
            return f"needs an operator since {at_(self.saga.awaiting_operator_since)} — "
        alert = self.unanswered or (self.alerts if self.state == S.UNKNOWN_EXPIRED else [])
        if alert:
            why = _times_in(alert[-1].payload.get("why", ""))
            return (
                f"needs an operator (alert raised {at_(alert[-1].created_at)}"
                f"{': ' + why if why else ''}) — "
            )
        if self.state == S.UNKNOWN_EXPIRED:
            return "needs an operator — "
        if self.dead:
            return f"needs an operator (dead letter: {self.dead[0].topic}) — "
        return ""

    def _live_headline(self) -> str:
        state, money, seats = self.state, self.money, self._seats()
        if state == S.PENDING:
            return f"not charged yet; {seats}"
        if state == S.CHARGING:
            asked = self._last_move_to(S.CHARGING)
            when = f" at {at_(asked.at)}" if asked else ""
            return f"{money} asked of the gateway{when}, no answer recorded yet; {seats}"
        if state == S.REQUIRES_ACTION:
            asked = self._last_move_to(S.REQUIRES_ACTION)
            when = f" since {at_(asked.at)}" if asked else ""
            return (
                f"{money} not charged: waiting for the buyer to authenticate (3-D Secure)"
                f"{when}; {seats}"
            )
        if state == S.UNKNOWN:
            answer = self._last_answer("charge")
            cause = (
                f"the charge's answer was lost: {answer.detail or answer.answer}"
                if answer is not None and answer.answer == "unknown"
                else "the charge's answer was never recorded"
            )
            return f"not known yet whether {money} was charged ({cause}); {seats}"
        if state == S.UNKNOWN_EXPIRED:
            return f"not known whether {money} was charged; {seats}"
        if state == S.PAYMENT_FAILED:
            answer = self._last_answer("charge", "retrieve")
            detail = f" ({answer.detail})" if answer is not None and answer.detail else ""
            return f"declined{detail}, not charged; {seats}"
        if state == S.EXPIRED:
            return (
                "the hold ran out and the intent was cancelled at the gateway; "
                f"not charged; {seats}"
            )
        owed = self.charge is not None and self.refund is None
        if state == S.COMPENSATING:
            return f"{'refund of ' + money + ' owed' if owed else 'nothing to refund'}; {seats}"
        # COMPENSATION_PENDING
        if self.saga.awaiting_operator_since:
            answer = self._last_answer("refund")
            said = answer.answer if answer is not None else "not_charged"
            reference = self.charge.gateway_reference if self.charge else "no charge id"
            return (
                f"the gateway says there is no charge to refund ({said}) while the ledger "
                f"holds {money} ({reference}); {seats}"
            )
        answer = self._last_answer("refund")
        said = (
            f" (the gateway answered {answer.answer}"
            f"{': ' + answer.detail if answer.detail else ''}, {at_(answer.at)})"
            if answer is not None
            else ""
        )
        return f"refund of {money} not confirmed yet{said}; retrying; {seats}"

    def _live_next_step(self) -> str:
        state = self.state
        if self.saga.awaiting_operator_since:
            return (
                "Compare the ledger with the gateway's view (“Ask the gateway”), then "
                "confirm after manual check (the gateway holds none of the money) or "
                "compensate after manual check (retry the refund); no retry or resumer "
                "moves it."
            )
        if state == S.UNKNOWN_EXPIRED:
            step = (
                "Check the gateway (“Ask the gateway”), then confirm after manual check "
                "(charged) or compensate after manual check (not charged); nothing "
                "automatic decides it."
            )
            if self.hold_timer is not None:
                step += (
                    f" Meanwhile the hold expiry at {at_(self.hold_timer.available_at)} "
                    "cancels the intent and compensates, or confirms if the gateway says "
                    "it was charged."
                )
            elif self.driving is not None:
                step += f" Meanwhile: {self._timer(self.driving)}."
            return step
        parts = []
        if self.driving is not None:
            parts.append(self._timer(self.driving))
        elif state == S.PENDING:
            parts.append("the charge task charges it (enqueued when the purchase started)")
        elif state == S.CHARGING:
            parts.append("the worker that asked records the gateway's answer")
        elif state == S.REQUIRES_ACTION:
            parts.append(
                "the processor's event (or the next look-up) tells how the authentication ended"
            )
        elif state in (S.PAYMENT_FAILED, S.EXPIRED, S.COMPENSATING):
            parts.append(
                "the compensation runs (a refund if charged, then the seats are "
                "released and the buyer told)"
            )
        if self.hold_timer is not None and state in _IN_DOUBT:
            parts.append(
                f"the hold expires {at_(self.hold_timer.available_at)}, then the intent "
                "is cancelled and the purchase compensated (or confirmed, if the "
                "gateway says it was charged)"
            )
        elif self.hold_timer is not None:
            parts.append(
                f"the hold expiry at {at_(self.hold_timer.available_at)} pushes the "
                "compensation along"
            )
        if state in (S.COMPENSATING, S.COMPENSATION_PENDING) and not self._deadline_alerted():
            started = self.saga.compensation_started_at
            if started is not None:
                deadline = started + timedelta(seconds=settings.COMPENSATION_DEADLINE_SECONDS)
                done = "refunded" if self.charge is not None and self.refund is None else "finished"
                parts.append(f"the chaser alerts if it is not {done} by {at_(deadline)}")
        step = "; ".join(parts)
        return f"{step[:1].upper()}{step[1:]}. {self._resumer()}" if step else self._resumer()

    def _resumer(self) -> str:
        drive = services.DRIVES.get(self.state)
        if drive is None:
            return ""
        if self.driving is not None:
            return f"Should it stop moving, the resumer will act: {drive.why}."
        due = self.saga.updated_at + timedelta(seconds=settings.RESUME_AFTER_SECONDS)
        return f"If nothing moves it by {at_(due)}, the resumer will act: {drive.why}."

    def _deadline_alerted(self) -> bool:
        return any((a.key or "").endswith(":compensation_deadline") for a in self.alerts)

    def _timer(self, m: OutboxMessage) -> str:
        due = at_(m.available_at)
        if m.topic == Topic.RECONCILE:
            text = (
                f"reconcile probe {m.payload.get('attempt', '?')} of "
                f"{len(settings.RECONCILE_BACKOFF_SECONDS)} at {due}"
            )
        elif m.topic == Topic.REFUND_RETRY:
            text = f"refund retry {(m.key or '').rpartition(':')[2]} at {due}"
        elif m.topic == Topic.REFUND_EXECUTE:
            asked = "looked up" if (m.key or "").startswith("refund-lookup:") else "asked"
            text = f"{asked} of the processor at {due} (refund {m.payload.get('refund_id')})"
        elif m.topic == Topic.REFUND_CHASE:
            text = (
                f"the refund's deadline at {due}: the chaser alerts if it is not settled "
                f"(refund {m.payload.get('refund_id')})"
            )
        elif m.topic == Topic.HOLD_RECHECK:
            text = (
                f"hold re-check {m.payload.get('attempt', '?')} at {due} (the hold ran out; "
                "the gateway is asked again to cancel the intent)"
            )
        else:
            text = f"the hold expires {due}"
        if m.fired_at is not None:
            text += (
                f" (handed over {at_(m.fired_at)}, not completed: "
                f"{_plural(m.deliveries, 'delivery', 'deliveries')}"
                f"{', last error: ' + m.last_error if m.last_error else ''})"
            )
        elif m.available_at < self.now - timedelta(seconds=settings.RESUME_AFTER_SECONDS):
            text += " (overdue: is the relay running?)"
        return text

    # --- pieces ---------------------------------------------------------------------

    def _seats(self) -> str:
        links = self.facts.seat_links
        refs = ", ".join(link.seat.ref for link in links)
        if self.state == S.COMPENSATED:
            released = [link for link in links if link.released_at is not None]
            if len(released) == len(links):
                return f"{_plural(len(links), 'seat')} released ({refs})"
            return f"{len(released)} of {_plural(len(links), 'seat')} released ({refs})"
        if self.state == S.CONFIRMED and any(link.released_at for link in links):
            return self._seats_given_back(links)
        statuses = {link.seat.status for link in links}
        unreleased = all(link.released_at is None for link in links)
        if len(statuses) == 1 and unreleased:
            still = "still " if self.state in _COMPENSATING else ""
            return f"{_plural(len(links), 'seat')} {still}{statuses.pop()} ({refs})"
        shown = "; ".join(f"{link.seat.ref}: {seat_reading(link)}" for link in links)
        return f"{_plural(len(links), 'seat')} ({shown})"

    def _seats_given_back(self, links: list[ReservationSeat]) -> str:
        """A confirmed purchase some of whose seats its refunds gave back."""
        kept = [link for link in links if link.released_at is None]
        back = [link for link in links if link.released_at is not None]
        parts = []
        if kept and {link.seat.status for link in kept} == {SeatStatus.SOLD}:
            parts.append(
                f"{_plural(len(kept), 'seat')} sold ({', '.join(k.seat.ref for k in kept)})"
            )
        elif kept:
            parts += [f"{link.seat.ref}: {seat_reading(link)}" for link in kept]
        given = ", ".join(link.seat.ref for link in back)
        parts.append(f"{_plural(len(back), 'seat')} given back by refunds ({given})")
        return ", ".join(parts)

    def _last(self, topic: str) -> OutboxMessage | None:
        rows = [m for m in self.facts.outbox if m.topic == topic]
        return rows[-1] if rows else None

    def _email_kind(self, row: OutboxMessage) -> str:
        if row.topic == Topic.CONFIRMED:
            return "confirmation"
        return "correction" if row.payload.get("was_confirmed") else "failure"

    def _email_sent(self, row: OutboxMessage) -> datetime | None:
        consumer = CONFIRMATION_EMAIL if row.topic == Topic.CONFIRMED else CANCELLATION_EMAIL
        return self.facts.processed.get(row.pk, {}).get(consumer)

    def _email(self, topic: str) -> str:
        row = self._last(topic)
        if row is None:
            return "no email written (run audit_sagas)"
        kind = self._email_kind(row)
        sent = self._email_sent(row)
        if sent is not None:
            return f"{kind} email sent {at_(sent)}"
        if row in self.dead:
            return f"{kind} email NOT sent: a dead letter since {at_(row.dead_at)}"
        if row.last_error:
            tries = _plural(row.deliveries, "delivery", "deliveries")
            return f"{kind} email not sent yet ({tries}, last error: {row.last_error})"
        return f"{kind} email not sent yet (queued {at_(row.created_at)})"

    def _last_answer(self, *asked: str) -> GatewayAnswer | None:
        answers = [a for a in self.facts.gateway_answers if a.asked in asked]
        return answers[-1] if answers else None

    def _last_move_to(self, state: str) -> SagaHistory | None:
        moves = [h for h in self.facts.history if h.to_state == state and h.from_state != state]
        return moves[-1] if moves else None

    # --- the evidence ---------------------------------------------------------------

    def _details(self) -> list[str]:
        lines = []
        moves = [h for h in self.facts.history if h.from_state != h.to_state]
        cause = next(
            (
                h
                for h in moves
                if h.to_state in (S.PAYMENT_FAILED, S.EXPIRED)
                or (h.to_state == S.COMPENSATING and h.from_state == S.CONFIRMED)
            ),
            None,
        )
        if cause is not None and self.state in _COMPENSATING | {S.COMPENSATED}:
            lines.append(f"why it is undone: {self._move(cause)}")
        if moves:
            lines.append(f"last move: {self._move(moves[-1])}")
        reconciled = self._reconciled()
        if reconciled:
            lines.append(reconciled)
        if self.facts.gateway_answers:
            asked = "; ".join(
                f"{a.asked}{' ' + str(a.attempt) if a.attempt else ''} → {a.answer}"
                f"{' (' + a.detail + ')' if a.detail and a.detail != a.answer else ''}"
                for a in self.facts.gateway_answers
            )
            lines.append(
                f"the gateway was asked {_plural(len(self.facts.gateway_answers), 'time')}: {asked}"
            )
        else:
            lines.append("the gateway was never asked")
        if self.facts.ledger:
            entries = ", ".join(
                f"{e.kind} {format_money(e.amount, e.currency)}"
                f"{' (' + e.gateway_reference + ')' if e.gateway_reference else ''}"
                f"{' [override]' if e.override else ''}"
                for e in self.facts.ledger
            )
            net = format_money(sum(e.amount for e in self.facts.ledger), self.saga.currency)
            lines.append(f"ledger: {entries}; net {net}")
        else:
            lines.append("ledger: no entry (no charge recorded)")
        lines += [self._refund_line(r) for r in self.facts.refunds]
        for d in self.facts.disputes:
            lines.append(
                f"dispute {d.processor_ref} opened {at_(d.created_at)}: {d.status}, "
                f"{format_money(d.amount, d.currency)}, reason {d.reason or 'not given'} "
                f"(last heard {at_(d.updated_at)}; answered in the processor's dashboard)"
            )
        for alert in self.alerts:
            answered = "unanswered" if alert in self.unanswered else "answered"
            why = _times_in(alert.payload.get("why", ""))
            lines.append(f"alert raised {at_(alert.created_at)}: {why} ({answered})")
        for row in self.dead:
            lines.append(
                f"dead letter since {at_(row.dead_at)}: {row.topic} "
                f"({row.last_error or 'no error recorded'})"
            )
        for timer in self.timers:
            lines.append(f"armed: {self._timer(timer)}")
        return lines

    def _refund_line(self, r: Refund) -> str:
        who = {
            "buyer": "the buyer cancelled",
            "organizer": "the organizer refunded",
            "event_cancellation": "the event was cancelled",
            "operator": "customer service refunded",
        }.get(r.source, r.source)
        by = f" ({r.requested_by.get_username()})" if r.requested_by else ""
        seats = f"; for seats {', '.join(r.seats)}" if r.seats else ""
        if r.released_seats:
            seats += f"; released {', '.join(r.released_seats)}"
        settled = f", {r.status} {at_(r.settled_at)}" if r.settled_at else f", {r.status}"
        looked = f", looked up {r.lookups} time(s)" if r.lookups else ""
        asked = (
            f"; asked of the processor{looked}"
            if r.asked or r.status != RefundStatus.PENDING
            else "; not asked of the processor yet"
        )
        detail = f" ({r.detail})" if r.detail else ""
        reason = f"; why: {r.reason}" if r.reason else ""
        ref = f"; processor's {r.processor_ref}" if r.processor_ref else ""
        return (
            f"refund {r.pk} of {format_money(r.amount, r.currency)}: {who}{by} "
            f"{at_(r.created_at)}{settled}{detail}{seats}{asked}{ref}{reason}"
        )

    def _move(self, h: SagaHistory) -> str:
        who = h.actor_name or h.actor
        return f"{h.from_state or '—'} → {h.to_state} at {at_(h.at)} by {who}: {h.reason}"

    def _reconciled(self) -> str:
        confirmed = self._last_move_to(S.CONFIRMED)
        if confirmed is None or not confirmed.reason.startswith("reconciled"):
            return ""
        probe = next(
            (
                a
                for a in reversed(self.facts.gateway_answers)
                if a.asked == "retrieve" and a.answer == "succeeded"
            ),
            None,
        )
        lost = next(
            (
                a
                for a in self.facts.gateway_answers
                if a.asked == "charge" and a.answer == "unknown"
            ),
            None,
        )
        by = f"probe {probe.attempt}" if probe is not None and probe.attempt else "a look-up"
        why = f", after the charge's answer was lost ({lost.detail})" if lost is not None else ""
        return f"reconciled by {by} at {at_(confirmed.at)}{why}"
