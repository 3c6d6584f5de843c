"""What the seller's event services refuse; the API turns each into its
answer (seller/apis.py): the status and ``code`` are the class's."""

from __future__ import annotations

from .seat_maps import SeatMapInvalid

__all__ = [
    "EventCancelled",
    "EventError",
    "EventHasNoSeats",
    "EventInvalid",
    "EventNotDraft",
    "EventNotFound",
    "SeatMapInvalid",
    "SeatsNotBlockable",
    "UnknownSeatRefs",
]


class EventError(Exception):
    status = 400
    code = "invalid"


class EventNotFound(EventError):
    """No such event of this organizer: another organizer's event is
    answered exactly as a missing one (``404 not_found``)."""

    status = 404
    code = "not_found"

    def __init__(self, message: str = "no such event"):
        super().__init__(message)


class EventNotDraft(EventError):
    """Only a draft's seat map, categories and currency may change, and only
    a draft is published (``409 event_not_draft``)."""

    status = 409
    code = "event_not_draft"

    def __init__(self, message: str = "the event is not a draft"):
        super().__init__(message)


class EventCancelled(EventError):
    """A cancelled event changes no more (``409 event_cancelled``)."""

    status = 409
    code = "event_cancelled"

    def __init__(self, message: str = "the event is cancelled"):
        super().__init__(message)


class EventHasNoSeats(EventError):
    """An event without seats is not published (``409 event_has_no_seats``)."""

    status = 409
    code = "event_has_no_seats"

    def __init__(self, message: str = "the event has no seats to sell"):
        super().__init__(message)


class SeatsNotBlockable(EventError):
    """Seats held or sold cannot be blocked (``409 seat_unavailable``,
    listing them in ``seats``)."""

    status = 409
    code = "seat_unavailable"

    def __init__(self, refs: list[str]):
        super().__init__(f"seats held or sold cannot be blocked: {', '.join(refs)}")
        self.refs = refs


class UnknownSeatRefs(EventError):
    """Refs that name no seat of the event (``400 invalid``, field
    ``seats``, listing them in ``seats``)."""

    def __init__(self, refs: list[str]):
        super().__init__(f"no such seats for this event: {', '.join(refs)}")
        self.refs = refs
        self.field = "seats"
        self.message = str(self)


class EventInvalid(EventError):
    """A value that breaks a rule the event's state decides (the sales
    window with the stored other end, a category its seats still use),
    named by its field (``400 invalid``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
