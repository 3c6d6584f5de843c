"""What every seller route under ``events/{event_id}/`` shares: the
organizer's event of the path (``common.paths`` reads the id), and the one
answer for an event the organizer does not have (missing, malformed or
another organizer's: the same 404)."""

from __future__ import annotations

from common.paths import event_pk as event_pk
from common.paths import no_event as no_event
from organizers.models import Organizer
from purchases.models import Event

from . import selectors
from .errors import EventNotFound


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
