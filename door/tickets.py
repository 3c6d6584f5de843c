"""A buyer's tickets (docs/door.md): one per seat still theirs in a confirmed
purchase (a live seat link, ``ReservationSeat``), each with its code signed
with the event's current key when it is read, and its status at the door.

A code is never stored: Ed25519 signatures are deterministic, so the same
link, version and key sign the same code on the purchase page, in the API's
answer and in the confirmation email. What this module reads: the links
(with their seats' refs; none when ``purchases.selectors`` prefetched them)
and the door's statuses, one query each, and the event's signing key
(cached in process by ``door.keys``).
"""

from __future__ import annotations

from dataclasses import dataclass

from purchases.models import PurchaseSaga, ReservationSeat
from purchases.saga.states import SagaState

from .codes import sign
from .keys import signing_key
from .selectors import CHECKED_IN, REVOKED, VALID, ticket_statuses

__all__ = ["CHECKED_IN", "REVOKED", "VALID", "TicketView", "purchase_tickets", "tickets_of"]


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
    email. Found by its event too when given (the tables are distributed
    by event)."""
    sagas = PurchaseSaga.objects.filter(pk=saga_id)
    if event_id is not None:
        sagas = sagas.filter(event_id=event_id)
    saga = sagas.only("id", "state", "event_id", "reservation_id").first()
    return [] if saga is None else tickets_of(saga)


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
