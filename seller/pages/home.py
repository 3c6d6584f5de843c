"""``/seller/``: the organizers the user belongs to, and a form to create
one (the creator is its owner)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from organizers.errors import OrganizerInvalid
from organizers.selectors import memberships_of
from organizers.services import organizer_create

from ..forms import OrganizerForm, show_refusal
from ..page_access import signed_in_page


def see_other(url: str) -> HttpResponseRedirect:
    """A 303 after a POST: the browser GETs ``url``, and a reload there
    cannot POST again."""
    response = HttpResponseRedirect(url)
    response.status_code = 303
    return response


@signed_in_page(methods=("GET", "POST"))
def organizer_list(request: HttpRequest) -> HttpResponse:
    form = OrganizerForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            membership = organizer_create(
                slug=form.cleaned_data["slug"], name=form.cleaned_data["name"], owner=request.user
            )
        except OrganizerInvalid as exc:
            show_refusal(form, exc.field, exc.message)
        else:
            return see_other(reverse("seller-events", args=[membership.organizer.slug]))
    return render(
        request,
        "seller/organizer_list.html",
        {"memberships": list(memberships_of(user=request.user)), "form": form, "nav": "seller"},
        status=400 if form.errors else 200,
    )
