"""``manage.py seed_demo`` (docs/api.md, "Authentication"): the demo event's
seat map (rows A-E, seats 1-10, each with its row and number, as the seat
map needs), the three users, the two organizers with an event each and an
owner each, both events real seat maps on sale (sections, categories,
coordinates, accessible places) that each owner alone sees, idempotent, and
no default password in production."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db.models import Model
from django.utils import timezone
from rest_framework.test import APIClient

from organizers.models import Membership, Organizer
from purchases.catalog import CategoryInput, event_create_with_seats, seat_grid
from purchases.models import Event, EventStatus, PriceCategory, Seat

from .factories import EventFactory, OrganizerFactory

pytestmark = pytest.mark.django_db(transaction=True)


def seed() -> None:
    call_command("seed_demo", stdout=io.StringIO())


def test_the_demo_event_has_rows_a_to_e_of_ten_numbered_seats(settings):
    settings.DEBUG = True

    seed()

    event = Event.objects.get(organizer__slug="demo")
    seats = list(
        Seat.objects.filter(event=event)
        .order_by("row", "number")
        .values_list("ref", "row", "number", "status")
    )
    assert seats == [(f"{row}{n}", row, n, "available") for row in "ABCDE" for n in range(1, 11)]


def _catalog() -> dict[str, list[dict]]:
    tables: tuple[type[Model], ...] = (Organizer, Membership, Event, PriceCategory, Seat)
    return {
        model.__name__: list(model._default_manager.order_by("pk").values()) for model in tables
    }


def test_the_users_and_a_second_run_that_changes_nothing(settings):
    settings.DEBUG = True
    seed()
    users = {
        u.username: (u.is_staff, u.check_password("boxoffice"))
        for u in get_user_model().objects.all()
    }
    before = _catalog()
    out = io.StringIO()

    call_command("seed_demo", stdout=out)

    assert users == {"alice": (False, True), "bob": (False, True), "admin": (True, True)}
    assert Event.objects.count() == 2
    assert Seat.objects.count() == 50 + 20
    assert PriceCategory.objects.count() == 3 + 2
    assert get_user_model().objects.count() == 3
    assert _catalog() == before
    assert out.getvalue() == "seed_demo: nothing to do\n"


def _seat_map(slug: str) -> dict[str, tuple]:
    return {
        s.ref: (s.section, s.row, s.category, s.price_amount, s.accessible)
        for s in Seat.objects.filter(event__organizer__slug=slug)
    }


def test_both_events_are_seat_maps_on_sale_with_sections_and_categories(settings):
    settings.DEBUG = True

    seed()

    for event in Event.objects.all():
        assert (event.status, event.currency) == (EventStatus.ON_SALE, "EUR")
        assert event.published_at is not None
    assert sorted(
        PriceCategory.objects.values_list(
            "event__organizer__slug", "code", "name", "price_amount", "currency"
        )
    ) == [
        ("demo", "balcony", "Balcony", 3500, "EUR"),
        ("demo", "restricted", "Balcony, restricted view", 2000, "EUR"),
        ("demo", "stalls", "Stalls", 5000, "EUR"),
        ("riverside", "floor", "Floor tables", 4500, "EUR"),
        ("riverside", "gallery", "Gallery", 3000, "EUR"),
    ]
    demo, riverside = _seat_map("demo"), _seat_map("riverside")
    # A1 keeps the docs' 50.00 EUR; each seat at its category's price.
    assert demo["A1"] == ("Stalls", "A", "stalls", 5000, True)
    assert demo["C10"] == ("Stalls", "C", "stalls", 5000, False)
    assert demo["D5"] == ("Balcony", "D", "balcony", 3500, False)
    assert demo["E10"] == ("Balcony", "E", "restricted", 2000, False)
    assert sorted(ref for ref, seat in demo.items() if seat[4]) == ["A1", "A10"]
    assert sorted(riverside) == sorted(f"{row}{n}" for row in "AB" for n in range(1, 11))
    assert riverside["A2"] == ("Floor", "A", "floor", 4500, True)
    assert riverside["B7"] == ("Gallery", "B", "gallery", 3000, False)


def test_every_seat_has_its_own_place_on_the_map(settings):
    settings.DEBUG = True

    seed()

    for event in Event.objects.all():
        places = list(Seat.objects.filter(event=event).values_list("x", "y"))
        assert len(set(places)) == len(places), event.name
    a1, a2, b1 = (
        Seat.objects.get(event__organizer__slug="demo", ref=ref) for ref in ("A1", "A2", "B1")
    )
    assert (a1.x, a1.y, a2.x, b1.y) == (0, 0, 1, 1)
    # The balcony is drawn apart from the stalls: a row's gap.
    assert Seat.objects.get(event__organizer__slug="demo", ref="D1").y == 4


def test_two_organizers_each_with_its_event_and_its_owner(settings):
    settings.DEBUG = True

    seed()
    seed()

    assert sorted(Event.objects.values_list("organizer__slug", "name")) == [
        ("demo", "boxoffice demo night"),
        ("riverside", "riverside jazz evening"),
    ]
    assert sorted(
        Membership.objects.values_list(
            "organizer__slug", "organizer__name", "user__username", "role"
        )
    ) == [("demo", "Demo venue", "alice", "owner"), ("riverside", "Riverside Hall", "bob", "owner")]
    # The demo event is made first: the curl tour and make run's test buy event 1's seats.
    assert (
        Event.objects.get(name="boxoffice demo night").pk
        < Event.objects.get(name="riverside jazz evening").pk
    )


def test_the_default_password_is_refused_when_debug_is_off(settings):
    settings.DEBUG = False
    settings.DEMO_PASSWORD = "boxoffice"

    with pytest.raises(CommandError, match="DEMO_PASSWORD"):
        seed()

    assert get_user_model().objects.count() == 0
    assert Event.objects.count() == 0


def test_the_default_organizer_of_a_migrated_database_gets_its_owner_and_keeps_its_event(
    settings,
):
    """A database from before organizers: the migration gave the demo event
    to the default organizer "demo", which has no member."""
    settings.DEBUG = True
    demo = Organizer.objects.create(slug="demo", name="Demo venue")
    EventFactory(organizer=demo, name="boxoffice demo night", seats=[])

    seed()

    assert list(Event.objects.filter(organizer=demo).values_list("name", flat=True)) == [
        "boxoffice demo night"
    ]
    assert list(
        Membership.objects.filter(organizer=demo).values_list("user__username", "role")
    ) == [("alice", "owner")]


def test_a_new_event_shows_in_the_cached_list_at_once(settings, client):
    """The list is cached (purchases/availability.py): creating an event moves
    its version on commit, so the list does not hide it for the TTL."""
    settings.DEBUG = True
    settings.AVAILABILITY_MAX_STALE_SECONDS = 60
    before = client.get("/api/events/").json()

    seed()

    after = client.get("/api/events/").json()
    assert [e["name"] for e in after if e not in before] == [
        "boxoffice demo night",
        "riverside jazz evening",
    ]


# --- the event maker the seed uses (purchases/catalog.py) -----------------------------


def test_the_event_maker_refuses_a_seat_of_an_unknown_category_and_writes_nothing(db):
    with pytest.raises(ValueError, match="unknown categories: balcony"):
        event_create_with_seats(
            organizer=OrganizerFactory(),
            name="half made",
            starts_at=timezone.now(),
            categories=[CategoryInput(code="stalls", name="Stalls", price_amount=1000)],
            seats=[
                *seat_grid(section="Stalls", rows="A", seats_per_row=2, category="stalls"),
                *seat_grid(section="Balcony", rows="B", seats_per_row=2, category="balcony"),
            ],
        )

    assert (Event.objects.count(), PriceCategory.objects.count(), Seat.objects.count()) == (0, 0, 0)


def test_the_event_maker_without_a_seat_map_makes_the_old_grid(db):
    event = event_create_with_seats(
        organizer=OrganizerFactory(),
        name="grid",
        starts_at=timezone.now(),
        rows="AB",
        seats_per_row=3,
        price_amount=1234,
        currency="JPY",
    )

    assert (event.status, event.currency) == (EventStatus.ON_SALE, "JPY")
    assert list(
        Seat.objects.filter(event=event)
        .order_by("row", "number")
        .values_list("ref", "section", "category", "price_amount", "currency")
    ) == [(f"{r}{n}", "", "", 1234, "JPY") for r in "AB" for n in (1, 2, 3)]
    assert not PriceCategory.objects.filter(event=event).exists()


def test_each_owner_lists_only_their_own_event_through_the_api(settings):
    """``GET /api/organizers/{slug}/events/`` (the seller's API): each
    owner's list holds their event alone, and the other's slug is a 404."""
    settings.DEBUG = True
    seed()
    users = get_user_model().objects
    alice, bob = APIClient(), APIClient()
    alice.force_authenticate(users.get(username="alice"))
    bob.force_authenticate(users.get(username="bob"))

    def names(answer) -> list[str]:
        assert answer.status_code == 200, answer.content
        body = answer.json()
        return [e["name"] for e in (body if isinstance(body, list) else body["results"])]

    assert names(alice.get("/api/organizers/demo/events/")) == ["boxoffice demo night"]
    assert names(bob.get("/api/organizers/riverside/events/")) == ["riverside jazz evening"]
    assert alice.get("/api/organizers/riverside/events/").status_code == 404
    assert bob.get("/api/organizers/demo/events/").status_code == 404
