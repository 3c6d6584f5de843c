"""A refund row opened under its saga's lock, with everything that goes with
it in the same commit (docs/refunds.md, "A refund's life").

:func:`refund_open` runs inside the caller's transaction, the saga locked
(``lock_objects.saga_for_update``): the refunds of one purchase are decided
one at a time, so two of them (a buyer's cancel and an organizer's refund,
or either and the event's cancellation) never give back the same money or
the same seat twice. In that commit: the row (``pending``), the seats it
releases back on sale (their tickets void with them), the obligation to
ask the processor (``refund.execute``, due now) and the chaser's deadline
(``refund.chase``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection

from door.models import RevocationReason
from door.revocations import revoke_links
from outbox.services import outbox_publish, timer_schedule

from .. import lock_objects
from ..availability import availability_changed
from ..models import (
    PurchaseSaga,
    Refund,
    RefundSource,
    RefundStatus,
    ReservationSeat,
    Seat,
)
from ..saga.states import SagaState
from ..saga.topics import Topic
from .errors import InvalidRefund, NotRefundable, RefundExceedsPaid


@dataclass(frozen=True)
class SeatLink:
    id: int
    seat_id: int
    ref: str
    released: bool
    price: int | None


@dataclass(frozen=True)
class RefundAsk:
    """What a refund is asked to give back: ``seats`` by ref (None: none
    named), ``amount`` (None: those seats' prices, or all that is left)."""

    source: RefundSource
    public_reason: str
    amount: int | None = None
    seats: list[str] | None = None
    release: bool = False
    fee_percent: int = 0  # kept of the seats' prices (a buyer's cancel)
    reason: str = ""
    requested_by_id: int | None = None
    request_key: str = ""
    request_hash: str = ""


# Every seat link of the purchase with its seat's ref and the price paid,
# each table by its whole key (as confirm.reservation_links reads them).
_LINKS_SQL = """
SELECT rs.id, rs.seat_id, s.ref, rs.released_at IS NOT NULL, rs.price_amount
  FROM {link} rs JOIN {seat} s ON s.id = rs.seat_id AND s.event_id = rs.event_id
 WHERE rs.reservation_id = %s AND rs.event_id = %s ORDER BY s.ref
"""


def seat_links(saga: PurchaseSaga) -> list[SeatLink]:
    sql = _LINKS_SQL.format(link=ReservationSeat._meta.db_table, seat=Seat._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(sql, [saga.reservation_id, saga.event_id])
        return [SeatLink(*row) for row in cursor.fetchall()]


def refundable(saga: PurchaseSaga) -> int:
    """What is left to refund of the purchase's charge."""
    if saga.state != SagaState.CONFIRMED:
        return 0
    owed, _ = _earlier(saga)
    return max(saga.amount - owed, 0)


def seats_refunded(saga: PurchaseSaga) -> set[str]:
    """The refs of the seats a refund (not a failed one) already names."""
    _, taken = _earlier(saga)
    return taken


def _earlier(saga: PurchaseSaga) -> tuple[int, set[str]]:
    """What the purchase's refunds (not failed ones) give back or still owe,
    and the seats they name (:func:`_earlier_of`, for one purchase)."""
    return _earlier_of([saga]).get(saga.pk, (0, set()))


def _seat_price(link: SeatLink, saga: PurchaseSaga, links: list[SeatLink]) -> int:
    # A link older than refunds has no price of its own: its share of the total.
    return link.price if link.price is not None else saga.amount // len(links)


def _named(ask: RefundAsk, links: list[SeatLink], *, taken: set[str]) -> list[SeatLink]:
    """The links of the seats asked for, checked: each in the purchase, once,
    none refunded already (``taken``)."""
    refs = ask.seats or []
    if not refs:
        raise InvalidRefund("seats", "name at least one seat")
    if len(set(refs)) != len(refs):
        raise InvalidRefund("seats", "a seat is named twice")
    by_ref = {link.ref: link for link in links}
    unknown = [ref for ref in refs if ref not in by_ref]
    if unknown:
        raise InvalidRefund("seats", f"not seats of this purchase: {', '.join(unknown)}")
    again = sorted(set(refs) & taken)
    if again:
        raise InvalidRefund("seats", f"refunded already: {', '.join(again)}")
    return [by_ref[ref] for ref in refs]


def refund_open(saga: PurchaseSaga, *, ask: RefundAsk, at: datetime) -> Refund:
    """Open a refund of ``saga`` (locked by the caller) as ``ask`` says."""
    if saga.state != SagaState.CONFIRMED:
        raise NotRefundable(saga.state)
    links = seat_links(saga)
    owed, taken = _earlier(saga)
    named = _named(ask, links, taken=taken) if ask.seats is not None else []
    left = max(saga.amount - owed, 0)
    amount = ask.amount
    if amount is None and ask.seats is not None:
        prices = sum(_seat_price(link, saga, links) for link in named)
        amount = min(prices - prices * ask.fee_percent // 100, left)
    elif amount is None:
        amount = left
    if amount > left or left == 0:
        raise RefundExceedsPaid(left, saga.currency)
    if amount <= 0:
        field = "amount" if ask.amount is not None else "seats"
        raise InvalidRefund(field, "nothing to refund: the amount is 0")
    release = [link for link in (named if ask.seats is not None else links) if not link.released]
    if ask.seats is None and ask.release:
        # Everything left, seats too: those no earlier refund paid for.
        named = [link for link in release if link.ref not in taken]
    released = release if ask.release else []
    refund = _row(saga, ask, amount=amount, seats=named, released=released, at=at)
    refund.save(force_insert=True)
    if released:
        _release(saga.event_id, released, at=at)
    _oblige(refund, at=at)
    return refund


def _row(
    saga: PurchaseSaga,
    ask: RefundAsk,
    *,
    amount: int,
    seats: list[SeatLink],
    released: list[SeatLink],
    at: datetime,
) -> Refund:
    """A new refund row (not saved yet): of ``amount``, paying for ``seats``
    and releasing ``released``."""
    return Refund(
        saga_id=saga.pk,
        event_id=saga.event_id,
        amount=amount,
        currency=saga.currency,
        seats=[link.ref for link in seats],
        released=bool(released),
        released_seats=[link.ref for link in released],
        source=ask.source,
        reason=ask.reason,
        public_reason=ask.public_reason,
        requested_by_id=ask.requested_by_id,
        request_key=ask.request_key,
        request_hash=ask.request_hash,
        created_at=at,
        updated_at=at,
    )


# Every seat link of several purchases of one event, as _LINKS_SQL reads
# one purchase's, with its reservation.
_ALL_LINKS_SQL = """
SELECT rs.reservation_id, rs.id, rs.seat_id, s.ref, rs.released_at IS NOT NULL, rs.price_amount
  FROM {link} rs JOIN {seat} s ON s.id = rs.seat_id AND s.event_id = rs.event_id
 WHERE rs.reservation_id = ANY(%s) AND rs.event_id = %s ORDER BY s.ref
"""


def _links_of(sagas: list[PurchaseSaga]) -> dict[int, list[SeatLink]]:
    """``seat_links`` of each reservation of ``sagas`` (one statement)."""
    sql = _ALL_LINKS_SQL.format(link=ReservationSeat._meta.db_table, seat=Seat._meta.db_table)
    found: dict[int, list[SeatLink]] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, [[saga.reservation_id for saga in sagas], sagas[0].event_id])
        for reservation_id, *link in cursor.fetchall():
            found.setdefault(reservation_id, []).append(SeatLink(*link))
    return found


def _earlier_of(sagas: list[PurchaseSaga]) -> dict:
    """What the refunds (not failed ones) of each of ``sagas`` (one event's)
    give back or still owe, and the seats they name, in one statement: saga
    id -> (amount, refs)."""
    found: dict = {}
    for saga_id, amount, seats in (
        Refund.objects.filter(saga_id__in=[saga.pk for saga in sagas], event_id=sagas[0].event_id)
        .exclude(status=RefundStatus.FAILED)
        .values_list("saga_id", "amount", "seats")
    ):
        owed, taken = found.get(saga_id, (0, set()))
        found[saga_id] = (owed + amount, taken | set(seats))
    return found


def refunds_open_in_full(sagas: list[PurchaseSaga], *, ask: RefundAsk, at: datetime) -> int:
    """:func:`refund_open` of all that is left of each of ``sagas`` (one
    event's, each locked by the caller; ``ask`` names no seats and no
    amount; one with nothing left is passed over), their live seats
    released if it says so: what an event's cancellation opens by the
    hundred, in a few statements for all of them (ten or so each, one purchase
    after the other, set the run's pace: bench figure 15). Returns how many
    were opened."""
    if not sagas:
        return 0
    earlier, links = _earlier_of(sagas), _links_of(sagas)
    refunds: list[Refund] = []
    released: list[SeatLink] = []
    for saga in sagas:
        if saga.state != SagaState.CONFIRMED:
            raise NotRefundable(saga.state)
        owed, taken = earlier.get(saga.pk, (0, set()))
        left = max(saga.amount - owed, 0)
        if left == 0:
            continue
        live = [link for link in links.get(saga.reservation_id, []) if not link.released]
        mine = live if ask.release else []
        released += mine
        paid_for = [link for link in live if link.ref not in taken] if ask.release else []
        refunds.append(_row(saga, ask, amount=left, seats=paid_for, released=mine, at=at))
    Refund.objects.bulk_create(refunds)
    if released:
        _release(sagas[0].event_id, released, at=at)
    for refund in refunds:
        _oblige(refund, at=at)
    return len(refunds)


def _release(event_id: int, links: list[SeatLink], *, at: datetime) -> None:
    """The seats back on sale (at today's price) and their links ended: a
    ticket is valid while its link is live."""
    seat_ids = [link.seat_id for link in links]
    # Lock order: sagas (held by the caller) -> seats.
    lock_objects.seats_for_update(event_id=event_id, seat_ids=seat_ids)
    lock_objects.seats_release_at_current_price(event_id=event_id, seat_ids=seat_ids)
    availability_changed(event_id)
    ReservationSeat.objects.filter(
        event_id=event_id, id__in=[link.id for link in links], released_at__isnull=True
    ).update(released_at=at)
    # The tickets void in this commit, as rows the door's offline list
    # carries (docs/door.md, "Revocations").
    revoke_links([link.id for link in links], RevocationReason.REFUND, at, event_id=event_id)


def _oblige(refund: Refund, *, at: datetime) -> None:
    """Ask the processor now (a message handed over on commit) and chase
    the refund if it is still not settled by its deadline."""
    payload = {"refund_id": str(refund.pk), "event_id": refund.event_id}
    outbox_publish(
        topic=Topic.REFUND_EXECUTE,
        payload={**payload, "lookup": 0},
        key=f"refund-execute:{refund.pk}",
        event_id=refund.event_id,
        saga_id=refund.saga_id,
        now=at,
    )
    timer_schedule(
        key=chase_key(refund),
        topic=Topic.REFUND_CHASE,
        payload=payload,
        due_at=at + timedelta(seconds=settings.REFUND_CHASE_SECONDS),
        event_id=refund.event_id,
        saga_id=refund.saga_id,
        now=at,
    )


def chase_key(refund: Refund) -> str:
    return f"refund-chase:{refund.pk}"
