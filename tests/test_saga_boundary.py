"""One saga boundary (issue 31; docs/design.md, "Operators' steps"):
``purchases.services`` exports operations and the words their callers need,
never the saga's machinery.

The import contracts in pyproject.toml catch the machinery that has a module
of its own (the step helper, the confirming commit: only the saga's steps
import them). This checks the names, for the machinery that shares a module
with an operation (``move`` beside ``saga_transition``,
``finish_compensation`` beside ``saga_compensate``).
"""

from __future__ import annotations

import inspect
import types

from purchases import services
from purchases.saga import compensate, confirm, step, transition

# What a step is made of, used inside a commit the saga holds: lent to a
# caller, it lets that caller build steps of its own outside the saga.
MACHINERY = {
    "move": transition.move,
    "note_decision": transition.note_decision,
    "clock": transition.clock,
    "gateway_step": step.gateway_step,
    "ask_and_record": step.ask_and_record,
    "record_answer": step.record_answer,
    "gateway_or_default": step.gateway_or_default,
    "Ask": step.Ask,
    "confirm": confirm.confirm,
    "finish_compensation": compensate.finish_compensation,
    "record_refund": compensate.record_refund,
}

# Not operations but the words their callers need: who acts, what the driver
# does from each state, what a start returns, what an operation may raise.
VOCABULARY = {"By", "SYSTEM", "DRIVES", "PurchaseStarted", "NotEnoughSeats", "ActionRefused"}
# The one operation that runs inside its caller's commit: the chaser claims
# the sagas it alerts about itself, with SKIP LOCKED.
IN_THE_CALLERS_COMMIT = {"raise_operator_alert"}


def _exported(module) -> dict[str, object]:
    return {
        name: value
        for name, value in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }


def _is_an_operation(value: object) -> bool:
    """Keywords only (ids, a clock, a gateway): an operation takes no row
    locked in its caller's commit, it owns its commits."""
    if not inspect.isfunction(value):
        return False
    parameters = inspect.signature(value).parameters.values()
    return all(p.kind == p.KEYWORD_ONLY for p in parameters)


def _lent(module) -> list[str]:
    """The names ``module`` exports that are the saga's machinery, or
    neither an operation nor a word its callers need."""
    machinery = list(MACHINERY.values())
    return sorted(
        name
        for name, value in _exported(module).items()
        if any(value is part for part in machinery)
        or (name not in VOCABULARY | IN_THE_CALLERS_COMMIT and not _is_an_operation(value))
    )


def test_the_services_export_what_they_list():
    assert sorted(_exported(services)) == sorted(services.__all__)


def test_the_services_lend_out_none_of_the_sagas_machinery():
    assert _lent(services) == []


def test_the_check_finds_the_machinery_re_exported():
    # given: the services as they were before issue 31, re-exporting the
    # saga's machinery for the runbook
    before = types.ModuleType("services_before")
    vars(before).update(_exported(services))
    vars(before).update(MACHINERY)
    vars(before)["reservation_links"] = confirm.reservation_links  # not listed above

    # then
    assert _lent(before) == sorted([*MACHINERY, "reservation_links"])
