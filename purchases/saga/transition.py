"""The one way a saga moves, and what every step shares: who moves it, the
clock, the backoff schedule (docs/design.md, "The saga").

A transition is one commit: the table decides first (an illegal move raises
before anything is written), then a conditional update on (state, version)
makes the move, so a saga changed behind our back is a :class:`StaleSaga`
verdict, not a retry; the history row and whatever the move implies (outbox,
timer, ledger rows) are written by the caller in the same transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from common import rows
from config import metrics, tracing
from config.transactions import in_transaction

from .. import lock_objects
from ..errors import IllegalTransition, StaleSaga
from ..models import Actor, PurchaseSaga, SagaHistory
from .states import TRANSITIONS, SagaState

logger = logging.getLogger(__name__)

S = SagaState


@dataclass(frozen=True)
class By:
    """Who moves the saga: the system, the resumer, or a named operator. It
    goes into every history row the move writes."""

    actor: str = Actor.SYSTEM
    name: str = ""

    @classmethod
    def operator(cls, name: str) -> By:
        return cls(Actor.OPERATOR, name)


SYSTEM = By()
RESUMER = By(Actor.RESUMER)
AN_OPERATOR = By(Actor.OPERATOR)  # not named (customer service's default)


def clock(now: datetime | None) -> datetime:
    """The instant of one commit's decision: the injected clock, else now.

    Each commit asks for its own instant (a step that makes a network call
    between two commits passes its caller's ``now`` on unresolved), so every
    history row carries the moment of its own decision.
    """
    return now or timezone.now()


def log_extra(saga: PurchaseSaga | None = None, **extra) -> dict:
    """``extra=`` for a log line about a saga: its id and state on every line."""
    if saga is not None:
        extra.setdefault("saga_id", str(saga.pk))
        extra.setdefault("state", saga.state)
    return {"extra": extra}


class Backoff:
    """A retry schedule read one way: ``delay(n)`` before the n-th retry
    (1-based; past the end the last delay repeats), and ``is_spent(n)`` when
    the schedule has no n-th delay of its own."""

    def __init__(self, delays: list[int] | None = None) -> None:
        self.delays = list(settings.RECONCILE_BACKOFF_SECONDS if delays is None else delays)

    def delay(self, n: int) -> int:
        return self.delays[min(max(n, 1), len(self.delays)) - 1]

    def is_spent(self, n: int) -> bool:
        return n > len(self.delays)


def move(
    saga: PurchaseSaga,
    to: SagaState,
    *,
    reason: str,
    at: datetime,
    by: By = SYSTEM,
    count_attempt: bool = False,
    action_secret: str = "",
) -> PurchaseSaga:
    """Move ``saga`` to ``to`` inside the caller's transaction.

    ``action_secret``: with a move to REQUIRES_ACTION, what the buyer's
    browser authenticates with; every move writes it, so a move out of
    REQUIRES_ACTION clears it."""
    if not in_transaction():
        raise RuntimeError("a transition belongs inside its commit")
    source = SagaState(saga.state)
    if to not in TRANSITIONS[source]:
        raise IllegalTransition(source, to)
    with _transition_span(saga, source, to):
        if action_secret and to != S.REQUIRES_ACTION:
            raise ValueError("an action secret belongs to a move to REQUIRES_ACTION")
        updated = _move_and_record(
            saga,
            source,
            to,
            reason=reason,
            at=at,
            by=by,
            count_attempt=count_attempt,
            action_secret=action_secret,
        )
        if updated != 1:
            raise StaleSaga(f"saga {saga.pk} is no longer {source} v{saga.version}")
        saga.state = to
        saga.version += 1
        saga.updated_at = at
        saga.awaiting_operator_since = None
        saga.action_secret = action_secret
        if to == S.COMPENSATING and saga.compensation_started_at is None:
            saga.compensation_started_at = at
        if count_attempt:
            saga.attempts += 1
    logger.info("saga %s -> %s: %s", source, to, reason, **log_extra(saga, actor=by.actor))
    transaction.on_commit(
        lambda: metrics.TRANSITIONS.labels(from_state=source.value, to_state=to.value).inc()
    )
    return saga


# The move and its history row in one statement (one round trip, written
# once: every step makes one or two moves; docs/performance.md). The update
# names the whole key (id and event): by the id alone, a planner without
# statistics ANDed it with the live-state index. Any move ends a wait for an
# operator (the move is the verdict); the first COMPENSATING stamps when the
# compensation started; the action secret lives only while REQUIRES_ACTION.
_MOVE_SQL = """
WITH moved AS (
  UPDATE {saga} SET state = %(to)s, version = version + 1, updated_at = %(at)s,
         attempts = attempts + %(attempt)s, awaiting_operator_since = NULL,
         action_secret = %(action_secret)s,
         compensation_started_at = COALESCE(compensation_started_at, %(compensating)s)
   WHERE id = %(id)s AND event_id = %(event)s AND state = %(source)s AND version = %(version)s
  RETURNING id, event_id, version
)
INSERT INTO {history} (saga_id, event_id, from_state, to_state, at, reason, actor, actor_name,
                       version)
SELECT id, event_id, %(source)s, %(to)s, %(at)s, %(reason)s, %(actor)s, %(actor_name)s, version
  FROM moved
"""


def _move_and_record(
    saga: PurchaseSaga,
    source: SagaState,
    to: SagaState,
    *,
    reason: str,
    at: datetime,
    by: By,
    count_attempt: bool,
    action_secret: str,
) -> int:
    """The conditional update and the history row (PostgreSQL); returns the
    number of sagas moved (0: it was no longer ``source`` at that version)."""
    sql = _MOVE_SQL.format(saga=PurchaseSaga._meta.db_table, history=SagaHistory._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            {
                "to": SagaState(to).value,
                "at": at,
                "attempt": 1 if count_attempt else 0,
                "compensating": at if to == S.COMPENSATING else None,
                "id": saga.pk,
                "event": saga.event_id,
                "source": source.value,
                "version": saga.version,
                "reason": reason[:500],
                "actor": by.actor,
                "actor_name": by.name,
                "action_secret": action_secret,
            },
        )
        return cursor.rowcount


# move() for several sagas of one event in one statement: each by its whole
# key and the version it was read at.
_MOVE_MANY_SQL = """
WITH moved AS (
  UPDATE {saga} s SET state = %(to)s, version = s.version + 1, updated_at = %(at)s,
         awaiting_operator_since = NULL, action_secret = ''
    FROM unnest(%(ids)s::uuid[], %(versions)s::bigint[]) AS v(id, version)
   WHERE s.id = v.id AND s.event_id = %(event)s AND s.state = %(source)s
     AND s.version = v.version
  RETURNING s.id, s.event_id, s.version
)
INSERT INTO {history} (saga_id, event_id, from_state, to_state, at, reason, actor, actor_name,
                       version)
SELECT id, event_id, %(source)s, %(to)s, %(at)s, %(reason)s, %(actor)s, %(actor_name)s, version
  FROM moved
"""

# The moves move_many makes: out of a state into one that stamps nothing more
# than a move does (no attempt counted, no secret, no compensation started).
_MANY_TARGETS = frozenset({S.CONFIRMED})


def move_many(
    sagas: list[PurchaseSaga], to: SagaState, *, reason: str, at: datetime, by: By = SYSTEM
) -> None:
    """:func:`move` for sagas of one event, all in one state, in one
    statement inside the caller's transaction (a charge burst's
    confirmations); each saga's log line as :func:`move` writes it. All or
    nothing: a saga not as it was read is a :class:`StaleSaga`."""
    if not in_transaction():
        raise RuntimeError("a transition belongs inside its commit")
    if not sagas:
        return
    source = SagaState(sagas[0].state)
    if to not in _MANY_TARGETS or any(saga.state != source for saga in sagas):
        raise ValueError(f"move_many moves sagas of one state to {sorted(_MANY_TARGETS)}")
    if to not in TRANSITIONS[source]:
        raise IllegalTransition(source, to)
    (event_id,) = {saga.event_id for saga in sagas}
    sql = _MOVE_MANY_SQL.format(
        saga=PurchaseSaga._meta.db_table, history=SagaHistory._meta.db_table
    )
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            {
                "to": to.value,
                "at": at,
                "ids": [saga.pk for saga in sagas],
                "versions": [saga.version for saga in sagas],
                "event": event_id,
                "source": source.value,
                "reason": reason[:500],
                "actor": by.actor,
                "actor_name": by.name,
            },
        )
        moved = cursor.rowcount
    if moved != len(sagas):
        raise StaleSaga(f"{len(sagas) - moved} of {len(sagas)} sagas are no longer {source}")
    for saga in sagas:
        saga.state, saga.version, saga.updated_at = to, saga.version + 1, at
        saga.awaiting_operator_since, saga.action_secret = None, ""
        logger.info("saga %s -> %s: %s", source, to, reason, **log_extra(saga, actor=by.actor))
    transaction.on_commit(
        lambda: metrics.TRANSITIONS.labels(from_state=source.value, to_state=to.value).inc(moved)
    )


def _transition_span(saga: PurchaseSaga, source: SagaState, to: SagaState):
    """The move's span, in the step's trace, named after the move (the
    transition table bounds the names); a no-op with tracing off."""
    if not tracing.enabled():
        return tracing.NOOP
    return tracing.span(
        f"saga.transition {source.value}->{to.value}",
        attributes={
            "saga.id": saga.pk,
            "intent.id": saga.intent_id,
            "saga.state.from": source.value,
            "saga.state.to": to.value,
            "saga.version": saga.version + 1,
        },
    )


def step_span(name: str, *, saga_id):
    """The span of a saga step, in the purchase's trace whoever runs it (a
    task whose headers were lost, the resumer's sweep, an operator): the
    trace stored on the saga, read only when the caller is not in it already
    (an outbox delivery of this saga's row). A no-op with tracing off."""
    if not tracing.enabled():
        return tracing.NOOP
    attributes = {"saga.id": saga_id}
    if tracing.in_saga(saga_id):
        return tracing.span(name, attributes=attributes)
    stored = PurchaseSaga.objects.filter(pk=saga_id).values_list("trace_context", flat=True).first()
    return tracing.continue_from(stored or "", name, attributes=attributes, saga_id=saga_id)


def note_decision(saga: PurchaseSaga, *, reason: str, at: datetime, by: By = SYSTEM) -> None:
    """A history row for a decision that makes no move: a refusal, an
    operator's reason before an action, an answer that settles nothing."""
    _history(saga, saga.state, saga.state, reason=reason, at=at, by=by)
    logger.info("saga note: %s", reason, **log_extra(saga, actor=by.actor))


def _history(saga, source, to, *, reason: str, at: datetime, by: By) -> None:
    rows.create(
        SagaHistory(
            saga=saga,
            event_id=saga.event_id,
            from_state=source,
            to_state=to,
            at=at,
            reason=reason[:500],
            actor=by.actor,
            actor_name=by.name,
            version=saga.version,
        )
    )


def saga_transition(
    *,
    saga_id,
    to: SagaState,
    reason: str,
    by: By = SYSTEM,
    now: datetime | None = None,
) -> PurchaseSaga:
    """A bare, guarded move in its own commit (operators' tooling, tests of
    the table)."""
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        return move(saga, to, reason=reason, at=clock(now), by=by)
