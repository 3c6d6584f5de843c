"""A stateful property test of the purchase saga (Hypothesis RuleBasedStateMachine).

Hypothesis interleaves, at random, everything the world can do to a few
purchases of a three-seat event: buyers submit (and resubmit) purchases, the
charge step runs (and is redelivered), the gateway loses answers per method,
the relay hands due rows over and they are delivered (or redelivered) in any
order, the hold expiry races the confirming charge, workers die at a gateway
call (before the request left, or after the processor acted on it), the
resumer sweeps, customer service, the organizer and the buyer refund confirmed
purchases (refund rows asked of the processor by their own messages, looked
up when their answer is lost: docs/refunds.md), and time passes. After every
step the invariants of docs/design.md are checked against the tables
(tests/stateful_checks.py); at the
end of each example the outages stop, time runs far ahead, everything due is
delivered and the resumer runs until nothing moves, and every saga must have
reached CONFIRMED or COMPENSATED (or UNKNOWN_EXPIRED with an operator alert)
with exactly the emails its end calls for, every refund settled, and the
invariant auditor must find nothing to report.

Deterministic and in-process: the in-process fake gateway behind
:class:`tests.gateways.FaultyGateway`, one frozen clock that only the rules
move, the outbox relayed and delivered synchronously, no Celery, no sleeps.
Each example runs inside its own savepoint (marked ``_from_testcase`` like
Django's TestCase blocks, so the services' ``atomic(durable=True)`` nests in
it; the test harness's, so the no-I/O-in-a-transaction guard ignores it:
config/transactions.py) and is rolled back.

    STATEFUL_EXAMPLES      examples to run (default 30; ``make chaos``: 1000+)
    STATEFUL_STEPS         steps per example (default 25)
    STATEFUL_DERANDOMIZE   1 (default): the same examples every run (CI);
                           0: fresh random examples (chaos runs)
    STATEFUL_STATS         1: print what the examples reached (with ``-s``)

A failure prints the shrunk sequence of steps and, with STATEFUL_DERANDOMIZE=0,
a ``@reproduce_failure(...)`` line to replay it.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import freezegun.api
import pytest
from django.conf import settings as django_settings
from django.core import mail
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from freezegun import freeze_time
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from config.transactions import harness_blocks
from organizers.models import Organizer
from outbox.delivery import message_deliver
from outbox.models import InboxEntry, OutboxMessage
from outbox.relay import relay_tick
from payments.fake_gateway import services as fake
from payments.fake_gateway.models import FakeIntent
from payments.interface import RefundRequest
from payments.registry import override_gateway
from purchases.errors import IdempotencyKeyReused, SeatUnavailable
from purchases.models import (
    Event,
    PurchaseSaga,
    Refund,
    Reservation,
    ReservationSeat,
    SagaHistory,
    Seat,
    SeatStatus,
)
from purchases.ops.audit import audit_run
from purchases.ops.sweeps import sweep_chase, sweep_resume
from purchases.refunds.errors import RefundError
from purchases.saga.states import SagaState
from purchases.services import (
    By,
    organizer_refund,
    purchase_cancel,
    purchase_refund,
    purchase_start,
    saga_charge,
    saga_charge_burst,
    saga_expire_hold,
)

from . import stateful_checks as checks
from .factories import EventFactory, UserFactory
from .gateways import FaultyGateway

S = SagaState

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
SEATS = ("A1", "A2", "A3")
SEAT_CHOICES = (("A1",), ("A2",), ("A3",), ("A1", "A2"), ("A2", "A3"))
# The riskiest first: Hypothesis tries the first values of a choice early
# (and the fixed CI examples are few).
PAYMENT_METHODS = (
    "pm_card_timeout_charged",
    "pm_card_unreachable",
    "pm_card_timeout_not_charged",
    "pm_card_chargeDeclined",
    "pm_card_visa",
    # Charged like visa; their refunds answer pending (settled by the first
    # look-up), fail, or lose their answer once (the refund made).
    "pm_card_refundPending",
    "pm_card_refundFail",
    "pm_card_refundTimeout",
)
CHARGES_LIKE_VISA = (
    "pm_card_visa",
    "pm_card_refundPending",
    "pm_card_refundFail",
    "pm_card_refundTimeout",
)
GATEWAY_METHODS = ("charge", "retrieve", "cancel", "refund", "create_refund", "retrieve_refund")
# How long before a relay pass, a drain or a sweep (time passes in between).
LATER = st.sampled_from([0, 10, 60, 300, 900])
# Consumers whose effect is an email: their inbox entry is what stops a
# redelivery from sending it again (at-least-once if a worker dies between
# the two, by design), so the "crash before the inbox write" redelivery is
# only simulated for the consumers that must be idempotent by state.
EMAIL_TOPICS = ("purchase.confirmed", "purchase.cancelled", "refund.settled")

EXAMPLES = int(os.environ.get("STATEFUL_EXAMPLES", "30"))
STEPS = int(os.environ.get("STATEFUL_STEPS", "25"))
DERANDOMIZE = os.environ.get("STATEFUL_DERANDOMIZE", "1") != "0"


# What the examples reached, printed with STATEFUL_STATS=1 (pytest -s).
COVERAGE: Counter = Counter()


class SimulatedCrash(Exception):
    """The worker process died at this point (nothing after it ran)."""


@dataclass(frozen=True)
class Submission:
    user: int
    key: str
    seats: tuple[str, ...]
    payment_method: str
    saga_id: str
    body: str  # the 202 body as canonical JSON (hashable)

    def __repr__(self) -> str:  # short, for Hypothesis' printed steps
        return (
            f"Submission(user={self.user}, key={self.key!r}, seats={self.seats}, "
            f"pm={self.payment_method!r})"
        )


class _Gateway(FaultyGateway):
    """The faulty fake, remembering the refund it is being asked about (so
    that a worker dying after the processor acted can make that one)."""

    asking: RefundRequest | None = None

    def create_refund(self, request):
        self.asking = request
        return super().create_refund(request)

    def retrieve_refund(self, request):
        self.asking = request
        return super().retrieve_refund(request)


def _processor_handles(method: str, intent_id: str, gateway: _Gateway) -> None:
    """What the processor does with the request of ``method`` (its answer is
    lost): the in-process fake's own services, with the saga's keys."""
    asked = gateway.asking
    if method == "create_refund" and asked is not None:
        fake.refund_create(
            intent_id=asked.intent_ref,
            idempotency_key=asked.idempotency_key,
            amount=asked.amount,
            refund_id=asked.refund_id,
        )
    elif method == "retrieve_refund" and asked is not None:
        fake.refund_retrieve(refund_id=asked.refund_id)  # settles a pending one
    if method == "charge":
        saga = PurchaseSaga.objects.get(intent_id=intent_id)
        fake.intent_charge(
            intent_id=intent_id,
            idempotency_key=intent_id,
            amount=saga.amount,
            currency=saga.currency,
            payment_method=saga.payment_method,
        )
    elif method == "cancel":
        fake.intent_cancel(intent_id=intent_id)
    elif method == "refund":
        fake.intent_refund(intent_id=intent_id, idempotency_key=f"refund:{intent_id}")
    # a look-up changes nothing at the processor


def _freeze(body: dict) -> str:
    return json.dumps(body, sort_keys=True)


class PurchaseSagaMachine(RuleBasedStateMachine):
    # Set by the test: rows created once, outside the per-example savepoint.
    user_objs: tuple = ()
    event_id: int = 0
    organizer: Organizer | None = None
    # The test's frozen clock (freeze_time's), set by the test before any example.
    clock: (
        freezegun.api.FrozenDateTimeFactory
        | freezegun.api.StepTickTimeFactory
        | freezegun.api.TickingDateTimeFactory
    )

    submissions = Bundle("submissions")

    def __init__(self) -> None:
        super().__init__()
        self._atomic: transaction.Atomic | None = None
        self._settings: override_settings | None = None
        self._gateway_cm = None
        # The example's transaction first, so that everything below rolls back.
        atomic = transaction.atomic()
        # Like TestCase's own blocks: the services' durable blocks may nest in
        # it (Django's durability check reads this marker).
        atomic._from_testcase = True  # type: ignore[attr-defined]  # Django's; not in the stubs
        atomic.__enter__()
        self._atomic = atomic
        # The harness's block: the no-network-in-a-transaction guard does not
        # count it (config/transactions.py).
        self._harness = harness_blocks()
        self._harness.__enter__()
        self.clock.move_to(T0)
        mail.outbox = []
        self.gateway = _Gateway()
        self._gateway_cm = override_gateway(self.gateway)
        self._gateway_cm.__enter__()
        self.keys = 0
        self.pending: list[int] = []  # handed over by the relay, not delivered yet
        self.delivered: list[int] = []  # delivered at least once
        self.saga_ids: list[str] = []
        self.hold_seconds = 0
        self.backoff: list[int] = []

    # --- set-up and tear-down --------------------------------------------------

    @initialize(
        target=submissions,
        hold=st.sampled_from([30, 120, 900]),
        backoff=st.sampled_from([(10, 20, 40), (60, 120, 240, 480), (300, 600)]),
        first=st.sampled_from(PAYMENT_METHODS),
        second=st.sampled_from(PAYMENT_METHODS) | st.none(),
        users=st.sampled_from([(0, 1), (0, 0), (1, 0)]),
        outages=st.fixed_dictionaries(
            {method: st.sampled_from([0, 0, 1, -1]) for method in GATEWAY_METHODS}
        ),
        charged=st.booleans(),
    )
    def begin(self, hold, backoff, first, second, users, outages, charged):
        """The example's settings, the network it starts with, and one or two
        purchases (the random rule selection alone often leaves ``submit`` or
        ``network`` out of an example)."""
        self.hold_seconds, self.backoff = hold, list(backoff)
        self._settings = override_settings(
            PURCHASE_HOLD_SECONDS=hold,
            RECONCILE_BACKOFF_SECONDS=list(backoff),
            RESUME_AFTER_SECONDS=60,
            COMPENSATION_DEADLINE_SECONDS=3600,
            OUTBOX_REDELIVER_SECONDS=[120] * 19,  # 20 hand-overs, 120 s apart
            OUTBOX_CLAIM_LEASE_SECONDS=30,
        )
        self._settings.enable()
        for method, times in outages.items():
            if times:
                self.gateway.down(method, times=times)
        made = [self._start(users[0], ("A1",), first)]
        if second is not None:
            made.append(self._start(users[1], ("A2", "A3"), second))
        if charged:  # what the task enqueued on commit does, at once
            for sub in made:
                saga_charge(saga_id=sub.saga_id)
        return multiple(*made)

    def teardown(self) -> None:
        try:
            if self._settings is not None:
                self._settle()
        finally:
            self.gateway.before.clear()
            self.gateway.outages.clear()
            if self._gateway_cm is not None:
                self._gateway_cm.__exit__(None, None, None)
            if self._settings is not None:
                self._settings.disable()
            if self._atomic is not None:
                self._harness.__exit__(None, None, None)
                transaction.set_rollback(True)
                self._atomic.__exit__(None, None, None)

    def _settle(self) -> None:
        """The outages end; time runs far ahead; everything due is delivered
        and the sweeps run until nothing moves. Then every saga has an end."""
        self._note_coverage("before settling")
        COVERAGE["examples"] += 1
        COVERAGE[f"sagas per example: {len(self.saga_ids)}"] += 1
        self.gateway.before.clear()
        self.gateway.outages.clear()
        step = max(self.hold_seconds, sum(self.backoff), 300) + 60
        for _ in range(30):
            self.clock.tick(step)
            moved = self._drain()
            report = sweep_resume(older_than=0)
            self._assert_resumed(report)
            sweep_chase()
            moved += len(report.lines) + self._drain()
            live = PurchaseSaga.objects.filter(pk__in=self.saga_ids).exclude(
                state__in=[S.CONFIRMED, S.COMPENSATED, S.UNKNOWN_EXPIRED]
            )
            owed = Refund.objects.filter(saga_id__in=self._saga_uuids(), status="pending")
            if not moved and not live.exists() and not owed.exists():
                break
        self._note_coverage("settled")
        checks.check_settled(event_id=self.event_id, saga_ids=self.saga_ids)
        # The auditor, over the same world, agrees: nothing to report.
        audit = audit_run(gateway=self.gateway)
        assert audit.violations == [], [v.as_dict() for v in audit.violations]
        assert audit.complete, [u.as_dict() for u in audit.unverified]

    def _saga_uuids(self) -> list[uuid.UUID]:
        return [uuid.UUID(s) for s in self.saga_ids]

    def _note_coverage(self, when: str) -> None:
        # What the example reached (STATEFUL_STATS=1).
        for state in set(
            PurchaseSaga.objects.filter(pk__in=self.saga_ids).values_list("state", flat=True)
        ):
            COVERAGE[f"{when}: a saga in {state}"] += 1
        for status in set(
            Refund.objects.filter(saga_id__in=self._saga_uuids()).values_list("status", flat=True)
        ):
            COVERAGE[f"{when}: a refund {status}"] += 1
        if when == "settled":
            for moved in set(
                SagaHistory.objects.filter(
                    saga_id__in=[uuid.UUID(s) for s in self.saga_ids]
                ).values_list("from_state", "to_state")
            ):
                COVERAGE[f"move {moved[0]} -> {moved[1]}"] += 1

    def _drain(self) -> int:
        delivered = 0
        for _ in range(50):
            handed: list[int] = []
            if relay_tick(dispatch=handed.append) == 0:
                break
            for message_id in handed:
                message_deliver(message_id=message_id)
                delivered += 1
        return delivered

    # --- helpers ------------------------------------------------------------------

    def _deliver(self, message_id: int) -> None:
        self.delivered.append(message_id)
        self._survive(message_deliver, message_id=message_id)

    def _survive(self, step, **kwargs):
        """Run a step in a worker that may die at an armed gateway call; a dead
        worker's step returns None (its message stays undone, as in life)."""
        try:
            return step(**kwargs)
        except SimulatedCrash:
            COVERAGE["a worker died at the gateway"] += 1
            return None

    def _crash_armed(self) -> bool:
        return any(getattr(hook, "crashes", False) for hook in self.gateway.before.values())

    def _hand(self, message_id: int) -> None:
        self.pending.append(message_id)

    @staticmethod
    def _assert_resumed(report) -> None:
        failed = [
            line
            for line in report.lines
            if line.result.startswith("failed") and "SimulatedCrash" not in line.result
        ]
        assert not failed, f"the resumer failed on: {[(f.state, f.result) for f in failed]}"

    def _world(self) -> tuple:
        return (
            PurchaseSaga.objects.count(),
            Reservation.objects.count(),
            OutboxMessage.objects.count(),
            list(
                Seat.objects.filter(event_id=self.event_id)
                .order_by("id")
                .values_list("status", flat=True)
            ),
        )

    # --- buyers ---------------------------------------------------------------------

    @rule(
        target=submissions,
        user=st.integers(0, 1),
        seats=st.sampled_from(SEAT_CHOICES),
        payment_method=st.sampled_from(PAYMENT_METHODS),
    )
    def submit(self, user, seats, payment_method):
        status = dict(
            Seat.objects.filter(event_id=self.event_id, ref__in=seats).values_list("ref", "status")
        )
        taken = sorted(ref for ref, s in status.items() if s != SeatStatus.AVAILABLE)
        before = self._world()
        try:
            sub = self._start(user, seats, payment_method)
        except SeatUnavailable as exc:
            assert taken, f"refused {seats} although all were available"
            assert sorted(exc.seats) == taken
            assert self._world() == before, "a refused purchase wrote something"
            return multiple()
        assert not taken, f"sold {seats} although {taken} were taken"
        return sub

    def _start(self, user, seats, payment_method) -> Submission:
        self.keys += 1
        key = f"key-{self.keys}"
        started = purchase_start(
            user=self.user_objs[user],
            idempotency_key=key,
            event_id=self.event_id,
            seat_refs=list(seats),
            payment_method=payment_method,
        )
        assert started.created
        saga = PurchaseSaga.objects.get(pk=started.saga_id)
        assert saga.state == S.PENDING
        timer = OutboxMessage.objects.get(key=saga.hold_timer_key)
        assert timer.available_at == timezone.now() + timedelta(seconds=self.hold_seconds)
        self.saga_ids.append(started.saga_id)
        return Submission(
            user, key, tuple(seats), payment_method, started.saga_id, _freeze(started.purchase)
        )

    @rule(sub=submissions, same_body=st.booleans(), other=st.sampled_from(PAYMENT_METHODS))
    def resubmit(self, sub, same_body, other):
        """The same key again: with the same body, the first answer and nothing
        new; with another body, a refusal and nothing new."""
        before = self._world()
        if not same_body:
            seats = list(sub.seats) if other != sub.payment_method else list(reversed(SEATS))
            with pytest.raises(IdempotencyKeyReused):
                purchase_start(
                    user=self.user_objs[sub.user],
                    idempotency_key=sub.key,
                    event_id=self.event_id,
                    seat_refs=seats,
                    payment_method=other,
                )
            assert self._world() == before, "a refused key reuse wrote something"
            return
        again = purchase_start(
            user=self.user_objs[sub.user],
            idempotency_key=sub.key,
            event_id=self.event_id,
            seat_refs=list(sub.seats),
            payment_method=sub.payment_method,
        )
        assert not again.created
        assert again.saga_id == sub.saga_id
        assert _freeze(again.purchase) == sub.body
        assert self._world() == before, "a replay wrote something"

    # --- the charge step ------------------------------------------------------------

    @rule(sub=submissions, twice=st.booleans(), burst=st.booleans())
    def charge(self, sub, twice, burst):
        """The charge task: the one-saga step, or a burst that charges the
        event's other PENDING sagas with it (purchases/saga/burst.py)."""
        step = saga_charge_burst if burst else saga_charge
        saga = PurchaseSaga.objects.get(pk=sub.saga_id)
        was = saga.state
        charge_down = self.gateway.outages.get("charge", 0) != 0
        # A cancel already reached the processor (an expiry whose worker died
        # before recording the answer): no charge can land, the saga unwinds.
        canceled = FakeIntent.objects.filter(
            intent_id=saga.intent_id, status=FakeIntent.Status.CANCELED
        ).exists()
        # The hold ran out first (the relay and the workers were down): the
        # late charge goes through the expiry path, never a first charge.
        hold_over = timezone.now() >= saga.reservation.hold_expires_at
        charges_asked = self.gateway.calls.count(("charge", saga.intent_id))
        crash = self._crash_armed()
        result = self._survive(step, saga_id=sub.saga_id)
        if result is None or crash:
            pass  # a worker died somewhere on the way: no expectation
        elif was == S.PENDING and hold_over:
            assert self.gateway.calls.count(("charge", saga.intent_id)) == charges_asked, (
                "charged a saga whose hold had run out"
            )
            assert result.state in (S.COMPENSATED, S.CONFIRMED, S.PENDING), result.state
        elif was == S.PENDING and canceled and not charge_down:
            assert result.state == S.COMPENSATED, (
                f"{sub.payment_method}: charge of a canceled intent ended {result.state}"
            )
        elif was == S.PENDING and not charge_down:
            expected = {
                **dict.fromkeys(CHARGES_LIKE_VISA, S.CONFIRMED),
                "pm_card_chargeDeclined": S.COMPENSATED,
                "pm_card_timeout_charged": S.UNKNOWN,
                "pm_card_timeout_not_charged": S.UNKNOWN,
                "pm_card_unreachable": S.UNKNOWN,
            }[sub.payment_method]
            assert result.state == expected, (
                f"{sub.payment_method}: charge from PENDING ended {result.state}"
            )
        elif was != S.PENDING:
            assert result.state == was, "the charge step acted on a saga that moved on"
        if twice:  # the task delivered again
            self._survive(step, saga_id=sub.saga_id)

    @rule(method=st.sampled_from(GATEWAY_METHODS), after_the_gateway=st.booleans())
    def worker_dies_at(self, method, after_the_gateway):
        """Arm a crash: the next worker to call ``method`` dies there, before
        the request left or after the processor handled it (its answer and
        everything the step would have done next are lost)."""
        if method in self.gateway.before:
            return

        def crash(intent_id):
            self.gateway.before.pop(method, None)
            if after_the_gateway:
                _processor_handles(method, intent_id, self.gateway)
            raise SimulatedCrash(f"{method} {intent_id}")

        crash.crashes = True  # type: ignore[attr-defined]  # read back with getattr
        self.gateway.before[method] = crash

    @precondition(lambda self: "charge" not in self.gateway.before)
    @rule(sub=submissions, after_the_gateway=st.booleans())
    def charge_crashes(self, sub, after_the_gateway):
        """The worker dies during the gateway call: before the request left,
        or after the processor handled it but before the answer was recorded."""

        charged = []

        def crash(intent_id):
            charged.append(intent_id)
            if after_the_gateway:
                _processor_handles("charge", intent_id, self.gateway)
            raise SimulatedCrash

        saga = PurchaseSaga.objects.get(pk=sub.saga_id)
        hold_over = timezone.now() >= saga.reservation.hold_expires_at
        self.gateway.before["charge"] = crash
        try:
            saga_charge(saga_id=sub.saga_id)
        except SimulatedCrash:
            # (A crash armed elsewhere, e.g. at the cancel of the expiry path
            # that a charge past its hold takes, is not this rule's.)
            if charged:
                assert PurchaseSaga.objects.get(pk=sub.saga_id).state == S.CHARGING
        finally:
            self.gateway.before.pop("charge", None)
        assert not (hold_over and saga.state == S.PENDING and charged), (
            "charged a saga whose hold had run out"
        )

    # --- the gateway's network ----------------------------------------------------

    @rule(method=st.sampled_from(GATEWAY_METHODS), times=st.sampled_from([-1, 1, 2, 0]))
    def network(self, method, times):
        """Answers of ``method`` get lost: all of them (-1), the next 1 or 2,
        or none any more (0: the outage ends)."""
        if times == 0:
            self.gateway.up(method)
        else:
            self.gateway.down(method, times=times)

    # --- the outbox ---------------------------------------------------------------

    @rule(after=LATER)
    def relay(self, after):
        """Hand due rows over (to the pending bag; nothing is delivered yet)."""
        self.clock.tick(after)
        relay_tick(dispatch=self._hand)

    @rule(after=LATER)
    def drain(self, after):
        """What the relay and the workers do when nothing goes wrong: hand
        over everything due and deliver it (and what was already pending)."""
        self.clock.tick(after)
        while self.pending:
            self._deliver(self.pending.pop(0))
        for _ in range(20):
            handed: list[int] = []
            if relay_tick(dispatch=handed.append) == 0:
                break
            for message_id in handed:
                self._deliver(message_id)

    @precondition(lambda self: self.pending)
    @rule(index=st.integers(0, 50))
    def deliver(self, index):
        message_id = self.pending.pop(index % len(self.pending))
        self._deliver(message_id)

    @precondition(lambda self: self.delivered)
    @rule(index=st.integers(0, 50), crashed_before_inbox=st.booleans())
    def redeliver(self, index, crashed_before_inbox):
        """The same message again: a second task (acks_late), or, when the
        worker died after the consumer ran but before the inbox recorded it,
        the consumer itself runs again."""
        message_id = self.delivered[index % len(self.delivered)]
        message = OutboxMessage.objects.get(pk=message_id)
        # As the row stands when its worker died before completing it: handed
        # over, and due again on the redelivery schedule (what the relay wrote
        # when it handed it over).
        schedule = django_settings.OUTBOX_REDELIVER_SECONDS
        redeliver_after = schedule[min(max(message.attempts, 1), len(schedule)) - 1]
        OutboxMessage.objects.filter(pk=message_id).update(
            completed_at=None,
            due_at=(message.handed_over_at or timezone.now()) + timedelta(seconds=redeliver_after),
        )
        if crashed_before_inbox and message.topic not in EMAIL_TOPICS:
            InboxEntry.objects.filter(message_id=message_id).delete()
        self._deliver(message_id)

    @rule(sub=submissions, during=st.booleans())
    def hold_expiry_races_the_charge(self, sub, during):
        """The hold runs out and the relay hands its timer over; then the
        charge step runs, and the expiry is delivered while the gateway is
        being asked, or right after the charge step returned."""
        timer = OutboxMessage.objects.get(key=f"hold:{sub.saga_id}")
        if timer.pk not in self.pending:
            if timer.cancelled_at is not None or timer.completed_at is not None:
                return  # nothing left to race
            self.clock.move_to(max(timezone.now(), timer.available_at))
            relay_tick(dispatch=self._hand)
            if timer.pk not in self.pending:
                return  # claimed, or handed over earlier and not due again yet
        self.pending.remove(timer.pk)
        fired = []

        def fire(intent_id):
            self.gateway.before.pop("charge", None)
            fired.append(intent_id)
            self._deliver(timer.pk)

        if during and "charge" not in self.gateway.before:
            self.gateway.before["charge"] = fire
        try:
            self._survive(saga_charge, saga_id=sub.saga_id)
        finally:
            if self.gateway.before.get("charge") is fire:
                del self.gateway.before["charge"]
        if not fired:
            self._deliver(timer.pk)

    # --- sweeps, customer service, time ---------------------------------------------

    @rule(older_than=st.sampled_from([0, None]), after=LATER)
    def resume(self, older_than, after):
        self.clock.tick(after)
        self._assert_resumed(sweep_resume(older_than=older_than))
        sweep_chase()

    @rule(sub=submissions)
    def refund(self, sub):
        """Customer service refunds everything left, its seats back on sale."""
        self._refund_attempt(
            sub,
            "customer service",
            lambda: purchase_refund(
                saga_id=sub.saga_id, reason="customer asked", by=By.operator("carol")
            ),
        )

    @rule(
        sub=submissions,
        amount=st.sampled_from([None, 1, 1000, 2500]),
        seat=st.sampled_from([None, *SEATS]),
        release=st.booleans(),
    )
    def organizer_refunds(self, sub, amount, seat, release):
        """The organizer refunds an amount, a seat (released or not), or all
        that is left."""
        self._refund_attempt(
            sub,
            "the organizer",
            lambda: organizer_refund(
                organizer=self.organizer,
                saga_id=sub.saga_id,
                user=self.user_objs[0],
                reason="the show started late",
                amount=amount,
                seats=None if seat is None else [seat],
                release_seats=release,
                request_key=f"organizer-{self.keys}",
            ),
        )

    @rule(sub=submissions, seat=st.sampled_from([None, *SEATS]))
    def buyer_cancels(self, sub, seat):
        """The buyer cancels a seat, or all they hold (less the event's fee)."""
        self._refund_attempt(
            sub,
            "the buyer",
            lambda: purchase_cancel(
                saga_id=sub.saga_id,
                user=self.user_objs[sub.user],
                seats=None if seat is None else [seat],
                request_key=f"cancel-{self.keys}",
            ),
        )

    def _refund_attempt(self, sub, who: str, ask) -> None:
        """A refund asked of a purchase: refused (writing nothing) unless it
        is confirmed with something left to give back; else a pending row,
        the purchase still CONFIRMED, the seats it releases unlinked in the
        same commit, and nothing asked of the processor yet (the row's
        message does, after the commit)."""
        self.keys += 1
        saga = PurchaseSaga.objects.get(pk=sub.saga_id)
        before = set(Refund.objects.filter(saga_id=saga.pk).values_list("pk", flat=True))
        asked = [c for c in self.gateway.calls if "refund" in c[0]]
        try:
            ask()
        except RefundError:
            now = set(Refund.objects.filter(saga_id=saga.pk).values_list("pk", flat=True))
            assert now == before, f"{who}: a refused refund wrote a row"
            return
        assert saga.state == S.CONFIRMED, f"{who} refunded a {saga.state} purchase"
        COVERAGE[f"refund by {who}"] += 1
        assert PurchaseSaga.objects.get(pk=saga.pk).state == S.CONFIRMED
        assert [c for c in self.gateway.calls if "refund" in c[0]] == asked
        [made] = Refund.objects.filter(saga_id=saga.pk).exclude(pk__in=before)
        assert made.status == "pending" and not made.asked
        if made.released:
            live = ReservationSeat.objects.filter(
                reservation_id=saga.reservation_id,
                event_id=saga.event_id,
                seat__ref__in=made.released_seats,
                released_at__isnull=True,
            )
            assert not live.exists(), f"refund {made.pk} released seats still linked"

    @rule(seconds=st.sampled_from([1, 10, 30, 60, 120, 300, 900, 3600, 4 * 3600]))
    def advance_clock(self, seconds):
        self.clock.tick(seconds)

    # --- after every step -------------------------------------------------------------

    @invariant()
    def invariants_hold(self):
        if self.saga_ids or mail.outbox:
            checks.check_all(event_id=self.event_id, saga_ids=self.saga_ids)


