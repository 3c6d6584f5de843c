"""What every seller route under ``events/{event_id}/`` shares: the event id
of the path, and the one answer for an event the organizer does not have
(missing, malformed or another organizer's: the same 404)."""

from __future__ import annotations

import re

from django.urls.converters import IntConverter
from rest_framework.response import Response

from common.api import error
from organizers.models import Organizer
from purchases.models import Event

from . import selectors
from .errors import EventNotFound

NO_EVENT = "no such event"
# Ids are bigint: a longer run of digits names no row (and must not reach
# PostgreSQL, which would refuse it as out of range).
_MAX_ID = 2**63 - 1


def event_pk(segment: str) -> int | None:
    """The id of a path segment, or None: the routes take any segment so
    that a malformed one gets the API's JSON 404, whatever DEBUG says."""
    if not re.fullmatch(IntConverter.regex, segment):
        return None
    value = int(segment)
    return value if value <= _MAX_ID else None


def organizer_event(organizer: Organizer, segment: str) -> Event | None:
    """The organizer's event of a path segment, or None (missing, malformed,
    or another organizer's: the same 404)."""
    pk = event_pk(segment)
    if pk is None:
        return None
    try:
        return selectors.event_of(organizer=organizer, event_id=pk)
    except EventNotFound:
        return None


def no_event() -> Response:
    return error(404, "not_found", NO_EVENT)
