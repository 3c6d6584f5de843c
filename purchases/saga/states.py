"""The saga's states and its transition table: the one place that says which
move is legal. Anything not listed here raises and writes nothing."""

from django.db import models


class SagaState(models.TextChoices):
    PENDING = "PENDING"
    CHARGING = "CHARGING"
    # The buyer must authenticate the payment (3-D Secure); nothing charged.
    REQUIRES_ACTION = "REQUIRES_ACTION"
    CONFIRMED = "CONFIRMED"
    PAYMENT_FAILED = "PAYMENT_FAILED"
    UNKNOWN = "UNKNOWN"
    UNKNOWN_EXPIRED = "UNKNOWN_EXPIRED"
    EXPIRED = "EXPIRED"
    COMPENSATING = "COMPENSATING"
    COMPENSATION_PENDING = "COMPENSATION_PENDING"
    COMPENSATED = "COMPENSATED"


S = SagaState

TRANSITIONS: dict[SagaState, frozenset[SagaState]] = {
    S.PENDING: frozenset({S.CHARGING, S.EXPIRED}),
    S.CHARGING: frozenset({S.CONFIRMED, S.PAYMENT_FAILED, S.UNKNOWN, S.EXPIRED, S.REQUIRES_ACTION}),
    # Authenticated and charged, authentication failed, or abandoned until
    # the hold ran out (the intent canceled at the processor first).
    S.REQUIRES_ACTION: frozenset({S.CONFIRMED, S.PAYMENT_FAILED, S.EXPIRED}),
    # A look-up that finds no charge allows a retry with the same key.
    S.UNKNOWN: frozenset(
        {S.CHARGING, S.CONFIRMED, S.PAYMENT_FAILED, S.UNKNOWN_EXPIRED, S.EXPIRED, S.REQUIRES_ACTION}
    ),
    # Escalated: an operator (or the hold expiry, after the gateway's definitive
    # answer) settles it.
    S.UNKNOWN_EXPIRED: frozenset({S.CONFIRMED, S.EXPIRED, S.COMPENSATING}),
    S.PAYMENT_FAILED: frozenset({S.COMPENSATING}),
    S.EXPIRED: frozenset({S.COMPENSATING}),
    # Terminal: money given back to a confirmed purchase is a refund row of
    # its own (docs/refunds.md), never a move of the saga.
    S.CONFIRMED: frozenset(),
    S.COMPENSATING: frozenset({S.COMPENSATED, S.COMPENSATION_PENDING}),
    S.COMPENSATION_PENDING: frozenset({S.COMPENSATING, S.COMPENSATED}),
    S.COMPENSATED: frozenset(),
}

TERMINAL = frozenset({S.CONFIRMED, S.COMPENSATED})
NON_TERMINAL = [s.value for s in S if s not in TERMINAL]
