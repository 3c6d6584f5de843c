"""The outbox consumer of ``webhook.delivery`` (routed in ``webhooks/topics.py``).

An ordinary consumer (it calls out): it runs outside any transaction, at
least once. It is idempotent: an attempt already recorded is not made again,
and an attempt of a delivery no longer pending is not made at all (see
:func:`webhooks.services.webhook_attempt`). A receiver that fails is not a
failure of the consumer: the attempt is recorded and the next one armed.
"""

from __future__ import annotations

from collections.abc import Callable

from outbox.models import OutboxMessage

from .services import webhook_attempt_send


def deliver(message: OutboxMessage) -> Callable[[], str] | None:
    payload = message.payload
    outcome = webhook_attempt_send(
        delivery_id=payload["delivery_id"],
        attempt=payload["attempt"],
        resend=bool(payload.get("resend")),
    )
    return None if isinstance(outcome, str) else outcome
