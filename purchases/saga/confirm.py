"""Confirming a purchase: the one commit that takes the money into the ledger
and sells the seats, whichever step learnt that the charge landed (the charge
answer, a look-up, the hold expiry's refused cancel, an operator)."""

from __future__ import annotations

import functools
import logging
from datetime import datetime
from typing import NamedTuple

from django.contrib.auth import get_user_model
from django.db import connection

from ledger.models import EntryKind, LedgerEntry
from ledger.services import ledger_record, ledger_record_charges
from outbox.services import outbox_publish_many, timer_cancel, timer_cancels
from webhooks.services import WebhookEvent, purchase_data, webhook_publish, webhook_publish_many

from ..availability import availability_changed
from ..errors import IllegalTransition
from ..models import (
    PurchaseSaga,
    Reservation,
    ReservationSeat,
    ReservationStatus,
    Seat,
    SeatStatus,
)
from .states import SagaState
from .topics import Topic
from .transition import SYSTEM, By, log_extra, move, move_many

logger = logging.getLogger(__name__)

S = SagaState


def confirm(
    saga: PurchaseSaga,
    *,
    charge_id: str,
    reason: str,
    at: datetime,
    by: By = SYSTEM,
    note: str = "",
    override: bool = False,
) -> None:
    """CONFIRMED in one commit (the caller's): ledger, seats sold,
    reservation, hold timer cancelled, ``purchase.confirmed``."""
    if saga.state == S.PENDING:
        # The gateway says charged while we had not yet recorded the attempt
        # (a crash between the two commits): record the attempt first.
        move(
            saga, S.CHARGING, reason="charge found at the gateway", at=at, by=by, count_attempt=True
        )
    move(saga, S.CONFIRMED, reason=reason, at=at, by=by)
    ledger_record(
        intent_id=saga.intent_id,
        kind=EntryKind.CHARGE,
        amount=saga.amount,
        currency=saga.currency,
        saga_id=saga.pk,
        event_id=saga.event_id,
        now=at,
        gateway_reference=charge_id,
        note=note,
        override=override,
    )
    links = reservation_links(saga)
    seat_ids = [link.seat_id for link in links if not link.released]
    if _sell(saga.event_id, seat_ids) != len(seat_ids):
        # The seats were released under us: an invariant is broken. Refuse the
        # whole commit; the charge stays recorded at the gateway and the
        # reconcile/operator path settles it.
        raise IllegalTransition(saga.state, "CONFIRMED with seats not held")
    availability_changed(saga.event_id)
    _execute(
        _reservation_sql(), [ReservationStatus.CONFIRMED.value, saga.reservation_id, saga.event_id]
    )
    cancel = timer_cancel(key=saga.hold_timer_key, now=at)
    logger.info("hold timer %s", cancel.status, **log_extra(saga))
    _announce_confirmed([(saga, purchase_facts(saga, links=links))], at=at)


def _announce_confirmed(confirmed: list[tuple[PurchaseSaga, dict]], *, at: datetime) -> None:
    """Confirmations' ``purchase.confirmed`` rows and webhooks (each saga of
    one event with its facts), in their commit: one statement for the rows
    and one for the webhooks, however many."""
    outbox_publish_many(
        topic=Topic.CONFIRMED,
        messages=[
            {
                "payload": facts,
                "key": f"confirmed:{saga.pk}",
                "event_id": saga.event_id,
                "saga_id": saga.pk,
            }
            for saga, facts in confirmed
        ],
        now=at,
    )
    webhook_publish_many(
        event_type=WebhookEvent.CONFIRMED,
        event_id=confirmed[0][0].event_id,
        data={
            saga.pk: purchase_data(facts, status=saga.state, version=saga.version)
            for saga, facts in confirmed
        },
        now=at,
    )


