"""The bad inputs of a purchase request: one table for ``POST /api/purchases/``
(its request serializer, purchases/serializers.py) and for the seat map's
purchase form (shop/forms.py), which must refuse the same inputs
(tests/test_bad_inputs.py feeds it to both; tests/test_purchase_request.py
holds the serializer's fast path to it).

Each input is a good body with some fields changed or left out: a body the
request serializer refuses (with no database read), naming ``field``. The
page sends the same input as form data when a form can say it
(:meth:`BadInput.form`); what only JSON can say (a number where text goes,
a list where one value goes, an event other than the page's own, a lone
surrogate, which UTF-8 cannot carry) is the API's alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VISA = "pm_card_visa"
# The seat limit the table is written for: its users set MAX_SEATS_PER_PURCHASE to it.
LIMIT = 8


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # a field left out of the body


@dataclass(frozen=True)
class BadInput:
    name: str
    field: str  # the field the refusal names (the API's "field")
    changes: dict[str, Any]  # on a good body; MISSING leaves a field out

    def body(self, event_id: int = 1) -> dict[str, Any]:
        """The JSON body of ``POST /api/purchases/`` for the event ``event_id``."""
        body: dict[str, Any] = {"event": event_id, "seats": ["A1"], "payment_method": VISA}
        for key, value in self.changes.items():
            if value is MISSING:
                body.pop(key, None)
            else:
                body[key] = value
        return body

    def form(self) -> dict[str, Any] | None:
        """The same input as the seat map's form posts it (the event is the
        page's), or None when a form cannot say it."""
        body = self.body(event_id=1)
        event = body.pop("event", MISSING)
        if type(event) is not int or event != 1:
            return None
        data: dict[str, Any] = {}
        seats = body.pop("seats", [])
        if type(seats) is not list or not all(_sayable(ref) for ref in seats):
            return None
        if seats:
            data["seats"] = seats
        if "quantity" in body:
            quantity = body.pop("quantity")
            if type(quantity) is not int:
                return None
            data["quantity"] = str(quantity)
        if "category" in body:
            # The page offers a category for a quantity only, and "" is its
            # "any part of the hall": neither refusal can come from a form.
            category = body.pop("category")
            if "quantity" not in data or not _sayable(category) or category == "":
                return None
            data["category"] = category
        if "payment_method" in body:
            method = body.pop("payment_method")
            if not _sayable(method):
                return None
            data["payment_method"] = method
        assert not body, body  # every field of the request is one of the form's
        return data


def _sayable(value: object) -> bool:
    """Text a browser can post: UTF-8 carries no lone surrogate."""
    if type(value) is not str:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


BAD_INPUTS = [
    # the choice: exactly one of seats and quantity
    BadInput("neither-seats-nor-quantity", "seats", {"seats": MISSING}),
    BadInput("seats-and-quantity", "quantity", {"quantity": 1}),
    # the seats
    BadInput("no-seats", "seats", {"seats": []}),
    BadInput("duplicate-seats", "seats", {"seats": ["A1", "A1"]}),
    BadInput("blank-seat", "seats", {"seats": [""]}),
    BadInput("space-seat", "seats", {"seats": ["   "]}),
    BadInput("long-seat", "seats", {"seats": ["A" * 33]}),
    BadInput("nul-in-seat", "seats", {"seats": ["A\x001"]}),
    BadInput("nul-seat", "seats", {"seats": ["\x00"]}),
    BadInput("surrogate-seat", "seats", {"seats": ["\ud800"]}),
    BadInput("too-many-seats", "seats", {"seats": [f"S{i}" for i in range(LIMIT + 1)]}),
    BadInput("seats-a-string", "seats", {"seats": "A1"}),
    BadInput("seats-an-object", "seats", {"seats": {"A1": 1}}),
    BadInput("seat-null", "seats", {"seats": [None]}),
    # best available
    BadInput("quantity-zero", "quantity", {"seats": MISSING, "quantity": 0}),
    BadInput("quantity-negative", "quantity", {"seats": MISSING, "quantity": -2}),
    BadInput("quantity-over-the-limit", "quantity", {"seats": MISSING, "quantity": LIMIT + 1}),
    BadInput("quantity-huge", "quantity", {"seats": MISSING, "quantity": 10**30}),
    BadInput("quantity-a-string", "quantity", {"seats": MISSING, "quantity": "2"}),
    BadInput("quantity-a-fraction", "quantity", {"seats": MISSING, "quantity": 2.0}),
    BadInput("quantity-a-bool", "quantity", {"seats": MISSING, "quantity": True}),
    BadInput("quantity-null", "quantity", {"seats": MISSING, "quantity": None}),
    # best available in one price category
    BadInput("category-with-seats", "category", {"category": "stalls"}),
    BadInput("category-blank", "category", {"seats": MISSING, "quantity": 1, "category": ""}),
    BadInput(
        "category-too-long", "category", {"seats": MISSING, "quantity": 1, "category": "c" * 33}
    ),
    # the payment method
    BadInput("no-payment-method", "payment_method", {"payment_method": MISSING}),
    BadInput("blank-payment-method", "payment_method", {"payment_method": ""}),
    BadInput("space-payment-method", "payment_method", {"payment_method": "   "}),
    BadInput("long-payment-method", "payment_method", {"payment_method": "p" * 101}),
    BadInput("nul-in-payment-method", "payment_method", {"payment_method": "pm_\x00visa"}),
    BadInput("payment-method-null", "payment_method", {"payment_method": None}),
    # the event (a page's event is its URL's)
    BadInput("event-zero", "event", {"event": 0}),
    BadInput("event-negative", "event", {"event": -3}),
    BadInput("event-a-bool", "event", {"event": True}),
    BadInput("event-null", "event", {"event": None}),
    BadInput("event-a-word", "event", {"event": "abc"}),
    BadInput("event-a-numeric-string", "event", {"event": "1"}),
    BadInput("event-a-fraction", "event", {"event": 1.0}),
    BadInput("no-event", "event", {"event": MISSING}),
]

# What a form can say, for the page's tests.
FORM_INPUTS = [bad for bad in BAD_INPUTS if bad.form() is not None]
