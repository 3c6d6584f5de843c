"""Stripe mode's settings: start-up refuses a missing, malformed or mixed key
(payments/stripe/keys.py, read by config/settings.py), and
``PAYMENT_GATEWAY`` chooses the adapter (payments/registry.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from payments.gateway import HttpPaymentGateway
from payments.registry import get_gateway
from payments.stripe.adapter import StripePaymentGateway
from payments.stripe.keys import StripeSettingsInvalid, check_stripe_settings

ROOT = Path(__file__).resolve().parent.parent

GOOD_TEST = {
    "secret_key": "sk_test_51Hboxoffice0123456789",
    "publishable_key": "pk_test_51Hboxoffice0123456789",
    "webhook_secret": "whsec_0123456789abcdefABCDEF+/=",
}
GOOD_LIVE = {
    "secret_key": "sk_live_51Hboxoffice0123456789",
    "publishable_key": "pk_live_51Hboxoffice0123456789",
    "webhook_secret": "whsec_0123456789abcdef",
}


@pytest.mark.parametrize("keys", [GOOD_TEST, GOOD_LIVE], ids=["test", "live"])
def test_good_keys_are_accepted(keys):
    check_stripe_settings(**keys)


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"secret_key": ""}, "STRIPE_SECRET_KEY must be set"),
        ({"secret_key": "pk_test_51Hboxoffice0123456789"}, "STRIPE_SECRET_KEY must be a secret"),
        ({"secret_key": "rk_test_51Hboxoffice0123456789"}, "STRIPE_SECRET_KEY must be a secret"),
        ({"secret_key": "sk_test_"}, "STRIPE_SECRET_KEY must be a secret"),
        ({"secret_key": "sk_test_abc def"}, "STRIPE_SECRET_KEY must be a secret"),
        ({"publishable_key": ""}, "STRIPE_PUBLISHABLE_KEY must be set"),
        ({"publishable_key": "sk_test_51Hboxoffice"}, "STRIPE_PUBLISHABLE_KEY must be a"),
        ({"webhook_secret": ""}, "STRIPE_WEBHOOK_SECRET"),
        ({"webhook_secret": "0123456789abcdef"}, "STRIPE_WEBHOOK_SECRET"),
        ({"secret_key": "sk_live_51Hboxoffice0123456789"}, "must both be test or both live"),
        ({"publishable_key": "pk_live_51Hboxoffice0123456789"}, "must both be test or both live"),
    ],
)
def test_missing_malformed_or_mixed_keys_are_refused(change, names):
    with pytest.raises(StripeSettingsInvalid, match=names):
        check_stripe_settings(**{**GOOD_TEST, **change})


def _django_setup(**env: str) -> subprocess.CompletedProcess[str]:
    """``django.setup()`` with config.settings (production's) in a process of
    its own, with ``env`` over the test session's environment."""
    environment = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "SECRET_KEY": "test-only-not-secret",
        "STRIPE_SECRET_KEY": GOOD_TEST["secret_key"],
        "STRIPE_PUBLISHABLE_KEY": GOOD_TEST["publishable_key"],
        "STRIPE_WEBHOOK_SECRET": GOOD_TEST["webhook_secret"],
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_stripe_mode_starts_with_good_keys():
    started = _django_setup(PAYMENT_GATEWAY="stripe")

    assert started.returncode == 0, started.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"STRIPE_SECRET_KEY": "pk_test_51Hboxoffice0123456789"},
            "STRIPE_SECRET_KEY must be a secret key",
        ),
        ({"STRIPE_SECRET_KEY": ""}, "STRIPE_SECRET_KEY must be set when PAYMENT_GATEWAY=stripe"),
        ({"STRIPE_WEBHOOK_SECRET": "nope"}, "STRIPE_WEBHOOK_SECRET must be set"),
    ],
)
def test_stripe_mode_with_a_bad_key_does_not_start(env, message):
    started = _django_setup(PAYMENT_GATEWAY="stripe", **env)

    assert started.returncode != 0
    assert "StripeSettingsInvalid" in started.stderr and message in started.stderr


def test_the_fake_gateway_needs_no_stripe_key():
    started = _django_setup(PAYMENT_GATEWAY="fake", STRIPE_SECRET_KEY="")

    assert started.returncode == 0, started.stderr


def test_a_misspelt_processor_does_not_start():
    started = _django_setup(PAYMENT_GATEWAY="strip")

    assert started.returncode != 0
    assert "PAYMENT_GATEWAY must be fake or stripe" in started.stderr


def test_payment_gateway_chooses_the_adapter_once_per_process(settings):
    settings.PAYMENT_GATEWAY = "stripe"
    stripe_gateway = get_gateway()

    settings.PAYMENT_GATEWAY = "fake"
    fake_gateway = get_gateway()

    assert isinstance(stripe_gateway, StripePaymentGateway)
    assert stripe_gateway.creates_intent and stripe_gateway.processor == "stripe"
    assert isinstance(fake_gateway, HttpPaymentGateway)
    settings.PAYMENT_GATEWAY = "stripe"
    assert get_gateway() is stripe_gateway