def confirm_many(
    confirmed: list[tuple[PurchaseSaga, str]], *, reason: str, at: datetime, by: By = SYSTEM
) -> None:
    """:func:`confirm` of several CHARGING sagas of one event, each with its
    charge's id, in the caller's commit: what :func:`confirm` writes for
    each, in one statement per table for them all (the moves and their
    history, the ledger's charges, the seats sold, the reservations, the
    hold timers cancelled, the buyers read); each saga's
    ``purchase.confirmed`` and webhooks as :func:`confirm` writes them (one
    statement each for them all). A
    seat not held any more refuses the whole commit, as it refuses one
    saga's."""
    if not confirmed:
        return
    sagas = [saga for saga, _ in confirmed]
    (event_id,) = {saga.event_id for saga in sagas}
    move_many(sagas, S.CONFIRMED, reason=reason, at=at, by=by)
    ledger_record_charges([_charge_entry(saga, charge_id, at) for saga, charge_id in confirmed])
    links = _links_of(event_id, [saga.reservation_id for saga in sagas])
    seat_ids = [
        link.seat_id
        for saga in sagas
        for link in links.get(saga.reservation_id, [])
        if not link.released
    ]
    if _sell_many(event_id, seat_ids) != len(seat_ids):
        raise IllegalTransition(S.CONFIRMED, "CONFIRMED with seats not held")
    availability_changed(event_id)
    _execute(
        _reservations_sql(),
        [ReservationStatus.CONFIRMED.value, [saga.reservation_id for saga in sagas], event_id],
    )
    cancels = timer_cancels(keys=[saga.hold_timer_key for saga in sagas], now=at)
    buyers = _buyers([saga.buyer_id for saga in sagas])
    for saga in sagas:
        logger.info("hold timer %s", cancels[saga.hold_timer_key].status, **log_extra(saga))
    _announce_confirmed(
        [
            (saga, _facts(saga, links.get(saga.reservation_id, []), buyers[saga.buyer_id]))
            for saga in sagas
        ],
        at=at,
    )


def _charge_entry(saga: PurchaseSaga, charge_id: str, at: datetime) -> LedgerEntry:
    """The ledger's charge entry :func:`confirm` records for the saga."""
    return LedgerEntry(
        intent_id=saga.intent_id,
        kind=EntryKind.CHARGE,
        amount=saga.amount,
        currency=saga.currency,
        saga_id=saga.pk,
        event_id=saga.event_id,
        gateway_reference=charge_id,
        note="",
        override=False,
        created_at=at,
        refund_id=None,
    )


def announce(
    saga: PurchaseSaga, event_type: WebhookEvent, *, at: datetime, facts: dict | None = None
) -> None:
    """The move's webhooks, in its commit (docs/design.md, "The edges"): the
    purchase after the move, from ``facts`` when the caller has read them
    already (read only if an endpoint listens, otherwise)."""
    webhook_publish(
        event_type=event_type,
        saga_id=saga.pk,
        event_id=saga.event_id,
        now=at,
        data=(
            purchase_data(facts, status=saga.state, version=saga.version)
            if facts is not None
            else lambda: purchase_data(
                purchase_facts(saga), status=saga.state, version=saga.version
            )
        ),
    )


class Link(NamedTuple):
    id: int
    seat_id: int
    released: bool
    seat_ref: str


# Every seat link of the reservation, released or not, with its seat's
# reference, each table by its whole key: the links by the reservation and
# its event (one index: a condition on ``released_at`` beside them let a
# planner without statistics AND in the index of every live link of every
# event), the seat by its id and event (joined on the id alone, a planner
# without statistics made it a hash join over every seat of every event).
# docs/performance.md, "Plans that do not depend on statistics".
_LINKS_SQL = """
SELECT rs.id, rs.seat_id, rs.released_at IS NOT NULL, s.ref
  FROM {link} rs JOIN {seat} s ON s.id = rs.seat_id AND s.event_id = rs.event_id
 WHERE rs.reservation_id = %s AND rs.event_id = %s
"""


def reservation_links(saga: PurchaseSaga) -> list[Link]:
    """Every seat link of the saga's reservation, released or not, with the
    seat's reference, in one statement."""
    sql = _LINKS_SQL.format(link=ReservationSeat._meta.db_table, seat=Seat._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(sql, [saga.reservation_id, saga.event_id])
        return [
            Link(id=i, seat_id=seat_id, released=bool(released), seat_ref=ref)
            for i, seat_id, released, ref in cursor.fetchall()
        ]


def purchase_facts(saga: PurchaseSaga, *, links: list[Link] | None = None) -> dict:
    """What ``purchase.confirmed`` / ``purchase.cancelled`` carry: the facts
    a consumer needs (the emails need no read of their own). ``links``:
    :func:`reservation_links`, when the caller has read them already (the
    seats' references come with them)."""
    if links is None:
        links = reservation_links(saga)
    return _facts(saga, links, _buyer(saga.buyer_id))


def _facts(saga: PurchaseSaga, links: list[Link], buyer: dict) -> dict:
    return {
        "saga_id": str(saga.pk),
        "reservation": saga.reservation.ref,
        "event_id": saga.event_id,
        "buyer_id": saga.buyer_id,
        "buyer": buyer,
        "seats": sorted(link.seat_ref for link in links),
        "amount": saga.amount,
        "currency": saga.currency,
        "intent_id": saga.intent_id,
    }


# reservation_links for several reservations of one event, in one statement.
_LINKS_MANY_SQL = """
SELECT rs.reservation_id, rs.id, rs.seat_id, rs.released_at IS NOT NULL, s.ref
  FROM {link} rs JOIN {seat} s ON s.id = rs.seat_id AND s.event_id = rs.event_id
 WHERE rs.reservation_id = ANY(%s) AND rs.event_id = %s
"""


def _links_of(event_id: int, reservation_ids: list[int]) -> dict[int, list[Link]]:
    sql = _LINKS_MANY_SQL.format(link=ReservationSeat._meta.db_table, seat=Seat._meta.db_table)
    found: dict[int, list[Link]] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, [reservation_ids, event_id])
        for reservation_id, i, seat_id, released, ref in cursor.fetchall():
            found.setdefault(reservation_id, []).append(
                Link(id=i, seat_id=seat_id, released=bool(released), seat_ref=ref)
            )
    return found


