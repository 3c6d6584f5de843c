"""The seller pages' forms (seller/pages/). A form reads what a browser
posts (text, dates, numbers, a file) into the values a service takes; what
a value may be is the service's to say (``organizers.services``,
``webhooks.services``, ``seller.services`` and ``seller.seat_maps``), and
its refusal is shown on the field it names (:func:`show_refusal`), so the
pages refuse what the API refuses, in the same words."""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django import forms

from common.money import UnknownCurrency, minor_units_exponent, to_decimal
from organizers.models import SLUG_MAX_CHARS, SLUG_RULE
from organizers.roles import Role
from webhooks.models import WebhookEvent

# A date and time as <input type="datetime-local"> sends it, read as UTC (the
# pages say so: every time the project shows is UTC).
DATETIME_LOCAL = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")
DATETIME_FORMATS = ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"]
# The largest seat-map file read (100,000 seats of ~60 characters: ~6 MB).
SEAT_MAP_MAX_BYTES = 16 * 1024 * 1024


def _datetime(**kwargs) -> forms.DateTimeField:
    return forms.DateTimeField(widget=DATETIME_LOCAL, input_formats=DATETIME_FORMATS, **kwargs)


def show_refusal(form: forms.Form, field: str | None, message: str) -> None:
    """A service's refusal, on the form's field of that name, or on the form
    as a whole when the form has no such field."""
    form.add_error(field if field in form.fields else None, message)


# --- organizers and members -----------------------------------------------------------


class OrganizerForm(forms.Form):
    slug = forms.CharField(
        label="Short name (in the address)",
        help_text=SLUG_RULE[:1].upper() + SLUG_RULE[1:] + ".",
        max_length=SLUG_MAX_CHARS,
        widget=forms.TextInput(attrs={"autocapitalize": "none", "spellcheck": "false"}),
    )
    name = forms.CharField(label="Name", max_length=200)


ROLE_CHOICES = [(role.value, role.label) for role in Role]


class MemberForm(forms.Form):
    """Add a member, or give a member another role (``member_add`` does both)."""

    username = forms.CharField(
        label="Username",
        max_length=150,
        widget=forms.TextInput(attrs={"autocapitalize": "none", "spellcheck": "false"}),
    )
    # The least a member may do, unless the owner chooses more.
    role = forms.ChoiceField(label="Role", choices=ROLE_CHOICES, initial=Role.DOOR.value)


# --- webhook endpoints ------------------------------------------------------------------


class WebhookEndpointForm(forms.Form):
    url = forms.CharField(
        label="URL",
        help_text="Where we POST each event (https://, a public address).",
        max_length=2000,
        widget=forms.URLInput(attrs={"spellcheck": "false", "autocapitalize": "none"}),
    )
    events = forms.MultipleChoiceField(
        label="Events to send",
        choices=[(e.value, f"{e.value}: {e.label}") for e in WebhookEvent],
        widget=forms.CheckboxSelectMultiple,
    )
    description = forms.CharField(label="Description", max_length=300, required=False)


# --- events -----------------------------------------------------------------------------


class EventForm(forms.Form):
    """An event's facts and rules (not its categories nor its seat map)."""

    name = forms.CharField(label="Name", max_length=200)
    starts_at = _datetime(label="Starts at (UTC)")
    currency = forms.CharField(
        label="Currency",
        help_text="ISO 4217, e.g. EUR; every price of the event is in it.",
        max_length=10,  # what a currency may be is the service's to say
        initial="EUR",
        widget=forms.TextInput(attrs={"autocapitalize": "characters", "size": 4}),
    )
    sales_start = _datetime(label="Sales open (UTC)", required=False, help_text="Empty: at once.")
    sales_end = _datetime(
        label="Sales close (UTC)", required=False, help_text="Empty: until the event."
    )
    hold_seconds = forms.IntegerField(
        label="Hold seats for (seconds)",
        required=False,
        help_text="How long a buyer's seats are held while paying. Empty: the site's default.",
        widget=forms.NumberInput(attrs={"inputmode": "numeric"}),
    )
    max_seats_per_buyer = forms.IntegerField(
        label="Seats per buyer, at most",
        required=False,
        help_text="Counting every purchase of one buyer for this event. Empty: no limit.",
        widget=forms.NumberInput(attrs={"inputmode": "numeric"}),
    )
    buyer_can_cancel_until = _datetime(
        label="Buyers may cancel until (UTC)", required=False, help_text="Empty: never."
    )
    cancel_fee_percent = forms.IntegerField(
        label="Cancellation fee (percent)",
        initial=0,
        widget=forms.NumberInput(attrs={"inputmode": "numeric"}),
    )

    def clean_currency(self) -> str:
        return self.cleaned_data["currency"].strip().upper()

    def api_body(self) -> dict[str, Any]:
        """The cleaned values in the API's shape (the body of ``POST
        /api/organizers/{slug}/events/`` less its categories and seat map)."""
        data = self.cleaned_data
        return {
            "name": data["name"],
            "starts_at": _iso(data["starts_at"]),
            "currency": data["currency"],
            "sales_start": _iso(data.get("sales_start")),
            "sales_end": _iso(data.get("sales_end")),
            "hold_seconds": data.get("hold_seconds"),
            "max_seats_per_buyer": data.get("max_seats_per_buyer"),
            "refund_policy": {
                "buyer_can_cancel_until": _iso(data.get("buyer_can_cancel_until")),
                "fee_percent": data["cancel_fee_percent"],
            },
        }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


