"""The only module of the door that takes row locks.

A ticket is its seat link (``purchases.ReservationSeat``). The reissue takes
the link ``FOR UPDATE`` and nothing else; the check-in's admitting insert
reads the link ``FOR SHARE`` (door/services.py). So a reissue and a scan of
the same ticket take turns: the scan that waited sees the new version (its
code no longer admits), the reissue that waited sees the check-in (and is
refused). A refund's release updates the link after the saga and its seats
(purchases/lock_objects.py): it waits for both, and neither waits for it.
"""

from __future__ import annotations

from datetime import datetime

from purchases.models import ReservationSeat, Seat

from .models import EventKey

# The purchase's link of the seat ``ref`` (its live one first, should an
# older released one of the same seat be there), locked.
_TICKET_SQL = """
SELECT rs.* FROM {link} rs JOIN {seat} s ON s.id = rs.seat_id AND s.event_id = rs.event_id
 WHERE rs.reservation_id = %s AND rs.event_id = %s AND s.ref = %s
 ORDER BY rs.released_at IS NULL DESC, rs.id DESC LIMIT 1
   FOR UPDATE OF rs
"""


def ticket_for_update(
    *, event_id: int, reservation_id: int, seat_ref: str
) -> ReservationSeat | None:
    """The seat link of ``seat_ref`` in the reservation, locked until the
    commit; None when the purchase has no such seat."""
    sql = _TICKET_SQL.format(link=ReservationSeat._meta.db_table, seat=Seat._meta.db_table)
    found = list(ReservationSeat.objects.raw(sql, [reservation_id, event_id, seat_ref]))
    return found[0] if found else None


def event_keys_for_update(*, event_id: int) -> list[tuple[int, datetime | None]]:
    """The event's keys, newest first, as (version, retired_at), locked
    until the commit: a retirement decides against the keys as they are."""
    return list(
        EventKey.objects.select_for_update(of=("self",))
        .filter(event_id=event_id)
        .order_by("-version")
        .values_list("version", "retired_at")
    )