# Written once (docs/performance.md, "Statements written once"): built by the
# ORM, selling the seats, confirming the reservation, reading the buyer (and
# cancelling the hold timer: outbox.services) were half of the confirmation's
# CPU in the saga worker (a GIL-only profile of make bench's figure 9).
# Plain SQL.
_SELL_SQL = "UPDATE {seat} SET status = %s WHERE event_id = %s AND status = %s AND id IN ({ids})"
_RESERVATION_SQL = "UPDATE {reservation} SET status = %s WHERE id = %s AND event_id = %s"
_BUYER_SQL = "SELECT {username}, {email} FROM {user} WHERE {pk} = %s"


def _execute(sql: str, params: list) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


@functools.lru_cache(maxsize=64)  # by the number of seats
def _sell_sql(seats: int) -> str:
    return _SELL_SQL.format(seat=Seat._meta.db_table, ids=", ".join(["%s"] * seats))


@functools.cache
def _reservation_sql() -> str:
    return _RESERVATION_SQL.format(reservation=Reservation._meta.db_table)


@functools.cache
def _buyer_sql() -> str:
    user = get_user_model()
    return _BUYER_SQL.format(
        user=user._meta.db_table,
        pk=user._meta.pk.column,
        username=user._meta.get_field("username").column,
        email=user._meta.get_field("email").column,
    )


def _sell(event_id: int, seat_ids: list[int]) -> int:
    """The seats still held among ``seat_ids`` sold; how many."""
    if not seat_ids:
        return 0
    return _execute(
        _sell_sql(len(seat_ids)),
        [SeatStatus.SOLD.value, event_id, SeatStatus.HELD.value, *seat_ids],
    )


_SELL_MANY_SQL = (
    "UPDATE {seat} SET status = %s WHERE event_id = %s AND status = %s AND id = ANY(%s)"
)
_RESERVATIONS_SQL = "UPDATE {reservation} SET status = %s WHERE id = ANY(%s) AND event_id = %s"
_BUYERS_SQL = "SELECT {pk}, {username}, {email} FROM {user} WHERE {pk} = ANY(%s)"


def _sell_many(event_id: int, seat_ids: list[int]) -> int:
    """:func:`_sell` for any number of seats, in one statement."""
    if not seat_ids:
        return 0
    sql = _SELL_MANY_SQL.format(seat=Seat._meta.db_table)
    return _execute(sql, [SeatStatus.SOLD.value, event_id, SeatStatus.HELD.value, seat_ids])


@functools.cache
def _reservations_sql() -> str:
    return _RESERVATIONS_SQL.format(reservation=Reservation._meta.db_table)


def _buyers(buyer_ids: list[int]) -> dict[int, dict]:
    """:func:`_buyer` of several buyers, in one statement; by id."""
    user = get_user_model()
    sql = _BUYERS_SQL.format(
        user=user._meta.db_table,
        pk=user._meta.pk.column,
        username=user._meta.get_field("username").column,
        email=user._meta.get_field("email").column,
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [sorted(set(buyer_ids))])
        found = {pk: {"username": name, "email": email} for pk, name, email in cursor.fetchall()}
    missing = set(buyer_ids) - found.keys()
    if missing:
        raise user.DoesNotExist(f"no user {sorted(missing)[0]}")
    return found


def _buyer(buyer_id: int) -> dict:
    """The buyer's username and e-mail address, as the e-mails need them."""
    with connection.cursor() as cursor:
        cursor.execute(_buyer_sql(), [buyer_id])
        row = cursor.fetchone()
    if row is None:
        raise get_user_model().DoesNotExist(f"no user {buyer_id}")
    return {"username": row[0], "email": row[1]}
