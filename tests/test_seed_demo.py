"""``manage.py seed_demo`` (docs/api.md, "Authentication"): the demo event's
seat map (rows A-E, seats 1-10, each with its row and number, as the seat
map needs), the three users, the two organizers with an event each and an
owner each, idempotent, and no default password in production."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from organizers.models import Membership, Organizer
from purchases.models import Event, Seat

from .factories import EventFactory

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


def test_the_users_and_a_second_run_that_changes_nothing(settings):
    settings.DEBUG = True
    seed()
    users = {
        u.username: (u.is_staff, u.check_password("boxoffice"))
        for u in get_user_model().objects.all()
    }

    seed()

    assert users == {"alice": (False, True), "bob": (False, True), "admin": (True, True)}
    assert Event.objects.count() == 2
    assert Seat.objects.count() == 50 + 20
    assert get_user_model().objects.count() == 3


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
