"""Domain errors. The API maps each to one status code and ``code``."""

from __future__ import annotations

from datetime import datetime


class DomainError(Exception):
    code = "domain_error"


class SeatUnavailable(DomainError):
    code = "seat_unavailable"

    def __init__(self, seats: list[str]):
        super().__init__(f"seats not available: {', '.join(seats)}")
        self.seats = seats


class UnknownSeats(DomainError):
    code = "invalid"

    def __init__(self, seats: list[str]):
        super().__init__(f"no such seats for this event: {', '.join(seats)}")
        self.seats = seats


class UnknownEvent(DomainError):
    code = "invalid"

    def __init__(self, event_id: int):
        super().__init__("no such event")
        self.event_id = event_id


class IdempotencyKeyReused(DomainError):
    code = "idempotency_key_reused"


class IllegalTransition(DomainError):
    code = "illegal_transition"

    def __init__(self, source: str, target: str):
        super().__init__(f"a saga cannot move from {source} to {target}")
        self.source = source
        self.target = target


class StaleSaga(DomainError):
    """The saga moved on between our read and our write: a verdict, not a retry."""

    code = "stale_saga"


class NotEnoughSeats(DomainError):
    """No row has the seats asked for next to each other (best available).

    ``available`` counts the event's seats that are available and not being
    taken right now, as the refused request saw them (docs/design.md, "Start").
    """

    code = "not_enough_seats"

    def __init__(self, available: int):
        super().__init__(
            f"no row has that many available seats next to each other ({available} "
            f"available in all)"
        )
        self.available = available


# --- the seller's rules (docs/api.md, "The seller's rules") ----------------------------
# Checked in the start's transaction (purchases/saga/start.py).


class SalesNotOpen(DomainError):
    """The event's sales window has not opened: ``sales_start`` is ahead."""

    code = "sales_not_open"

    def __init__(self, sales_start: datetime):
        super().__init__("sales for this event have not opened yet")
        self.sales_start = sales_start


class SalesClosed(DomainError):
    """The event's sales window has closed (``sales_end`` reached), or the
    event was cancelled."""

    code = "sales_closed"

    def __init__(self) -> None:
        super().__init__("sales for this event are closed")


class BuyerLimitReached(DomainError):
    """The buyer would hold or have bought more than the event's
    ``max_seats_per_buyer``: ``held_or_bought`` are the seats the buyer
    already has (held or confirmed purchases, every one counted)."""

    code = "buyer_limit_reached"

    def __init__(self, *, limit: int, held_or_bought: int):
        super().__init__(
            f"at most {limit} seats per buyer for this event; you hold or bought "
            f"{held_or_bought} already"
        )
        self.limit = limit
        self.held_or_bought = held_or_bought


class UnknownCategory(DomainError):
    """Best available asked for a price category the event does not have."""

    code = "invalid"

    def __init__(self, category: str):
        super().__init__(f"no such price category for this event: {category}")
        self.category = category


class PaymentsPaused(DomainError):
    """The processor's breaker is open (purchases/breaker.py): no new purchase
    is started, no seat held, for ``retry_after`` seconds."""

    code = "payments_paused"

    def __init__(self, retry_after: int):
        super().__init__(
            "payments are paused: the card processor is not answering; nothing was held or "
            "charged, try again shortly"
        )
        self.retry_after = retry_after


class InWaitingRoom(DomainError):
    """The event's waiting room is letting buyers in in turn
    (purchases/admission.py): nothing was held; the buyer is in the room at
    ``position`` (1 is next; None before the draw at the opening) and asks
    again in ``retry_after`` seconds."""

    code = "waiting_room"

    def __init__(
        self, *, position: int | None, retry_after: int, sales_start: datetime | None = None
    ):
        if position is None:
            words = "you are in the waiting room: your place is drawn when the sale opens"
        else:
            words = f"you are in the waiting room, number {position} in line"
        super().__init__(f"{words}; nothing was held or charged, ask again in {retry_after} s")
        self.position = position
        self.retry_after = retry_after
        self.sales_start = sales_start
