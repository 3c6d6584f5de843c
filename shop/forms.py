"""The seat map's purchase form: the same fields as ``POST /api/purchases/``
(seats or a quantity, a payment method) and the Idempotency-Key as a hidden
field drawn when the page is rendered, so that a double click or a reload
sends the same key and makes one purchase (docs/api.md, "Pages for buyers")."""

from __future__ import annotations

import re
import secrets
from typing import Any

from django import forms
from django.conf import settings

from purchases.serializers import PurchaseRequestSerializer, plain_purchase_request

# The fake gateway's test payment methods (docs/api.md, "Test payment methods"),
# offered only while it is on.
TEST_PAYMENT_METHODS = [
    ("pm_card_visa", "Test card: charges (pm_card_visa)"),
    ("pm_card_chargeDeclined", "Test card: declined (pm_card_chargeDeclined)"),
    ("pm_card_timeout_charged", "Test card: charges, answer lost (pm_card_timeout_charged)"),
    (
        "pm_card_timeout_not_charged",
        "Test card: first call lost, then charges (pm_card_timeout_not_charged)",
    ),
    ("pm_card_unreachable", "Test card: bank unreachable (pm_card_unreachable)"),
]
TEST_METHOD_TOKENS = frozenset(token for token, _ in TEST_PAYMENT_METHODS)


def stripe_mode() -> bool:
    """Stripe is the processor (docs/api.md, "Paying with Stripe"): the
    buyer's browser makes the payment method with Stripe.js, and the form
    posts only its id."""
    return settings.PAYMENT_GATEWAY == "stripe"


def offers_test_methods() -> bool:
    """The fake gateway's test cards are offered while it is the processor
    and on; they mean nothing to Stripe."""
    return bool(settings.FAKE_GATEWAY_ENABLED) and not stripe_mode()


def new_idempotency_key() -> str:
    """A key for one purchase form, drawn when the page is rendered."""
    return f"page-{secrets.token_urlsafe(24)}"


