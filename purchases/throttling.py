"""Throttling of purchase starts, per user.

The rate is read from settings at call time (DRF's own throttles bind their
rates at import), and counted in the default cache: Redis when CACHE_URL
points at it, so that every web process shares one count.
"""

from django.conf import settings
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle


class PurchaseStartThrottle(UserRateThrottle):
    scope = "purchase_start"

    def get_rate(self):
        return settings.PURCHASE_THROTTLE_RATE


class TokenThrottle(AnonRateThrottle):
    """Password guesses at ``POST /api/auth/token/``, counted per client address."""

    scope = "auth_token"

    def get_rate(self):
        # Counted per address: the token view authenticates nobody, so every
        # caller is anonymous here, whatever credentials it sends.
        return settings.AUTH_TOKEN_THROTTLE_RATE
