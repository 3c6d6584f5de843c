"""Charges in bursts (docs/design.md, "Charging in bursts").

With ``CHARGE_BURST_SIZE`` above 1, a charge task whose saga is PENDING
charges it with up to ``CHARGE_BURST_SIZE - 1`` other PENDING sagas of its
event that nobody holds, in the three stages of the one-saga step
(purchases/saga/step.py), each paid once for the burst:

1. **one commit**: the task's own saga locked and moved to CHARGING as the
   one-saga step moves it; the others claimed (``FOR UPDATE SKIP LOCKED``:
   a saga another worker holds is that worker's) and moved, with their
   history rows, in one statement;
2. **the processor asked** for each, concurrently (at most
   ``CHARGE_BURST_CONCURRENCY`` at a time, from threads of the process;
   one after another for a gateway that is not to be asked from threads),
   outside any transaction, each with its own intent id as the idempotency
   key; the answers counted by the processor's breaker together (the
   burst's answers as one, then each failure: purchases/breaker.py);
3. **one commit**: every saga of the burst locked in one statement (in id
   order), each answer kept and recorded as the one-saga step records it
   (confirmed, declined, unknown, or a saga that moved on meanwhile; the
   confirmations in one statement per table for them all:
   :func:`purchases.saga.confirm.confirm_many`), the
   event's availability version moved once for them all; what follows a
   record (a decline's compensation) runs after the commit, as it does for
   one saga.

The rules are the one-saga step's: a saga is charged only from PENDING, only
while its hold runs and its event is not cancelled, and every answer is
judged against the saga's state and version under its lock. A crash between
the commits leaves each saga of the burst in CHARGING, its charge asked or
not: where a crash leaves one saga, and the resumer looks each intent up
before anything else. A recording commit that fails is rolled back whole and
each answer recorded alone, in a commit of its own, as the one-saga step
records it (an error there is raised as it is raised for one saga).

**Wake-ups.** A purchase publishes its own charge task after its commit
only if its event owes no wake-up: it sets the event's flag in the shared
cache (``cache.add``, :func:`charge_wake`) and publishes if the flag was
clear. A purchase that finds it set rides the task that set it. A task
clears the flag *before* its first claim, charges its own saga's burst,
then the event's PENDING sagas in bursts until a claim comes back short
(at most ``BURSTS_PER_TASK`` full ones, then it publishes a task for the
rest). As for the outbox's sweeps (outbox/sweeping.py): a purchase
committed before the clear is seen by the claims after it; one committed
after finds the flag clear (or set by a later one) and has a task to come;
a claim that comes back full is followed by another; a flag whose task was
lost expires (``WAKE_SECONDS``) and the next purchase publishes again.
Whatever else (no broker, a worker killed mid-burst) leaves sagas PENDING
or CHARGING for the resumer, as a lost task of its own always did. With
the cache down every purchase publishes its own task.

A task whose saga another burst charged (a task published by the resumer,
or by a purchase that found the cache down) reads it without the lock (no
saga comes back to PENDING) and goes on to the event's claims. A task
whose saga is the only one PENDING charges it alone, so one purchase on a
quiet day is charged as before. A processor that makes its
intents first (Stripe's create, then the charge) is charged one saga at a
time (:func:`purchases.saga.charge.saga_charge`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection, connections, transaction

from common import rows
from config import metrics, tracing
from config.celery import app
from payments.interface import ChargeOutcome, PaymentGateway, calls_concurrently, creates_intent

from .. import breaker, lock_objects
from ..availability import availability_changes_gathered
from ..cache_outage import cache_call
from ..models import Event, EventStatus, PurchaseSaga, Reservation, SagaHistory
from .charge import CONFIRMED_REASON, charge_call, charge_record, hold_ran_out, saga_charge
from .confirm import confirm_many
from .states import SagaState
from .step import (
    Ask,
    gateway_or_default,
    record_answer,
    record_answers,
    record_step,
    traced_call,
)
from .topics import CHARGE_TASK
from .transition import SYSTEM, clock, log_extra, move, step_span

logger = logging.getLogger(__name__)

S = SagaState

REASON = "charge started"


def saga_charge_burst(
    *,
    saga_id,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
    each_burst: Callable[[], AbstractContextManager] = contextlib.nullcontext,
) -> PurchaseSaga:
    """Charge the saga, and with it a burst of its event's PENDING sagas
    (the module docstring); then the event's PENDING sagas in bursts until a
    claim comes back short (the purchases that rode this wake-up: the module
    docstring). Each burst runs inside ``each_burst()`` (the task's delivery
    in place). The saga as its charge left it."""
    gateway = gateway_or_default(gateway)
    size = settings.CHARGE_BURST_SIZE
    if not _in_bursts(gateway):
        with each_burst():
            return saga_charge(saga_id=saga_id, gateway=gateway, now=now)
    with each_burst(), step_span("saga.charge", saga_id=saga_id):
        saga, owed = _own_burst(saga_id, gateway=gateway, now=now, size=size)
    bursts = 0
    while owed and bursts < BURSTS_PER_TASK:
        with each_burst():
            owed = _event_burst(saga.event_id, gateway=gateway, now=now, size=size)
        bursts += 1
    if owed:
        # Still full: the rest is another task's, behind what else waits on
        # the queue (a hold's expiry, a reconciliation), so that a busy
        # event never keeps a worker process to itself.
        publish_charge(saga.pk)
    return saga


def _in_bursts(gateway: PaymentGateway) -> bool:
    """Whether charges go in bursts (and purchases ride wake-ups): bursts
    on, and a processor whose intents are not made first (Stripe's are
    charged one saga at a time)."""
    return settings.CHARGE_BURST_SIZE > 1 and not creates_intent(gateway)


def _own_burst(saga_id, *, gateway: PaymentGateway, now, size: int) -> tuple[PurchaseSaga, bool]:
    """The task's own saga charged with up to ``size - 1`` others; the saga
    as its charge left it, and whether the event may have more due (a claim
    that came back full, or none made)."""
    # Most tasks of a busy event find their saga charged by another's
    # burst: no saga ever comes back to PENDING, so a read without the
    # lock (one statement, no transaction) that finds it moved on is
    # final. One that finds it PENDING decides again under the lock.
    seen = lock_objects.saga_read(saga_id=saga_id)
    # Before any claim: a purchase committed from now on finds no wake-up
    # owed and publishes its own task (the module docstring).
    unwake(seen.event_id)
    if seen.state != S.PENDING:
        logger.info("charge skipped: saga has moved on", **log_extra(seen))
        return seen, True
    with transaction.atomic(durable=True):
        own = lock_objects.saga_for_update(saga_id=saga_id)
        at = clock(now)
        if own.state != S.PENDING:
            logger.info("charge skipped: saga has moved on", **log_extra(own))
            return own, True
        chargeable = not (hold_ran_out(own, at) or getattr(own, "event_cancelled", False))
        if chargeable:
            move(own, S.CHARGING, reason=REASON, at=at, by=SYSTEM, count_attempt=True)
            others = _claim(own.event_id, own=own.pk, at=at, limit=size - 1)
    if not chargeable:
        # The one-saga step settles it (the hold's expiry, the
        # cancellation's refusal), each with its own log line.
        return saga_charge(saga_id=saga_id, gateway=gateway, now=now), True
    burst = [own, *others]
    if others:
        logger.info("charge burst: %d sagas", len(burst), **log_extra(own, burst=len(burst)))
    answers = _ask_all(burst, gateway)
    return _record_all(burst, answers, gateway=gateway, now=now)[own.pk], len(burst) == size


def _event_burst(event_id: int, *, gateway: PaymentGateway, now, size: int) -> bool:
    """Up to ``size`` of the event's PENDING sagas charged as one burst;
    whether the claim came back full."""
    with transaction.atomic(durable=True):
        burst = _claim(event_id, own=None, at=clock(now), limit=size)
    if not burst:
        return False
    logger.info("charge burst: %d sagas", len(burst), **log_extra(burst[0], burst=len(burst)))
    answers = _ask_all(burst, gateway)
    _record_all(burst, answers, gateway=gateway, now=now)
    return len(burst) == size


# --- Wake-ups: one task for the purchases of a busy event --------------------

# How long a wake-up flag outlives a task that never ran (a task lost with it
# set holds its event's purchases' own tasks back that long at most).
WAKE_SECONDS = 5
# Full bursts one task charges before it leaves the rest to a task of its own.
BURSTS_PER_TASK = 8


def wake_key(event_id: int) -> str:
    return f"charge:wake-owed:{event_id}"


def charge_wake(event_id: int) -> bool:
    """After a purchase's commit: whether it publishes its own charge task
    (True), or rides the wake-up its event owes already (False: a task is
    coming that claims it, the module docstring). True whenever charges are
    not made in bursts, and when the cache does not answer."""
    if not _in_bursts(gateway_or_default(None)):
        return True
    reached, added = cache_call(
        "charge_wake", lambda: cache.add(wake_key(event_id), 1, timeout=WAKE_SECONDS)
    )
    return not reached or bool(added)


def unwake(event_id: int) -> None:
    """Clear the event's wake-up flag: a task before its first claim, or a
    purchase whose task could not be published (so that the next one tries).
    A flag that could not be cleared expires on its own."""
    cache_call("charge_wake", lambda: cache.delete(wake_key(event_id)))


def publish_charge(saga_id) -> None:
    """Send the charge task for ``saga_id`` (Celery's own publish, by name:
    the saga does not import the task module). Raises what the broker
    raises."""
    app.send_task(CHARGE_TASK, args=(str(saga_id),))


# The other sagas of the burst: the event's PENDING sagas whose hold runs,
# oldest first along the live sagas' index, those another transaction holds
# passed over; moved to CHARGING (one attempt more) with their history rows,
# as the one-saga move writes them (purchases/saga/transition.py), and read
# back with their reservations.
_CLAIM_SQL = """
WITH due AS (
  SELECT s.id FROM {saga} s
    JOIN {reservation} r ON r.id = s.reservation_id AND r.event_id = s.event_id
    JOIN {event} e ON e.id = s.event_id AND e.status <> %(cancelled)s
   WHERE s.event_id = %(event)s AND s.state = %(pending)s AND s.id IS DISTINCT FROM %(own)s
     AND r.hold_expires_at > %(at)s
   ORDER BY s.updated_at
   LIMIT %(limit)s
   FOR UPDATE OF s SKIP LOCKED
), moved AS (
  UPDATE {saga} s SET state = %(charging)s, version = s.version + 1, updated_at = %(at)s,
         attempts = s.attempts + 1, awaiting_operator_since = NULL, action_secret = ''
    FROM due WHERE s.id = due.id AND s.event_id = %(event)s AND s.state = %(pending)s
  RETURNING {saga_columns}
), history AS (
  INSERT INTO {history} (saga_id, event_id, from_state, to_state, at, reason, actor,
                         actor_name, version)
  SELECT id, event_id, %(pending)s, %(charging)s, %(at)s, %(reason)s, %(actor)s, '', version
    FROM moved
)
SELECT {moved_columns}, {reservation_columns}
  FROM moved m JOIN {reservation} r ON r.id = m.reservation_id AND r.event_id = m.event_id
