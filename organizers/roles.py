"""Roles and what each may do: the contract's matrix as data (docs/api.md,
"Organizers and roles").

``MAY`` is the one table the permission class reads
(``organizers.permissions.OrganizerPermission``); a view says which action
it takes, never which roles. The first two rows are ours (every member sees
its organizer; only an owner deletes it), the rest are the contract's.
"""

from __future__ import annotations

import enum

from django.db import models


class Role(models.TextChoices):
    OWNER = "owner"
    MANAGER = "manager"
    FINANCE = "finance"
    DOOR = "door"


class Action(enum.StrEnum):
    VIEW_ORGANIZER = "view the organizer"
    DELETE_ORGANIZER = "delete the organizer"
    MANAGE_MEMBERS = "manage members"
    MANAGE_EVENTS = "create, edit and publish events, seat maps, prices and blocks"
    MANAGE_WEBHOOKS = "manage the organizer's webhook endpoints"
    READ_SALES = "read purchases, reports and exports"
    REFUND = "refund purchases"
    CANCEL_EVENT = "cancel an event"
    CHECK_IN = "check tickets in"


OWNER, MANAGER, FINANCE, DOOR = Role.OWNER, Role.MANAGER, Role.FINANCE, Role.DOOR

MAY: dict[Action, frozenset[Role]] = {
    Action.VIEW_ORGANIZER: frozenset(Role),
    Action.DELETE_ORGANIZER: frozenset({OWNER}),
    Action.MANAGE_MEMBERS: frozenset({OWNER}),
    Action.MANAGE_EVENTS: frozenset({OWNER, MANAGER}),
    Action.MANAGE_WEBHOOKS: frozenset({OWNER, MANAGER}),
    Action.READ_SALES: frozenset({OWNER, MANAGER, FINANCE}),
    Action.REFUND: frozenset({OWNER, FINANCE}),
    Action.CANCEL_EVENT: frozenset({OWNER}),
    Action.CHECK_IN: frozenset({OWNER, MANAGER, DOOR}),
}


def may(role: str, action: Action) -> bool:
    return role in MAY[action]
