"""What the door reads (docs/door.md): a ticket's status, the offline
gates' list, the check-in's progress. Each query names its event (the
tables are distributed by it: config/distribution.py)."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models import Count
from django.utils import timezone

from organizers.models import Organizer
from purchases.models import Event, PurchaseSaga, ReservationSeat, Seat
from purchases.saga.states import SagaState

from . import codes, keys
from .models import CheckIn, TicketRevocation

VALID, CHECKED_IN, REVOKED = "valid", "checked_in", "revoked"


def event_of(*, organizer: Organizer, event_id: int) -> Event | None:
    """The organizer's event ``event_id``; None for a missing one and for
    another organizer's alike (the same 404)."""
    return Event.objects.filter(pk=event_id, organizer=organizer).first()


# Event id -> its organizer's id, as found: an event never moves to another
# organizer and is never deleted (its organizer is PROTECTed), so what is
# found once stays true; a missing event is not remembered (it may be made).
_organizer_of_event: dict[int, int] = {}
_ORGANIZER_OF_EVENT_MAX = 10_000


def event_id_of(*, organizer: Organizer, event_id: int) -> int | None:
    """:func:`event_of`'s answer as the event's id, remembered by the
    process: a scan does not read the event."""
    owner = _organizer_of_event.get(event_id)
    if owner is None:
        owner = Event.objects.filter(pk=event_id).values_list("organizer_id", flat=True).first()
        if owner is None:
            return None
        if len(_organizer_of_event) >= _ORGANIZER_OF_EVENT_MAX:
            _organizer_of_event.clear()
        _organizer_of_event[event_id] = owner
    return event_id if owner == organizer.pk else None


TABLES = {
    "link": ReservationSeat._meta.db_table,
    "saga": PurchaseSaga._meta.db_table,
    "seat": Seat._meta.db_table,
    "checkin": CheckIn._meta.db_table,
    "revocation": TicketRevocation._meta.db_table,
}

# A ticket is revoked when its link is released, its purchase is not
# confirmed, or its current version is voided; checked in when let in.
_STATUSES_SQL = """
SELECT rs.id,
       CASE WHEN rs.released_at IS NOT NULL OR sg.state <> %s
              OR EXISTS (SELECT 1 FROM {revocation} r WHERE r.event_id = rs.event_id
                            AND r.ticket_id = rs.id AND r.version = rs.ticket_version)
            THEN 'revoked'
            WHEN EXISTS (SELECT 1 FROM {checkin} c WHERE c.event_id = rs.event_id
                            AND c.ticket_id = rs.id)
            THEN 'checked_in'
            ELSE 'valid' END
  FROM {link} rs
  JOIN {saga} sg ON sg.reservation_id = rs.reservation_id AND sg.event_id = rs.event_id
 WHERE rs.event_id = %s AND rs.id = ANY(%s)
"""


def ticket_statuses(event_id: int, link_ids: Sequence[int]) -> dict[int, str]:
    """The status of the tickets of ``link_ids`` (one event's seat links, at
    their current version): ``valid``, ``checked_in`` or ``revoked``, by link
    id. One statement."""
    if not link_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            _STATUSES_SQL.format(**TABLES), [SagaState.CONFIRMED, event_id, list(link_ids)]
        )
        return dict(cursor.fetchall())


@dataclass(frozen=True)
class TicketState:
    """A ticket as the second read of a check-in finds it (when the
    admitting insert wrote nothing): why it did not admit."""

    seat: str
    live: bool  # link not released, purchase confirmed
    version: int  # the link's current ticket version
    voided: bool  # a revocation names the scanned version
    checked_in_at: datetime | None
    gate: str | None


_STATE_SQL = """
SELECT s.ref, rs.released_at IS NULL AND sg.state = %s, rs.ticket_version,
       EXISTS (SELECT 1 FROM {revocation} r WHERE r.event_id = rs.event_id
                  AND r.ticket_id = rs.id AND r.version = %s),
       c.checked_in_at, c.gate
  FROM {link} rs
  JOIN {seat} s ON s.id = rs.seat_id AND s.event_id = rs.event_id
  JOIN {saga} sg ON sg.reservation_id = rs.reservation_id AND sg.event_id = rs.event_id
  LEFT JOIN {checkin} c ON c.event_id = rs.event_id AND c.ticket_id = rs.id
 WHERE rs.event_id = %s AND rs.id = %s AND rs.seat_id = %s
"""


