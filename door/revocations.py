"""Tickets voided by what happens to their purchase (docs/door.md,
"Revocations"): a row per voided ticket version, written inside the commit
that voids it (a refund releasing seats, a lost dispute), so that the
offline list carries it. Imported by the purchases app under its own locks:
this module writes its rows and takes no lock of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import connection

from purchases.models import ReservationSeat

from .models import RevocationReason, TicketRevocation

# The links' current versions, each voided once (a second refund of the
# same seat, or a replayed dispute, writes nothing).
_REVOKE_SQL = f"""
INSERT INTO {TicketRevocation._meta.db_table} (event_id, ticket_id, version, reason, at)
SELECT rs.event_id, rs.id, rs.ticket_version, %s, %s FROM {ReservationSeat._meta.db_table} rs
 WHERE rs.event_id = %s AND rs.id = ANY(%s)
ON CONFLICT (event_id, ticket_id, version) DO NOTHING
"""


def revoke_links(links: Iterable[int], reason: str, at: datetime, *, event_id: int) -> int:
    """Void the tickets of the seat links ``links`` (ids, one event's) at
    their current version, for ``reason`` (a ``RevocationReason``), inside
    the caller's transaction. Returns how many rows were written."""
    ids = sorted(set(links))
    if not ids:
        return 0
    RevocationReason(reason)  # a misspelt reason fails here, not in a report
    with connection.cursor() as cursor:
        cursor.execute(_REVOKE_SQL, [reason, at, event_id, ids])
        return cursor.rowcount


# Every live link of a reservation, at its current version.
_REVOKE_PURCHASE_SQL = f"""
INSERT INTO {TicketRevocation._meta.db_table} (event_id, ticket_id, version, reason, at)
SELECT rs.event_id, rs.id, rs.ticket_version, %s, %s FROM {ReservationSeat._meta.db_table} rs
 WHERE rs.event_id = %s AND rs.reservation_id = %s AND rs.released_at IS NULL
ON CONFLICT (event_id, ticket_id, version) DO NOTHING
"""


def revoke_purchase(*, event_id: int, reservation_id: int, reason: str, at: datetime) -> int:
    """Void every ticket of a purchase whose seats stay sold (a lost
    dispute: the bank took the money back), inside the caller's
    transaction; idempotent. Returns how many rows were written."""
    RevocationReason(reason)
    with connection.cursor() as cursor:
        cursor.execute(_REVOKE_PURCHASE_SQL, [reason, at, event_id, reservation_id])
        return cursor.rowcount
