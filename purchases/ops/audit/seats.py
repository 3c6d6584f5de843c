"""A seat is sold at most once: set-based checks over the whole table, each a
single statement (consistent on its own, because every transaction that
touches seats also settles the reservation in the same commit).

A confirmed purchase keeps its reservation CONFIRMED for good; a refund that
gives seats back (docs/refunds.md) ends their links (``released_at``) and
puts them on sale in its commit, and names them (``Refund.released_seats``).
So a live link of a confirmed reservation is a sold seat, and a released one
must be a refund's.
"""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, Exists, OuterRef, QuerySet

from ...models import PurchaseSaga, Refund, ReservationSeat, ReservationStatus, Seat, SeatStatus
from ...saga.states import SagaState
from .context import AuditContext
from .report import SEAT_SOLD_ONCE

S = SagaState

# What the two reservation-vs-seat-status checks report about a seat link.
_LINK_FIELDS = (
    "seat__ref",
    "seat__status",
    "released_at",
    "reservation__ref",
    "reservation__status",
    "reservation__saga__id",
    "reservation__saga__intent_id",
)


def check_seats(ctx: AuditContext) -> None:
    live = ReservationSeat.objects.filter(released_at__isnull=True)
    _check_doubled(ctx, live)
    _check_sold_unconfirmed(ctx, live)
    _check_confirmed_unsold(ctx)
    _check_sold_to_nobody(ctx, live)
    _check_confirmed_saga_reservation(ctx)


def _check_doubled(ctx: AuditContext, live: QuerySet[ReservationSeat]) -> None:
    doubled = list(
        live.values("seat_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .values_list("seat_id", flat=True)
    )
    if doubled:
        links = defaultdict(list)
        for row in (
            live.filter(seat_id__in=doubled)
            .values(
                "seat_id",
                "seat__ref",
                "reservation__ref",
                "reservation__saga__id",
                "reservation__saga__intent_id",
            )
            .order_by("seat_id", "id")
        ):
            links[row["seat_id"]].append(row)
        for rows in links.values():
            latest = rows[-1]
            ctx.flag(
                SEAT_SOLD_ONCE,
                latest["reservation__saga__id"],
                latest["reservation__saga__intent_id"],
                f"seat {latest['seat__ref']} is held by {len(rows)} live reservations: "
                + ", ".join(r["reservation__ref"] for r in rows),
            )


def _check_sold_unconfirmed(ctx: AuditContext, live: QuerySet[ReservationSeat]) -> None:
    for row in (
        live.filter(seat__status=SeatStatus.SOLD)
        .exclude(reservation__status=ReservationStatus.CONFIRMED)
        .values(*_LINK_FIELDS)
    ):
        ctx.flag(
            SEAT_SOLD_ONCE,
            row["reservation__saga__id"],
            row["reservation__saga__intent_id"],
            f"seat {row['seat__ref']} is sold but its reservation {row['reservation__ref']} "
            f"is {row['reservation__status']}",
        )


def _check_confirmed_unsold(ctx: AuditContext) -> None:
    links = ReservationSeat.objects.filter(reservation__status=ReservationStatus.CONFIRMED)
    for row in (
        links.filter(released_at__isnull=True)
        .exclude(seat__status=SeatStatus.SOLD)
        .values(*_LINK_FIELDS)
    ):
        _flag_link(ctx, row, f"is {row['seat__status']}")
    # Released links, then the refunds of their purchases (read after them:
    # a refund's row commits with the release of its seats).
    released = list(links.filter(released_at__isnull=False).values(*_LINK_FIELDS, "event_id"))
    if not released:
        return
    given_back: set[tuple] = set()
    for saga_id, seats in Refund.objects.filter(
        saga_id__in={row["reservation__saga__id"] for row in released},
        event_id__in={row["event_id"] for row in released},
        released=True,
    ).values_list("saga_id", "released_seats"):
        given_back.update((saga_id, ref) for ref in seats or ())
    for row in released:
        if (row["reservation__saga__id"], row["seat__ref"]) not in given_back:
            _flag_link(ctx, row, "was released, and no refund of the purchase gave it back")


def _flag_link(ctx: AuditContext, row: dict, what: str) -> None:
    ctx.flag(
        SEAT_SOLD_ONCE,
        row["reservation__saga__id"],
        row["reservation__saga__intent_id"],
        f"confirmed reservation {row['reservation__ref']}: seat {row['seat__ref']} {what}",
    )


def _check_sold_to_nobody(ctx: AuditContext, live: QuerySet[ReservationSeat]) -> None:
    for seat in (
        Seat.objects.filter(status=SeatStatus.SOLD)
        .exclude(Exists(live.filter(seat_id=OuterRef("pk"))))
        .values("ref", "event_id")
    ):
        ctx.flag(
            SEAT_SOLD_ONCE,
            None,
            None,
            f"seat {seat['ref']} of event {seat['event_id']} is sold to no reservation",
        )


def _check_confirmed_saga_reservation(ctx: AuditContext) -> None:
    # A paid purchase whose reservation was let go: its seats can be sold again.
    for saga in (
        PurchaseSaga.objects.filter(state=S.CONFIRMED)
        .exclude(reservation__status=ReservationStatus.CONFIRMED)
        .values("pk", "intent_id", "reservation__ref", "reservation__status")
    ):
        ctx.flag(
            SEAT_SOLD_ONCE,
            saga["pk"],
            saga["intent_id"],
            f"saga is CONFIRMED but its reservation {saga['reservation__ref']} is "
            f"{saga['reservation__status']}",
        )
