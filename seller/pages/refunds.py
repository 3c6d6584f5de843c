"""``/seller/<slug>/events/<id>/purchases/``: an event's purchases, searched
and paged, and one purchase (``?purchase=<id>``) with its refunds and, for
finance and owners, the refund form (docs/refunds.md, "Who asks").

The form is ``purchases.services.organizer_refund``'s: an amount, or seats
(their prices when no amount is given), or everything left when neither is
named; a reason, the organizer's (the buyer reads a sentence written for
buyers); the seats back on sale only when ticked. It carries its own
Idempotency-Key, drawn when it is rendered: a double click or a reload of
its POST makes one refund. A refusal is shown on the field it names."""

from __future__ import annotations

import secrets
import uuid
from typing import Any

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from common.money import format_money
from organizers.roles import Action
from purchases.models import Event, PurchaseSaga
from purchases.refunds.errors import InvalidRefund, RefundError, RefundExceedsPaid
from purchases.refunds.opening import refundable, seat_links
from purchases.refunds.selectors import purchase_refunds, refunded_amount
from purchases.saga.states import SagaState
from purchases.services import organizer_refund

from .. import reports
from ..forms import PriceInvalid, price_to_minor, show_refusal
from ..page_access import SellerAccess, seller_page
from .dashboard import purchase_row
from .events import event_or_404
from .home import see_other

PAGE_SIZE = 25
SOURCE_WORDS = {
    "buyer": "the buyer cancelled",
    "organizer": "the organizer",
    "event_cancellation": "the event's cancellation",
    "operator": "customer service",
}
STATUS_WORDS = {"pending": "◷ pending", "succeeded": "✓ succeeded", "failed": "✕ failed"}


