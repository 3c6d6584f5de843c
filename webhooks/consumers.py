"""The outbox consumer of ``webhook.delivery`` (routed in ``webhooks/topics.py``).

An ordinary consumer (it calls out): it runs outside any transaction, at
least once. It is idempotent: an attempt already recorded is not made again,
and an attempt of a delivery no longer pending is not made at all (see
:func:`webhooks.attempts.webhook_attempt`). A receiver that fails is not a
failure of the consumer: the attempt is recorded and the next one armed.

The rows a sweep claims together are read together first (:func:`prepare`,
one statement for their deliveries, endpoints and attempts made); an attempt
uses that read only while it is fresh (``READ_FRESH_SECONDS``): after a slow
receiver held the sweep up, the next attempt reads its delivery again, as an
attempt alone does, so that a change of its endpoint (disabled, re-keyed,
moved) counts as soon as it would have.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from outbox.models import OutboxMessage
from outbox.services import prepared, prepared_keep

from . import lock_objects
from .attempts import webhook_attempt_send

READ_FRESH_SECONDS = 1.0


def deliver(message: OutboxMessage) -> Callable[[], str] | None:
    payload = message.payload
    outcome = webhook_attempt_send(
        delivery_id=payload["delivery_id"],
        attempt=payload["attempt"],
        resend=bool(payload.get("resend")),
        found=prepared(message, "webhook", within=READ_FRESH_SECONDS),
    )
    return None if isinstance(outcome, str) else outcome


def prepare(messages: list[OutboxMessage]) -> None:
    """Read the deliveries of ``messages`` (their attempts' rows) in one
    statement, and keep each one's on its message for :func:`deliver`."""
    pairs = [(m.payload["delivery_id"], m.payload["attempt"]) for m in messages]
    at = time.monotonic()  # before the read: its age counts from its start
    found = lock_objects.deliveries_with_attempt_made(pairs)
    for message, pair in zip(messages, pairs, strict=True):
        # Not found: the delivery is gone; deliver reads again and says so.
        prepared_keep(message, "webhook", found.get(pair), at=at)


deliver.prepare = prepare  # type: ignore[attr-defined]  # read by outbox.delivery
