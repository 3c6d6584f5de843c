"""Times as the project writes them: ISO 8601 in UTC with a "Z" (docs/api.md)."""

from __future__ import annotations

from datetime import UTC, datetime


def iso_z(value: datetime) -> str:
    """``2026-12-03T12:00:00Z``: an aware datetime in UTC, "Z" for "+00:00"."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