class RefundForm(forms.Form):
    """What ``organizer_refund`` takes, as a browser posts it."""

    purchase = forms.UUIDField(widget=forms.HiddenInput)
    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=255)
    amount = forms.CharField(
        required=False,
        max_length=20,
        label="Amount",
        help_text="Leave it empty to refund the seats ticked at their price, "
        "or everything left when no seat is ticked.",
        widget=forms.TextInput(attrs={"inputmode": "decimal", "autocomplete": "off"}),
    )
    seats = forms.MultipleChoiceField(
        required=False, label="Seats", widget=forms.CheckboxSelectMultiple
    )
    reason = forms.CharField(
        max_length=500,
        label="Reason",
        help_text="Yours, for your records: the buyer never sees it.",
        widget=forms.Textarea(attrs={"rows": 3}),
    )
    release_seats = forms.BooleanField(
        required=False,
        label="Put the seats back on sale (their tickets stop working)",
    )

    def __init__(self, *args, seats: list[str], currency: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.currency = currency
        choices = self.fields["seats"]
        assert isinstance(choices, forms.MultipleChoiceField)
        choices.choices = [(ref, ref) for ref in seats]
        self.fields["amount"].label = f"Amount ({currency})"

    def clean_amount(self) -> int | None:
        text = (self.cleaned_data.get("amount") or "").strip()
        if not text:
            return None
        try:
            return price_to_minor(text, self.currency)
        except PriceInvalid as exc:
            raise forms.ValidationError(f"An amount such as 12.50: {exc}.") from exc

    def clean_idempotency_key(self) -> str:
        key = self.cleaned_data["idempotency_key"]
        if not key.isascii() or not key.isprintable():
            raise forms.ValidationError("This form is damaged; reload the page.")
        return key


def _new_key() -> str:
    return f"page-{secrets.token_urlsafe(24)}"


def _purchase_of(event: Event, purchase_id: Any) -> PurchaseSaga | None:
    """The event's purchase ``purchase_id`` with its buyer, seats and the
    ledger's refunded amount (``reports.event_purchases``), or None."""
    try:
        pk = uuid.UUID(str(purchase_id))
    except ValueError:
        return None
    return reports.event_purchases(event=event).filter(pk=pk).first()


def purchase_panel(saga: PurchaseSaga) -> dict[str, Any]:
    """One purchase as the seller reads it: seats (live, released), the
    money, every refund with the seller's reason and the buyer's sentence."""
    refunds = purchase_refunds(saga)
    links = seat_links(saga)
    taken = {ref for r in refunds if r.status != "failed" for ref in r.seats}
    left = refundable(saga)
    return {
        "saga": saga,
        "confirmed": saga.state == SagaState.CONFIRMED,
        "seats": [{"ref": link.ref, "released": link.released} for link in links],
        "open_seats": [link.ref for link in links if link.ref not in taken],
        "total": format_money(saga.amount, saga.currency),
        "refunded": format_money(refunded_amount(saga), saga.currency),
        "refundable": left,
        "refundable_text": format_money(left, saga.currency),
        "refunds": [
            {
                "row": r,
                "amount": format_money(r.amount, r.currency),
                "source": SOURCE_WORDS.get(r.source, r.source),
                "status": STATUS_WORDS.get(r.status, r.status),
            }
            for r in refunds
        ],
    }


def _purchase_rows(event: Event, search: str, page_number: str) -> tuple[Any, list, str]:
    """A page of the event's purchases (the dashboard's rows), and a problem."""
    try:
        listed = reports.event_purchases(event=event, search=search or None)
    except reports.InvalidFilter as exc:
        return None, [], exc.message
    page = Paginator(listed, PAGE_SIZE).get_page(page_number)
    return page, [purchase_row(saga) for saga in page.object_list], ""


def _page(
    request: HttpRequest,
    access: SellerAccess,
    event: Event,
    *,
    saga: PurchaseSaga | None = None,
    form: RefundForm | None = None,
    problem: str = "",
    status: int = 200,
) -> HttpResponse:
    search = request.GET.get("q", "")
    page, rows, refused = _purchase_rows(event, search, request.GET.get("page", "1"))
    panel = purchase_panel(saga) if saga is not None else None
    if panel is not None and form is None and access.may(Action.REFUND):
        form = RefundForm(
            initial={"purchase": saga.pk, "idempotency_key": _new_key()},  # type: ignore[union-attr]
            seats=panel["open_seats"],
            currency=event.currency,
        )
    return render(
        request,
        "seller/purchases.html",
        {
            "access": access,
            "organizer": access.organizer,
            "nav": "seller",
            "section": "events",
            "event": event,
            "page": page,
            "purchases": rows,
            "search": search,
            "search_problem": refused,
            "panel": panel,
            "form": form,
            "problem": problem,
        },
        status=status,
    )


@seller_page(actions={"GET": Action.READ_SALES, "POST": Action.REFUND})
def event_purchases(request: HttpRequest, access: SellerAccess, event_id: int) -> HttpResponse:
    event = event_or_404(access, event_id)
    if request.method == "POST":
        return _refund(request, access, event)
    wanted = request.GET.get("purchase")
    saga = _purchase_of(event, wanted) if wanted else None
    if wanted and saga is None:
        return _page(request, access, event, problem="No such purchase of this event.", status=404)
    return _page(request, access, event, saga=saga)


def _refund(request: HttpRequest, access: SellerAccess, event: Event) -> HttpResponse:
    if not request.POST.get("purchase"):
        return _page(request, access, event, problem="Choose a purchase to refund.", status=400)
    saga = _purchase_of(event, request.POST["purchase"])
    if saga is None:
        return _page(request, access, event, problem="No such purchase of this event.", status=404)
    form = RefundForm(
        request.POST, seats=purchase_panel(saga)["open_seats"], currency=event.currency
    )
    if not form.is_valid():
        return _page(request, access, event, saga=saga, form=form, status=400)
    data = form.cleaned_data
    try:
        refund = organizer_refund(
            organizer=access.organizer,
            saga_id=saga.pk,
            user=request.user,
            reason=data["reason"],
            amount=data["amount"],
            seats=data["seats"] or None,
            release_seats=data["release_seats"],
            request_key=data["idempotency_key"],
        )
    except PurchaseSaga.DoesNotExist:
        return _page(request, access, event, problem="No such purchase of this event.", status=404)
    except RefundError as exc:
        _show(form, exc)
        return _page(request, access, event, saga=saga, form=form, status=exc.status)
    messages.success(
        request,
        f"Refund of {format_money(refund.amount, refund.currency)} opened: it is pending "
        "until the processor answers, and the buyer is emailed when it succeeds.",
    )
    url = reverse("seller-event-purchases", args=[access.organizer.slug, event.pk])
    return see_other(f"{url}?purchase={saga.pk}")


def _show(form: RefundForm, exc: RefundError) -> None:
    """A refusal of ``organizer_refund`` on the field it names, in words."""
    if isinstance(exc, RefundExceedsPaid):
        left = format_money(exc.refundable, exc.currency)
        show_refusal(form, "amount", f"At most {left} is left to refund on this purchase.")
    elif isinstance(exc, InvalidRefund):
        show_refusal(form, exc.field, f"{str(exc)[:1].upper()}{str(exc)[1:]}.")
    elif exc.code == "idempotency_key_reused":
        show_refusal(form, None, "This form already made another refund: reload the page.")
    else:
        show_refusal(form, None, f"Not refunded: {exc}.")
