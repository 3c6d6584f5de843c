"""``/door/<event_id>/``: the door staff's scanner page (docs/door.md, "The
scanner page"), for the members whose role may check tickets
in (``Action.CHECK_IN``: door, manager, owner) of the event's organizer.

The page is a form (``<input name="code">``) that posts here and is judged
by ``door.services.checkin``, so a phone without the script still checks
tickets in; with door/static/door/scanner.js the same form asks the API
(``…/checkin/``) instead, scans with the camera where the browser has
``BarcodeDetector``, keeps the offline list (``…/checkin/list/``) and judges
codes itself when the network is gone, uploading those scans later
(``…/checkin/upload/``).

Who may open it is decided as for the seller pages (seller/page_access.py,
with organizers/page_access.py's access and 403 page),
from the event's organizer since the URL names no slug: not signed in → the
login page and back; no such event, or an event of an organizer the user is
not a member of → the same 404; a role that may not check in → the 403 page
naming the role and the action; a method other than GET and POST → 405.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import render
from django.urls import reverse

from organizers.errors import OrganizerNotFound
from organizers.page_access import MemberAccess, forbidden, not_signed_in
from organizers.roles import Action
from organizers.selectors import membership_for
from purchases.models import Event, Seat

from . import services

# Offline, the page names a seat from the code's seat id: the event's seat
# refs travel with the page, up to this many (the seller's dashboard draws no
# larger hall either); past it an offline verdict names the seat by its id.
MAX_SEAT_REFS = 20_000
GATE_MAX_CHARS = 64
CODE_MAX_CHARS = 512

# The verdict in words (the colour is the stylesheet's), the script's too.
VERDICTS: dict[str, dict[str, str]] = {
    "ok": {"word": "✓ Admit", "detail": "A valid ticket: let them in."},
    "already_checked_in": {
        "word": "✕ Already in",
        "detail": "This ticket was checked in before: do not admit.",
    },
    "revoked": {
        "word": "✕ Revoked",
        "detail": "Refunded or replaced by a newer ticket: do not admit.",
    },
    "invalid": {"word": "✕ Not a ticket", "detail": "Not a valid ticket code: do not admit."},
    "wrong_event": {"word": "✕ Wrong event", "detail": "A ticket for another event."},
}


def door_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Call ``view(request, access, event)`` for a member who may check in."""

    @functools.wraps(view)
    def page(request: HttpRequest, event_id: int) -> HttpResponse:
        if not request.user.is_authenticated:
            return not_signed_in(request)
        if request.method not in ("GET", "HEAD", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        event = Event.objects.select_related("organizer").filter(pk=event_id).first()
        if event is None:
            raise Http404("no such event")
        try:
            membership = membership_for(user=request.user, slug=event.organizer.slug)
        except OrganizerNotFound:
            # Another organizer's event is as missing as a missing one.
            raise Http404("no such event") from None
        access = MemberAccess(membership)
        if not access.may(Action.CHECK_IN):
            return forbidden(request, access, Action.CHECK_IN)
        return view(request, access, event)

    # Read by tests that walk the routes: what each method takes.
    page.door_actions = {"GET": Action.CHECK_IN, "POST": Action.CHECK_IN}  # type: ignore[attr-defined]
    return page


def _seat_refs(event: Event) -> dict[str, str]:
    """The event's seat refs by seat id (what an offline verdict shows), one
    query; none past ``MAX_SEAT_REFS``."""
    rows = list(
        Seat.objects.filter(event=event).order_by().values_list("pk", "ref")[: MAX_SEAT_REFS + 1]
    )
    return {} if len(rows) > MAX_SEAT_REFS else {str(pk): ref for pk, ref in rows}


def _api_paths(event: Event) -> dict[str, str]:
    base = f"/api/organizers/{event.organizer.slug}/events/{event.pk}/checkin/"
    return {
        "checkin_url": base,
        "list_url": f"{base}list/",
        "upload_url": f"{base}upload/",
        "progress_url": f"{base}progress/",
    }


def _verdict(request: HttpRequest, event: Event) -> dict[str, Any] | None:
    """The form posted without the script: judged by the API's service."""
    code = (request.POST.get("code") or "").strip()[:CODE_MAX_CHARS]
    gate = (request.POST.get("gate") or "").strip()[:GATE_MAX_CHARS]
    if not code:
        return None
    answer = services.checkin(event_id=event.pk, code=code, gate=gate, user=request.user)
    return {**answer, **VERDICTS[answer["result"]]}


@door_page
def scanner(request: HttpRequest, access: MemberAccess, event: Event) -> HttpResponse:
    verdict = _verdict(request, event) if request.method == "POST" else None
    progress = services.checkin_progress(event=event)
    config = {
        "event_id": event.pk,
        **_api_paths(event),
        "expected": progress["expected"],
        "admitted": progress["admitted"],
        "seats": _seat_refs(event),
        "verdicts": VERDICTS,
    }
    response = render(
        request,
        "door/scanner.html",
        {
            "event": event,
            "organizer": access.organizer,
            "access": access,
            "progress": progress,
            "verdict": verdict,
            "config": config,
            "events_url": reverse("seller-events", args=[access.organizer.slug]),
            "gate_max": GATE_MAX_CHARS,
        },
    )
    # The counts and the verdict are of now: never from a cache.
    response["Cache-Control"] = "private, no-store"
    return response