"""


@functools.cache
def _claim_sql() -> str:
    return _CLAIM_SQL.format(
        saga=PurchaseSaga._meta.db_table,
        reservation=Reservation._meta.db_table,
        event=Event._meta.db_table,
        history=SagaHistory._meta.db_table,
        saga_columns=", ".join(rows.columns(PurchaseSaga, "s")),
        moved_columns=", ".join(rows.columns(PurchaseSaga, "m")),
        reservation_columns=", ".join(rows.columns(Reservation, "r")),
    )


def _claim(event_id: int, *, own, at: datetime, limit: int) -> list[PurchaseSaga]:
    """Up to ``limit`` PENDING sagas of the event (not ``own``, the task's
    saga moved in the same commit), moved to CHARGING in the caller's
    commit; none of an event cancelled (its status read in the claim's
    statement, as a saga's lock reads it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _claim_sql(),
            {
                "event": event_id,
                "own": own,
                "cancelled": EventStatus.CANCELLED,
                "pending": S.PENDING.value,
                "charging": S.CHARGING.value,
                "at": at,
                "limit": limit,
                "reason": REASON,
                "actor": SYSTEM.actor,
            },
        )
        found = cursor.fetchall()
    others = []
    for row in found:
        saga, saga.reservation = rows.split(row, PurchaseSaga, Reservation, db=connection.alias)
        others.append(saga)
    if others:
        moved = len(others)
        transaction.on_commit(
            lambda: metrics.TRANSITIONS.labels(
                from_state=S.PENDING.value, to_state=S.CHARGING.value
            ).inc(moved)
        )
    return others


