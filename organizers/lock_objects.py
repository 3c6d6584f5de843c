"""Every row lock of the organizers app (docs/design.md, "House rules").

A change of members locks the organizer first (``FOR NO KEY UPDATE``: the
foreign-key checks of the events and endpoints written for it take ``FOR
KEY SHARE`` and do not wait), so that two changes of one organizer's
members follow one another: the last owner cannot be removed by two owners
removing each other at once. A delete takes ``FOR UPDATE``, which those
checks do wait for; an event committed for an organizer deleted meanwhile
fails its foreign key, so no event outlives its organizer.
"""

from __future__ import annotations

from .models import Organizer


def organizer_for_update(*, organizer_id: int, delete: bool = False) -> Organizer | None:
    return (
        Organizer.objects.select_for_update(of=("self",), no_key=not delete)
        .filter(pk=organizer_id)
        .first()
    )
