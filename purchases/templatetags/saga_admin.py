"""What the saga admin's templates share: one way to write a time (UTC, to
the second), money in its currency's decimals, and a saga id short enough to
scan that still copies whole.

``{% load saga_admin %}``, then ``{{ value|utc }}``,
``{{ amount|money:currency }}``, ``{{ saga.pk|saga_id }}`` and
``{{ message.key|saga_key:saga.pk }}``.
"""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils.html import format_html

from common.money import format_money
from common.time import format_utc_seconds

register = template.Library()

SHORT_ID = 8


@register.filter
def utc(value: datetime | str | None) -> str:
    """A datetime (or an ISO 8601 text, as the gateway writes its times) as
    ``2026-12-02 12:00:05 UTC``; anything unreadable as it is."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return value
        value = parsed
    return format_utc_seconds(value)


@register.filter
def money(amount: int | None, currency: str) -> str:
    return "—" if amount is None else format_money(amount, currency)


@register.filter
def saga_id(value) -> str:
    """The first 8 characters to read; the whole id on hover (title) and in
    the text, so that selecting it copies all of it (the rest is clipped
    to no width, not left out: ``saga_id_style.html``)."""
    full = str(value)
    return format_html(
        '<span class="saga-id" title="{}">{}<span class="saga-id-rest">{}</span></span>',
        full,
        full[:SHORT_ID],
        full[SHORT_ID:],
    )


@register.filter
def saga_key(key: str | None, saga_pk) -> str:
    """An outbox key (``reconcile:<saga id>:3:1``) with the saga's id shown
    short, as :func:`saga_id` shows it (the whole key still copies)."""
    if not key:
        return ""
    full = str(saga_pk)
    before, found, after = key.partition(full)
    if not found:
        return key
    return format_html("{}{}{}", before, saga_id(full), after)
