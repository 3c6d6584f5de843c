"""Operators' runbook actions: guarded transitions through the saga's public
services (docs/operations.md, "Runbook").

Each action names the operator and a reason (both land in the saga's
history), is offered only where the transition table allows it, and has a
dry run (:func:`action_plan`) that says what it will do, and what the gateway
says, before it does it. The admin is a thin caller of these functions.
"""

from ...services import ActionRefused
from .actions import LABELS, SOURCES, TARGETS, Action, actions_for
from .gateway_view import GatewayView, gateway_view
from .plan import Plan, action_plan
from .run import action_run

__all__ = [
    "LABELS",
    "SOURCES",
    "TARGETS",
    "Action",
    "ActionRefused",
    "GatewayView",
    "Plan",
    "action_plan",
    "action_run",
    "actions_for",
    "gateway_view",
]
