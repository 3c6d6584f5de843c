"""Who may open a seller page (``/seller/...``): the one place that checks it
(docs/api.md, "Pages for sellers"), as ``organizers.permissions`` is for the
API.

A page under an organizer's slug is a view wrapped in :func:`seller_page`,
which declares the action each method takes (``organizers.roles.Action``)
and, per request:

- not signed in → the login page, and back here after it (an htmx poll is
  told to reload the page instead, so that no login form is swapped in);
- not a member of the slug's organizer, or no such organizer → the same
  404 page for both (``organizers.selectors.membership_for``);
- a role the matrix (``organizers.roles.may``) refuses the method's action
  → the 403 page, naming the role and the action;
- a method the page declares no action for → 405.

The view is then called with a :class:`SellerAccess` (the organizer, the
membership and what the role may do) and never looks the organizer up
itself. :func:`signed_in_page` is the one page that is no organizer's: the
list of the user's organizers. Both leave what they declared on the view
(``seller_actions``, ``seller_signed_in``), and tests/test_seller_pages.py
walks every ``seller/`` route of the URL conf with it: a page that declares
nothing fails there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed

from organizers.errors import OrganizerNotFound
from organizers.page_access import MemberAccess, forbidden, not_signed_in
from organizers.roles import Action
from organizers.selectors import membership_for

# The signed-in member of the page's organizer (organizers/page_access.py).
SellerAccess = MemberAccess


def _action_of(actions: Mapping[str, Action], method: str) -> Action | None:
    return actions.get("GET" if method == "HEAD" else method)


def seller_page(
    action: Action | None = None, *, actions: Mapping[str, Action] | None = None
) -> Callable:
    """Declare the action of a page under ``seller/<slug>/``: ``action`` for
    GET, or ``actions`` by method (``{"GET": ..., "POST": ...}``). The view
    is called as ``view(request, access, **the URL's other kwargs)``."""
    declared: dict[str, Action] = dict(actions or {})
    if action is not None:
        declared.setdefault("GET", action)
    if not declared:
        raise ValueError("a seller page declares the action of each method it serves")

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def page(request: HttpRequest, slug: str, **kwargs) -> HttpResponse:
            if not request.user.is_authenticated:
                return not_signed_in(request)
            try:
                membership = membership_for(user=request.user, slug=slug)
            except OrganizerNotFound:
                raise Http404("no such organizer") from None
            wanted = _action_of(declared, request.method or "GET")
            if wanted is None:
                return HttpResponseNotAllowed(sorted(declared))
            access = SellerAccess(membership)
            if not access.may(wanted):
                return forbidden(request, access, wanted)
            return view(request, access, **kwargs)

        page.seller_actions = declared  # type: ignore[attr-defined]  # read by the route walker
        return page

    return decorate


def signed_in_page(methods: tuple[str, ...] = ("GET",)) -> Callable:
    """A seller page that is no organizer's (the list of the user's
    organizers): signed in is all it takes."""
    allowed = frozenset(methods) | ({"HEAD"} if "GET" in methods else set())

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def page(request: HttpRequest, **kwargs) -> HttpResponse:
            if not request.user.is_authenticated:
                return not_signed_in(request)
            if request.method not in allowed:
                return HttpResponseNotAllowed(sorted(methods))
            return view(request, **kwargs)

        page.seller_signed_in = tuple(methods)  # type: ignore[attr-defined]  # read by the walker
        return page

    return decorate
