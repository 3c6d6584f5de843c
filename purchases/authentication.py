"""The API's token authentication, with the token's user kept in the cache.

DRF's ``TokenAuthentication`` reads the token and its user on every request:
a query, and a transaction of its own, about one in seven of a purchase's
(docs/performance.md). Here a token that authenticated is remembered in
Django's cache (Redis on the real stack) for ``AUTH_TOKEN_CACHE_SECONDS``,
keyed by a hash of the token (the cache never holds a usable credential),
with the few fields of the user a request reads; the others load from the
database if something asks for them.

What stops a remembered token at once: deleting it (the admin, a rotation)
and saving its user (deactivated, made staff or not) clear it, in the
process that makes the change (signals, connected by ``PurchasesConfig``).
What a signal cannot see (a bulk ``UPDATE`` of users, a token deleted by
SQL) is bounded by ``AUTH_TOKEN_CACHE_SECONDS``. A token that fails is never
remembered. ``0`` turns the cache off.

Under ``/api/organizers/{slug}/`` the cache is not asked: every such
request is authenticated, then authorized by the caller's membership of
that organizer (``organizers.permissions``, the one place that decides), so
the token, its user and the membership are read in one query
(``organizers.selectors.token_membership``) instead of a cache look-up and
a query: a door scan's hot path (docs/performance.md, figure 16). There a
deleted token, a deactivated user and a changed role take effect at the
next request in every process. The membership rides on the request's
``auth`` (the token) as ``organizer_membership``; the permission takes it
when it is of the URL's organizer and the request's user, and reads the
membership itself otherwise (a session). An unknown token or an inactive
user is refused by DRF's own read, in its words, from the database.

The cache down (docs/operations.md, "Cache down"): the token is read from the
database, as with the cache off, and the request goes on (the token is not
remembered then); the fallback is counted, the outage logged once, and the
cache not asked for ``CACHE_RETRY_SECONDS`` (``purchases/cache_outage.py``). A token
deleted or a user saved while the cache cannot be reached is not forgotten
there: if the cache comes back with its entries (a network cut, not a
restart), what it remembered is served until its TTL, at most
``AUTH_TOKEN_CACHE_SECONDS`` after it was remembered, the bound above.
"""

from __future__ import annotations

import functools
import hashlib

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db.models.signals import post_delete, post_save
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token

from common.users import USER_FIELDS, model_order, user_from_values
from organizers.selectors import token_membership

from .cache_outage import cache_call


def cache_key(token_key: str) -> str:
    return "authtoken:" + hashlib.sha256(token_key.encode()).hexdigest()


class CachedTokenAuthentication(TokenAuthentication):
    # The URL's organizer when the view is one under /api/organizers/{slug}/
    # (below), else None. DRF makes the authenticators anew for each request.
    slug: str | None = None

    def authenticate(self, request):
        # Here, not at the top: DRF imports this class while rest_framework.views
        # loads, which organizers.permissions imports.
        from organizers.permissions import OrganizerScopedApi

        view = request.parser_context.get("view")
        if isinstance(view, OrganizerScopedApi):
            self.slug = request.parser_context.get("kwargs", {}).get("slug", "")
        return super().authenticate(request)

    def authenticate_credentials(self, key):
        if self.slug is not None:
            return self._with_membership(key, self.slug)
        seconds = settings.AUTH_TOKEN_CACHE_SECONDS
        if seconds <= 0:
            return super().authenticate_credentials(key)
        # Whether the cache answered the look-up: a cache that did not is not
        # asked to remember either (the request would wait for it twice).
        reached, remembered = cache_call("token", functools.partial(cache.get, cache_key(key)))
        if remembered is not None:
            fields = dict(zip(USER_FIELDS, remembered, strict=True))
            user = user_from_values([fields[name] for name in model_order()])
            return user, Token(key=key, user=user)
        user, token = super().authenticate_credentials(key)  # refuses what it must
        if reached:  # read from the database next time too, if this one fails
            remember = [getattr(user, name) for name in USER_FIELDS]
            cache_call("token", functools.partial(cache.set, cache_key(key), remember, seconds))
        return user, token

    def _with_membership(self, key: str, slug: str):
        """Under an organizer: the token, its user and the user's membership
        of ``slug`` in one query (the module's docstring), the membership
        handed to ``organizers.permissions`` on the token."""
        found = token_membership(key=key, slug=slug)
        if found is None or not found.user.is_active:
            # DRF's own read: its refusal in its words, or (a slug of no
            # organizer's form) the user, whom the permission then refuses.
            return super().authenticate_credentials(key)
        token = Token(key=key, user=found.user)
        token.organizer_membership = found  # type: ignore[attr-defined]
        return found.user, token


# Forgetting while the cache is down is lost: the TTL bounds it (above).


def forget_token(sender, instance: Token, **kwargs) -> None:
    cache_call("token", functools.partial(cache.delete, cache_key(instance.key)))


def forget_tokens_of_user(sender, instance, **kwargs) -> None:
    keys = [
        cache_key(key)
        for key in Token.objects.filter(user_id=instance.pk).values_list("key", flat=True)
    ]
    if keys:  # a user with no token has nothing to forget
        cache_call("token", functools.partial(cache.delete_many, keys))


def connect() -> None:
    """Called once by ``PurchasesConfig.ready``."""
    # (A user deleted takes its tokens with it: each one's post_delete.)
    post_delete.connect(forget_token, sender=Token, dispatch_uid="authtoken-forget")
    post_save.connect(
        forget_tokens_of_user, sender=get_user_model(), dispatch_uid="authtoken-forget-user-saved"
    )
