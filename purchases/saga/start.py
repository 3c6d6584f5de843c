"""Start: one transaction under the request (docs/design.md, "The saga").

The idempotency record, the seats locked (by pk) and held, the reservation,
the saga PENDING with its intent id, the history row and the hold-expiry
timer commit together; the charge is enqueued on commit. A taken seat rolls
back everything. The same key and body replay the first answer; the same
key with another body is refused.

The seats are named (``seat_refs``) or chosen here (``quantity``: best
available, N seats next to each other in one row, of one price category when
``category`` is given, docs/design.md, "Start"). After the start, a saga is
the same whichever way its seats were chosen.

The seller's rules are checked in the same transaction (docs/api.md, "The
seller's rules"): the event's status and sales window, read with the seats
(no lock); its limit of seats per buyer, counted under a lock that every
purchase of the buyer for the event shares (``lock_objects.buyer_event_lock``);
its hold duration. A seat's price is the one it is held at: the hold returns
it, and a price changed since the unlocked read re-prices the purchase.

The statements are few on purpose: this is the request path
(docs/performance.md).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
import secrets
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import connection, transaction

from common import rows as rows_sql
from common.time import iso_z
from config import tracing
from outbox.services import timer_schedule

from .. import admission, breaker, lock_objects
from ..availability import availability_changed
from ..errors import (
    BuyerLimitReached,
    DomainError,
    IdempotencyKeyReused,
    InWaitingRoom,
    NotEnoughSeats,
    PaymentsPaused,
    SalesClosed,
    SalesNotOpen,
    SeatUnavailable,
    UnknownCategory,
    UnknownEvent,
    UnknownSeats,
)
from ..models import (
    Actor,
    Event,
    EventStatus,
    IdempotencyRecord,
    PriceCategory,
    PurchaseSaga,
    Reservation,
    ReservationSeat,
    ReservationStatus,
    SagaHistory,
    Seat,
    SeatStatus,
    WaitingRoom,
)
from .burst import charge_wake, publish_charge, unwake
from .states import SagaState
from .topics import Topic
from .transition import clock, log_extra

logger = logging.getLogger(__name__)

S = SagaState


@dataclass(frozen=True)
class PurchaseStarted:
    saga_id: str
    # The purchase as first answered: id, status, event, seats, total,
    # hold_expires_at (the API shapes the HTTP answer around it).
    purchase: dict
    created: bool  # False when this is a replay of the first answer


def request_fingerprint(
    *,
    event_id: int,
    seat_refs: list[str] | None = None,
    quantity: int | None = None,
    category: str | None = None,
    payment_method: str,
) -> str:
    # A body names its seats or asks for a quantity (of a category, or of
    # any); the canonical form of a body with seats, or with a quantity and
    # no category, is unchanged, so the records stored before best available
    # and categories existed still replay.
    chosen: dict[str, object]
    if quantity is not None:
        chosen = {"quantity": quantity}
        if category is not None:
            chosen["category"] = category
    elif seat_refs is not None:
        chosen = {"seats": list(seat_refs)}
    else:
        raise ValueError("give seat_refs or quantity")
    canonical = json.dumps(
        {"event": event_id, **chosen, "payment_method": payment_method},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def intent_id_for(reservation_ref: str) -> str:
    return f"pi_{reservation_ref}"


def reservation_ref(event_id: int) -> str:
    """A new reservation's ref: 12 random hex digits, then the event's id in
    hex. The database holds a ref (and the intent id made of it) unique per
    event only, the most it can under Citus (config/distribution.py); the
    gateway needs the intent id unique everywhere, and the fixed-length random
    part before the event makes it so. An event id past 16**7 would not fit
    the 20 characters: its insert would fail, loudly."""
    return f"R{secrets.token_hex(6).upper()}{event_id:X}"


def purchase_start(
    *,
    user,
    idempotency_key: str,
    event_id: int,
    seat_refs: list[str] | None = None,
    quantity: int | None = None,
    category: str | None = None,
    payment_method: str,
    admission_pass: str | None = None,
    now: datetime | None = None,
) -> PurchaseStarted:
    """Hold the seats and start the saga, or replay the first answer for the key.

    Exactly one of ``seat_refs`` (the seats named) and ``quantity`` (best
    available: 1 to ``MAX_SEATS_PER_PURCHASE`` seats next to each other in
    one row, chosen here, among the seats of price category ``category``
    when it is given) is given; anything else, or a category with seats
    named, is a caller's mistake (``ValueError``). Refusals:
    ``UnknownEvent`` (also a draft), ``SalesClosed``, ``SalesNotOpen``,
    ``UnknownSeats``, ``UnknownCategory``, ``BuyerLimitReached``,
    ``SeatUnavailable`` (named seats), ``NotEnoughSeats`` (a quantity),
    ``IdempotencyKeyReused``; ``PaymentsPaused`` (the breaker) and
    ``InWaitingRoom`` (the event's waiting room does not let the buyer in
    yet, with or without ``admission_pass``: purchases/admission.py), both
    before any seat is held.
    """
    # The purchase's trace: the saga and its rows store this span's context
    # (a shared no-op with tracing off).
    with tracing.span("saga.start"):
        return _purchase_start(
            user=user,
            idempotency_key=idempotency_key,
            event_id=event_id,
            choice=_Choice(seat_refs=seat_refs, quantity=quantity, category=category),
            payment_method=payment_method,
            admission_pass=admission_pass,
            now=now,
        )


def purchase_replay(
    *,
    user,
    idempotency_key: str,
    event_id: int,
    seat_refs: list[str] | None = None,
    quantity: int | None = None,
    category: str | None = None,
    payment_method: str,
    admission_pass: str | None = None,
) -> PurchaseStarted | None:
    """The first answer of the user's key for this body, starting nothing:
    None when the key has none, ``IdempotencyKeyReused`` when it answered
    another body. One indexed read, for a start that may not run (the
    throttle's: purchases/throttling.py). A waiting room's pass is not part
    of the body: a replay answers whatever it says."""
    del admission_pass
    fingerprint = request_fingerprint(
        event_id=event_id,
        seat_refs=seat_refs,
        quantity=quantity,
        category=category,
        payment_method=payment_method,
    )
    return _replay(user=user, idempotency_key=idempotency_key, fingerprint=fingerprint)


@dataclass(frozen=True)
class _Choice:
    """How the body chooses its seats: named, or a quantity (of a category)."""

    seat_refs: list[str] | None
    quantity: int | None
    category: str | None

    @property
    def asked(self) -> int:
        """How many seats the body asks for."""
        return self.quantity if self.quantity is not None else len(self.seat_refs or ())


def _purchase_start(
    *,
    user,
    idempotency_key: str,
    event_id: int,
    choice: _Choice,
    payment_method: str,
    admission_pass: str | None,
    now: datetime | None,
) -> PurchaseStarted:
    _check_choice(choice)
    now = clock(now)
    fingerprint = request_fingerprint(
        event_id=event_id,
        seat_refs=choice.seat_refs,
        quantity=choice.quantity,
        category=choice.category,
        payment_method=payment_method,
    )
    paused = breaker.payments_paused(now=now)
    if paused is not None:
        # Before any seat is held; a replay of the key still answers.
        replay = _replay(user=user, idempotency_key=idempotency_key, fingerprint=fingerprint)
        if replay is not None:
            return replay
        raise PaymentsPaused(paused)
    saga = _new_saga(event_id=event_id, user=user, payment_method=payment_method, now=now)
    turn = _Turn(admission_pass)
    try:
        purchase = _start_in_one_transaction(
            saga,
            user=user,
            idempotency_key=idempotency_key,
            fingerprint=fingerprint,
            choice=choice,
            turn=turn,
            now=now,
        )
    except (_KeyTaken, _Refused) as exc:
        # The key's first answer wins over any refusal of this body: the same
        # body replays it, another body is refused as a reused key (422).
        replay = _replay(user=user, idempotency_key=idempotency_key, fingerprint=fingerprint)
        if replay is not None:
            return replay
        if isinstance(exc, _Refused):
            raise _refusal(saga, exc.error, turn=turn, now=now) from None
        raise  # pragma: no cover - the unique index said the key exists
    except DomainError as exc:
        # A seat taken under the lock, or no block left (the hold's own
        # refusals): as the pick's.
        raise _refusal(saga, exc, turn=turn, now=now) from None

    _announce_started(saga, purchase=purchase, choice=choice)
    return PurchaseStarted(saga_id=str(saga.id), purchase=purchase, created=True)


def _refusal(saga: PurchaseSaga, error: DomainError, *, turn: _Turn, now: datetime) -> DomainError:
    """What a refused start raises: the buyer put in the event's waiting room
    when it did not let them in; else the refusal, the turn spent first if
    the room let them in (sold out, a seat taken: it holds no place in the
    room's count any more)."""
    if isinstance(error, _MustWait):
        return _waiting(saga, now=now)
    if turn.admitted:
        admission.turn_spent(event_id=saga.event_id, user_id=saga.buyer_id, now=now)
    return error


def _waiting(saga: PurchaseSaga, *, now: datetime) -> DomainError:
    """The buyer in the event's waiting room (joined now, or again if their
    admission lapsed): where they stand. The room's tick may have let them
    in meanwhile, or closed: then they ask again at once."""
    place = admission.join(event_id=saga.event_id, user_id=saga.buyer_id, now=now)
    if place.status != "waiting":
        return InWaitingRoom(position=0, retry_after=1)
    return InWaitingRoom(
        position=place.position, retry_after=place.retry_after, sales_start=place.sales_start
    )


def _check_choice(choice: _Choice) -> None:
    """Exactly one of the seats named and a quantity; a quantity 1 to
    ``MAX_SEATS_PER_PURCHASE``; a category only with a quantity. Anything
    else is a caller's mistake."""
    seat_refs, quantity = choice.seat_refs, choice.quantity
    if (seat_refs is None) == (quantity is None):
        raise ValueError("give exactly one of seat_refs and quantity")
    if quantity is not None and (
        isinstance(quantity, bool)
        or not isinstance(quantity, int)
        or not 1 <= quantity <= settings.MAX_SEATS_PER_PURCHASE
    ):
        raise ValueError(f"quantity must be 1 to {settings.MAX_SEATS_PER_PURCHASE}")
    if choice.category is not None and quantity is None:
        raise ValueError("a category chooses seats for a quantity, not with seats named")


def _new_saga(*, event_id: int, user, payment_method: str, now: datetime) -> PurchaseSaga:
    """The saga PENDING, not saved yet (``_record`` inserts it)."""
    return PurchaseSaga(
        event_id=event_id,
        buyer=user,
        payment_method=payment_method,
        state=S.PENDING,
        version=1,
        created_at=now,
        updated_at=now,
        trace_context=tracing.traceparent(),
        processor=settings.PAYMENT_GATEWAY,
    )


def _start_in_one_transaction(
    saga: PurchaseSaga,
    *,
    user,
    idempotency_key: str,
    fingerprint: str,
    choice: _Choice,
    turn: _Turn,
    now: datetime,
) -> dict:
    """Check the event's rules, pick, claim the key, hold and record; returns
    the purchase answered. ``_KeyTaken`` when the key has an answer,
    ``_Refused`` for a refusal the key's answer may override; either rolls
    everything back."""
    # One transaction and one commit; a replay (the key is taken) and every
    # refusal roll it back.
    with transaction.atomic(durable=True):
        rules, seats = _pick_seats(saga, choice=choice, turn=turn, now=now)
        hold_expires_at = now + timedelta(seconds=rules.hold_seconds_or_default)
        purchase = _purchase(saga, seats=seats, hold_expires_at=hold_expires_at)
        # First write: a concurrent duplicate waits here on the unique
        # index until we commit or roll back, then replays our answer.
        # Before any seat is locked: a transaction waiting here holds no
        # seat, so it is in no cycle of waits with a seat's holder.
        if not _claim_key(
            user=user,
            key=idempotency_key,
            fingerprint=fingerprint,
            purchase=purchase,
            saga_id=saga.id,
            now=now,
        ):
            raise _KeyTaken
        picked = [(s.id, s.price_amount) for s in seats]
        if choice.seat_refs is not None:
            seats = _hold_named(saga, seats=seats)
        else:
            seats = _hold_best_available(event_id=saga.event_id, choice=choice, first=seats)
        if [(s.id, s.price_amount) for s in seats] != picked:
            # Another buyer took (or is taking) a seat of the first pick, or
            # the seller changed a price since the seats were read: the
            # answer stored with the key is the one for the seats as held.
            purchase = _answer_again(
                saga, seats=seats, hold_expires_at=hold_expires_at, user=user, key=idempotency_key
            )
        _record(saga, seats=seats, hold_expires_at=hold_expires_at, now=now)
        saga_id, event_id = str(saga.id), saga.event_id
        transaction.on_commit(lambda: _enqueue_charge(saga_id, event_id), robust=True)
    return purchase


def _pick_seats(
    saga: PurchaseSaga, *, choice: _Choice, turn: _Turn, now: datetime
) -> tuple[_Rules, list[Seat]]:
    """The event's rules, checked; the seats named, or the best block of the
    quantity asked, priced on the saga, without a lock. ``_Refused`` for a
    refusal (the event's rules, the seats, the buyer's limit)."""
    if choice.seat_refs is not None:
        rules, seats = _event_and_seats_by_ref(saga.event_id, choice.seat_refs)
        rules = _check_sales(rules, saga=saga, turn=turn, now=now)
        _check_named(seats, seat_refs=choice.seat_refs)
        _check_buyer_limit(saga, rules=rules, asked=choice.asked)
        _price(saga, seats)
        return rules, seats
    assert choice.quantity is not None  # exactly one of the two: checked above
    rules = _check_sales(
        _event_rules(saga.event_id, category=choice.category),
        saga=saga,
        turn=turn,
        now=now,
    )
    if choice.category is not None and not rules.category_known:
        raise _Refused(UnknownCategory(choice.category))
    _check_buyer_limit(saga, rules=rules, asked=choice.asked)
    block = _find_best_block(
        event_id=saga.event_id, category=choice.category, quantity=choice.quantity
    )
    if block is None:
        raise _Refused(NotEnoughSeats(_available_count(saga.event_id, choice.category)))
    _price(saga, block)
    return rules, block


def _answer_again(
    saga: PurchaseSaga, *, seats: list[Seat], hold_expires_at: datetime, user, key: str
) -> dict:
    """Re-price the saga for the seats as held, and store the answer for
    them with the key (claimed by this transaction); returns the answer."""
    _price(saga, seats)
    purchase = _purchase(saga, seats=seats, hold_expires_at=hold_expires_at)
    IdempotencyRecord.objects.filter(user=user, key=key).update(response_body=purchase)
    return purchase


def _announce_started(saga: PurchaseSaga, *, purchase: dict, choice: _Choice) -> None:
    """The start's span attributes and log line, after the commit."""
    if tracing.enabled():
        tracing.set_attributes(
            {"saga.id": saga.id, "intent.id": saga.intent_id, "saga.state.to": S.PENDING.value}
        )
    chosen: dict[str, object] = {}
    if choice.quantity is not None:
        chosen["quantity"] = choice.quantity
    if choice.category is not None:
        chosen["category"] = choice.category
    logger.info("purchase started", **log_extra(saga, seats=",".join(purchase["seats"]), **chosen))


class _KeyTaken(Exception):
    """Another request with the same key committed first (or is committing)."""


@dataclass
class _Turn:
    """The buyer's turn in the event's waiting room, for one start: the pass
    they sent, and whether the room let them in (the start's check sets it)."""

    pass_token: str | None
    admitted: bool = False


class _MustWait(DomainError):
    """The waiting room does not let this buyer in now (``_purchase_start``
    puts them in it)."""


class _Refused(Exception):
    """This body is refused, unless its key already has an answer."""

    def __init__(self, error: DomainError):
        super().__init__(str(error))
        self.error = error


# --- the seller's rules (docs/api.md, "The seller's rules") ----------------------------


@dataclass(frozen=True)
class _Rules:
    """The event's rules for a purchase, as the start read them (no lock: a
    rule changed meanwhile applies from the next purchase on)."""

    status: str
    sales_start: datetime | None
    sales_end: datetime | None
    hold_seconds: int | None
    max_seats_per_buyer: int | None
    # The event's waiting room (purchases/admission.py): on, and letting
    # buyers in in turn now.
    room: bool
    room_active: bool
    # Best available by category: whether the event has that category
    # (True when none was asked for).
    category_known: bool = True

    @property
    def hold_seconds_or_default(self) -> int:
        # Null (or a nonsensical 0): the platform's hold.
        return self.hold_seconds or settings.PURCHASE_HOLD_SECONDS


_RULE_COLUMNS = (
    "e.status, e.sales_start, e.sales_end, e.hold_seconds, e.max_seats_per_buyer,"
    " w.event_id IS NOT NULL, w.active IS TRUE"
)
# The room of an event whose room is on (a room switched off is not read).
_ROOM_JOIN = " LEFT JOIN {room} w ON w.event_id = e.id AND e.waiting_room"

# Best available: the rules by the event's key, and whether the category
# asked for is the event's (a NULL category: none asked for; one row at
# most joined, the code being unique per event).
_EVENT_RULES_SQL = (
    f"SELECT {_RULE_COLUMNS}, %s::text IS NULL OR c.id IS NOT NULL FROM {{event}} e"
    " LEFT JOIN {category} c ON c.event_id = e.id AND c.code = %s"
    f"{_ROOM_JOIN} WHERE e.id = %s"
)


def _event_rules(event_id: int, *, category: str | None) -> _Rules | None:
    """The event's rules (None: no such event), for best available."""
    sql = _EVENT_RULES_SQL.format(
        category=PriceCategory._meta.db_table,
        event=Event._meta.db_table,
        room=WaitingRoom._meta.db_table,
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [category, category, event_id])
        row = cursor.fetchone()
    return None if row is None else _Rules(*row)


def _check_sales(rules: _Rules | None, *, saga: PurchaseSaga, turn: _Turn, now: datetime) -> _Rules:
    """The rules of an event on sale now, and the buyer let in by its waiting
    room if it is letting buyers in in turn (or has not opened yet);
    ``_Refused`` otherwise. A draft is the seller's alone: refused exactly as
    an event that does not exist."""
    if rules is None or rules.status == EventStatus.DRAFT:
        raise _Refused(UnknownEvent(saga.event_id))
    if rules.status == EventStatus.CANCELLED or (
        rules.sales_end is not None and now >= rules.sales_end
    ):
        raise _Refused(SalesClosed())
    not_open = rules.sales_start is not None and now < rules.sales_start
    if rules.room and (rules.room_active or not_open):
        turn.admitted = not not_open and admission.admission_use(
            event_id=saga.event_id, user_id=saga.buyer_id, token=turn.pass_token, now=now
        )
        if not turn.admitted:
            raise _Refused(_MustWait())
    if not_open:
        assert rules.sales_start is not None  # not_open says so
        raise _Refused(SalesNotOpen(rules.sales_start))
    return rules


# The buyer's seats for the event: live links of reservations held or
# confirmed, found through the reservations' (event, buyer) index and the
# links' (reservation, event) index.
_BUYER_SEATS_SQL = """
SELECT count(*) FROM {link} l
  JOIN {reservation} r ON r.id = l.reservation_id AND r.event_id = l.event_id
 WHERE r.event_id = %s AND r.buyer_id = %s AND r.status = ANY(%s)
   AND l.event_id = %s AND l.released_at IS NULL
"""


def _check_buyer_limit(saga: PurchaseSaga, *, rules: _Rules, asked: int) -> None:
    """Refuse (``BuyerLimitReached``) seats past the event's limit per buyer,
    counting every purchase of the buyer held or confirmed, also those
    committed while this one waited for the buyer's lock. Nothing at all
    for an event without a limit."""
    limit = rules.max_seats_per_buyer
    if limit is None:
        return
    # First lock of the transaction (lock_objects.py, the lock order); the
    # count below is the next statement, so its snapshot (READ COMMITTED: one
    # per statement) sees every purchase of this buyer committed before.
    lock_objects.buyer_event_lock(event_id=saga.event_id, buyer_id=saga.buyer_id)
    sql = _BUYER_SEATS_SQL.format(
        link=ReservationSeat._meta.db_table, reservation=Reservation._meta.db_table
    )
    live = [ReservationStatus.HELD, ReservationStatus.CONFIRMED]
    with connection.cursor() as cursor:
        cursor.execute(sql, [saga.event_id, saga.buyer_id, live, saga.event_id])
        (held_or_bought,) = cursor.fetchone()
    if held_or_bought + asked > limit:
        raise _Refused(BuyerLimitReached(limit=limit, held_or_bought=held_or_bought))


# --- seats named ----------------------------------------------------------------------

# Written once (docs/performance.md, "Statements written once"): built by
# the ORM, the seats' read was 12 % of the web's samples in a reserve. The
# event's rules come with them, in the same statement (the reserve's round
# trips: bench/reserve.sql): one row per seat found, or one row with no seat
# when none is; no row, no event.
_EVENT_AND_SEATS_BY_REF_SQL = (
    f"SELECT {_RULE_COLUMNS}, s.id, s.ref, s.price_amount, s.currency FROM {{event}} e"
    " LEFT JOIN {seat} s ON s.event_id = e.id AND s.ref = ANY(%s)"
    f"{_ROOM_JOIN} WHERE e.id = %s ORDER BY s.id"
)
_SEAT_FIELDS = ["id", "ref", "price_amount", "currency"]
_RULES_WIDTH = len(_RULE_COLUMNS.split(","))


def _event_and_seats_by_ref(
    event_id: int, seat_refs: list[str]
) -> tuple[_Rules | None, list[Seat]]:
    """The event's rules (None: no such event) and its seats named in
    ``seat_refs`` (id, ref, price, currency; the rest deferred), in id order.

    Refs and currencies of a seat never change once on sale, and a price
    read here is only what the purchase expects: availability and the price
    held at are decided under the lock (``_hold_named``).
    """
    sql = _EVENT_AND_SEATS_BY_REF_SQL.format(
        event=Event._meta.db_table, seat=Seat._meta.db_table, room=WaitingRoom._meta.db_table
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [seat_refs, event_id])
        rows = cursor.fetchall()
    if not rows:
        return None, []
    rules = _Rules(*rows[0][:_RULES_WIDTH])
    seats = [
        Seat.from_db(connection.alias, _SEAT_FIELDS, row[_RULES_WIDTH:])
        for row in rows
        if row[_RULES_WIDTH] is not None
    ]
    return rules, seats


def _check_named(seats: list[Seat], *, seat_refs: list[str]) -> None:
    missing = sorted(set(seat_refs) - {s.ref for s in seats})
    if missing:
        raise _Refused(UnknownSeats(missing))
    if len({s.currency for s in seats}) != 1:
        raise _Refused(UnknownSeats(sorted(seat_refs)))  # one purchase, one currency


def _price(saga: PurchaseSaga, seats: list[Seat]) -> None:
    saga.currency = seats[0].currency
    saga.amount = sum(s.price_amount for s in seats)


def _hold_named(saga: PurchaseSaga, *, seats: list[Seat]) -> list[Seat]:
    """Hold the seats named, never waiting for a lock; returns them, each at
    the price it is held at. A seat held, sold, blocked by the seller, or
    locked by another buyer's start right now: ``SeatUnavailable``, naming
    it (the buyer chooses again at once instead of queueing)."""
    held = lock_objects.seats_hold_skip_locked(
        event_id=saga.event_id, seat_ids=[s.id for s in seats]
    )
    if len(held) != len(seats):
        raise SeatUnavailable(sorted(s.ref for s in seats if s.id not in held))
    return _at_prices(seats, held)


def _at_prices(seats: list[Seat], prices: dict[int, int]) -> list[Seat]:
    """``seats``, each priced as in ``prices`` (by id): the price it was held at."""
    for seat in seats:
        seat.price_amount = prices[seat.id]
    return seats


# --- best available (docs/design.md, "Start") -------------------------------------------

# A chunk of the event's available seats (of one category, when one is asked
# for), in row order: sections, then rows, each by
# code point (COLLATE "C": "A" < "AA" < "B"), then numbers; from the row
# ``after`` on (inclusive), at most ``limit`` of them; each with the first and
# last number of its row (of every seat of the row, whatever its status or
# category: the row's middle does not move as it sells). The chunk is read
# along the partial index of available seats (seat_available_in_row_order),
# the rows' ends along seat_in_row_order: a hall whose front rows are sold
# costs nothing for them, and the read does not grow with the event.
_CANDIDATES_SQL = """
WITH chunk AS MATERIALIZED (
  SELECT id, ref, section, "row", number, price_amount, currency FROM {seat}
   WHERE event_id = %(event)s AND (status COLLATE "C") = '{available}' {after} {category}
   ORDER BY section COLLATE "C", "row" COLLATE "C", number
   LIMIT %(limit)s),
ends AS MATERIALIZED (
  SELECT r.section, r."row", e.row_first, e.row_last
    FROM (SELECT DISTINCT section, "row" FROM chunk) AS r
   CROSS JOIN LATERAL (
         SELECT MIN(s.number) AS row_first, MAX(s.number) AS row_last FROM {seat} s
          WHERE s.event_id = %(event)s AND s.section = r.section AND s."row" = r."row") AS e)
SELECT c.id, c.ref, c.section, c."row", c.number, c.price_amount, c.currency,
       ends.row_first, ends.row_last
  FROM chunk c JOIN ends ON ends.section = c.section AND ends."row" = c."row"
 ORDER BY c.section COLLATE "C", c."row" COLLATE "C", c.number
"""
# The statement's variable parts. The status is a literal, not a parameter,
# compared as the partial index's predicate says (COLLATE "C"): a partial
# index serves a statement whose condition implies its predicate, which a
# parameter (a prepared statement's generic plan) does not, and which no
# other statement's status = 'available' does. The CTEs are
# MATERIALIZED so that each row's ends are read once, not once per seat.
_AFTER = (
    'AND (section COLLATE "C", "row" COLLATE "C")'
    ' >= (%(section)s::text COLLATE "C", %(row)s::text COLLATE "C")'
)
_OF_CATEGORY = "AND category = %(category)s"
# Seats the first chunk reads (each next one twice the last, up to
# CHUNK_SEATS_MAX; a row that fills a whole chunk doubles it too). Module
# attributes, read at each call, so that tests can make them small.
CHUNK_SEATS = 64
CHUNK_SEATS_MAX = 1024
# After a failed attempt, the next block is one of this many best at random
# (``_hold_best_available``): the first attempt is always the best block.
RETRY_SPREAD = 4


class _Candidate(NamedTuple):
    """An available seat as the search reads it (``_CANDIDATES_SQL``'s
    columns): a chunk is tens of seats and a block a few, so only the
    block's become ``Seat`` rows (``_as_seats``)."""

    id: int
    ref: str
    section: str
    row: str
    number: int
    price_amount: int
    currency: str
    row_first: int
    row_last: int


@functools.cache
def _candidate_fields() -> tuple[str, ...]:
    """The columns of a ``Seat`` a candidate carries, in the model's order
    (``Model.from_db`` takes a partial row's values so)."""
    return tuple(f.attname for f in Seat._meta.concrete_fields if f.attname in _Candidate._fields)


def _as_seats(block: list[_Candidate] | None) -> list[Seat] | None:
    """The block's seats as ``Seat`` rows loaded with the columns read (the
    others deferred, as the ORM loads a partial row)."""
    if block is None:
        return None
    names = _candidate_fields()
    return [
        Seat.from_db(connection.alias, names, [getattr(seat, n) for n in names]) for seat in block
    ]


def _best_available_candidates(
    *,
    event_id: int,
    category: str | None = None,
    after: tuple[str, str] | None = None,
    limit: int | None = None,
) -> list[_Candidate]:
    """One chunk of the event's seats available now (of ``category``, when
    given), in row order from the row ``after`` on (``_CANDIDATES_SQL``), as
    last committed (no lock: what is chosen is locked, and re-checked, by
    ``_hold_best_available``). A seat the seller blocked is not available."""
    section, row = after if after is not None else ("", "")
    sql = _CANDIDATES_SQL.format(
        seat=Seat._meta.db_table,
        available=SeatStatus.AVAILABLE.value,
        after=_AFTER if after else "",
        category=_OF_CATEGORY if category is not None else "",
    )
    params = {
        "event": event_id,
        "category": category,
        "section": section,
        "row": row,
        "limit": limit or CHUNK_SEATS,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [_Candidate(*row) for row in cursor.fetchall()]


def _find_best_block(
    *,
    event_id: int,
    quantity: int,
    category: str | None = None,
    excluded: frozenset[int] | set[int] = frozenset(),
    spread: int = 1,
) -> list[Seat] | None:
    """The best block of ``quantity`` available seats (``_best_block``'s
    rules; the ids in ``excluded`` left out), reading the available seats a
    chunk at a time in row order and stopping at the first row with a
    block: the cost is that of the rows before it that have seats left, not
    of the event. A chunk's last row may be cut short: it is read again,
    whole, at the start of the next chunk, which is twice as large (up to
    ``CHUNK_SEATS_MAX``; a row that fills a whole chunk doubles it).

    With ``spread`` above one, one of the ``spread`` best blocks that share
    no seat, at random (``_pick``): after a failed attempt, so that buyers
    who all tried the same block do not all try the same next one."""
    after: tuple[str, str] | None = None
    limit = CHUNK_SEATS
    while True:
        chunk = _best_available_candidates(
            event_id=event_id, category=category, after=after, limit=limit
        )
        if len(chunk) < limit:  # the rest of the hall: every row whole
            return _as_seats(_pick(chunk, quantity=quantity, excluded=excluded, spread=spread))
        last = (chunk[-1].section, chunk[-1].row)
        whole = [seat for seat in chunk if (seat.section, seat.row) != last]
        if not whole:  # one row fills the chunk: read more of it at once
            limit *= 2
            continue
        block = _pick(whole, quantity=quantity, excluded=excluded, spread=spread)
        if block is not None:
            return _as_seats(block)
        after, limit = last, max(CHUNK_SEATS, min(limit * 2, CHUNK_SEATS_MAX))


def _pick(
    candidates: list[_Candidate],
    *,
    quantity: int,
    excluded: frozenset[int] | set[int],
    spread: int,
) -> list[_Candidate] | None:
    """The best block among ``candidates`` (``spread`` 1), or one at random
    of the ``spread`` best that share no seat: the best, the best of what it
    leaves, and so on (fewer when the candidates hold fewer)."""
    blocks: list[list[_Candidate]] = []
    taken = set(excluded)
    while len(blocks) < spread:
        block = _best_block(candidates, quantity=quantity, excluded=taken)
        if block is None:
            break
        blocks.append(block)
        taken.update(seat.id for seat in block)
    return random.choice(blocks) if blocks else None


# The event's available seats (of one category, when given) less those left
# out: the ``available`` of a ``not_enough_seats``.
_AVAILABLE_COUNT_SQL = """
SELECT count(*) FROM {seat}
 WHERE event_id = %s AND status = %s AND (%s::text IS NULL OR category = %s)
   AND NOT (id = ANY(%s::bigint[]))
"""


def _available_count(
    event_id: int, category: str | None, excluded: frozenset[int] | set[int] = frozenset()
) -> int:
    sql = _AVAILABLE_COUNT_SQL.format(seat=Seat._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(sql, [event_id, SeatStatus.AVAILABLE, category, category, sorted(excluded)])
        return cursor.fetchone()[0]


def _best_block(
    candidates: Iterable[_Candidate],
    *,
    quantity: int,
    excluded: frozenset[int] | set[int] = frozenset(),
) -> list[_Candidate] | None:
    """The best block of ``quantity`` seats among ``candidates`` (less the ids
    in ``excluded``), or None.

    Rows in the order of their sections' names, then of their labels, each
    compared by code point ("A" < "AA" < "B"; seats made without a section
    have the empty one, first); the first row with a block wins. In a row,
    a block is ``quantity`` seats with consecutive numbers, all candidates,
    of one currency; the best is the one whose centre (the mean of its first
    and last numbers) is nearest the row's centre (the mean of the row's
    first and last seat numbers); of two as near, the lower numbers.
    """
    rows: dict[tuple[str, str], list[_Candidate]] = defaultdict(list)
    for seat in candidates:
        if seat.id not in excluded:
            rows[seat.section, seat.row].append(seat)
    for label in sorted(rows):
        block = _best_in_row(sorted(rows[label], key=lambda s: s.number), quantity)
        if block is not None:
            return block
    return None


def _best_in_row(seats: list[_Candidate], quantity: int) -> list[_Candidate] | None:
    centre_twice = seats[0].row_first + seats[0].row_last  # twice: integers only
    best, best_key = None, None
    run: list[_Candidate] = []  # consecutive numbers, one currency, ending at ``seat``
    for seat in seats:
        if run and (seat.number != run[-1].number + 1 or seat.currency != run[-1].currency):
            run = []
        run.append(seat)
        if len(run) >= quantity:
            block = run[-quantity:]
            key = (abs(block[0].number + block[-1].number - centre_twice), block[0].number)
            if best_key is None or key < best_key:
                best, best_key = block, key
    return best


def _hold_best_available(*, event_id: int, choice: _Choice, first: list[Seat]) -> list[Seat]:
    """Hold ``first``, or failing that one of the next best blocks, never
    waiting for a lock; returns the seats held, each at the price it is held
    at. ``NotEnoughSeats`` when no block is left.

    Each attempt holds one whole block or nothing
    (``lock_objects.seats_hold_all_skip_locked``). After a failed one the
    available seats are read again (in an on-sale, many seats were taken
    since the last read, not only the ones just tried), and the seats it
    could not hold (sold, held, or locked by another buyer right now) stay
    left out of the next pick, so every failed attempt shrinks what is left:
    at most as many attempts as seats. The next pick is one of the
    ``RETRY_SPREAD`` best blocks left, at random: the buyers who tried the
    same block at the same instant (all of them read the same seats) would
    otherwise all try the same next one, one of them winning each round
    (docs/design.md, "Start"). When no block
    is left and some seats were left out, the seats are read once more with
    nothing left out: two buyers that each locked one seat of the same block
    at the same instant both gave it up, and it is free again.
    """
    assert choice.quantity is not None  # best available
    find = functools.partial(
        _find_best_block, event_id=event_id, category=choice.category, quantity=choice.quantity
    )
    block: list[Seat] | None = first
    excluded: set[int] = set()
    read_again = True
    while True:
        if block is None:
            if not (excluded and read_again):
                raise NotEnoughSeats(_available_count(event_id, choice.category, excluded))
            excluded, read_again = set(), False
            block = find(spread=RETRY_SPREAD)
            continue
        attempt = lock_objects.seats_hold_all_skip_locked(
            event_id=event_id, seat_ids=[s.id for s in block]
        )
        if not attempt.missing:
            return _at_prices(block, attempt.prices)
        excluded |= attempt.missing
        # Others tried this block at the same instant (an on-sale) and will
        # try again too: each picks one of the next few at random, rather
        # than all the same next best, one buyer winning each round.
        block = find(excluded=excluded, spread=RETRY_SPREAD)


def _purchase(saga: PurchaseSaga, *, seats: list[Seat], hold_expires_at: datetime) -> dict:
    return {
        "id": str(saga.id),
        "status": S.PENDING.value,
        "event": saga.event_id,
        # In seat order, as the purchase's detail lists them.
        "seats": [s.ref for s in seats],
        "total": {"amount": saga.amount, "currency": saga.currency},
        "hold_expires_at": iso_z(hold_expires_at),
    }


def _record(
    saga: PurchaseSaga, *, seats: list[Seat], hold_expires_at: datetime, now: datetime
) -> None:
    """With the seats held: the reservation, the saga, its first history row
    and the hold-expiry timer (the caller's transaction)."""
    availability_changed(saga.event_id)
    # Each insert written once (docs/performance.md, "Statements written once").
    reservation = rows_sql.create(
        Reservation(
            ref=reservation_ref(saga.event_id),
            event_id=saga.event_id,
            buyer=saga.buyer,
            status=ReservationStatus.HELD,
            hold_expires_at=hold_expires_at,
            total_amount=saga.amount,
            currency=saga.currency,
            created_at=now,
        )
    )
    rows_sql.insert(
        [
            ReservationSeat(
                reservation=reservation,
                seat_id=s.id,
                event_id=saga.event_id,
                price_amount=s.price_amount,
            )
            for s in seats
        ]
    )
    saga.reservation = reservation
    saga.intent_id = intent_id_for(reservation.ref)
    rows_sql.create(saga)
    rows_sql.create(
        SagaHistory(
            saga=saga,
            event_id=saga.event_id,
            from_state=None,
            to_state=S.PENDING,
            at=now,
            reason="purchase started",
            actor=Actor.SYSTEM,
            version=saga.version,
        )
    )
    timer_schedule(
        key=saga.hold_timer_key,
        topic=Topic.HOLD_EXPIRED,
        payload={"saga_id": str(saga.id)},
        due_at=hold_expires_at,
        event_id=saga.event_id,
        saga_id=saga.id,
        now=now,
    )


_CLAIM_KEY_SQL = """
INSERT INTO {table} (user_id, key, request_hash, response_body, saga_id, created_at)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (user_id, key) DO NOTHING
RETURNING id
"""


def _claim_key(*, user, key: str, fingerprint: str, purchase: dict, saga_id, now) -> bool:
    """Insert the idempotency record unless the key is taken; True if inserted.

    ``ON CONFLICT DO NOTHING`` waits for a concurrent insert of the same key
    and answers nothing if that one commits: no savepoint, no error to catch.
    The saga it points to is inserted later in the same transaction. The
    record is distributed by buyer, the saga by event (config/distribution.py):
    no foreign key between them, and under Citus this commit spans two shards.
    """
    meta = IdempotencyRecord._meta
    params = [
        user.pk,
        key,
        fingerprint,
        meta.get_field("response_body").get_db_prep_value(purchase, connection),
        meta.get_field("saga").get_db_prep_value(saga_id, connection),
        meta.get_field("created_at").get_db_prep_value(now, connection),
    ]
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_KEY_SQL.format(table=meta.db_table), params)
        return cursor.fetchone() is not None


def _replay(*, user, idempotency_key: str, fingerprint: str) -> PurchaseStarted | None:
    record = (
        IdempotencyRecord.objects.filter(user=user, key=idempotency_key)
        .only("request_hash", "response_body", "saga_id")
        .first()
    )
    if record is None:
        return None
    if record.request_hash != fingerprint:
        raise IdempotencyKeyReused(
            "this Idempotency-Key was already used with a different request body"
        )
    return PurchaseStarted(
        saga_id=str(record.saga_id), purchase=in_answer_order(record.response_body), created=False
    )


_ANSWER_KEYS = ("id", "status", "event", "seats", "total", "hold_expires_at", "links")


def in_answer_order(body: dict) -> dict:
    """``body`` with its keys in the answer's order. jsonb does not keep key
    order, and a replay must be byte-identical to the first answer."""
    ordered = {k: body[k] for k in _ANSWER_KEYS if k in body}
    ordered.update({k: v for k, v in body.items() if k not in ordered})
    if isinstance(ordered.get("total"), dict):
        ordered["total"] = {
            "amount": ordered["total"]["amount"],
            "currency": ordered["total"]["currency"],
        }
    return ordered


def _enqueue_charge(saga_id: str, event_id: int) -> None:
    # If this fails (broker down), the saga stays PENDING and the resumer
    # drives it; robust=True keeps the committed purchase's 202. A purchase
    # of an event that owes a wake-up rides it (purchases/saga/burst.py).
    if not charge_wake(event_id):
        return
    try:
        publish_charge(saga_id)
    except Exception:
        unwake(event_id)  # so that the event's next purchase publishes
        raise
