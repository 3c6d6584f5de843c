"""``/seller/<slug>/events/<id>/``: an event's dashboard. The seats by
status drawn on the seat map, the money (gross, refunded, net, and by price
category: ``seller.reports.event_report``, which equals the ledger), the 20
newest purchases (``seller.reports.event_purchases``), each linked to its
page with its refunds (seller/pages/refunds.py), the link to the CSV export
of them all, the check-in at the door (admitted of expected, and by gate:
``door.services.checkin_progress``) with the link to the scanner for the
roles that check in, and the event's cancellation: the owner's form, then its
progress, polled while it runs (seller/pages/cancellation.py). Its live part is polled by htmx
(``/seller/<slug>/events/<id>/live/``) and replaced as a whole."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from common.money import format_money
from door import services as door_services
from organizers.roles import Action
from purchases.admission import room_summary
from purchases.models import Event, EventStatus, PurchaseSaga
from purchases.selectors import saga_seat_refs

from .. import reports, selectors
from ..page_access import SellerAccess, seller_page
from . import cancellation, seat_svg
from .events import STATUS_WORDS, event_or_404

RECENT_PURCHASES = 20
# How often the live part asks again (htmx's "every ..."): each answer draws
# the whole map again, so a large hall is asked less often, and one past
# MAX_DRAWN is not drawn at all (its counts are, exactly).
POLL_EVERY = "5s"
POLL_EVERY_LARGE = "30s"
LARGE_HALL = 2_000
MAX_DRAWN = 20_000


def _money(money: dict[str, Any]) -> str:
    return format_money(money["amount"], money["currency"])


def purchase_row(saga: PurchaseSaga) -> dict[str, Any]:
    """A purchase as the purchase tables show it (here and on the purchases
    page), from a saga of ``reports.event_purchases``."""
    # Annotated by reports.event_purchases (the ledger's refunds).
    refunded = getattr(saga, "refunded_amount", 0) or 0
    return {
        "id": saga.pk,
        "created_at": saga.created_at,
        "buyer": saga.buyer.get_username(),
        "seats": saga_seat_refs(saga),
        "total": format_money(saga.amount, saga.currency),
        "refunded": format_money(refunded, saga.currency),
        "has_refund": bool(refunded),
        "state": saga.state,
    }


def _purchases(event: Event) -> list[dict[str, Any]]:
    newest = reports.event_purchases(event=event)[:RECENT_PURCHASES]
    return [purchase_row(saga) for saga in newest]


def live_context(access: SellerAccess, event: Event) -> dict[str, Any]:
    """What the live part shows, read now."""
    report = reports.event_report(event=event)
    counts = report["seats"]
    total = sum(counts.values())
    label = "Seat map: " + ", ".join(
        f"{counts.get(s, 0)} {seat_svg.STATUS_WORDS[s][0].lower()}" for s in seat_svg.STATUSES
    )
    drawing = None
    if total <= MAX_DRAWN:
        drawing = seat_svg.draw(seat_svg.marks(selectors.seat_map_of(event=event)), label=label)
    return {
        "event": event,
        "organizer": access.organizer,
        "seat_symbols": seat_svg.DEFINITIONS,
        "seat_total": total,
        "max_drawn": MAX_DRAWN,
        "drawing": drawing,
        "legend": [
            {
                "status": status,
                "word": seat_svg.STATUS_WORDS[status][0],
                "shape": seat_svg.STATUS_WORDS[status][1],
                "count": counts.get(status, 0),
                "symbol": seat_svg.legend_symbol(status),
            }
            for status in seat_svg.STATUSES
        ],
        "gross": _money(report["gross"]),
        "refunded": _money(report["refunded"]),
        "net": _money(report["net"]),
        "by_category": [
            {**row, "gross_text": _money(row["gross"])} for row in report["by_category"]
        ],
        "purchases": _purchases(event),
        "checkin": door_services.checkin_progress(event),
        # The on-sale waiting room (docs/waiting-room.md), when the event has one.
        "room": room_summary(event.pk) if event.waiting_room else None,
        "scanner_url": (
            reverse("door-scanner", args=[event.pk]) if access.may(Action.CHECK_IN) else None
        ),
        "as_of": timezone.now(),
        "poll_every": POLL_EVERY if total <= LARGE_HALL else POLL_EVERY_LARGE,
        "live_url": reverse("seller-event-live", args=[access.organizer.slug, event.pk]),
        "purchases_url": reverse("seller-event-purchases", args=[access.organizer.slug, event.pk]),
    }


@seller_page(Action.READ_SALES)
def event_dashboard(request: HttpRequest, access: SellerAccess, event_id: int) -> HttpResponse:
    event = event_or_404(access, event_id)
    slug = access.organizer.slug
    return render(
        request,
        "seller/dashboard.html",
        {
            **live_context(access, event),
            "access": access,
            "nav": "seller",
            "section": "events",
            "status_word": STATUS_WORDS.get(event.status, event.status),
            "draft": event.status == EventStatus.DRAFT,
            # The API's export (seller/read_urls.py): a session cookie is
            # credentials there too, so the link just works.
            "export_url": f"/api/organizers/{slug}/events/{event.pk}/purchases.csv",
            # The event's cancellation (seller/pages/cancellation.py): its
            # progress once it runs, the owner's form before.
            "cancellation": cancellation.progress_context(
                access, event, cancellation.run_of(event)
            ),
            "can_cancel": cancellation.can_cancel(access, event),
            "cancel_form": cancellation.CancelEventForm(),
        },
    )


@seller_page(Action.READ_SALES)
def event_live(request: HttpRequest, access: SellerAccess, event_id: int) -> HttpResponse:
    """The dashboard's live part alone, for its poll."""
    event = event_or_404(access, event_id)
    response = render(request, "seller/_dashboard_live.html", live_context(access, event))
    response["Cache-Control"] = "private, no-cache"
    return response
