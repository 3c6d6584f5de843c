"""The admin shows money and inventory but never edits them: seats, price
categories, reservations, sagas, their history, daily sales and the fake
gateway's tables change only through the services
(``config.admin.ReadOnlyAdminMixin``). Even a superuser is refused every
add, change and delete; looking stays allowed."""

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.contrib.admin.utils import quote
from django.db import models
from django.forms.models import model_to_dict
from django.urls import reverse

from payments.fake_gateway.models import (
    FakeCharge,
    FakeDroppedCharge,
    FakeIdempotentAnswer,
    FakeIntent,
    FakeRequest,
)
from purchases.models import (
    DailySales,
    Event,
    PriceCategory,
    PurchaseSaga,
    Reservation,
    SagaHistory,
    Seat,
)
from purchases.services import saga_charge

from .conftest import start_purchase
from .factories import UserFactory


@dataclass
class World:
    sold: PurchaseSaga
    dropped: PurchaseSaga


@pytest.fixture
def world(alice, event, gateway) -> World:
    """A sold seat (with its charge at the fake) and a charge the fake dropped."""
    sold = saga_charge(saga_id=start_purchase(alice, event, seats=["A1"]).pk)
    assert sold.state == "CONFIRMED"
    dropped = saga_charge(
        saga_id=start_purchase(
            alice, event, seats=["A2"], payment_method="pm_card_timeout_not_charged"
        ).pk
    )
    assert dropped.state == "UNKNOWN"
    return World(sold=sold, dropped=dropped)


@pytest.fixture
def root_client(client, db):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


@dataclass
class Case:
    model: type[models.Model]
    row: Callable[[World], models.Model | None]
    # Form data a hand-made row (add) or a hand edit (change) would post.
    new: dict
    edit: dict


CASES = {
    "seat": Case(
        Seat,
        lambda w: Seat.objects.get(event=w.sold.event, ref="A1"),
        new={"ref": "B9", "row": "B", "number": 9},
        edit={"price_amount": 1, "status": "available"},
    ),
    "reservation": Case(
        Reservation,
        lambda w: w.sold.reservation,
        new={"ref": "RHANDMADE"},
        edit={"status": "CANCELLED", "total_amount": 1},
    ),
    "purchasesaga": Case(
        PurchaseSaga,
        lambda w: w.sold,
        new={"intent_id": "pi_handmade"},
        edit={"state": "COMPENSATED"},
    ),
    "pricecategory": Case(
        PriceCategory,
        lambda w: PriceCategory.objects.create(
            event=w.sold.event, code="stalls", name="Stalls", price_amount=2500, currency="EUR"
        ),
        new={"code": "handmade", "name": "Handmade", "price_amount": 1},
        edit={"price_amount": 1},
    ),
    "sagahistory": Case(
        SagaHistory,
        lambda w: w.sold.history.order_by("id").first(),
        new={"to_state": "CONFIRMED", "reason": "handmade"},
        edit={"to_state": "COMPENSATED"},
    ),
    "dailysales": Case(
        DailySales,
        lambda w: DailySales.objects.create(
            event=w.sold.event, day="2026-12-02", currency="EUR", confirmed_count=1
        ),
        new={"day": "2026-12-03", "currency": "EUR"},
        edit={"confirmed_count": 99},
    ),
    "fakeintent": Case(
        FakeIntent,
        lambda w: FakeIntent.objects.get(pk=w.sold.intent_id),
        new={"intent_id": "pi_handmade", "charges-TOTAL_FORMS": "0", "charges-INITIAL_FORMS": "0"},
        edit={"status": "refunded", "amount": 1},
    ),
    "fakecharge": Case(
        FakeCharge,
        lambda w: FakeCharge.objects.get(intent_id=w.sold.intent_id),
        new={},
        edit={"status": "refunded", "amount": 1},
    ),
    "fakeidempotentanswer": Case(
        FakeIdempotentAnswer,
        lambda w: FakeIdempotentAnswer.objects.get(intent_id=w.sold.intent_id),
        new={"idempotency_key": "handmade"},
        edit={"status_code": 500},
    ),
    "fakedroppedcharge": Case(
        FakeDroppedCharge,
        lambda w: FakeDroppedCharge.objects.get(intent_id=w.dropped.intent_id),
        new={"idempotency_key": "handmade"},
        edit={"intent_id": "pi_elsewhere"},
    ),
    "fakerequest": Case(
        FakeRequest,
        lambda w: FakeRequest.objects.filter(intent_id=w.sold.intent_id).first(),
        new={},
        edit={"status_code": 500, "timed_out": True},
    ),
}


