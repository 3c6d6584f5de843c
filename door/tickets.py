"""A buyer's tickets (docs/door.md): one per seat still theirs in a confirmed
purchase (a live seat link, ``ReservationSeat``), each with its code signed
with the event's current key when it is read, and its status at the door.

A code is never stored: Ed25519 signatures are deterministic, so the same
link, version and key sign the same code on the purchase page, in the API's
answer and in the confirmation email. What this module reads: the links
(with their seats' refs; none when ``purchases.selectors`` prefetched them)
and the door's statuses, one query each (one for both, for the email), and
the event's signing key (its private half cached in process by
``door.keys``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from django.db import connection

from purchases.models import PurchaseSaga, ReservationSeat
from purchases.saga.states import SagaState

from .codes import sign
from .keys import signing_key
from .selectors import CHECKED_IN, REVOKED, TABLES, VALID, ticket_statuses

__all__ = [
    "CHECKED_IN",
    "REVOKED",
    "VALID",
    "TicketView",
    "purchase_tickets",
    "purchases_tickets",
    "tickets_of",
]


@dataclass(frozen=True)
class TicketView:
    """A ticket as its buyer sees it: the API's ``{"seat", "code", "status"}``."""

    seat: str  # the seat's ref (its label)
    code: str  # what the QR code encodes (door/codes.py)
    status: str  # valid | checked_in | revoked


def tickets_of(saga: PurchaseSaga) -> list[TicketView]:
    """The tickets of ``saga``, in the order its seats were taken; none
    unless it is CONFIRMED (a purchase on its way, or undone, has no
    ticket), none for a seat given back (its link released)."""
    if saga.state != SagaState.CONFIRMED:
        return []
    links = _live_links(saga)
    if not links:
        return []
    statuses = ticket_statuses(saga.event_id, [link.pk for link in links])
    key = signing_key(saga.event_id)
    return [
        TicketView(
            seat=link.seat.ref,
            code=sign(
                key,
                event_id=saga.event_id,
                seat_id=link.seat_id,
                ticket_id=link.pk,
                ticket_version=link.ticket_version,
            ),
            # A link the statuses did not name lets no one in (never expected).
            status=statuses.get(link.pk, REVOKED),
        )
        for link in links
    ]


def purchase_tickets(*, saga_id: str, event_id: int | None) -> list[TicketView]:
    """The tickets of the purchase ``saga_id`` as they are now (none when
    it is missing): for a reader that holds only its ids, the confirmation
    email, whose every confirmation reads them. :func:`tickets_of`'s answer
    in one statement (its links, seats and statuses; the purchase's, and by
    its event too when given: the tables are distributed by event), and the
    event's key (its own statement; its private half cached)."""
    sql = _purchase_tickets_sql(by_event=event_id is not None, many=False)
    params = [SagaState.CONFIRMED.value, saga_id] + ([event_id] if event_id is not None else [])
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    return _signed(found).get(str(saga_id), [])


def purchases_tickets(purchases: list[tuple[str, int]]) -> dict[str, list[TicketView]]:
    """:func:`purchase_tickets` of several purchases, each named by its
    (saga id, event id), in one statement, and each event's key once: by
    saga id, none for one missing (the emails of a charge burst's
    confirmations)."""
    if not purchases:
        return {}
    sql = _purchase_tickets_sql(by_event=True, many=True)
    saga_ids = [str(saga_id) for saga_id, _ in purchases]
    event_ids = sorted({event_id for _, event_id in purchases})
    with connection.cursor() as cursor:
        cursor.execute(sql, [SagaState.CONFIRMED.value, saga_ids, event_ids])
        found = cursor.fetchall()
    return _signed(found)


def _signed(found: list[tuple]) -> dict[str, list[TicketView]]:
    """The tickets of rows of :data:`_PURCHASE_TICKETS_SQL`, by saga id, each
    code signed with its event's current key (read once per event)."""
    keys: dict[int, tuple] = {}
    tickets: dict[str, list[TicketView]] = {}
    for saga_id, event, link_id, seat_id, version, ref, status in found:
        if event not in keys:
            keys[event] = signing_key(event)
        code = sign(
            keys[event], event_id=event, seat_id=seat_id, ticket_id=link_id, ticket_version=version
        )
        tickets.setdefault(str(saga_id), []).append(TicketView(seat=ref, code=code, status=status))
    return tickets


# A confirmed purchase's live links in the order of their ids, with their
# seats' refs and their statuses at the door (door.selectors' statuses for a
# live link of a confirmed purchase: revoked when its version is voided,
# checked in when let in, else valid), each table by its whole key.
_PURCHASE_TICKETS_SQL = """
SELECT sg.id, rs.event_id, rs.id, rs.seat_id, rs.ticket_version, st.ref,
       CASE WHEN EXISTS (SELECT 1 FROM {revocation} r WHERE r.event_id = rs.event_id
                            AND r.ticket_id = rs.id AND r.version = rs.ticket_version)
            THEN 'revoked'
            WHEN EXISTS (SELECT 1 FROM {checkin} c WHERE c.event_id = rs.event_id
                            AND c.ticket_id = rs.id)
            THEN 'checked_in'
            ELSE 'valid' END
  FROM {saga} sg
  JOIN {link} rs ON rs.reservation_id = sg.reservation_id AND rs.event_id = sg.event_id
  JOIN {seat} st ON st.id = rs.seat_id AND st.event_id = rs.event_id
 WHERE sg.state = %s AND {by_saga} {by_event} AND rs.released_at IS NULL
 ORDER BY rs.id
"""


@functools.cache
def _purchase_tickets_sql(*, by_event: bool, many: bool) -> str:
    if many:
        return _PURCHASE_TICKETS_SQL.format(
            **TABLES, by_saga="sg.id = ANY(%s::uuid[])", by_event="AND sg.event_id = ANY(%s)"
        )
    return _PURCHASE_TICKETS_SQL.format(
        **TABLES, by_saga="sg.id = %s", by_event="AND sg.event_id = %s" if by_event else ""
    )


def _live_links(saga: PurchaseSaga) -> list[ReservationSeat]:
    """The saga's links not released, by id (the order of its seats
    everywhere else): those ``purchases.selectors.purchase_get`` prefetched
    (``reservation.links``), else one query."""
    reservation = saga.reservation if PurchaseSaga.reservation.is_cached(saga) else None
    links = getattr(reservation, "links", None)
    if links is None:
        links = list(
            ReservationSeat.objects.filter(
                reservation_id=saga.reservation_id, event_id=saga.event_id
            )
            .select_related("seat")
            .order_by("id")
        )
    return [link for link in links if link.released_at is None]
