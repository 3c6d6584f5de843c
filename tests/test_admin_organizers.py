"""The operators' admin with organizers (docs/operations.md, "Admin"): every
list whose rows belong to an event or an organizer shows the organizer and
filters by it, with two organizers' data present; the lists cost the same
queries however many organizers' rows they show; the event's page shows the
seller's rules and price categories without letting an operator change
them, and a seat its place on the map.

The purchases are real (the services, the in-process fake gateway); daily
sales rows are written here (test data: the analytics consumer has its own
tests).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from organizers.models import Organizer
from purchases.models import (
    DailySales,
    Event,
    EventStatus,
    PriceCategory,
    PurchaseSaga,
    Seat,
)
from purchases.ops.admin import EventAdmin
from purchases.services import saga_charge
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.services import webhook_endpoint_create

from .conftest import start_purchase
from .factories import EventFactory, OrganizerFactory, UserFactory

pytestmark = pytest.mark.django_db

HOOK = "http://127.0.0.1:9/hook"


@pytest.fixture(autouse=True)
def local_urls(settings):
    # The endpoints' URL is never called here (nothing drains the outbox).
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True


@pytest.fixture
def root(client, db):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


@dataclass
class Seller:
    organizer: Organizer
    event: Event
    saga: PurchaseSaga


def seller(slug: str, buyer) -> Seller:
    """An organizer with an endpoint, an event with two categories, a
    confirmed purchase (saga, reservation, history, a delivery) and a day's
    sales."""
    organizer = OrganizerFactory(slug=slug, name=f"{slug.title()} Hall")
    webhook_endpoint_create(
        url=HOOK, events=["purchase.confirmed"], description="", organizer=organizer
    )
    event = EventFactory(organizer=organizer, name=f"{slug} night", seats=["A1", "A2", "B1"])
    PriceCategory.objects.bulk_create(
        PriceCategory(event=event, code=code, name=name, price_amount=price, currency="EUR")
        for code, name, price in (("stalls", "Stalls", 2500), ("back", "Back row", 1500))
    )
    Seat.objects.filter(event=event, row="A").update(section="Stalls", category="stalls")
    Seat.objects.filter(event=event, row="B").update(
        section="Stalls", category="back", price_amount=1500
    )
    saga = saga_charge(saga_id=start_purchase(buyer, event, seats=["A1"]).pk)
    assert saga.state == "CONFIRMED"
    DailySales.objects.create(
        event=event,
        day=date(2026, 12, 2),
        currency="EUR",
        confirmed_count=1,
        confirmed_amount=2500,
    )
    return Seller(organizer, event, saga)


@pytest.fixture
def sellers(alice, gateway) -> tuple[Seller, Seller]:
    return seller("north", alice), seller("south", alice)


@dataclass(frozen=True)
class ListCase:
    url_name: str
    # The organizer filter's query parameter.
    param: str
    # Whose a listed row is (an organizer's id; None: platform-wide).
    owner: Callable[[Any], int | None]


CASES = {
    "sagas": ListCase(
        "purchases_purchasesaga", "event__organizer__id__exact", lambda r: r.event.organizer_id
    ),
    "reservations": ListCase(
        "purchases_reservation", "event__organizer__id__exact", lambda r: r.event.organizer_id
    ),
    "seats": ListCase(
        "purchases_seat", "event__organizer__id__exact", lambda r: r.event.organizer_id
    ),
    "events": ListCase("purchases_event", "organizer__id__exact", lambda r: r.organizer_id),
    "price categories": ListCase(
        "purchases_pricecategory", "event__organizer__id__exact", lambda r: r.event.organizer_id
    ),
    "saga history": ListCase(
        "purchases_sagahistory", "event__organizer__id__exact", lambda r: r.event.organizer_id
    ),
    "daily sales": ListCase(
        "purchases_dailysales", "event__organizer__id__exact", lambda r: r.event.organizer_id
    ),
    "webhook endpoints": ListCase(
        "webhooks_webhookendpoint", "organizer__id__exact", lambda r: r.organizer_id
    ),
    "webhook deliveries": ListCase(
        "webhooks_webhookdelivery",
        "endpoint__organizer__id__exact",
        lambda r: r.endpoint.organizer_id,
    ),
}


def changelist(case: ListCase) -> str:
    return reverse(f"admin:{case.url_name}_changelist")


def owners(response, case: ListCase) -> list:
    assert response.status_code == 200
    return [case.owner(row) for row in response.context["cl"].result_list]


@pytest.mark.parametrize("name", list(CASES))
def test_each_list_shows_the_organizer_and_its_filter_narrows_to_one(root, sellers, name):
    case = CASES[name]
    north, south = sellers

    every = root.get(changelist(case))
    narrowed = root.get(changelist(case), {case.param: north.organizer.pk})

    assert set(owners(every, case)) == {north.organizer.pk, south.organizer.pk}
    assert set(owners(narrowed, case)) == {north.organizer.pk}
    html = every.content.decode()
    assert "column-organizer" in html
    for s in sellers:
        assert re.search(
            rf'<td class="field-organizer[^"]*">{re.escape(str(s.organizer))}</td>', html
        )
        # The filter offers each organizer.
        assert f"?{case.param}={s.organizer.pk}" in html


def _queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries.captured_queries)


def test_no_list_reads_more_queries_for_more_organizers_rows(root, alice, gateway):
    seller("north", alice)
    one = {name: _queries(root, changelist(case)) for name, case in CASES.items()}
    for slug in ("east", "west", "up", "down"):
        seller(slug, alice)

    five = {name: _queries(root, changelist(case)) for name, case in CASES.items()}

    assert five == one


def test_a_platform_wide_endpoints_deliveries_are_named_so_and_filtered_apart(root, sellers):
    north, _ = sellers
    everyone = webhook_endpoint_create(url=HOOK, events=["purchase.confirmed"], description="")
    theirs = start_purchase(north.saga.buyer, north.event, seats=["A2"])
    saga_charge(saga_id=theirs.pk)
    case = CASES["webhook deliveries"]

    html = root.get(changelist(case)).content.decode()
    platform = root.get(changelist(case), {"endpoint__organizer__isnull": "True"})

    assert '<td class="field-organizer">(platform-wide)</td>' in html
    assert {d.endpoint_id for d in platform.context["cl"].result_list} == {everyone.pk}
    assert WebhookDelivery.objects.filter(endpoint=everyone).count() == 1


# --- the event's page -----------------------------------------------------------------


def _inline_rows(html: str) -> list[list[str]]:
    """The price categories' table on an event's page, cell by cell."""
    cells = re.findall(
        r'<td class="field-(code|name|price|seats)">\s*<p>(.*?)</p>\s*</td>', html, re.S
    )
    return [[text for _, text in cells[i : i + 4]] for i in range(0, len(cells), 4)]


def _event_page(client, event) -> str:
    response = client.get(reverse("admin:purchases_event_change", args=[event.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_the_event_page_shows_the_sellers_rules_and_its_price_categories(root, sellers):
    north, south = sellers
    event = north.event
    Event.objects.filter(pk=event.pk).update(
        max_seats_per_buyer=4,
        hold_seconds=600,
        buyer_can_cancel_until=datetime(2026, 12, 20, 18, tzinfo=UTC),
        cancel_fee_percent=10,
    )

    html = _event_page(root, event)

    assert "On Sale" in html
    assert "EUR" in html and "600 s" in html
    assert "buyers may cancel until 2026-12-20 18:00:00 UTC, fee 10%" in html
    assert "from open until open" in html
    # The categories, with their prices and how many seats each holds (A1
    # and A2; B1), read-only.
    assert _inline_rows(html) == [
        ["stalls", "Stalls", "25.00 EUR", "2"],
        ["back", "Back row", "15.00 EUR", "1"],
    ]
    assert 'name="price_categories-0-price_amount"' not in html
    # Only its own categories.
    south_ids = PriceCategory.objects.filter(event=south.event).values_list("pk", flat=True)
    assert all(f'value="{pk}"' not in html for pk in south_ids)


def test_an_event_without_rules_says_what_applies(root, settings, db):
    settings.PURCHASE_HOLD_SECONDS = 900
    event = EventFactory(seats=["A1"])

    html = _event_page(root, event)

    assert f"{900} s (PURCHASE_HOLD_SECONDS)" in html
    assert "no limit" in html and "buyers cannot cancel" in html


def _management(prefix: str, initial: int) -> dict:
    return {
        f"{prefix}-TOTAL_FORMS": str(initial),
        f"{prefix}-INITIAL_FORMS": str(initial),
        f"{prefix}-MIN_NUM_FORMS": "0",
        f"{prefix}-MAX_NUM_FORMS": "1000",
    }


def test_an_operator_renames_an_event_but_cannot_change_the_sellers_part(root, sellers):
    north, _ = sellers
    event = north.event
    stalls = PriceCategory.objects.get(event=event, code="stalls")

    response = root.post(
        reverse("admin:purchases_event_change", args=[event.pk]),
        {
            "name": "renamed",
            "starts_at_0": "2027-01-02",
            "starts_at_1": "20:00:00",
            # What a forged form would add: none of it is a field here.
            "status": "cancelled",
            "currency": "USD",
            "max_seats_per_buyer": "1",
            "organizer": OrganizerFactory(slug="elsewhere").pk,
            **_management("price_categories", 2),
            "price_categories-0-id": stalls.pk,
            "price_categories-0-event": event.pk,
            "price_categories-0-price_amount": "1",
        },
    )

    assert response.status_code == 302
    event.refresh_from_db()
    stalls.refresh_from_db()
    assert (event.name, event.starts_at.year) == ("renamed", 2027)
    assert (event.status, event.currency, event.max_seats_per_buyer) == (
        EventStatus.ON_SALE,
        "EUR",
        None,
    )
    assert event.organizer == north.organizer
    assert stalls.price_amount == 2500
    assert Seat.objects.get(event=event, ref="A2").price_amount == 2500


def test_a_rename_does_not_undo_what_the_seller_committed_meanwhile(root, sellers, monkeypatch):
    # given: the seller's rules change between the admin's read of the event
    # and its save (a publish, a buyer limit committed in that instant)
    north, _ = sellers
    event = north.event
    read = EventAdmin.save_form

    def read_then_seller_commits(self, request, form, change):
        obj = read(self, request, form, change)
        Event.objects.filter(pk=event.pk).update(
            status=EventStatus.CANCELLED, max_seats_per_buyer=4
        )
        return obj

    monkeypatch.setattr(EventAdmin, "save_form", read_then_seller_commits)

    # when
    response = root.post(
        reverse("admin:purchases_event_change", args=[event.pk]),
        {
            "name": "renamed",
            "starts_at_0": "2027-01-02",
            "starts_at_1": "20:00:00",
            **_management("price_categories", 0),
        },
    )

    # then: the name is the operator's, the rules stay the seller's
    assert response.status_code == 302
    event.refresh_from_db()
    assert (event.name, event.status, event.max_seats_per_buyer) == (
        "renamed",
        EventStatus.CANCELLED,
        4,
    )


def test_a_new_event_is_a_draft_in_a_known_currency(root, db):
    organizer = OrganizerFactory(slug="newcomer")
    add = reverse("admin:purchases_event_add")
    form = {
        "organizer": organizer.pk,
        "name": "first night",
        "starts_at_0": "2027-01-02",
        "starts_at_1": "20:00:00",
        **_management("price_categories", 0),
    }

    refused = root.post(add, {**form, "currency": "ABC"})
    added = root.post(add, {**form, "currency": " chf "})

    assert refused.status_code == 200
    assert refused.context["adminform"].form.errors == {
        "currency": ["Not an ISO 4217 currency code."]
    }
    assert added.status_code == 302
    event = Event.objects.get(name="first night")
    assert (event.organizer, event.status, event.currency, event.published_at) == (
        organizer,
        EventStatus.DRAFT,
        "CHF",
        None,
    )


def test_price_categories_cannot_be_added_changed_or_deleted(root, sellers):
    north, _ = sellers
    stalls = PriceCategory.objects.get(event=north.event, code="stalls")
    change = reverse("admin:purchases_pricecategory_change", args=[stalls.pk])

    assert root.get(reverse("admin:purchases_pricecategory_add")).status_code == 403
    assert root.post(change, {"price_amount": "1", "code": "x"}).status_code == 403
    assert (
        root.post(
            reverse("admin:purchases_pricecategory_delete", args=[stalls.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    stalls.refresh_from_db()
    assert (stalls.code, stalls.price_amount) == ("stalls", 2500)
    page = root.get(change).content.decode()
    assert 'name="_save"' not in page and "25.00 EUR" in page


# --- a seat's place on the map ----------------------------------------------------------


def test_a_seat_page_shows_its_place_and_why_it_is_blocked(root, sellers):
    north, _ = sellers
    seat = Seat.objects.get(event=north.event, ref="B1")
    Seat.objects.filter(pk=seat.pk).update(
        status="unavailable", block_reason="camera platform", accessible=True, x=3.5, y=7
    )

    html = root.get(reverse("admin:purchases_seat_change", args=[seat.pk])).content.decode()
    listed = root.get(reverse("admin:purchases_seat_changelist"), {"accessible__exact": "1"})

    for text in ("Stalls", "back", "camera platform", "3.5", "7.0", "Unavailable"):
        assert text in html, text
    assert 'name="_save"' not in html
    assert [s.pk for s in listed.context["cl"].result_list] == [seat.pk]


# --- the organizer's row leads to its lists ----------------------------------------------


def test_an_organizers_row_links_to_its_own_lists(root, sellers):
    north, south = sellers

    html = root.get(reverse("admin:organizers_organizer_changelist")).content.decode()
    events = root.get(
        reverse("admin:purchases_event_changelist"), {"organizer__id__exact": north.organizer.pk}
    )
    sagas = root.get(
        reverse("admin:purchases_purchasesaga_changelist"),
        {"event__organizer__id__exact": south.organizer.pk},
    )

    assert (
        f"{reverse('admin:purchases_event_changelist')}?organizer__id__exact={north.organizer.pk}"
        in html
    )
    assert (
        f"{reverse('admin:purchases_purchasesaga_changelist')}"
        f"?event__organizer__id__exact={south.organizer.pk}" in html
    )
    assert [e.pk for e in events.context["cl"].result_list] == [north.event.pk]
    assert [s.pk for s in sagas.context["cl"].result_list] == [south.saga.pk]


def test_the_history_list_finds_a_sagas_moves_newest_first(root, sellers):
    north, _ = sellers

    found = root.get(reverse("admin:purchases_sagahistory_changelist"), {"q": str(north.saga.pk)})

    moves = [(h.from_state, h.to_state) for h in found.context["cl"].result_list]
    assert moves == [("CHARGING", "CONFIRMED"), ("PENDING", "CHARGING"), (None, "PENDING")]
    assert {h.saga_id for h in found.context["cl"].result_list} == {north.saga.pk}


def test_endpoints_of_no_organizer_are_the_filters_platform_wide_choice(root, sellers):
    everyone = webhook_endpoint_create(url=HOOK, events=["purchase.confirmed"], description="")
    case = CASES["webhook endpoints"]

    page = root.get(changelist(case), {"organizer__isnull": "True"})

    assert [e.pk for e in page.context["cl"].result_list] == [everyone.pk]
    assert 'href="?organizer__isnull=True">(platform-wide)</a>' in page.content.decode()
    assert WebhookEndpoint.objects.count() == 3