@functools.cache
def _pool(pid: int, workers: int) -> ThreadPoolExecutor:
    """The calls' threads, one pool per process (``pid``: a pool made before
    a fork is not the child's)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="charge-burst")


def _ask_all(burst: list[PurchaseSaga], gateway: PaymentGateway) -> list[Any]:
    """Each saga's charge asked, concurrently: its answer, or what the call
    raised. The answers are counted by the processor's breaker together
    (:func:`purchases.breaker.observe_many`)."""
    call = charge_call(gateway)
    workers = settings.CHARGE_BURST_CONCURRENCY
    if len(burst) == 1 or workers == 1 or not calls_concurrently(gateway):
        answers = [_ask(saga, call) for saga in burst]
    else:
        pool = _pool(os.getpid(), workers)
        futures = [pool.submit(_ask_in_thread, saga, call) for saga in burst]
        answers = [future.result() for future in futures]
    breaker.observe_many(
        asked="charge",
        answers=[(a.label, a.detail) for a in answers if not isinstance(a, Exception)],
    )
    return answers


def _ask(saga: PurchaseSaga, call):
    """One call: its answer, or what it raised (recorded as the one-saga
    step would raise it)."""
    try:
        with _in_trace(saga, "saga.charge"):
            return traced_call(saga, Ask("charge", saga.version), call)
    except Exception as error:
        return error


def _ask_in_thread(saga: PurchaseSaga, call):
    try:
        return _ask(saga, call)
    finally:
        # Nothing here reads the database; a thread's connection would be
        # its own and outlive the burst.
        connections.close_all()


def _in_trace(saga: PurchaseSaga, name: str):
    """The saga's own trace for its part of a burst: the task's span is its
    own saga's (a child of it, for that one), and a thread starts outside
    any."""
    if not tracing.enabled() or tracing.in_saga(saga.pk):
        return tracing.NOOP
    return tracing.continue_from(
        saga.trace_context or "", name, attributes={"saga.id": saga.pk}, saga_id=saga.pk
    )


def _record_all(
    burst: list[PurchaseSaga], answers: list[Any], *, gateway: PaymentGateway, now
) -> dict:
    """Every answer recorded in one commit, then what follows each; by id,
    each saga as its charge left it."""
    record = charge_record(gateway, now=now, by=SYSTEM)
    asks = {saga.pk: Ask("charge", saga.version) for saga in burst}
    answered = [
        (saga, a) for saga, a in zip(burst, answers, strict=True) if not isinstance(a, Exception)
    ]
    done: dict = {saga.pk: saga for saga in burst}
    nexts: list[Callable[[], PurchaseSaga]] = []
    try:
        with transaction.atomic(durable=True), availability_changes_gathered():
            at = clock(now)
            locked = lock_objects.sagas_for_update(
                event_id=burst[0].event_id, saga_ids=[saga.pk for saga, _ in answered]
            )
            confirming = []
            for saga, answer in answered:
                saga = locked[saga.pk]
                done[saga.pk] = saga
                if _confirms(saga, asks[saga.pk], answer):
                    confirming.append((saga, answer))
                    continue
                with _in_trace(saga, "saga.charge recorded"):
                    record_answer(saga, asked="charge", answer=answer, at=at)
                    then = record(saga, asks[saga.pk], answer, at)
                if then is not None:
                    nexts.append(then)
            record_answers(confirming, asked="charge", at=at)
            confirm_many(
                [(saga, answer.charge_id or "") for saga, answer in confirming],
                reason=CONFIRMED_REASON,
                at=at,
                by=SYSTEM,
            )
    except Exception:
        logger.exception(
            "charge burst: its recording commit failed; each answer is recorded alone",
            **log_extra(burst[0], burst=len(burst)),
        )
        return _record_each(burst, answers, asks, record=record, now=now)
    for then in nexts:
        moved = then()
        done[moved.pk] = moved
    _raise_first(answers)
    return done


def _confirms(saga: PurchaseSaga, ask: Ask, answer) -> bool:
    """Whether the answer confirms the saga as the one-saga record would
    (a charge that succeeded, the saga still as it was asked), so that it
    is confirmed with the burst's others in one statement per table. With
    tracing on, each saga is recorded by the one-saga code in its own trace."""
    return (
        not tracing.enabled()
        and answer.outcome == ChargeOutcome.SUCCEEDED
        and saga.state == S.CHARGING
        and saga.version == ask.version
    )


def _record_each(burst, answers, asks, *, record, now) -> dict:
    """The fallback: each answer in a commit of its own (the one-saga step's
    stage 3); the first error raised once every other answer is recorded."""
    done: dict = {}
    errors: list[Exception] = []
    for saga, answer in zip(burst, answers, strict=True):
        done[saga.pk] = saga
        if isinstance(answer, Exception):
            continue
        try:
            done[saga.pk] = record_step(
                saga=saga, ask=asks[saga.pk], answer=answer, record=record, now=now
            )
        except Exception as error:
            errors.append(error)
    if errors:
        raise errors[0]
    _raise_first(answers)
    return done


def _raise_first(answers: list[Any]) -> None:
    """A call that raised leaves its saga in CHARGING, its answer unknown to
    us: raised, as the one-saga step raises it (the task's retry finds the
    saga moved on; the resumer looks the intent up)."""
    for answer in answers:
        if isinstance(answer, Exception):
            raise answer