@pytest.mark.django_db
def test_purchase_saga_state_machine(monkeypatch):
    users = (UserFactory(username="stateful-alice"), UserFactory(username="stateful-bob"))
    event = EventFactory(seats=list(SEATS))
    # Buyers may cancel (for 10% of the price) until a month after the clock's start.
    Event.objects.filter(pk=event.pk).update(
        buyer_can_cancel_until=T0 + timedelta(days=30), cancel_fee_percent=10
    )
    # Hypothesis must keep real time (its own timing and shrinking budget)
    # while the code under test sees the frozen clock: ignore its modules, and
    # look only at the direct caller, so that code called *from* a rule (with
    # Hypothesis a few frames up) is still frozen.
    monkeypatch.setattr(freezegun.api, "call_stack_inspection_limit", 1)
    with freeze_time(T0, ignore=["hypothesis"]) as clock:
        PurchaseSagaMachine.user_objs = users
        PurchaseSagaMachine.event_id = event.pk
        PurchaseSagaMachine.organizer = event.organizer
        PurchaseSagaMachine.clock = clock
        run_state_machine_as_test(
            PurchaseSagaMachine,
            settings=hypothesis_settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                derandomize=DERANDOMIZE,
                database=None,
                print_blob=True,
                suppress_health_check=[
                    HealthCheck.too_slow,
                    HealthCheck.function_scoped_fixture,
                    HealthCheck.filter_too_much,
                ],
            ),
        )
    # Every example ran in its own savepoint and was rolled back.
    assert not PurchaseSaga.objects.exists()
    assert not OutboxMessage.objects.exists()
    if os.environ.get("STATEFUL_STATS") == "1":
        for what, n in sorted(COVERAGE.items()):
            print(f"{n:6d}  {what}")


