"""The Stripe settings' shapes, checked at start-up
(docs/stripe.md, "Settings"): a key of the wrong kind (a publishable key
where the secret one belongs, a restricted or made-up one) fails the process
before it serves anything, rather than at a buyer's first purchase.

Imported by ``config.settings``: nothing here may import Django."""

from __future__ import annotations

import re

_SECRET = re.compile(r"sk_(test|live)_[0-9A-Za-z]+")
_PUBLISHABLE = re.compile(r"pk_(test|live)_[0-9A-Za-z]+")
_WEBHOOK = re.compile(r"whsec_[0-9A-Za-z+/=]+")


class StripeSettingsInvalid(Exception):
    """A Stripe setting is missing or malformed (its message names which)."""


def check_stripe_settings(*, secret_key: str, publishable_key: str, webhook_secret: str) -> None:
    if not secret_key:
        raise StripeSettingsInvalid("STRIPE_SECRET_KEY must be set when PAYMENT_GATEWAY=stripe")
    if not _SECRET.fullmatch(secret_key):
        raise StripeSettingsInvalid(
            "STRIPE_SECRET_KEY must be a secret key (sk_test_… or sk_live_…)"
        )
    if publishable_key and not _PUBLISHABLE.fullmatch(publishable_key):
        raise StripeSettingsInvalid(
            "STRIPE_PUBLISHABLE_KEY must be a publishable key (pk_test_… or pk_live_…)"
        )
    if not publishable_key:
        raise StripeSettingsInvalid(
            "STRIPE_PUBLISHABLE_KEY must be set when PAYMENT_GATEWAY=stripe"
        )
    if not _WEBHOOK.fullmatch(webhook_secret):
        raise StripeSettingsInvalid(
            "STRIPE_WEBHOOK_SECRET must be set to the endpoint's signing secret (whsec_…)"
        )
    live_secret = secret_key.startswith("sk_live_")
    if live_secret != publishable_key.startswith("pk_live_"):
        raise StripeSettingsInvalid(
            "STRIPE_SECRET_KEY and STRIPE_PUBLISHABLE_KEY must both be test or both live keys"
        )
