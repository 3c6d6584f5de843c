"""The seat map's purchase form: the same fields as ``POST /api/purchases/``
(seats or a quantity, a payment method) and the Idempotency-Key as a hidden
field drawn when the page is rendered, so that a double click or a reload
sends the same key and makes one purchase (docs/api.md, "Pages for buyers")."""

from __future__ import annotations

import secrets

from django import forms
from django.conf import settings
from django.core.validators import MaxValueValidator

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


def new_idempotency_key() -> str:
    """A key for one purchase form, drawn when the page is rendered."""
    return f"page-{secrets.token_urlsafe(24)}"


class SeatRefsField(forms.Field):
    """The seats ticked on the map. Which seats exist and are free is the
    service's to say (under its row locks), not the form's: the map may be a
    few seconds old."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value):
        refs = [str(ref).strip() for ref in (value or []) if str(ref).strip()]
        duplicates = sorted({ref for ref in refs if refs.count(ref) > 1})
        if duplicates:
            raise forms.ValidationError(f"Seat {', '.join(duplicates)} was chosen twice.")
        if any(len(ref) > 10 for ref in refs):
            raise forms.ValidationError("That is not a seat of this hall.")
        limit = settings.MAX_SEATS_PER_PURCHASE
        if len(refs) > limit:
            raise forms.ValidationError(
                f"At most {limit} seats per purchase: you chose {len(refs)}."
            )
        return refs


class PurchaseForm(forms.Form):
    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=255)
    seats = SeatRefsField(required=False)
    quantity = forms.IntegerField(
        required=False,
        min_value=1,
        label="How many seats",
        help_text="With no seat chosen on the map: we pick the best seats side by side.",
        widget=forms.NumberInput(attrs={"inputmode": "numeric"}),
    )
    payment_method = forms.CharField(max_length=100, label="Payment method")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        limit = settings.MAX_SEATS_PER_PURCHASE
        quantity = self.fields["quantity"]
        # The limit is read per form, so that it follows the setting (as the API's).
        quantity.validators.append(
            MaxValueValidator(limit, message=f"At most {limit} seats per purchase.")
        )
        quantity.widget.attrs.update(min=1, max=limit)
        method = self.fields["payment_method"]
        if settings.FAKE_GATEWAY_ENABLED:
            method.widget = forms.Select(choices=TEST_PAYMENT_METHODS)
        else:
            method.help_text = "The payment method token your card processor gave you."
            method.widget = forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"})

    def clean_idempotency_key(self) -> str:
        key = self.cleaned_data["idempotency_key"]
        # The API's rule for its Idempotency-Key header (docs/api.md, "Purchases").
        if not key.isascii() or not key.isprintable():
            raise forms.ValidationError("This form is damaged; reload the page.")
        return key

    def clean(self):
        cleaned = super().clean()
        data = self.cleaned_data  # what Form.clean returned (the stubs say "or None")
        if not self.errors and not data.get("seats") and not data.get("quantity"):
            raise forms.ValidationError(
                "Choose your seats on the map, or say how many seats you want.",
                code="nothing_chosen",
            )
        return cleaned
