"""Who may use a route under ``/api/organizers/{slug}/``: the one place that
checks it (docs/api.md, "Organizers and roles").

A view declares the action it takes (``required_action``, or
``required_actions`` by method); :class:`OrganizerPermission` finds the
organizer of the URL's ``slug`` among the caller's (``404 not_found`` for a
stranger exactly as for a missing organizer), then asks the matrix
(``organizers.roles.MAY``) whether the caller's role may take that action
(``403 permission_denied`` otherwise). A served method that declares no
action is refused to everyone, and tests/test_organizer_scoping.py fails on
it. The view then reads ``self.organizer`` and ``self.membership``: it never
looks the organizer up, nor filters by it, itself; the selectors it calls
take the organizer.
"""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.permissions import BasePermission
from rest_framework.views import APIView

from .errors import OrganizerNotFound
from .models import Membership, Organizer
from .roles import Action, may
from .selectors import membership_for

NOT_FOUND = "no such organizer"


def declared_action(view, method: str) -> Action | None:
    """The action a request with ``method`` takes on ``view`` (a view class
    or instance), or None when it declares none."""
    if method == "HEAD":
        method = "GET"  # Django serves it with GET's handler
    by_method: dict[str, Action] = getattr(view, "required_actions", None) or {}
    return by_method.get(method, getattr(view, "required_action", None))


def caller_membership(request, slug: str) -> Membership:
    """The caller's membership of ``slug``: as the token's authentication
    read it with the token (purchases/authentication.py), or read now (a
    session)."""
    read = getattr(request.auth, "organizer_membership", None)
    if read is None or read.slug != slug or read.user.pk != request.user.pk:
        return membership_for(user=request.user, slug=slug)
    if read.membership is None:
        raise OrganizerNotFound(f"no organizer {slug!r} of this user")
    return read.membership


class OrganizerPermission(BasePermission):
    """A member of the URL's organizer whose role may take the view's action.
    Anonymous requests fail here too: DRF answers them ``401``."""

    message = "your role may not do this"

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        try:
            membership = caller_membership(request, view.kwargs.get("slug", ""))
        except OrganizerNotFound:
            raise exceptions.NotFound(NOT_FOUND) from None
        view.membership, view.organizer = membership, membership.organizer
        if request.method == "OPTIONS" or not hasattr(view, request.method.lower()):
            return True  # what the route takes, or DRF's 405
        action = declared_action(view, request.method)
        if action is None:
            self.message = "this route declares no action: nobody may use it"
            return False
        if may(membership.role, action):
            return True
        self.message = f"the role {membership.role} may not {action}"
        return False


class OrganizerScopedApi(APIView):
    """The base of a view under ``/api/organizers/{slug}/``: it declares its
    action, and finds its organizer and the caller's membership set by the
    permission."""

    permission_classes = [OrganizerPermission]
    required_action: Action | None = None
    required_actions: dict[str, Action] = {}
    organizer: Organizer
    membership: Membership
