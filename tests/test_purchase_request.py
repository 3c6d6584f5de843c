"""The plain bodies of ``POST /api/purchases/`` are judged without building
the serializer (purchases/serializers.py: plain_purchase_request). For every
body it takes, its answer is the serializer's ``validated_data``; every
other body goes to the serializer, which words the refusal."""

import pytest
from django.test import override_settings

from purchases.serializers import PurchaseRequestSerializer, plain_purchase_request

VISA = "pm_card_visa"

# Bodies the plain path takes: what clients send.
PLAIN = [
    {"event": 1, "seats": ["A1"], "payment_method": VISA},
    {"event": 7, "seats": ["A1", "B10", "E9"], "payment_method": VISA},
    {"event": 2**40, "seats": ["Z" * 10], "payment_method": "x"},
    {"event": 3, "quantity": 1, "payment_method": VISA},
    {"event": 3, "quantity": 4, "payment_method": "p" * 100},
    {"event": 3, "seats": ["A1"], "payment_method": VISA, "note": "ignored", "user": 9},
    {"event": 3, "seats": [f"S{i}" for i in range(8)], "payment_method": VISA},
]

# Bodies it leaves to the serializer: each refused by it, or accepted in a
# form the plain path does not take (a string id, spaces to strip).
OTHERS: list[object] = [
    [],
    "event=1",
    None,
    {},
    {"event": 1, "payment_method": VISA},
    {"event": 1, "seats": ["A1"], "quantity": 1, "payment_method": VISA},
    {"event": "1", "seats": ["A1"], "payment_method": VISA},
    {"event": 1.0, "seats": ["A1"], "payment_method": VISA},
    {"event": True, "seats": ["A1"], "payment_method": VISA},
    {"event": 0, "seats": ["A1"], "payment_method": VISA},
    {"event": -3, "seats": ["A1"], "payment_method": VISA},
    {"event": None, "seats": ["A1"], "payment_method": VISA},
    {"seats": ["A1"], "payment_method": VISA},
    {"event": 1, "seats": [], "payment_method": VISA},
    {"event": 1, "seats": "A1", "payment_method": VISA},
    {"event": 1, "seats": {"A1": 1}, "payment_method": VISA},
    {"event": 1, "seats": ["A1", "A1"], "payment_method": VISA},
    {"event": 1, "seats": [" A1"], "payment_method": VISA},
    {"event": 1, "seats": [""], "payment_method": VISA},
    {"event": 1, "seats": ["A" * 11], "payment_method": VISA},
    {"event": 1, "seats": [1], "payment_method": VISA},
    {"event": 1, "seats": [None], "payment_method": VISA},
    {"event": 1, "seats": ["A\x001"], "payment_method": VISA},
    {"event": 1, "seats": ["\ud800"], "payment_method": VISA},
    {"event": 1, "seats": ["É1"], "payment_method": VISA},
    {"event": 1, "seats": [f"S{i}" for i in range(9)], "payment_method": VISA},
    {"event": 1, "quantity": 0, "payment_method": VISA},
    {"event": 1, "quantity": 9, "payment_method": VISA},
    {"event": 1, "quantity": "2", "payment_method": VISA},
    {"event": 1, "quantity": 2.0, "payment_method": VISA},
    {"event": 1, "quantity": True, "payment_method": VISA},
    {"event": 1, "quantity": None, "payment_method": VISA},
    {"event": 1, "seats": ["A1"]},
    {"event": 1, "seats": ["A1"], "payment_method": ""},
    {"event": 1, "seats": ["A1"], "payment_method": " pm_card_visa "},
    {"event": 1, "seats": ["A1"], "payment_method": "p" * 101},
    {"event": 1, "seats": ["A1"], "payment_method": 42},
    {"event": 1, "seats": ["A1"], "payment_method": None},
]


def _serializer(body):
    payload = PurchaseRequestSerializer(data=body)
    return dict(payload.validated_data) if payload.is_valid() else None


@pytest.fixture(autouse=True)
def _limit(settings):
    settings.MAX_SEATS_PER_PURCHASE = 8


@pytest.mark.parametrize("body", PLAIN)
def test_a_plain_body_is_taken_with_the_serializers_answer(body):
    plain = plain_purchase_request(body)

    assert plain is not None
    assert plain == _serializer(body)
    assert [type(v) for v in plain.values()] == [type(v) for v in _serializer(body).values()]


@pytest.mark.parametrize("body", OTHERS)
def test_any_other_body_is_left_to_the_serializer(body):
    assert plain_purchase_request(body) is None


def test_the_limit_is_the_settings_when_the_body_is_judged():
    body = {"event": 1, "quantity": 9, "payment_method": VISA}
    with override_settings(MAX_SEATS_PER_PURCHASE=9):
        assert plain_purchase_request(body) == _serializer(body) == body
    assert plain_purchase_request(body) is None and _serializer(body) is None
