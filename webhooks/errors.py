"""The webhooks app's errors; the staff API maps each to an answer
(docs/api.md): ``WebhookInvalid`` → ``400 invalid`` naming ``field``,
``WebhookNotFound`` → ``404 not_found``, ``WebhookResendRefused`` → a refusal
that says why."""

from __future__ import annotations


class WebhookInvalid(ValueError):
    """A value an endpoint cannot take; ``field`` is ``url``, ``events``,
    ``description`` or ``enabled``, ``message`` a sentence for a person."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class WebhookNotFound(LookupError):
    pass


class WebhookResendRefused(RuntimeError):
    """A resend that cannot be made now (an attempt is already owed, or the
    endpoint is disabled)."""


class WebhookOutsideTransaction(RuntimeError):
    """``webhook_publish`` belongs inside the commit of the move it announces."""