class CategoryForm(forms.Form):
    """One price category: a row of the event form (an empty row is none)."""

    code = forms.CharField(
        label="Code",
        max_length=32,
        widget=forms.TextInput(attrs={"autocapitalize": "none", "spellcheck": "false"}),
    )
    name = forms.CharField(label="Name", max_length=100)
    price = forms.CharField(
        label="Price",
        max_length=20,
        widget=forms.TextInput(attrs={"inputmode": "decimal"}),
    )


class _CategoryRows(forms.BaseFormSet):
    """The category rows: every row may be left empty (an empty row is no
    category; a row cleared on an edit removes its category), so no row is
    an "initial" one that must be filled; the rows drawn are the initial
    values given (the event's categories and a few empty rows)."""

    def initial_form_count(self) -> int:
        return 0

    def total_form_count(self) -> int:
        if self.is_bound:
            return super().total_form_count()
        return min(len(self.initial or ()), self.absolute_max)


CategoryFormSet = forms.formset_factory(
    CategoryForm, formset=_CategoryRows, extra=0, max_num=50, absolute_max=50
)
# The empty rows an event form offers for new categories.
NEW_CATEGORY_ROWS = 3

_PRICE = re.compile(r"[0-9]{1,12}(?:[.,][0-9]{1,4})?")


class PriceInvalid(ValueError):
    pass


def price_to_minor(text: str, currency: str) -> int:
    """A price as a person types it ("50", "49.90", "49,90") in minor units
    of ``currency``: refused if it has more decimals than the currency."""
    text = text.strip()
    if not _PRICE.fullmatch(text):
        raise PriceInvalid("a price such as 50 or 49.90")
    try:
        exponent = minor_units_exponent(currency)
    except UnknownCurrency:
        exponent = 2  # the currency is refused on its own field
    try:
        value = Decimal(text.replace(",", ".")) * (10**exponent)
    except InvalidOperation as exc:  # cannot happen past the pattern; said anyway
        raise PriceInvalid("a price such as 50 or 49.90") from exc
    if value != value.to_integral_value():
        raise PriceInvalid(f"at most {exponent} decimals in {currency}")
    return int(value)


def minor_to_price(amount: int, currency: str) -> str:
    """Minor units as the price field shows them ("49.90")."""
    try:
        return str(to_decimal(amount, currency))
    except UnknownCurrency:
        return str(amount)


def category_rows(formset, currency: str) -> list[dict[str, Any]] | None:
    """The filled rows of a valid category formset in the API's shape, or
    None when a price is refused (then named on its row)."""
    rows: list[dict[str, Any]] = []
    refused = False
    for form in formset.forms:
        data = form.cleaned_data
        if not data:
            continue  # an empty row
        try:
            amount = price_to_minor(data["price"], currency)
        except PriceInvalid as exc:
            form.add_error("price", str(exc))
            refused = True
            continue
        rows.append(
            {
                "code": data["code"].strip(),
                "name": data["name"].strip(),
                "price": {"amount": amount, "currency": currency},
            }
        )
    return None if refused else rows


class SeatMapUploadForm(forms.Form):
    seat_map = forms.FileField(
        label="Seat map (CSV)",
        required=False,
        help_text="Columns section,row,number,ref,category,x,y,accessible; the first line is "
        "that header; a seat's category is one of the price categories' codes.",
        widget=forms.ClearableFileInput(attrs={"accept": ".csv,text/csv"}),
    )

    def csv_text(self) -> str | None:
        """The file as text (UTF-8, a BOM allowed), or None if none was sent."""
        upload = self.cleaned_data.get("seat_map")
        if not upload:
            return None
        if upload.size > SEAT_MAP_MAX_BYTES:
            self.add_error("seat_map", f"at most {SEAT_MAP_MAX_BYTES // (1024 * 1024)} MB")
            return None
        try:
            return upload.read().decode("utf-8-sig")
        except UnicodeDecodeError:
            self.add_error("seat_map", "the file is not UTF-8 text")
            return None


class PricesForm(forms.Form):
    """New prices of an on-sale event's categories: a field per category."""

    def __init__(self, *args, categories, currency: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.currency = currency
        for category in categories:
            self.fields[f"price_{category.code}"] = forms.CharField(
                label=f"{category.name} ({category.code})",
                max_length=20,
                initial=minor_to_price(category.price_amount, currency),
                widget=forms.TextInput(attrs={"inputmode": "decimal"}),
            )

    def prices(self) -> dict[str, int] | None:
        """The prices in minor units by category code, or None (refused on
        their fields)."""
        prices: dict[str, int] = {}
        for name in list(self.fields):
            try:
                prices[name.removeprefix("price_")] = price_to_minor(
                    self.cleaned_data[name], self.currency
                )
            except PriceInvalid as exc:
                self.add_error(name, str(exc))
        return None if self.errors else prices
