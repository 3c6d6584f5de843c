"""The organizer's events: the list (``/seller/<slug>/``), the new event and
edit pages with the seat-map upload, publishing, and the price change of an
event on sale. Every write is a ``seller.services`` call, judged by
``seller.seat_maps`` as the API's are: the pages refuse what the API
refuses, each refusal on the field or the CSV line it names."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from organizers.roles import Action
from purchases.models import Event, EventStatus

from .. import selectors, services
from ..errors import (
    EventCancelled,
    EventHasNoSeats,
    EventInvalid,
    EventNotDraft,
    EventNotFound,
    SeatsNotBlockable,
)
from ..forms import (
    NEW_CATEGORY_ROWS,
    CategoryFormSet,
    EventForm,
    PricesForm,
    SeatMapUploadForm,
    category_rows,
    minor_to_price,
)
from ..page_access import SellerAccess, seller_page
from ..seat_maps import EventSpec, SeatMapInvalid, event_from_json, seats_from_csv
from .home import see_other

STATUS_WORDS: dict[str, str] = {
    EventStatus.DRAFT: "Draft",
    EventStatus.ON_SALE: "On sale",
    EventStatus.CANCELLED: "Cancelled",
}


def event_or_404(access: SellerAccess, event_id: int) -> Event:
    """The organizer's event ``event_id``; another organizer's is as missing
    as a missing one (``seller.selectors.event_of``)."""
    try:
        return selectors.event_of(organizer=access.organizer, event_id=event_id)
    except EventNotFound:
        raise Http404("no such event") from None


def _context(access: SellerAccess, **more) -> dict[str, Any]:
    return {"access": access, "organizer": access.organizer, "nav": "seller", **more}


# --- the list ---------------------------------------------------------------------------


@seller_page(Action.VIEW_ORGANIZER)
def event_list(request: HttpRequest, access: SellerAccess) -> HttpResponse:
    """Every member sees the events (door staff need them); what else each
    row links to follows the role: the dashboard (sales) and the edit page."""
    events = [
        {"event": event, "status": STATUS_WORDS.get(event.status, event.status)}
        for event in selectors.events_of(organizer=access.organizer)
    ]
    return render(
        request, "seller/event_list.html", _context(access, events=events, section="events")
    )


# --- errors on their fields -------------------------------------------------------------

# A path of the API's (docs/api.md, "Events, seat maps and prices") and the
# field of the event form that shows it.
_EVENT_FIELDS = {
    "refund_policy.buyer_can_cancel_until": "buyer_can_cancel_until",
    "refund_policy.fee_percent": "cancel_fee_percent",
}
# price_categories[1].code, price_categories[1].price.amount: a row's field.
_CATEGORY_PATH = re.compile(r"price_categories\[(?P<index>[0-9]+)\](?:\.(?P<field>[a-z_]+).*)?")


def place_errors(
    errors: list[tuple[str, str]], form: EventForm, categories, *, rows: list[int]
) -> list[str]:
    """Put each (path, message) on the field it names; what has no field
    (the seat map's lines, a refusal of the whole) is returned, in words.
    ``rows``: the formset's form index of each category posted, in order
    (empty rows are not posted to the service)."""
    left: list[str] = []
    for path, message in errors:
        if path.endswith(".price.currency"):
            continue  # a row's currency is the event's: its own field says it
        field = _EVENT_FIELDS.get(path, path)
        category = _CATEGORY_PATH.fullmatch(path)
        if field in form.fields:
            form.add_error(field, message)
        elif categories is not None and category and int(category["index"]) < len(rows):
            row = categories.forms[rows[int(category["index"])]]
            name = category["field"]
            row.add_error(name if name in row.fields else "price" if name else None, message)
        else:
            left.append(_line(path, message))
    return left


# The refusals about the seat map: a CSV line, the map as a whole, the rest of a long list.
_SEAT_MAP_PATHS = ("line ", "seat_map", "seats[", "... and")


def _line(path: str, message: str) -> str:
    """A refusal in words, e.g. "line 17: ref — duplicate"."""
    return f"{path} — {message}" if path and path != "..." else message


# --- a new event --------------------------------------------------------------------------


def _category_formset(data=None, *, initial=None) -> Any:
    initial = list(initial or [])
    return CategoryFormSet(
        data,
        prefix="categories",
        initial=initial + [{}] * (NEW_CATEGORY_ROWS if data is None else 0),
    )


def _posted_categories(formset, currency: str) -> tuple[list[dict], list[int]] | None:
    """The category rows filled in, in the API's shape, and the index of
    the form of each; None when a row is refused (on its row)."""
    rows = category_rows(formset, currency)
    if rows is None:
        return None
    return rows, [i for i, form in enumerate(formset.forms) if form.cleaned_data]


def _new_event_spec(body: dict[str, Any], csv_text: str | None) -> EventSpec:
    """The event of the form and its seat map, read as the API reads them;
    :class:`SeatMapInvalid` with the problems of both."""
    errors: list[tuple[str, str]] = []
    spec = None
    try:
        spec = event_from_json(body)
    except SeatMapInvalid as exc:
        errors += exc.errors
    seats: list = []
    if csv_text is not None:
        codes = {row["code"] for row in body["price_categories"]}
        try:
            seats = seats_from_csv(csv_text, categories=codes)
        except SeatMapInvalid as exc:
            errors += exc.errors
    if errors or spec is None:
        raise SeatMapInvalid(errors)
    return dataclasses.replace(spec, seats=seats)


@seller_page(actions={"GET": Action.MANAGE_EVENTS, "POST": Action.MANAGE_EVENTS})
def event_new(request: HttpRequest, access: SellerAccess) -> HttpResponse:
    if request.method != "POST":
        return _new_page(request, access, EventForm(), _category_formset(), SeatMapUploadForm())
    form = EventForm(request.POST)
    categories = _category_formset(request.POST)
    upload = SeatMapUploadForm(request.POST, request.FILES)
    valid = all([form.is_valid(), categories.is_valid(), upload.is_valid()])
    posted = _posted_categories(categories, form.cleaned_data["currency"]) if valid else None
    csv_text = upload.csv_text() if posted is not None else None
    if posted is None or upload.errors:
        return _new_page(request, access, form, categories, upload, status=400)
    rows, filled = posted
    try:
        spec = _new_event_spec({**form.api_body(), "price_categories": rows}, csv_text)
        event = services.event_create(organizer=access.organizer, spec=spec)
    except (SeatMapInvalid, EventInvalid) as exc:
        left = place_errors(_errors_of(exc), form, categories, rows=filled)
        return _new_page(request, access, form, categories, upload, status=400, left=left)
    messages.success(request, f"“{event.name}” is saved as a draft: publish it when it is ready.")
    return see_other(reverse("seller-event-edit", args=[access.organizer.slug, event.pk]))


def _errors_of(exc: SeatMapInvalid | EventInvalid) -> list[tuple[str, str]]:
    return exc.errors if isinstance(exc, SeatMapInvalid) else [(exc.field, exc.message)]


def _new_page(request, access, form, categories, upload, *, status=200, left=()) -> HttpResponse:
    """The new event page; ``left``: the refusals no field shows, the seat
    map's lines apart from the rest."""
    lines = [line for line in left if line.startswith(_SEAT_MAP_PATHS)]
    others = [line for line in left if not line.startswith(_SEAT_MAP_PATHS)]
    return render(
        request,
        "seller/event_form.html",
        _context(
            access,
            section="events",
            event=None,
            form=form,
            categories=categories,
            upload=upload,
            seat_map_errors=lines,
            problem=" ".join(others) or None,
            draft=True,
        ),
        status=status,
    )


# --- editing an event ---------------------------------------------------------------------


def _event_initial(event: Event) -> dict[str, Any]:
    return {
        "name": event.name,
        "starts_at": event.starts_at,
        "currency": event.currency,
        "sales_start": event.sales_start,
        "sales_end": event.sales_end,
        "hold_seconds": event.hold_seconds,
        "max_seats_per_buyer": event.max_seats_per_buyer,
        "buyer_can_cancel_until": event.buyer_can_cancel_until,
        "cancel_fee_percent": event.cancel_fee_percent,
    }


def _categories_initial(event: Event) -> list[dict[str, Any]]:
    return [
        {
            "code": c.code,
            "name": c.name,
            "price": minor_to_price(c.price_amount, c.currency),
        }
        for c in selectors.categories_of(event=event)
    ]


def edit_page(
    request: HttpRequest,
    access: SellerAccess,
    event: Event,
    *,
    form: EventForm | None = None,
    categories=None,
    upload: SeatMapUploadForm | None = None,
    prices: PricesForm | None = None,
    seat_map_errors: list[str] | None = None,
    problem: str | None = None,
    status: int = 200,
) -> HttpResponse:
    """The edit page of ``event``, with what a refused POST leaves on it."""
    draft = event.status == EventStatus.DRAFT
    current = selectors.categories_of(event=event)
    return render(
        request,
        "seller/event_form.html",
        _context(
            access,
            section="events",
            event=event,
            status_word=STATUS_WORDS.get(event.status, event.status),
            draft=draft,
            on_sale=event.status == EventStatus.ON_SALE,
            form=form or _event_form(event),
            categories=categories or _category_formset(initial=_categories_initial(event)),
            current_categories=current,
            seat_count=selectors.seat_map_of(event=event).count(),
            upload=upload or SeatMapUploadForm(),
            prices=prices or PricesForm(categories=current, currency=event.currency),
            seat_map_errors=seat_map_errors or [],
            problem=problem,
        ),
        status=status,
    )


def _event_form(event: Event, data=None) -> EventForm:
    """The event form of ``event``: its currency is fixed once on sale."""
    form = EventForm(data, initial=_event_initial(event))
    if event.status != EventStatus.DRAFT:
        form.fields["currency"].disabled = True
        form.fields["currency"].help_text = "Fixed since the event went on sale."
    return form


@seller_page(actions={"GET": Action.MANAGE_EVENTS, "POST": Action.MANAGE_EVENTS})
def event_edit(request: HttpRequest, access: SellerAccess, event_id: int) -> HttpResponse:
    """The event's facts and rules, as ``PATCH`` changes them; its
    categories too while it is a draft (on sale: the prices form)."""
    event = event_or_404(access, event_id)
    if request.method != "POST":
        return edit_page(request, access, event)
    draft = event.status == EventStatus.DRAFT
    form = _event_form(event, request.POST)
    categories = _category_formset(request.POST) if draft else None
    valid = form.is_valid() and (categories is None or categories.is_valid())
    posted = None
    if valid and categories is not None:
        posted = _posted_categories(categories, form.cleaned_data["currency"])
        valid = posted is not None
    if not valid:
        return edit_page(request, access, event, form=form, categories=categories, status=400)
    changes = form.api_body()
    if not draft:
        del changes["currency"]  # fixed (the field is disabled)
    if posted is not None:
        changes["price_categories"] = posted[0]
    try:
        services.event_update(organizer=access.organizer, event_id=event.pk, changes=changes)
    except (SeatMapInvalid, EventInvalid) as exc:
        rows = posted[1] if posted is not None else []
        lines = place_errors(_errors_of(exc), form, categories, rows=rows)
        return edit_page(
            request, access, event, form=form, categories=categories, status=400,
            problem=" ".join(lines) or None,
        )  # fmt: skip
    except (EventNotDraft, EventCancelled) as exc:
        return edit_page(request, access, event, problem=str(exc), status=409)
    messages.success(request, "Saved.")
    return see_other(reverse("seller-event-edit", args=[access.organizer.slug, event.pk]))


@seller_page(actions={"POST": Action.MANAGE_EVENTS})
def seat_map_upload(request: HttpRequest, access: SellerAccess, event_id: int) -> HttpResponse:
    """A CSV seat map replaces the draft's whole map, its seats in the
    event's categories; a refused one is listed line by line, and nothing
    is written."""
    event = event_or_404(access, event_id)
    upload = SeatMapUploadForm(request.POST, request.FILES)
    text = upload.csv_text() if upload.is_valid() else None
    if text is None:
        if not upload.errors:
            upload.add_error("seat_map", "Choose a CSV file to upload.")
        return edit_page(request, access, event, upload=upload, status=400)
    codes = {c.code for c in selectors.categories_of(event=event)}
    try:
        count = services.seat_map_replace(
            organizer=access.organizer,
            event_id=event.pk,
            seats=seats_from_csv(text, categories=codes),
        )
    except SeatMapInvalid as exc:
        lines = [_line(path, message) for path, message in exc.errors]
        return edit_page(request, access, event, upload=upload, seat_map_errors=lines, status=400)
    except (EventNotDraft, EventCancelled, SeatsNotBlockable) as exc:
        return edit_page(request, access, event, problem=str(exc), status=409)
    messages.success(request, f"The seat map has {count} seat{'s' if count != 1 else ''} now.")
    return see_other(reverse("seller-event-edit", args=[access.organizer.slug, event.pk]))


@seller_page(actions={"POST": Action.MANAGE_EVENTS})
def event_publish(request: HttpRequest, access: SellerAccess, event_id: int) -> HttpResponse:
    event = event_or_404(access, event_id)
    try:
        services.event_publish(organizer=access.organizer, event_id=event.pk)
    except (EventNotDraft, EventHasNoSeats) as exc:
        return edit_page(request, access, event, problem=f"Not published: {exc}.", status=409)
    messages.success(request, f"“{event.name}” is on sale.")
    return see_other(reverse("seller-event", args=[access.organizer.slug, event.pk]))


@seller_page(actions={"POST": Action.MANAGE_EVENTS})
def event_prices(request: HttpRequest, access: SellerAccess, event_id: int) -> HttpResponse:
    """New prices of the categories (an event on sale too: a held or sold
    seat keeps the price it was held at)."""
    event = event_or_404(access, event_id)
    form = PricesForm(
        request.POST, categories=selectors.categories_of(event=event), currency=event.currency
    )
    prices = form.prices() if form.is_valid() else None
    if prices is None:
        return edit_page(request, access, event, prices=form, status=400)
    try:
        services.category_prices_set(organizer=access.organizer, event_id=event.pk, prices=prices)
    except EventInvalid as exc:
        field = exc.field.replace("price_categories.", "price_")
        form.add_error(field if field in form.fields else None, exc.message)
        return edit_page(request, access, event, prices=form, status=400)
    except EventCancelled as exc:
        return edit_page(request, access, event, problem=str(exc), status=409)
    messages.success(request, "The new prices apply to every seat not held or sold.")
    return see_other(reverse("seller-event-edit", args=[access.organizer.slug, event.pk]))
