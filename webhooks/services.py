"""Outgoing webhooks, the app's operations (docs/design.md, "The edges"; the
contract is docs/api.md), one module per concern:

- ``webhooks.endpoints``: endpoints created, changed, re-keyed and deleted
  (``webhook_endpoint_*``), each value checked (:class:`WebhookInvalid`
  names the field);
- ``webhooks.publishing``: :func:`webhook_publish`, a move's deliveries and
  their first attempts, inside the saga's commit (:func:`webhook_publish_many`
  for several sagas' moves of one commit);
- ``webhooks.attempts``: :func:`webhook_attempt_send` and
  :func:`webhook_attempt`, one attempt made and recorded, and the next one
  armed;
- ``webhooks.resend``: :func:`webhook_resend`, one more attempt of a
  delivered or failed delivery, same ``webhook-id``.

Other apps, the API, the admin and the tests call them here.
"""

from __future__ import annotations

from .attempts import (
    webhook_attempt,
    webhook_attempt_send,
)
from .endpoints import (
    EVENT_TYPES,
    webhook_endpoint_create,
    webhook_endpoint_delete,
    webhook_endpoint_rotate_secret,
    webhook_endpoint_update,
)
from .errors import (
    WebhookInvalid,
    WebhookNotFound,
    WebhookOutsideTransaction,
    WebhookResendRefused,
)
from .models import WebhookEvent
from .publishing import purchase_data, webhook_publish, webhook_publish_many
from .resend import webhook_resend

__all__ = [
    "EVENT_TYPES",
    "WebhookEvent",
    "WebhookInvalid",
    "WebhookNotFound",
    "WebhookOutsideTransaction",
    "WebhookResendRefused",
    "purchase_data",
    "webhook_attempt",
    "webhook_attempt_send",
    "webhook_endpoint_create",
    "webhook_endpoint_delete",
    "webhook_endpoint_rotate_secret",
    "webhook_endpoint_update",
    "webhook_publish",
    "webhook_publish_many",
    "webhook_resend",
]