# --- what the machine found, kept as plain tests ------------------------------------


@pytest.mark.django_db
def test_hold_expiry_handled_twice_while_the_gateway_cannot_cancel_is_idempotent(
    alice, event, faulty_gateway, settings
):
    """Found by the machine (``redeliver(crashed_before_inbox=True)`` of a
    hold-expiry timer while cancels are lost). The consumer runs again when
    its worker dies after ``handle()`` and before the inbox write (or when a
    slow delivery outlives its processing lease); the second run must decide
    from the saga's state like the first, not crash on the retry timer's key.
    """
    settings.PURCHASE_HOLD_SECONDS = 30
    faulty_gateway.down("cancel")
    with freeze_time(T0) as clock:
        saga = PurchaseSaga.objects.get(
            pk=purchase_start(
                user=alice,
                idempotency_key="k",
                event_id=event.pk,
                seat_refs=["A1"],
                payment_method="pm_card_visa",
            ).saga_id
        )
        clock.tick(30)

        saga_expire_hold(saga_id=saga.pk)  # cancel lost: ask again later
        saga_expire_hold(saga_id=saga.pk)  # the same delivery, handled again

    rechecks = OutboxMessage.objects.filter(saga_id=saga.pk, topic="purchase.hold_recheck")
    assert rechecks.count() == 1
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "PENDING"
