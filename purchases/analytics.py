"""Daily sales, materialized from the purchase events (choreography).

Three outbox consumers count ``purchase.confirmed``, ``purchase.cancelled``
and ``refund.settled`` (a refund of a confirmed purchase, docs/refunds.md)
into :class:`~purchases.models.DailySales`, one row per (event, UTC day of the
message, currency). A counter is not idempotent by nature, so each consumer
claims its inbox entry *inside the transaction that counts* (they are
transactional consumers: the delivery's closing transaction): the claim and
the increment commit together or not at all, and a redelivery (or a
concurrent delivery of the same message) finds the claim taken and counts
nothing.

They never block a purchase: they run after the purchase committed, from the
relay, and a consumer added later (or stopped for a while) counts the history
when its messages are delivered again.
"""

from __future__ import annotations

import datetime as dt

from django.db import connection, transaction

from outbox.delivery import inbox_claim, inbox_claim_many, transactional
from outbox.models import OutboxMessage

from .models import DailySales, Refund
from .saga.topics import ANALYTICS_ON_CANCELLED, ANALYTICS_ON_CONFIRMED, ANALYTICS_ON_REFUND

# Their names in the inbox (and the routing table).
ON_CONFIRMED = ANALYTICS_ON_CONFIRMED
ON_CANCELLED = ANALYTICS_ON_CANCELLED
ON_REFUND = ANALYTICS_ON_REFUND


@transactional
def analytics_on_confirmed(message: OutboxMessage) -> None:
    """``purchase.confirmed`` -> one more confirmed sale. Exactly once per message."""
    # No savepoint: inside the delivery's closing transaction, a failure here
    # fails that transaction anyway (and a savepoint is two round trips).
    with transaction.atomic(savepoint=False):
        if not inbox_claim(consumer=ON_CONFIRMED, message=message):
            return  # already counted
        _add(message, _confirmed(message))


def analytics_on_confirmed_together(messages: list[OutboxMessage]) -> None:
    """:func:`analytics_on_confirmed` for several messages closing together
    (a charge burst's confirmations): their inbox entries claimed in one
    statement, and the sales of those claimed now added in one more, per
    day row the sum of its messages. Exactly once per message, as alone."""
    with transaction.atomic(savepoint=False):
        claimed = inbox_claim_many(consumer=ON_CONFIRMED, messages=messages)
        _add_many([(message, _confirmed(message), "") for message in claimed])


analytics_on_confirmed.together = analytics_on_confirmed_together  # type: ignore[attr-defined]  # read by outbox.delivery


def _confirmed(message: OutboxMessage) -> dict[str, int]:
    return {"confirmed_count": 1, "confirmed_amount": int(message.payload["amount"])}


@transactional
def analytics_on_cancelled(message: OutboxMessage) -> None:
    """``purchase.cancelled`` -> one more cancellation (and a refund if money
    went back). Exactly once per message."""
    with transaction.atomic(savepoint=False):
        if not inbox_claim(consumer=ON_CANCELLED, message=message):
            return  # already counted
        increments = {"cancelled_count": 1}
        if message.payload.get("refunded"):
            increments["refunded_count"] = 1
            increments["refunded_amount"] = int(message.payload["amount"])
        _add(message, increments)


@transactional
def analytics_on_refund(message: OutboxMessage) -> None:
    """``refund.settled`` -> one more refund and its amount, on the day the
    money went back (the message's day), whole or in part. Exactly once per
    message. The amount is the refund row's: settled, it never changes."""
    with transaction.atomic(savepoint=False):
        if not inbox_claim(consumer=ON_REFUND, message=message):
            return  # already counted
        refund = Refund.objects.only("amount", "currency").get(
            pk=message.payload["refund_id"], event_id=message.event_id
        )
        _add(
            message,
            {"refunded_count": 1, "refunded_amount": refund.amount},
            currency=refund.currency,
        )


_COUNTERS = (
    "confirmed_count",
    "confirmed_amount",
    "cancelled_count",
    "refunded_count",
    "refunded_amount",
)

# The rows created with the increments, or, when a key exists, the
# increments added to it, in one statement (one row per key: an upsert may
# not touch a row twice). A concurrent creator of the same key is waited for
# (ON CONFLICT), then DO UPDATE adds to the latest committed version under
# the row's lock: no lost increment, no retry loop. The keys come in one
# order, so that two statements with several wait on each other in it.
_ADD_SQL = """
INSERT INTO {table} (event_id, day, currency, {counters})
VALUES {values}
ON CONFLICT (event_id, day, currency) DO UPDATE SET {sums}
"""


def _add(message: OutboxMessage, increments: dict[str, int], *, currency: str = "") -> None:
    _add_many([(message, increments, currency)])


def _add_many(counted: list[tuple[OutboxMessage, dict[str, int], str]]) -> None:
    """Each message's increments on its day row (its event, the UTC day it
    was written, the currency given or the payload's), one statement."""
    sums: dict[tuple, dict[str, int]] = {}
    for message, increments, currency in counted:
        unknown = set(increments) - set(_COUNTERS)
        if unknown:
            raise ValueError(f"no such daily sales counter: {sorted(unknown)}")
        facts = message.payload
        key = (
            facts.get("event_id", message.event_id),
            message.created_at.astimezone(dt.UTC).date(),
            currency or facts["currency"],
        )
        row = sums.setdefault(key, dict.fromkeys(_COUNTERS, 0))
        for name, value in increments.items():
            row[name] += value
    if not sums:
        return
    table = DailySales._meta.db_table
    one = "(" + ", ".join(["%s"] * (3 + len(_COUNTERS))) + ")"
    sql = _ADD_SQL.format(
        table=table,
        counters=", ".join(_COUNTERS),
        values=", ".join([one] * len(sums)),
        sums=", ".join(f"{name} = {table}.{name} + excluded.{name}" for name in _COUNTERS),
    )
    params = [value for key in sorted(sums) for value in [*key, *(sums[key][n] for n in _COUNTERS)]]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


# --- reads ------------------------------------------------------------------------

_FIELDS = (
    "day",
    "currency",
    "confirmed_count",
    "confirmed_amount",
    "cancelled_count",
    "refunded_count",
    "refunded_amount",
)


def daily_sales(*, event_id: int) -> list[dict]:
    """The event's sales per UTC day and currency, oldest first. ``net_amount``
    is what was taken and kept (confirmed minus refunded), in minor units."""
    rows = DailySales.objects.filter(event_id=event_id).order_by("day", "currency").values(*_FIELDS)
    return [{**row, "net_amount": row["confirmed_amount"] - row["refunded_amount"]} for row in rows]
