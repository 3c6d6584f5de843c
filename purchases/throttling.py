"""Throttling of purchase starts, per user.

The rate is read from settings at call time (DRF's own throttles bind their
rates at import), and counted in the default cache: Redis when CACHE_URL
points at it, so that every web process shares one count.

The purchase throttle counts through Django's public cache API, so that two
starts at once in two processes cannot both take the last place (DRF's
reads the user's history, then writes it back: both may read the same
history and both pass). Each start let through takes a numbered ticket,
``cache.add`` (atomic: one start gets each number) of the ticket's time,
kept for the window: start ``n`` may take its ticket only if ticket
``n - limit`` is gone or older than the window. The window, the count and
``Retry-After`` are DRF's. The user's last number is a hint (``…:last``): a
start that finds its number taken tries the next.

What counts (docs/api.md, "Throttling"; ``purchase_start_throttled``, the
one decision for the API and the pages): the throttle is decided after the
request's key and body are valid, and a start that turns out not to count
gives its step back (``refund``): a replay of a key, and a refusal of the
input (``400``, ``422``). A start refused for its seats or by the event's
rules (``409``: taken, not open yet, closed, over the buyer's limit) counts:
it is a real attempt at them, what a scalper repeats. Over the rate, a key
that already has an answer replays it (its first answer wins over any
refusal), read without starting anything. A step given back while the same
user's next start has already taken the next number stays counted until it
leaves the window (the count errs on the side of the limit).

The cache down (docs/operations.md, "Cache down"; ``purchases/cache_outage.py``
counts and logs it): the purchase throttle counts the user's purchases
started in the window in the database (their idempotency records, one per
start, shared by every process). Refusals are not counted then, and two
starts at the same instant may both pass the last place: an outage's
approximation, which still bounds what one user holds. The token throttle
has no rows to count: it counts in the process (a local cache), so with N
web processes an address gets up to N times its rate during an outage.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.cache.backends.locmem import LocMemCache
from django.db.models import Count, Min
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle

from . import services
from .cache_outage import cache_answered, cache_call, cache_down, cache_skipped, cache_unavailable
from .errors import (
    IdempotencyKeyReused,
    InWaitingRoom,
    PaymentsPaused,
    UnknownCategory,
    UnknownEvent,
    UnknownSeats,
)
from .models import IdempotencyRecord


class PurchaseStartThrottle(UserRateThrottle):
    scope = "purchase_start"
    # What the cache or the database answered about a start refused.
    _count: int | None = None
    _oldest: float | None = None
    # The ticket this start took, for refund() (None: nothing to give back).
    _ticket: int | None = None

    def get_rate(self):
        return settings.PURCHASE_THROTTLE_RATE

    def allow_request(self, request, view) -> bool:
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        self.now = self.timer()
        reached, ticket = cache_call("purchase_throttle", self._take_ticket)
        if not reached:  # just found down, or down now
            return self._allow_from_database(request)
        self._ticket = ticket
        return ticket is not None

    def _take_ticket(self) -> int | None:
        """The number this start takes, or None: the window is full (see the
        module's docstring)."""
        # (Set by DRF's __init__ from the rate; not in its stubs.)
        duration, limit = self.duration, self.num_requests  # type: ignore[attr-defined]
        if limit <= 0:
            self._count, self._oldest = 0, None
            return None
        kept = math.ceil(duration)
        number = (self.cache.get(self._at("last")) or 0) + 1
        while True:
            if number > limit:
                oldest = self.cache.get(self._at(number - limit))
                if oldest is not None and oldest > self.now - duration:
                    self._count, self._oldest = limit, oldest
                    return None
            if self.cache.add(self._at(number), self.now, kept):
                self.cache.set(self._at("last"), number, kept)
                return number
            number += 1  # taken by a start at the same time: the next one

    def refund(self) -> None:
        """Give back the step this start took: it replayed, or its input was
        refused. Nothing when nothing was counted; the cache down, the step
        stays (it counts)."""
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            cache_call("purchase_throttle", lambda: self._give_back(ticket))

    def _give_back(self, ticket: int) -> None:
        # Only the last number is given back: a ticket deleted behind a later
        # one would leave a gap that lets one start too many through (start
        # n reads ticket n - limit alone).
        if self.cache.get(self._at("last")) == ticket:  # nobody took a number since
            kept = math.ceil(self.duration)  # type: ignore[attr-defined]
            self.cache.delete(self._at(ticket))
            self.cache.set(self._at("last"), ticket - 1, kept)

    def _at(self, name: int | str) -> str:
        """The cache key of one of this user's tickets, or of its last number."""
        return f"{self.key}:{name}"

    def _allow_from_database(self, request) -> bool:
        """The cache down: the user's purchases started within the window,
        counted from their idempotency records (one per start; replays and
        refusals write none). An anonymous caller starts nothing: let through
        (the view refuses it before any start)."""
        if not request.user.is_authenticated:
            return True
        duration, limit = self.duration, self.num_requests  # type: ignore[attr-defined]
        since = datetime.fromtimestamp(self.now - duration, tz=UTC)
        found = IdempotencyRecord.objects.filter(
            user_id=request.user.pk, created_at__gt=since
        ).aggregate(count=Count("id"), oldest=Min("created_at"))
        oldest = found["oldest"]
        self._count, self._oldest = found["count"], oldest.timestamp() if oldest else None
        return found["count"] < limit

    def wait(self) -> float | None:
        """DRF's: the time until the oldest start leaves the window, spread
        over the starts the window will then allow."""
        if self._count is None:
            return super().wait()
        duration, limit = self.duration, self.num_requests  # type: ignore[attr-defined]
        remaining = duration - (self.now - self._oldest) if self._oldest else duration
        available = limit - self._count + 1
        return None if available <= 0 else remaining / float(available)


# The token throttle's count while the cache is down: this process's own.
LOCAL_COUNTS = LocMemCache("boxoffice-token-throttle-while-cache-down", {})


class TokenThrottle(AnonRateThrottle):
    """Password guesses at ``POST /api/auth/token/``, counted per client address."""

    scope = "auth_token"

    def get_rate(self):
        # Counted per address: the token view authenticates nobody, so every
        # caller is anonymous here, whatever credentials it sends.
        return settings.AUTH_TOKEN_THROTTLE_RATE

    def allow_request(self, request, view) -> bool:
        if self.rate is not None and cache_skipped("token_throttle"):
            # Found down a moment ago: not asked (DRF's documented ``cache``
            # attribute, this one throttle object's).
            self.cache = LOCAL_COUNTS
            return super().allow_request(request, view)
        try:
            allowed = super().allow_request(request, view)
        except cache_down() as exc:
            cache_unavailable("token_throttle", exc)
            # DRF's documented ``cache`` attribute: this one throttle object's.
            self.cache = LOCAL_COUNTS
            return super().allow_request(request, view)
        if self.rate is not None:
            cache_answered()
        return allowed


class PurchaseThrottled(Exception):
    """Over ``PURCHASE_THROTTLE_RATE``, and the key has no answer to replay."""

    def __init__(self, wait: float | None):
        super().__init__("purchase starts throttled")
        self.wait = wait


def purchase_start_throttled(request, view, **start: Any) -> services.PurchaseStarted:
    """``services.purchase_start`` behind the purchase throttle, as the API
    and the pages decide it (docs/api.md, "Throttling"), called once the key
    and the body are valid (bad input spent nothing before it).

    A start counts when it reaches the seats: a purchase started, or seats
    refused (``SeatUnavailable``, ``NotEnoughSeats``, and the event's rules:
    ``SalesNotOpen``, ``SalesClosed``, ``BuyerLimitReached``; a real attempt
    at them, what a scalper repeats). A replay of the key and a refusal of
    the input (``IdempotencyKeyReused``, ``UnknownEvent``, ``UnknownSeats``,
    ``UnknownCategory``) and a start refused while payments are paused
    (``PaymentsPaused``: no seat was reached) or told to wait in the
    event's waiting room (``InWaitingRoom``: asking again is how a buyer
    waits) give their step back. Over the rate, the key's first answer is
    replayed if it has one (it wins over any refusal), from
    one indexed read and without starting anything; else
    ``PurchaseThrottled``.
    """
    throttle = PurchaseStartThrottle()
    if not throttle.allow_request(request, view):
        replay = services.purchase_replay(user=request.user, **start)
        if replay is None:
            raise PurchaseThrottled(throttle.wait())
        return replay
    try:
        started = services.purchase_start(user=request.user, **start)
    except (
        IdempotencyKeyReused,
        UnknownEvent,
        UnknownSeats,
        UnknownCategory,
        PaymentsPaused,
        InWaitingRoom,
    ):
        throttle.refund()
        raise
    if not started.created:
        throttle.refund()
    return started
