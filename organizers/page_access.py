"""What a page for an organizer's members needs to know about who opened it,
shared by the seller pages (seller/page_access.py, where who may open which
page is decided) and the door's scanner (door/pages.py): the member's access
(organizer, role, what the role may do), the answer for a visitor not signed
in, and the 403 page naming the role and the action."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django_htmx.http import HttpResponseClientRefresh

from .models import Membership, Organizer
from .roles import Action, may

FORBIDDEN_TEMPLATE = "seller/forbidden.html"


@dataclass(frozen=True)
class MemberAccess:
    """The signed-in member of the page's organizer."""

    membership: Membership

    @property
    def organizer(self) -> Organizer:
        return self.membership.organizer

    @property
    def role(self) -> str:
        return self.membership.role

    def may(self, action: Action) -> bool:
        return may(self.role, action)

    @property
    def can(self) -> dict[str, bool]:
        """What the role may do, by the action's name (``can.READ_SALES`` in
        a template): the pages show only what the role may use."""
        return {action.name: may(self.role, action) for action in Action}


def not_signed_in(request: HttpRequest) -> HttpResponse:
    """The login page, and back to this one after it."""
    if getattr(request, "htmx", False):
        # A poll of a page whose session ended: reload the page, which then
        # goes to the login page (a redirect would swap the login form in).
        return HttpResponseClientRefresh()
    return redirect_to_login(request.get_full_path())


def forbidden(request: HttpRequest, access: MemberAccess, action: Action) -> HttpResponse:
    """The 403 page: this member's role may not take ``action``."""
    return render(
        request,
        FORBIDDEN_TEMPLATE,
        {"access": access, "organizer": access.organizer, "action": action, "nav": "seller"},
        status=403,
    )
