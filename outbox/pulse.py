"""The relay's pulse: a relay loop that completes passes says so, at most
every ``OUTBOX_RELAY_PULSE_SECONDS``, so that readiness (``/readyz``,
``manage.py probe relay``) can tell a live relay from a hung or dead one.

The pulse is recorded by the function ``settings.OUTBOX_RELAY_PULSE`` names
(the purchases app's heartbeats, ``purchases.ops.health.relay_pulse_record``):
the outbox knows nothing of the apps above it, as with its consumers
(``OUTBOX_CONSUMERS``).
"""

from __future__ import annotations

import time

from django.conf import settings
from django.utils import timezone
from django.utils.module_loading import import_string

# When this process last recorded a pulse (time.monotonic()); None: never.
_last_pulse: float | None = None


def relay_pulse() -> bool:
    """Record the relay's pulse unless this process recorded one less than
    ``OUTBOX_RELAY_PULSE_SECONDS`` ago: between pulses a call costs a clock
    read. Returns whether it recorded one. A recorder that fails (the
    database is down) raises, and the next call tries again."""
    global _last_pulse
    at = time.monotonic()
    if _last_pulse is not None and at - _last_pulse < settings.OUTBOX_RELAY_PULSE_SECONDS:
        return False
    # (Two relay threads of one process may both record: harmless, one row.)
    import_string(settings.OUTBOX_RELAY_PULSE)(now=timezone.now())
    _last_pulse = at
    return True