def ticket_state(payload: codes.Payload) -> TicketState | None:
    """The ticket a code names, as it is now; None when no seat link of its
    event matches it."""
    with connection.cursor() as cursor:
        cursor.execute(
            _STATE_SQL.format(**TABLES),
            [
                SagaState.CONFIRMED,
                payload.ticket_version,
                payload.event_id,
                payload.ticket_id,
                payload.seat_id,
            ],
        )
        row = cursor.fetchone()
    return None if row is None else TicketState(*row)


# --- the offline list ---------------------------------------------------------------------

# (ticket, seat, version) of every voided ticket: the revocations, and the
# links of confirmed purchases released without one (before the door).
_REVOKED_SQL = """
SELECT r.ticket_id, rs.seat_id, r.version FROM {revocation} r
  JOIN {link} rs ON rs.id = r.ticket_id AND rs.event_id = r.event_id
 WHERE r.event_id = %s
UNION
SELECT rs.id, rs.seat_id, rs.ticket_version FROM {link} rs
  JOIN {saga} sg ON sg.reservation_id = rs.reservation_id AND sg.event_id = rs.event_id
 WHERE rs.event_id = %s AND rs.released_at IS NOT NULL AND sg.state = %s
"""
_CHECKED_IN_SQL = """
SELECT c.ticket_id, rs.seat_id, c.version FROM {checkin} c
  JOIN {link} rs ON rs.id = c.ticket_id AND rs.event_id = c.event_id
 WHERE c.event_id = %s
"""


def _tickets(sql: str, params: list) -> list[tuple[int, int, int]]:
    with connection.cursor() as cursor:
        cursor.execute(sql.format(**TABLES), params)
        return sorted(cursor.fetchall())


def _codes_of(event_id: int, tickets: Iterable[tuple[int, int, int]], signers: list) -> list[str]:
    """Each ticket's code under every accepted key (a code signed before a
    rotation still scans until its key is retired)."""
    return [
        codes.sign(
            signer,
            event_id=event_id,
            seat_id=seat_id,
            ticket_id=ticket_id,
            ticket_version=version,
        )
        for ticket_id, seat_id, version in tickets
        for signer in signers
    ]


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def checkin_list(event: Event) -> dict:
    """What an offline gate needs (docs/door.md, "Offline gates"): the
    public keys, and the codes that must not admit (revoked) or admit no
    more (checked in), as of the moment before they were read."""
    as_of = timezone.now()
    public = keys.public_key_bytes(event.pk)
    signers = [keys.private_key(event.pk, version) for version in sorted(public)]
    revoked = _tickets(_REVOKED_SQL, [event.pk, event.pk, SagaState.CONFIRMED])
    checked_in = _tickets(_CHECKED_IN_SQL, [event.pk])
    current = max(public)
    return {
        "public_key": _b64(public[current]),
        "key_version": current,
        "public_keys": [
            {"version": version, "key": _b64(raw)} for version, raw in sorted(public.items())
        ],
        "revoked": _codes_of(event.pk, revoked, signers),
        "checked_in": _codes_of(event.pk, checked_in, signers),
        "as_of": as_of,
    }


_EXPECTED_SQL = """
SELECT count(*) FROM {link} rs
  JOIN {saga} sg ON sg.reservation_id = rs.reservation_id AND sg.event_id = rs.event_id
 WHERE rs.event_id = %s AND rs.released_at IS NULL AND sg.state = %s
"""


def checkin_progress(event: Event) -> dict:
    """How many are expected (live tickets of confirmed purchases), how many
    were let in, and by which gate."""
    with connection.cursor() as cursor:
        cursor.execute(_EXPECTED_SQL.format(**TABLES), [event.pk, SagaState.CONFIRMED])
        (expected,) = cursor.fetchone()
    by_gate = list(
        CheckIn.objects.filter(event_id=event.pk)
        .values("gate")
        .annotate(admitted=Count("id"))
        .order_by("gate")
    )
    return {
        "expected": expected,
        "admitted": sum(row["admitted"] for row in by_gate),
        "by_gate": [{"gate": row["gate"], "admitted": row["admitted"]} for row in by_gate],
    }
