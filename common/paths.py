"""What every API route under ``…/events/{event_id}/`` shares: the event id
of the path segment, and the one answer for an event the caller's organizer
does not have (missing, malformed or another organizer's: the same 404). The
routes take any segment, so that a malformed one gets the API's JSON 404
whatever DEBUG says."""

from __future__ import annotations

import re

from django.urls.converters import IntConverter
from rest_framework.response import Response

from .api import error

NO_EVENT = "no such event"
# Ids are bigint: a longer run of digits names no row (and must not reach
# PostgreSQL, which would refuse it as out of range).
MAX_ID = 2**63 - 1


def event_pk(segment: str) -> int | None:
    """The id of a path segment, or None when it names no row."""
    if not re.fullmatch(IntConverter.regex, segment):
        return None
    value = int(segment)
    return value if value <= MAX_ID else None


def no_event() -> Response:
    return error(404, "not_found", NO_EVENT)
