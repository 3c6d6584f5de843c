"""Times as the project writes them: ISO 8601 in UTC with a "Z" for machines
(docs/api.md), and UTC to the second for the people reading the admin."""

from __future__ import annotations

from datetime import UTC, datetime


def iso_z(value: datetime) -> str:
    """``2026-12-03T12:00:00Z``: an aware datetime in UTC, "Z" for "+00:00"."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def format_utc_seconds(value: datetime | None, *, empty: str = "—") -> str:
    """``2026-12-03 12:00:00 UTC``: a time as an operator reads it (the admin),
    in UTC and to the second, whatever the zone it comes in. ``None`` (a time
    that has not happened: not fired, not cancelled) is ``empty``."""
    if value is None:
        return empty
    if value.tzinfo is None:
        # The project stores aware times (USE_TZ); a naive one is UTC already.
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
