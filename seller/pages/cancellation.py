"""An event's cancellation from the seller's pages
(docs/refunds.md, "Event cancellation"): the owner's form (a reason, then
a confirmation step that says what it will do),
``purchases.services.event_cancel`` on the confirmation, and the run's
progress (``purchases.refunds.selectors.cancellation_progress``), polled by
htmx on the dashboard while it runs."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.db.models import Count, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from common.money import format_money
from organizers.roles import Action
from purchases.models import Event, EventCancellation, EventStatus, PurchaseSaga
from purchases.refunds.errors import InvalidRefund
from purchases.refunds.selectors import cancellation_progress
from purchases.saga.states import NON_TERMINAL, SagaState
from purchases.services import event_cancel

from ..forms import show_refusal
from ..page_access import SellerAccess, seller_page
from .events import event_or_404
from .home import see_other

# How often the progress asks again while the run is running.
POLL_EVERY = "1s"


class CancelEventForm(forms.Form):
    reason = forms.CharField(
        max_length=500,
        label="Why is it cancelled?",
        help_text="Sent to your webhook endpoints with event.cancelled; each buyer is told "
        "that the event was cancelled and that everything they paid is refunded.",
        widget=forms.Textarea(attrs={"rows": 3}),
    )
    confirm = forms.BooleanField(required=False, widget=forms.HiddenInput)


def run_of(event: Event) -> EventCancellation | None:
    return EventCancellation.objects.filter(event_id=event.pk).first()


def progress_context(access: SellerAccess, event: Event, run: EventCancellation | None) -> dict:
    """The progress part: the run's figures in words (None: no run)."""
    progress = cancellation_progress(run) if run is not None else None
    return {
        "event": event,
        "organizer": access.organizer,
        "progress": progress,
        "owed": format_money(progress["owed_amount"], event.currency) if progress else "",
        "running": bool(progress and progress["status"] == "running"),
        "poll_every": POLL_EVERY,
        "progress_url": reverse(
            "seller-event-cancellation", args=[access.organizer.slug, event.pk]
        ),
    }


def _impact(event: Event) -> dict[str, Any]:
    """What a cancellation would refund now: the confirmed purchases and
    their money, and the purchases still in flight (settled first)."""
    sums = PurchaseSaga.objects.filter(event_id=event.pk).aggregate(
        confirmed=Count("pk", filter=Q(state=SagaState.CONFIRMED)),
        paid=Sum("amount", filter=Q(state=SagaState.CONFIRMED), default=0),
        in_flight=Count("pk", filter=Q(state__in=list(NON_TERMINAL))),
    )
    return {**sums, "paid_text": format_money(sums["paid"], event.currency)}


def _page(request, access, event, form, *, step: str, status: int = 200) -> HttpResponse:
    return render(
        request,
        "seller/event_cancel.html",
        {
            "access": access,
            "organizer": access.organizer,
            "nav": "seller",
            "section": "events",
            "event": event,
            "form": form,
            "step": step,  # "reason" | "confirm"
            "impact": _impact(event),
            "run": run_of(event),
        },
        status=status,
    )


@seller_page(actions={"GET": Action.CANCEL_EVENT, "POST": Action.CANCEL_EVENT})
def event_cancel_page(request: HttpRequest, access: SellerAccess, event_id: int) -> HttpResponse:
    """GET: the form. POST without ``confirm``: the confirmation step (what
    it will do, the reason kept). POST with it: the cancellation, then the
    dashboard with its progress."""
    event = event_or_404(access, event_id)
    if request.method != "POST":
        return _page(request, access, event, CancelEventForm(), step="reason")
    form = CancelEventForm(request.POST)
    if not form.is_valid():
        return _page(request, access, event, form, step="reason", status=400)
    if not form.cleaned_data["confirm"]:
        confirm = CancelEventForm(initial={"reason": form.cleaned_data["reason"], "confirm": True})
        return _page(request, access, event, confirm, step="confirm")
    try:
        event_cancel(
            organizer=access.organizer,
            event_id=event.pk,
            reason=form.cleaned_data["reason"],
            user=request.user,
        )
    except InvalidRefund as exc:
        show_refusal(form, exc.field, f"{str(exc)[:1].upper()}{str(exc)[1:]}.")
        return _page(request, access, event, form, step="reason", status=400)
    messages.success(
        request,
        f"“{event.name}” is cancelled: sales stopped, and every buyer is being refunded.",
    )
    return see_other(reverse("seller-event", args=[access.organizer.slug, event.pk]))


@seller_page(Action.READ_SALES)
def cancellation_live(request: HttpRequest, access: SellerAccess, event_id: int) -> HttpResponse:
    """The progress part alone, for its poll (an event not cancelled: says so)."""
    event = event_or_404(access, event_id)
    response = render(
        request,
        "seller/_cancellation_live.html",
        progress_context(access, event, run_of(event)),
    )
    response["Cache-Control"] = "private, no-cache"
    return response


def can_cancel(access: SellerAccess, event: Event) -> bool:
    return access.may(Action.CANCEL_EVENT) and event.status != EventStatus.CANCELLED
