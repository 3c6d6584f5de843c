"""Domain errors. The API maps each to one status code and ``code``."""


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