def _url(model, view: str, *args) -> str:
    # The admin's own quoting of a key in a URL: a fake charge "ch_23…" is
    # read back as "ch#…" without it (the admin then redirects: 1 run in 40).
    opts = model._meta
    return reverse(
        f"admin:{opts.app_label}_{opts.model_name}_{view}", args=[quote(a) for a in args]
    )


def _form(obj: models.Model, /, **overrides) -> dict:
    """What the admin's form would post for ``obj``, with ``overrides``."""
    data = {}
    for name, value in {**model_to_dict(obj), **overrides}.items():
        if value is None or value is False:
            continue  # an unchecked box is absent
        if value is True:
            value = "on"
        elif isinstance(value, list):  # many-to-many: the related rows' pks
            value = [v.pk if isinstance(v, models.Model) else v for v in value]
        elif isinstance(value, dict):
            value = json.dumps(value)
        data[name] = value
    return data


def _snapshot(model) -> list[dict]:
    return list(model.objects.order_by("pk").values())


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(CASES))
def test_a_superuser_can_look_but_not_write(root_client, world, name):
    case = CASES[name]
    row = case.row(world)
    assert row is not None
    before = _snapshot(case.model)

    # adding: neither the form nor a post
    assert root_client.get(_url(case.model, "add")).status_code == 403
    assert root_client.post(_url(case.model, "add"), _form(row, **case.new)).status_code == 403
    # changing
    change = _url(case.model, "change", row.pk)
    assert root_client.post(change, _form(row, **case.edit)).status_code == 403
    # deleting: one row, or the changelist's bulk action
    delete = _url(case.model, "delete", row.pk)
    assert root_client.get(delete).status_code == 403
    assert root_client.post(delete, {"post": "yes"}).status_code == 403
    root_client.post(
        _url(case.model, "changelist"),
        {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"},
    )

    assert _snapshot(case.model) == before

    # looking: the list and the row's page, with nothing to save
    listed = root_client.get(_url(case.model, "changelist"))
    assert listed.status_code == 200
    assert "delete_selected" not in listed.content.decode()
    page = root_client.get(change)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="_save"' not in html and 'name="_continue"' not in html
    assert "deletelink" not in html


@pytest.mark.django_db
def test_a_sold_seats_price_and_status_cannot_be_edited(root_client, world):
    seat = Seat.objects.get(event=world.sold.event, ref="A1")
    assert (seat.status, seat.price_amount) == ("sold", 2500)

    response = root_client.post(
        _url(Seat, "change", seat.pk), _form(seat, price_amount=1, status="available")
    )

    assert response.status_code == 403
    seat.refresh_from_db()
    assert (seat.status, seat.price_amount) == ("sold", 2500)


@pytest.mark.django_db
def test_events_stay_editable(root_client, world):
    # The catalogue (name, start time) is not money nor inventory.
    event = world.sold.event

    response = root_client.post(
        _url(Event, "change", event.pk),
        {
            "name": "renamed",
            "starts_at_0": "2027-01-02",
            "starts_at_1": "20:00:00",
            # The price categories' table (read-only) posts its management form.
            "price_categories-TOTAL_FORMS": "0",
            "price_categories-INITIAL_FORMS": "0",
        },
    )

    assert response.status_code == 302
    event.refresh_from_db()
    assert event.name == "renamed"
