"""One table of bad purchase inputs (tests/bad_inputs.py), refused alike by
``POST /api/purchases/`` and by the seat map's form: a 400 naming the same
field, nothing written, never a 500 (a NUL byte in a seat ref reached the
seat look-up from the page and answered 500)."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from django.test import Client

from purchases.serializers import PurchaseRequestSerializer
from shop.forms import PurchaseForm

from .bad_inputs import BAD_INPUTS, FORM_INPUTS, LIMIT, VISA, BadInput
from .conftest import new_key, row_counts
from .factories import EventFactory

pytestmark = pytest.mark.django_db

HALL = [f"{row}{n}" for row in "AB" for n in range(1, 11)]


@pytest.fixture(autouse=True)
def _limit(settings):
    settings.MAX_SEATS_PER_PURCHASE = LIMIT


@pytest.fixture
def hall():
    return EventFactory(seats=HALL)


def _ids(inputs: list[BadInput]) -> list[str]:
    return [bad.name for bad in inputs]


def test_the_table_has_inputs_a_form_can_say_and_the_nul_byte_among_them():
    assert {"nul-in-seat", "nul-in-payment-method", "seats-and-quantity"} <= set(_ids(FORM_INPUTS))
    assert "surrogate-seat" not in _ids(FORM_INPUTS)  # UTF-8 cannot carry it


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=_ids(BAD_INPUTS))
def test_the_request_serializer_refuses_it_naming_the_field(bad):
    payload = PurchaseRequestSerializer(data=bad.body())

    assert not payload.is_valid()
    assert next(iter(payload.errors)) == bad.field, payload.errors


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=_ids(BAD_INPUTS))
def test_the_api_answers_400_naming_the_field(alice_api, hall, bad):
    body = bad.body(event_id=hall.pk)

    answer = alice_api.post(
        "/api/purchases/",
        json.dumps(body),  # ASCII, escapes and all: a lone surrogate too
        content_type="application/json",
        headers={"Idempotency-Key": new_key()},
    )

    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] == "invalid"
    assert answer.json()["field"] == bad.field
    assert row_counts() == dict.fromkeys(row_counts(), 0)


@pytest.mark.parametrize("bad", FORM_INPUTS, ids=_ids(FORM_INPUTS))
def test_the_page_form_refuses_it_naming_the_field(hall, bad):
    form = PurchaseForm({"idempotency_key": "page-k", **bad.form()}, event_id=hall.pk)

    assert not form.is_valid()
    assert list(form.errors) == [bad.field], form.errors


@pytest.mark.parametrize("bad", FORM_INPUTS, ids=_ids(FORM_INPUTS))
def test_the_page_answers_400_with_the_seat_map_and_the_problem(alice, hall, bad):
    client = Client()
    client.force_login(alice)

    answer = client.post(
        f"/events/{hall.pk}/", {"idempotency_key": f"page-{uuid.uuid4()}", **bad.form()}
    )

    assert answer.status_code == 400, answer.content[:2000]
    page = answer.content.decode()
    found = re.search(r'<div class="problem"[^>]*data-error="([a-z_]+)"', page)
    assert found is not None and found.group(1) == "invalid", page
    assert f'data-error-field="{bad.field}"' in page
    assert 'data-seat="A1"' in page  # the seat map again, to choose anew
    assert row_counts() == dict.fromkeys(row_counts(), 0)


# Good inputs, as the API reads them and as the page's form sends them: the
# form's answer is the serializer's.
GOOD = [
    ({"seats": ["A1"], "payment_method": VISA}, {"seats": ["A1"], "payment_method": VISA}),
    (
        {"seats": ["A1", "B10"], "payment_method": " tok_x "},
        {"seats": ["A1", "B10"], "payment_method": "tok_x"},
    ),
    ({"seats": [" A2 "], "payment_method": VISA}, {"seats": ["A2"], "payment_method": VISA}),
    ({"quantity": "3", "payment_method": VISA}, {"quantity": 3, "payment_method": VISA}),
    (
        {"quantity": str(LIMIT), "payment_method": VISA},
        {"quantity": LIMIT, "payment_method": VISA},
    ),
]


@pytest.mark.parametrize(("posted", "body"), GOOD)
def test_the_page_form_takes_what_the_api_takes_with_the_same_answer(hall, posted, body):
    form = PurchaseForm({"idempotency_key": "page-k", **posted}, event_id=hall.pk)
    payload = PurchaseRequestSerializer(data={"event": hall.pk, **body})

    assert payload.is_valid(), payload.errors
    assert form.is_valid(), form.errors
    assert form.request == dict(payload.validated_data)