class SeatRefsField(forms.Field):
    """The seats ticked on the map, as posted: the API's request serializer
    judges them (purchases/serializers.py). Which seats exist and are free
    is the service's to say (under its row locks), not the form's: the map
    may be a few seconds old."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value):
        return list(value or [])


class PostedField(forms.Field):
    """A value as posted, for the serializer to judge (Django's CharField
    would strip it and refuse a NUL byte itself, in words of its own)."""

    def to_python(self, value):
        return value


# A quantity typed as digits (an HTML form sends text) is read as the number
# it spells; any other text goes to the serializer as text, which it refuses
# as the API refuses a quantity that is not a JSON integer. Bounded: Python
# will not read a number of thousands of digits, and none is a quantity.
_NUMBER = re.compile(r"-?[0-9]{1,30}")


class PurchaseForm(forms.Form):
    """The seat map's form. What a purchase request may be is the API's to
    say: the form makes what the page posts into the body of ``POST
    /api/purchases/`` for the page's event and judges it with the API's
    request serializer, so that the page and the API refuse the same inputs
    (tests/bad_inputs.py), with the same words, each on its field. What is
    the page's own is the transport: text for a quantity, and the
    Idempotency-Key as a hidden field. ``request`` is then the serializer's
    ``validated_data``."""

    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=255)
    seats = SeatRefsField(required=False)
    quantity = PostedField(
        required=False,
        label="How many seats",
        help_text="With no seat chosen on the map: we pick the best seats side by side.",
        widget=forms.NumberInput(attrs={"inputmode": "numeric"}),
    )
    # Best available among one price category's seats (the API's "category").
    category = forms.CharField(
        required=False,
        label="In",
        widget=forms.Select(choices=[("", "any part of the hall")]),
    )
    payment_method = PostedField(required=False, label="Payment method")

    def __init__(self, *args, event_id: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.event_id = event_id
        self.request: dict[str, Any] = {}
        quantity = self.fields["quantity"]
        # The limit is read per form, so that it follows the setting (as the API's).
        quantity.widget.attrs.update(min=1, max=settings.MAX_SEATS_PER_PURCHASE)
        method = self.fields["payment_method"]
        if stripe_mode():
            # The id Stripe.js made in the browser (shop/static/shop/shop.js);
            # the card's number never comes here.
            method.label = "Card"
            method.widget = forms.HiddenInput()
        elif offers_test_methods():
            method.widget = forms.Select(choices=TEST_PAYMENT_METHODS)
        else:
            method.help_text = "The payment method token your card processor gave you."
            method.widget = forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"})

    def offer_categories(self, codes: list[str]) -> None:
        """The price categories the seat map has, to choose best available in."""
        widget = self.fields["category"].widget
        widget.choices = [("", "any part of the hall"), *((c, c.replace("-", " ")) for c in codes)]

    def clean_idempotency_key(self) -> str:
        key = self.cleaned_data["idempotency_key"]
        # The API's rule for its Idempotency-Key header (docs/api.md, "Purchases").
        if not key.isascii() or not key.isprintable():
            raise forms.ValidationError("This form is damaged; reload the page.")
        return key

    def clean(self):
        cleaned = super().clean()
        data = self.cleaned_data  # what Form.clean returned (the stubs say "or None")
        body: dict[str, Any] = {"event": self.event_id}
        # Left out when not given, as a JSON body leaves them out: both, or
        # neither, is the serializer's to refuse.
        if data.get("seats"):
            body["seats"] = data["seats"]
        quantity = (data.get("quantity") or "").strip()
        if quantity:
            body["quantity"] = int(quantity) if _NUMBER.fullmatch(quantity) else quantity
            if data.get("category"):
                body["category"] = data["category"]
        if data.get("payment_method") is not None:
            body["payment_method"] = data["payment_method"]
        request = plain_purchase_request(body)
        if request is None:
            payload = PurchaseRequestSerializer(data=body)
            if not payload.is_valid():
                for name, errors in payload.errors.items():
                    self._refused(name, errors, body=body)
                return cleaned
            request = dict(payload.validated_data)
        self.request = request
        return cleaned

    def _refused(self, name: str, errors, *, body: dict[str, Any]) -> None:
        # The serializer's words for the choice are for a JSON body; on the
        # page the choice is ticks on the map or a number.
        if name == "seats" and "seats" not in body and "quantity" not in body:
            errors = ["Choose your seats on the map, or say how many seats you want."]
        elif name == "quantity" and "seats" in body:
            errors = ["Tick seats on the map or say how many seats you want, not both."]
        field = name if name in self.fields else None  # the event is the page's URL
        for message in _messages(errors):
            self.add_error(field, message)


def _messages(errors) -> list[str]:
    """The serializer's messages, flat: a list field's are per item."""
    if isinstance(errors, dict):
        return list(dict.fromkeys(m for value in errors.values() for m in _messages(value)))
    if isinstance(errors, list):
        return list(dict.fromkeys(m for value in errors for m in _messages(value)))
    return [str(errors)]


class CancelForm(forms.Form):
    """The confirmation of a buyer's cancellation
    (docs/refunds.md, "Who asks"): the seats the buyer saw the amount for,
    and the form's own Idempotency-Key, drawn when the confirmation was
    rendered, so that a double click or a reload cancels once
    (``purchase_cancel`` answers the same refund to the same key)."""

    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=255)
    seats = SeatRefsField(required=False)

    def clean_idempotency_key(self) -> str:
        key = self.cleaned_data["idempotency_key"]
        if not key.isascii() or not key.isprintable():
            raise forms.ValidationError("This form is damaged; reload the page.")
        return key

    def clean_seats(self) -> list[str]:
        seats = self.cleaned_data["seats"]
        if any(not isinstance(ref, str) or not 0 < len(ref) <= 10 for ref in seats):
            raise forms.ValidationError("This form is damaged; reload the page.")
        return seats
