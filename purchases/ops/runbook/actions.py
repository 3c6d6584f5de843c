"""The runbook's actions and where each may start, checked against the
transition table."""

from __future__ import annotations

import enum

from ...saga.states import TERMINAL, TRANSITIONS, SagaState

S = SagaState


class Action(enum.StrEnum):
    RECONCILE_NOW = "reconcile_now"
    RESUME_NOW = "resume_now"
    CONFIRM_MANUAL = "confirm_after_manual_check"
    COMPENSATE_MANUAL = "compensate_after_manual_check"
    REFUND = "refund"


LABELS = {
    Action.RECONCILE_NOW: "Reconcile now (look the intent up at the gateway)",
    Action.RESUME_NOW: "Resume now (drive from the current state)",
    Action.CONFIRM_MANUAL: "Confirm after manual check",
    Action.COMPENSATE_MANUAL: "Compensate after manual check",
    Action.REFUND: "Refund (customer service)",
}

_NON_TERMINAL = frozenset(s for s in S if s not in TERMINAL)

# Where each action may start: derived from, and checked against, the
# transition table (see test_runbook).
SOURCES: dict[Action, frozenset[SagaState]] = {
    Action.RECONCILE_NOW: _NON_TERMINAL,
    Action.RESUME_NOW: _NON_TERMINAL - {S.UNKNOWN_EXPIRED},
    Action.CONFIRM_MANUAL: frozenset({S.UNKNOWN_EXPIRED, S.COMPENSATION_PENDING}),
    Action.COMPENSATE_MANUAL: frozenset({S.UNKNOWN_EXPIRED, S.COMPENSATION_PENDING}),
    Action.REFUND: frozenset({S.CONFIRMED}),
}
# The move each manual action makes, for the table check (the refund makes
# none: it opens a refund row, docs/refunds.md).
TARGETS = {
    (Action.CONFIRM_MANUAL, S.UNKNOWN_EXPIRED): S.CONFIRMED,
    (Action.CONFIRM_MANUAL, S.COMPENSATION_PENDING): S.COMPENSATED,
    (Action.COMPENSATE_MANUAL, S.UNKNOWN_EXPIRED): S.COMPENSATING,
    (Action.COMPENSATE_MANUAL, S.COMPENSATION_PENDING): S.COMPENSATING,
}
assert all(target in TRANSITIONS[source] for (_, source), target in TARGETS.items())


def actions_for(state: str) -> list[Action]:
    return [a for a in Action if SagaState(state) in SOURCES[a]]
