"""The plain bodies of ``POST /api/purchases/`` are judged without building
the serializer (purchases/serializers.py: plain_purchase_request). For every
body it takes, its answer is the serializer's ``validated_data``; every
other body goes to the serializer, which words the refusal."""

import pytest
from django.test import override_settings

from purchases.serializers import PurchaseRequestSerializer, plain_purchase_request

from .bad_inputs import BAD_INPUTS, LIMIT, VISA

# Bodies the plain path takes: what clients send.
PLAIN = [
    {"event": 1, "seats": ["A1"], "payment_method": VISA},
    {"event": 7, "seats": ["A1", "B10", "E9"], "payment_method": VISA},
    {"event": 2**40, "seats": ["Z" * 10], "payment_method": "x"},
    {"event": 3, "quantity": 1, "payment_method": VISA},
    {"event": 3, "quantity": 4, "payment_method": "p" * 100},
    {"event": 3, "seats": ["A1"], "payment_method": VISA, "note": "ignored", "user": 9},
    {"event": 3, "seats": [f"S{i}" for i in range(8)], "payment_method": VISA},
    {"event": 3, "seats": ["Z" * 32], "payment_method": VISA},
    {"event": 3, "quantity": 2, "category": "stalls", "payment_method": VISA},
]

# Bodies it leaves to the serializer: every bad input of tests/bad_inputs.py
# (the serializer refuses each, and the seat map's form refuses those a form
# can say: tests/test_bad_inputs.py), bodies that are no object, and bodies
# the serializer accepts in a form the plain path does not take (spaces to
# strip, a number for text, a ref that is not ASCII).
OTHERS: list[object] = [
    [],
    "event=1",
    None,
    {},
    {"event": 1, "seats": [" A1"], "payment_method": VISA},
    {"event": 1, "seats": [1], "payment_method": VISA},
    {"event": 1, "seats": ["É1"], "payment_method": VISA},
    {"event": 1, "seats": ["A1"], "payment_method": " pm_card_visa "},
    {"event": 1, "seats": ["A1"], "payment_method": 42},
    *(bad.body() for bad in BAD_INPUTS),
]


def _serializer(body):
    payload = PurchaseRequestSerializer(data=body)
    return dict(payload.validated_data) if payload.is_valid() else None


@pytest.fixture(autouse=True)
def _limit(settings):
    settings.MAX_SEATS_PER_PURCHASE = LIMIT


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
