"""Which gateway the code base uses: one HTTP adapter per process, built from
settings, unless a test installs another (``override_gateway``)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from .gateway import HttpPaymentGateway
from .interface import PaymentGateway

logger = logging.getLogger(__name__)

_default_gateway: HttpPaymentGateway | None = None
_override: PaymentGateway | None = None
_default_lock = threading.Lock()


def get_gateway() -> PaymentGateway:
    """The gateway the code base should use: an override if a test set one,
    else one :class:`HttpPaymentGateway` per process, built from settings."""
    global _default_gateway
    if _override is not None:
        return _override
    if _default_gateway is None:
        with _default_lock:
            if _default_gateway is None:
                _default_gateway = HttpPaymentGateway()
    return _default_gateway


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
