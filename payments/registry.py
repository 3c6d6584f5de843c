"""Which gateway the code base uses: one adapter per process, chosen by
``settings.PAYMENT_GATEWAY`` ("fake": the HTTP adapter of the fake gateway;
"stripe": Stripe's, docs/stripe.md), unless a test installs another
(``override_gateway``)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from django.conf import settings

from .gateway import HttpPaymentGateway
from .interface import PaymentGateway

logger = logging.getLogger(__name__)

# One adapter per process and per processor: keyed by PAYMENT_GATEWAY, so
# that a test that changes the setting gets the adapter it names.
_defaults: dict[str, PaymentGateway] = {}
_override: PaymentGateway | None = None
_default_lock = threading.Lock()


def get_gateway() -> PaymentGateway:
    """The gateway the code base should use: an override if a test set one,
    else one adapter per process, of the processor ``PAYMENT_GATEWAY`` names
    (``StripePaymentGateway`` or :class:`HttpPaymentGateway`)."""
    if _override is not None:
        return _override
    processor = settings.PAYMENT_GATEWAY
    gateway = _defaults.get(processor)
    if gateway is None:
        with _default_lock:
            gateway = _defaults.get(processor)
            if gateway is None:
                gateway = _defaults[processor] = _build(processor)
    return gateway


def _build(processor: str) -> PaymentGateway:
    if processor == "stripe":
        # Imported here: the stripe library takes ~150 ms to import, which a
        # process of the fake gateway's (make run, most tests) need not pay.
        from .stripe.adapter import StripePaymentGateway

        return StripePaymentGateway()
    return HttpPaymentGateway()


def set_gateway(gateway: PaymentGateway | None) -> None:
    """Make :func:`get_gateway` return ``gateway``; None restores the default."""
    global _override
    _override = gateway


@contextlib.contextmanager
def override_gateway(gateway: PaymentGateway) -> Iterator[PaymentGateway]:
    previous = _override
    set_gateway(gateway)
    try:
        yield gateway
    finally:
        set_gateway(previous)


def prepare_in_pool_process(**kwargs: object) -> None:
    """Celery's ``worker_process_init`` (connected in ``payments/apps.py``):
    a pool process builds the gateway's HTTP client as it starts, so that
    the first purchase it charges does not pay for it (make bench's profile
    caught that inside the measured window). A failure is only logged: the
    first charge builds the client then, as before."""
    prepare = getattr(get_gateway(), "prepare", None)
    if prepare is None:
        return
    try:
        prepare()
    except Exception:
        logger.exception("gateway client not built at start")
