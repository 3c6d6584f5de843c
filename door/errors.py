"""What the door's services refuse (docs/door.md). The views answer each
as the API says: a missing ticket 404, a refused one 409 with its code."""

from __future__ import annotations


class DoorError(Exception):
    """Any refusal of the door's services."""


class TicketNotFound(DoorError):
    """No such purchase, another user's, or no ticket for that seat in it."""


class TicketRefused(DoorError):
    """A ticket that cannot be reissued: ``code`` is the API's
    (``ticket_checked_in``, ``ticket_revoked``)."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code


TICKET_CHECKED_IN = "ticket_checked_in"
TICKET_REVOKED = "ticket_revoked"


class KeyRefused(DoorError):
    """A key move that would leave the event without a current key, or
    names no key of it."""
