"""What the organizers' services refuse; the API turns each into its answer
(organizers/apis.py)."""

from __future__ import annotations


class OrganizerError(Exception):
    pass


class OrganizerNotFound(OrganizerError):
    """No such organizer, or one the user is not a member of: the same
    answer for both (``404 not_found``), so that a stranger learns nothing."""


class MemberNotFound(OrganizerError):
    """No such member of this organizer (``404 not_found``)."""


class OrganizerInvalid(OrganizerError):
    """A bad value, named by its field (``400 invalid``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class OrganizerConflict(OrganizerError):
    """Refused in the state the organizer is in (``409 <code>``): the last
    owner cannot go, an organizer with events cannot be deleted."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
