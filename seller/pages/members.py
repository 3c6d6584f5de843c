"""``/seller/<slug>/members/``: the organizer's members and their roles; the
owner adds members, changes their roles and removes them
(``organizers.services.member_add`` / ``member_remove``, whose rules hold:
the last owner stays)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from organizers.errors import MemberNotFound, OrganizerConflict, OrganizerInvalid
from organizers.roles import Action, Role
from organizers.selectors import members_of
from organizers.services import member_add, member_remove

from ..forms import ROLE_CHOICES, MemberForm, show_refusal
from ..page_access import SellerAccess, seller_page
from .home import see_other


def _page(
    request: HttpRequest,
    access: SellerAccess,
    form: MemberForm,
    *,
    status: int = 200,
    problem: str | None = None,
) -> HttpResponse:
    return render(
        request,
        "seller/members.html",
        {
            "access": access,
            "organizer": access.organizer,
            "section": "members",
            "nav": "seller",
            "members": list(members_of(organizer=access.organizer)),
            "roles": ROLE_CHOICES,
            "form": form,
            "problem": problem,
        },
        status=status,
    )


@seller_page(actions={"GET": Action.MANAGE_MEMBERS, "POST": Action.MANAGE_MEMBERS})
def member_list(request: HttpRequest, access: SellerAccess) -> HttpResponse:
    """The members; a POST adds one, or gives one another role."""
    if request.method != "POST":
        return _page(request, access, MemberForm())
    form = MemberForm(request.POST)
    if not form.is_valid():
        return _page(request, access, form, status=400)
    username, role = form.cleaned_data["username"], form.cleaned_data["role"]
    try:
        _, created = member_add(organizer=access.organizer, username=username, role=role)
    except OrganizerInvalid as exc:
        show_refusal(form, exc.field, exc.message)
        return _page(request, access, form, status=400)
    except OrganizerConflict as exc:
        return _page(request, access, MemberForm(), status=409, problem=str(exc))
    messages.success(request, f"{username} {'joined as' if created else 'is now'} {role}.")
    gave_up = username == request.user.get_username() and role != Role.OWNER
    return _back(request, access, me=gave_up)


@seller_page(actions={"POST": Action.MANAGE_MEMBERS})
def member_remove_page(request: HttpRequest, access: SellerAccess, username: str) -> HttpResponse:
    try:
        member_remove(organizer=access.organizer, username=username)
    except MemberNotFound:
        return _page(
            request, access, MemberForm(), status=404, problem=f"{username} is not a member."
        )
    except OrganizerConflict as exc:
        return _page(request, access, MemberForm(), status=409, problem=str(exc))
    messages.success(request, f"{username} is no longer a member.")
    if username == request.user.get_username():
        return see_other(reverse("seller-home"))  # no longer one of yours
    return _back(request, access, me=False)


def _back(request: HttpRequest, access: SellerAccess, *, me: bool) -> HttpResponse:
    """Back to the members, or, for an owner who just gave up the role
    (another owner stays), to the events: the members page is an owner's."""
    if me:
        return see_other(reverse("seller-events", args=[access.organizer.slug]))
    return see_other(reverse("seller-members", args=[access.organizer.slug]))
