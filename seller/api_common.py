"""What the seller's API modules say alike in their schema: the event id of
the path, and who may call a route (``organizers.permissions``)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse

from common.api import error_response
from organizers.roles import MAY, Action

EVENT_ID = OpenApiParameter("event_id", OpenApiTypes.INT, OpenApiParameter.PATH, required=True)


def roles(action: Action) -> str:
    """The roles that may take ``action``, as the schema lists them."""
    return ", ".join(sorted(MAY[action]))


def scoped(action: Action, what: str = "") -> str:
    """A route's description: ``what`` it does, then who may call it."""
    said = (
        f"Members whose role may {action} ({roles(action)}); anyone else who is not a "
        "member gets the same `404` as for a missing organizer."
    )
    return f"{what}\n\n{said}" if what else said


def forbidden(action: Action) -> OpenApiResponse:
    """The ``403`` of a route that takes ``action``."""
    return error_response(
        f"`permission_denied`: your role may not {action} (only {roles(action)}), or session "
        "authentication without a valid CSRF token"
    )
