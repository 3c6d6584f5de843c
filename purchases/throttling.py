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
        return settings.AUTH_TOKEN_THROTTLE_RATE

    def get_cache_key(self, request, view):
        # Per address whatever credentials come along: the endpoint is where
        # credentials are guessed.
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
