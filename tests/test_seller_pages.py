"""The seller pages (docs/api.md, "Pages for sellers") with Django's test
client.

First the walk: every route of the URL conf under ``seller/`` is read from
``get_resolver()`` (a page added tomorrow is walked tomorrow) and visited by
each method it declares (seller/page_access.py) as anonymous (the login
page, and back), a stranger (exactly the 404 of a missing organizer) and
each role (403 where the matrix, ``organizers.roles.MAY``, refuses the
page's action; past the scoping where it allows it); a method a page does
not declare is refused to everyone (405). Then each page: what it shows,
what its forms do through the services, its refusals in words, CSRF. The
browser stories are tests/test_seller_pages_browser.py.
"""

from __future__ import annotations

import html
import re
import types
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import HttpResponse
from django.test import Client
from django.urls import get_resolver, path

from organizers.models import Membership, Organizer
from organizers.roles import MAY, Action, Role
from purchases.models import Event, EventStatus, PriceCategory, Seat
from purchases.services import saga_charge
from seller.pages import dashboard, seat_svg
from webhooks.models import WebhookEndpoint

from .conftest import start_purchase
from .factories import EventFactory, MembershipFactory, OrganizerFactory, UserFactory
from .test_organizer_scoping import url_routes

pytestmark = pytest.mark.django_db

SELLER = "seller/"
MISSING_SLUG = "no-such-organizer"
PARAMETER = re.compile(r"<(?:[^>:]+:)?(?P<name>[^>]+)>")
METHODS = ("GET", "POST")
T0 = "2026-12-02T12:00:00+00:00"

CSV_HEADER = "section,row,number,ref,category,x,y,accessible\n"
GOOD_CSV = CSV_HEADER + "".join(
    f"Stalls,{row},{n},{row}{n},{'front' if row == 'A' else 'back'},{n * 2},{i * 2},"
    f"{'true' if (row, n) == ('A', 1) else 'false'}\n"
    for i, row in enumerate("AB")
    for n in range(1, 5)
)
# Line 4 (the header is line 1) repeats A1's ref; line 6 names no category.
BAD_CSV = (
    CSV_HEADER
    + "Stalls,A,1,A1,front,0,0,false\n"
    + "Stalls,A,2,A2,front,2,0,false\n"
    + "Stalls,A,3,A1,front,4,0,false\n"
    + "Stalls,A,4,A4,front,6,0,false\n"
    + "Stalls,A,5,A5,nowhere,8,0,false\n"
)


# --- reading the pages --------------------------------------------------------------------


def text_of(answer) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", answer.content.decode())).split())


def page_of(answer) -> str:
    return answer.content.decode()


def field_errors(page: str) -> list[str]:
    return [html.unescape(m) for m in re.findall(r'<p class="field-error"[^>]*>([^<]*)</p>', page)]


def seat_map_errors(page: str) -> list[str]:
    return [html.unescape(m) for m in re.findall(r"<li data-seat-map-error>([^<]*)</li>", page)]


def unmasked(answer) -> str:
    """The page without its CSRF tokens (masked anew for every answer)."""
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", page_of(answer))


def client_for(user: User | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


# --- the walk -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    route: str  # as the URL conf writes it, e.g. seller/<str:slug>/members/
    view: Callable

    def declared(self) -> dict[str, Action | None] | None:
        """The methods the page serves and each one's action (None: signed
        in is enough); None when the page declares nothing."""
        actions = getattr(self.view, "seller_actions", None)
        if actions is not None:
            return dict(actions)
        signed_in = getattr(self.view, "seller_signed_in", None)
        return dict.fromkeys(signed_in) if signed_in is not None else None


def seller_routes(urlconf=None) -> list[Route]:
    return [
        Route(route, view)
        for route, view in url_routes(get_resolver(urlconf).url_patterns)
        if route.startswith(SELLER)
    ]


@dataclass
class World:
    members: dict[Role, User]
    stranger: User
    samples: dict[str, object]


def make_world() -> World:
    organizer = OrganizerFactory()
    members = {role: UserFactory() for role in Role}
    for role, user in members.items():
        MembershipFactory(organizer=organizer, user=user, role=role)
    endpoint = WebhookEndpoint.objects.create(
        organizer=organizer,
        url="http://127.0.0.1:9/hook",
        events=["purchase.confirmed"],
        secret="whsec_c2VjcmV0",
        created_at=T0,
        updated_at=T0,
    )
    event = EventFactory(organizer=organizer, status=EventStatus.DRAFT, seats=["A1", "A2"])
    return World(
        members=members,
        stranger=UserFactory(),
        samples={
            "slug": organizer.slug,
            "event_id": event.pk,
            "endpoint_id": endpoint.pk,
            "username": members[Role.DOOR].username,  # a member the owner may remove
        },
    )


class NoSample(Exception):
    pass


def filled(route: str, samples: dict[str, object]) -> str:
    def value(match: re.Match) -> str:
        if match.group("name") not in samples:
            raise NoSample(match.group("name"))
        return str(samples[match.group("name")])

    return "/" + PARAMETER.sub(value, route)


def call(user: User | None, method: str, url: str):
    client = client_for(user)
    return client.get(url) if method == "GET" else client.post(url, {})


def _anonymous_problems(where: str, url: str, method: str) -> list[str]:
    answer = call(None, method, url)
    expected = f"{django_settings.LOGIN_URL}?next="
    if answer.status_code != 302 or not answer["Location"].startswith(expected):
        return [f"{where}: anonymous got {answer.status_code}, not the login page"]
    return []


def _role_problems(route: Route, method: str, action: Action) -> list[str]:
    problems, where = [], f"{method} /{route.route}"
    for role in Role:
        world = make_world()  # each its own: an allowed call may delete what it names
        answer = call(world.members[role], method, filled(route.route, world.samples))
        if role in MAY[action]:
            if answer.status_code in (403, 404, 405) or answer.status_code >= 500:
                problems.append(f"{where}: {role} may {action}, yet got {answer.status_code}")
        elif answer.status_code != 403 or 'data-error="permission_denied"' not in page_of(answer):
            problems.append(f"{where}: {role} may not {action}, yet got {answer.status_code}")
    return problems


def scoping_problems(route: Route) -> list[str]:
    """What is wrong with ``route``, as sentences (none: it is scoped, and
    each role gets what the matrix says)."""
    declared = route.declared()
    if declared is None:
        return [f"/{route.route}: the page declares no action (seller/page_access.py)"]
    try:
        world = make_world()
        url = filled(route.route, world.samples)
        missing = filled(route.route, {**world.samples, "slug": MISSING_SLUG})
    except NoSample as exc:
        return [f"/{route.route}: the walker has no sample for <{exc}>: give it one"]
    problems: list[str] = []
    for method in METHODS:
        where = f"{method} /{route.route}"
        if method not in declared:
            refused = call(world.members[Role.OWNER], method, url)
            if refused.status_code != 405:
                problems.append(f"{where}: not declared, yet got {refused.status_code}")
            continue
        problems += _anonymous_problems(where, url, method)
        action = declared[method]
        if action is None:  # signed in is enough
            answer = call(world.stranger, method, url)
            if answer.status_code in (403, 404, 405) or answer.status_code >= 500:
                problems.append(f"{where}: a signed-in user got {answer.status_code}")
            continue
        stranger, nothing = call(world.stranger, method, url), call(world.stranger, method, missing)
        if nothing.status_code != 404:
            problems.append(f"{where}: a missing organizer answers {nothing.status_code}")
        if (stranger.status_code, unmasked(stranger)) != (nothing.status_code, unmasked(nothing)):
            problems.append(f"{where}: a stranger gets {stranger.status_code}, not the same 404")
        problems += _role_problems(route, method, action)
    return problems


ROUTES = seller_routes()


def test_the_walker_finds_the_seller_pages():
    found = {route.route for route in ROUTES}
    assert {
        "seller/",
        "seller/<str:slug>/",
        "seller/<str:slug>/events/new/",
        "seller/<str:slug>/events/<int:event_id>/",
        "seller/<str:slug>/events/<int:event_id>/edit/",
        "seller/<str:slug>/members/",
        "seller/<str:slug>/webhooks/",
    } <= found


@pytest.mark.parametrize("route", ROUTES, ids=[f"/{route.route}" for route in ROUTES])
def test_every_seller_page_is_scoped_and_follows_the_matrix(route):
    assert scoping_problems(route) == []


def _undecorated(request, slug):
    return HttpResponse(f"{slug}: everyone's")


_FAKE_URLS = types.ModuleType("fake_seller_urls")
_FAKE_URLS.urlpatterns = [  # type: ignore[attr-defined]  # a module made here
    path("seller/<str:slug>/leaky/", _undecorated),
    path("seller/<str:slug>/things/<str:thing_id>/", _undecorated),
    path("elsewhere/<str:slug>/", _undecorated),
]


def test_the_walker_catches_a_page_that_declares_nothing(settings):
    settings.ROOT_URLCONF = _FAKE_URLS
    routes = {route.route: route for route in seller_routes(_FAKE_URLS)}
    assert set(routes) == {"seller/<str:slug>/leaky/", "seller/<str:slug>/things/<str:thing_id>/"}
    assert scoping_problems(routes["seller/<str:slug>/leaky/"]) == [
        "/seller/<str:slug>/leaky/: the page declares no action (seller/page_access.py)"
    ]


def test_the_walker_catches_an_unscoped_page_and_a_missing_sample(settings):
    # given: a page that says it takes an action but never checks anything
    _undecorated.seller_actions = {"GET": Action.READ_SALES}  # type: ignore[attr-defined]
    settings.ROOT_URLCONF = _FAKE_URLS
    try:
        routes = {route.route: route for route in seller_routes(_FAKE_URLS)}
        leaky = scoping_problems(routes["seller/<str:slug>/leaky/"])
        unknown = scoping_problems(routes["seller/<str:slug>/things/<str:thing_id>/"])
    finally:
        del _undecorated.seller_actions  # type: ignore[attr-defined]

    assert "GET /seller/<str:slug>/leaky/: anonymous got 200, not the login page" in leaky
    assert "GET /seller/<str:slug>/leaky/: a missing organizer answers 200" in leaky
    assert any("door may not read purchases" in p and "got 200" in p for p in leaky)
    assert "POST /seller/<str:slug>/leaky/: not declared, yet got 200" in leaky
    assert unknown == [
        "/seller/<str:slug>/things/<str:thing_id>/: the walker has no sample for <thing_id>: "
        "give it one"
    ]


def test_an_htmx_poll_of_a_signed_out_page_reloads_it():
    world = make_world()
    url = f"/seller/{world.samples['slug']}/events/{world.samples['event_id']}/live/"

    answer = Client().get(url, headers={"HX-Request": "true"})

    assert answer.status_code == 200 and answer["HX-Refresh"] == "true"


def test_the_forbidden_page_names_the_role_and_the_action():
    world = make_world()
    door = client_for(world.members[Role.DOOR])

    answer = door.get(f"/seller/{world.samples['slug']}/members/")

    assert answer.status_code == 403
    assert "Your role at" in text_of(answer) and "door" in text_of(answer)
    assert str(Action.MANAGE_MEMBERS) in text_of(answer)


# --- fixtures for the pages -----------------------------------------------------------------


@pytest.fixture
def venue() -> Organizer:
    return OrganizerFactory(slug="riverside", name="Riverside Hall")


@pytest.fixture
def people(venue) -> dict[Role, User]:
    people = {role: UserFactory(username=f"{role.value}-person") for role in Role}
    for role, user in people.items():
        MembershipFactory(organizer=venue, user=user, role=role)
    return people


@pytest.fixture
def owner(people) -> Client:
    return client_for(people[Role.OWNER])


@pytest.fixture
def door(people) -> Client:
    return client_for(people[Role.DOOR])


def event_form(**changes) -> dict[str, object]:
    """A new event's form as a browser posts it: two categories."""
    form: dict[str, object] = {
        "name": "Autumn gala",
        "starts_at": "2031-10-01T20:00",
        "currency": "EUR",
        "sales_start": "",
        "sales_end": "",
        "hold_seconds": "",
        "max_seats_per_buyer": "4",
        "buyer_can_cancel_until": "",
        "cancel_fee_percent": "10",
        "categories-TOTAL_FORMS": "3",
        "categories-INITIAL_FORMS": "0",
        "categories-MIN_NUM_FORMS": "0",
        "categories-MAX_NUM_FORMS": "50",
        "categories-0-code": "front",
        "categories-0-name": "Front stalls",
        "categories-0-price": "60",
        "categories-1-code": "back",
        "categories-1-name": "Back stalls",
        "categories-1-price": "35.50",
        "categories-2-code": "",
        "categories-2-name": "",
        "categories-2-price": "",
    }
    form.update(changes)
    return form


def csv_file(text: str) -> SimpleUploadedFile:
    return SimpleUploadedFile("hall.csv", text.encode(), content_type="text/csv")


def create_event(client: Client, slug: str = "riverside", csv: str = GOOD_CSV) -> Event:
    answer = client.post(f"/seller/{slug}/events/new/", {**event_form(), "seat_map": csv_file(csv)})
    assert answer.status_code == 303, field_errors(page_of(answer)) or text_of(answer)
    return Event.objects.get(organizer__slug=slug, name="Autumn gala")


# --- /seller/ ---------------------------------------------------------------------------------


def test_the_home_page_lists_my_organizers_with_my_role(people, venue):
    elsewhere = OrganizerFactory(slug="elsewhere", name="Elsewhere")
    MembershipFactory(organizer=elsewhere, user=people[Role.FINANCE], role=Role.MANAGER)

    text = text_of(client_for(people[Role.FINANCE]).get("/seller/"))

    assert "Riverside Hall Your role: finance" in text
    assert "Elsewhere Your role: manager" in text


def test_creating_an_organizer_makes_me_its_owner():
    me = UserFactory(username="newcomer")
    client = client_for(me)

    answer = client.post("/seller/", {"slug": "night-owls", "name": "Night Owls"})

    assert answer.status_code == 303 and answer["Location"] == "/seller/night-owls/"
    assert Membership.objects.get(organizer__slug="night-owls", user=me).role == Role.OWNER


def test_a_bad_or_taken_slug_is_refused_on_its_field(venue):
    client = client_for(UserFactory())

    bad = client.post("/seller/", {"slug": "Not A Slug", "name": "X"})
    taken = client.post("/seller/", {"slug": "riverside", "name": "Another"})

    assert bad.status_code == 400 and "lower-case letters" in " ".join(field_errors(page_of(bad)))
    assert taken.status_code == 400 and field_errors(page_of(taken)) == ["'riverside' is taken"]
    assert Organizer.objects.filter(slug="riverside").get().name == "Riverside Hall"


# --- the events list --------------------------------------------------------------------------


def test_the_events_list_shows_what_each_role_may_use(people, venue):
    event = EventFactory(organizer=venue, name="Jazz night", seats=["A1", "A2", "A3"])

    as_owner = page_of(client_for(people[Role.OWNER]).get("/seller/riverside/"))
    as_finance = page_of(client_for(people[Role.FINANCE]).get("/seller/riverside/"))
    as_door = page_of(client_for(people[Role.DOOR]).get("/seller/riverside/"))

    for page in (as_owner, as_finance, as_door):
        assert f'data-event="{event.pk}"' in page and "Jazz night" in page
        assert 'data-event-status="on_sale"' in page
    assert 'data-action="new-event"' in as_owner
    assert f"/seller/riverside/events/{event.pk}/edit/" in as_owner
    assert 'data-action="new-event"' not in as_finance
    assert f"/seller/riverside/events/{event.pk}/" in as_finance
    assert 'data-action="new-event"' not in as_door
    assert f"/seller/riverside/events/{event.pk}/" not in as_door  # no dashboard, no edit
    assert "Members" not in text_of(client_for(people[Role.DOOR]).get("/seller/riverside/"))


def test_one_organizers_events_never_show_on_anothers_list(people, venue):
    EventFactory(organizer=OrganizerFactory(slug="other"), name="Not yours")

    assert "Not yours" not in page_of(client_for(people[Role.OWNER]).get("/seller/riverside/"))


# --- a new event ------------------------------------------------------------------------------


def test_a_seat_map_with_errors_lists_them_by_line_and_creates_nothing(owner, venue):
    answer = owner.post(
        "/seller/riverside/events/new/", {**event_form(), "seat_map": csv_file(BAD_CSV)}
    )

    assert answer.status_code == 400
    errors = seat_map_errors(page_of(answer))
    assert len(errors) == 2, errors
    assert errors[0].startswith("line 4: ref — ") and "A1" in errors[0]
    assert errors[1].startswith("line 6: category — ")
    assert not Event.objects.filter(organizer=venue).exists()
    # what was typed is still there
    assert 'value="Autumn gala"' in page_of(answer)


def test_a_new_event_is_a_draft_with_its_categories_and_seats(owner, venue):
    event = create_event(owner)

    assert event.status == EventStatus.DRAFT and event.max_seats_per_buyer == 4
    assert event.cancel_fee_percent == 10
    assert {(c.code, c.price_amount) for c in PriceCategory.objects.filter(event=event)} == {
        ("front", 6000),
        ("back", 3550),
    }
    seats = Seat.objects.filter(event=event)
    assert seats.count() == 8
    assert seats.get(ref="B4").price_amount == 3550 and seats.get(ref="A1").accessible


def test_a_refused_field_is_shown_on_it(owner, venue):
    currency = owner.post("/seller/riverside/events/new/", event_form(currency="EURO"))
    price = owner.post(
        "/seller/riverside/events/new/", event_form(**{"categories-1-price": "3.555"})
    )

    assert currency.status_code == price.status_code == 400
    assert field_errors(page_of(currency)) == ["must be 3 upper-case letters (ISO 4217)"]
    assert field_errors(page_of(price)) == ["at most 2 decimals in EUR"]
    assert re.search(r'data-category-row="1".*?at most 2 decimals', page_of(price), re.S)
    assert not Event.objects.filter(organizer=venue).exists()


def test_the_services_refusal_is_shown_on_the_field_it_names(owner, venue):
    answer = owner.post("/seller/riverside/events/new/", event_form(hold_seconds="5"))

    assert answer.status_code == 400
    page = page_of(answer)
    block = re.search(r'data-field="hold_seconds">(.*?)</div>', page, re.S)
    assert block is not None and "field-error" in block.group(1), field_errors(page)


# --- editing, the seat map, publishing, prices --------------------------------------------------


def test_the_draft_edit_page_changes_the_event_and_its_categories(owner, venue):
    event = create_event(owner)
    form = event_form(
        name="Autumn gala (late)",
        **{"categories-1-code": "", "categories-1-name": "", "categories-1-price": ""},
    )
    # the back category goes: its seats must go first
    upload = owner.post(
        f"/seller/riverside/events/{event.pk}/seat-map/",
        {"seat_map": csv_file(CSV_HEADER + "Stalls,A,1,A1,front,0,0,false\n")},
    )
    assert upload.status_code == 303

    answer = owner.post(f"/seller/riverside/events/{event.pk}/edit/", form)

    assert answer.status_code == 303, field_errors(page_of(answer)) or text_of(answer)
    event.refresh_from_db()
    assert event.name == "Autumn gala (late)"
    assert list(PriceCategory.objects.filter(event=event).values_list("code", flat=True)) == [
        "front"
    ]


def test_uploading_a_seat_map_replaces_it_or_lists_its_errors(owner, venue):
    event = create_event(owner)
    url = f"/seller/riverside/events/{event.pk}/seat-map/"

    refused = owner.post(url, {"seat_map": csv_file(BAD_CSV)})
    replaced = owner.post(url, {"seat_map": csv_file(GOOD_CSV.replace("B,4,B4", "B,4,B4x"))})
    nothing = owner.post(url, {})

    assert refused.status_code == 400
    assert [e.split(" — ")[0] for e in seat_map_errors(page_of(refused))] == [
        "line 4: ref",
        "line 6: category",
    ]
    assert Seat.objects.filter(event=event).count() == 8  # as it was
    assert replaced.status_code == 303
    assert Seat.objects.filter(event=event, ref="B4x").exists()
    assert nothing.status_code == 400 and "Choose a CSV file" in text_of(nothing)


def test_publishing_a_draft_puts_it_on_sale_and_freezes_its_seat_map(owner, venue):
    event = create_event(owner)

    published = owner.post(f"/seller/riverside/events/{event.pk}/publish/")
    again = owner.post(f"/seller/riverside/events/{event.pk}/publish/")
    upload = owner.post(
        f"/seller/riverside/events/{event.pk}/seat-map/", {"seat_map": csv_file(GOOD_CSV)}
    )
    edit = page_of(owner.get(f"/seller/riverside/events/{event.pk}/edit/"))

    assert published.status_code == 303
    assert published["Location"] == f"/seller/riverside/events/{event.pk}/"
    event.refresh_from_db()
    assert event.status == EventStatus.ON_SALE and event.published_at is not None
    assert again.status_code == 409 and 'data-error="refused"' in page_of(again)
    assert upload.status_code == 409
    assert 'data-action="publish"' not in edit and "data-seat-map-form" not in edit
    assert "data-prices-form" in edit
    assert re.search(r'name="currency"[^>]*disabled', edit)


def test_an_event_without_seats_is_not_published(owner, venue):
    event = create_event(owner, csv=CSV_HEADER)

    answer = owner.post(f"/seller/riverside/events/{event.pk}/publish/")

    assert answer.status_code == 409
    event.refresh_from_db()
    assert event.status == EventStatus.DRAFT


def test_a_price_change_on_sale_leaves_a_held_seat_at_its_price(owner, venue, alice):
    event = create_event(owner)
    owner.post(f"/seller/riverside/events/{event.pk}/publish/")
    start_purchase(alice, event, seats=["A2"])  # held at 60.00, not charged

    answer = owner.post(
        f"/seller/riverside/events/{event.pk}/prices/", {"price_front": "75", "price_back": "35.5"}
    )
    bad = owner.post(
        f"/seller/riverside/events/{event.pk}/prices/", {"price_front": "x", "price_back": "1"}
    )

    assert answer.status_code == 303
    seats = {s.ref: s.price_amount for s in Seat.objects.filter(event=event)}
    assert seats["A1"] == 7500 and seats["A2"] == 6000 and seats["B1"] == 3550
    assert bad.status_code == 400 and "a price such as 50 or 49.90" in field_errors(page_of(bad))


# --- the dashboard ------------------------------------------------------------------------------


def test_the_dashboard_draws_the_seats_by_status_and_shows_the_money(owner, venue, alice, gateway):
    event = create_event(owner)
    owner.post(f"/seller/riverside/events/{event.pk}/publish/")
    saga = saga_charge(saga_id=start_purchase(alice, event, seats=["A2", "B3"]).pk)
    assert saga.state == "CONFIRMED"
    start_purchase(alice, event, seats=["B1"])  # held
    Seat.objects.filter(event=event, ref="B4").update(status="unavailable")

    page = page_of(owner.get(f"/seller/riverside/events/{event.pk}/"))

    drawn = dict(re.findall(r'data-seat="([^"]+)" data-seat-status="([^"]+)"', page))
    assert drawn == {
        "A1": "available",
        "A2": "sold",
        "A3": "available",
        "A4": "available",
        "B1": "held",
        "B2": "available",
        "B3": "sold",
        "B4": "unavailable",
    }
    counts = dict(re.findall(r'data-seat-count="([a-z]+)">.*?<strong data-count>(\d+)<', page))
    assert counts == {"available": "4", "held": "1", "sold": "2", "unavailable": "1"}
    assert re.search(r"data-gross>95\.50 EUR<", page)
    assert re.search(r"data-net>95\.50 EUR<", page)
    assert re.search(r'data-category="front">.*?data-category-sold>1<', page, re.S)
    assert f'data-purchase="{saga.pk}" data-purchase-state="CONFIRMED"' in page
    assert 'hx-trigger="every 5s"' in page


def test_the_export_link_works_with_the_session(owner, venue, alice, gateway):
    event = create_event(owner)
    owner.post(f"/seller/riverside/events/{event.pk}/publish/")
    saga_charge(saga_id=start_purchase(alice, event, seats=["A1"]).pk)
    page = page_of(owner.get(f"/seller/riverside/events/{event.pk}/"))
    link = re.search(r'<a href="([^"]+)" data-export', page)
    assert link is not None

    answer = owner.get(link.group(1))

    assert answer.status_code == 200, answer.content[:300]
    assert answer["Content-Type"].startswith("text/csv")
    body = b"".join(answer.streaming_content).decode()
    assert "alice" in body and "A1" in body


def test_the_live_part_is_the_dashboards_own(owner, venue):
    event = EventFactory(organizer=venue, seats=["A1", "A2"])

    answer = owner.get(f"/seller/riverside/events/{event.pk}/live/")

    page = page_of(answer)
    assert answer.status_code == 200 and page.startswith('<div id="dashboard-live"')
    assert "<html" not in page and page.count("data-seat-status=") == 2


def test_another_organizers_event_is_as_missing_as_a_missing_one(owner, venue):
    theirs = EventFactory(organizer=OrganizerFactory(slug="theirs"), status=EventStatus.DRAFT)
    missing = theirs.pk + 1000

    for suffix, method in (
        ("", "get"),
        ("live/", "get"),
        ("edit/", "get"),
        ("edit/", "post"),
        ("seat-map/", "post"),
        ("publish/", "post"),
        ("prices/", "post"),
    ):
        a = getattr(owner, method)(f"/seller/riverside/events/{theirs.pk}/{suffix}")
        b = getattr(owner, method)(f"/seller/riverside/events/{missing}/{suffix}")
        assert (a.status_code, unmasked(a)) == (b.status_code, unmasked(b)) and a.status_code == 404
    theirs.refresh_from_db()
    assert theirs.status == EventStatus.DRAFT


# --- members ----------------------------------------------------------------------------------


def test_the_owner_adds_a_member_changes_the_role_and_removes_them(owner, venue):
    UserFactory(username="gina")

    added = owner.post("/seller/riverside/members/", {"username": "gina", "role": "door"})
    changed = owner.post("/seller/riverside/members/", {"username": "gina", "role": "finance"})
    listed = owner.get("/seller/riverside/members/")
    removed = owner.post("/seller/riverside/members/gina/remove/")

    assert added.status_code == changed.status_code == removed.status_code == 303
    assert "gina joined as door. gina is now finance." in text_of(listed)
    assert re.search(r'data-member="gina">.*?data-member-role="finance"', page_of(listed), re.S)
    assert not Membership.objects.filter(organizer=venue, user__username="gina").exists()
    assert "gina is no longer a member." in text_of(owner.get("/seller/riverside/members/"))


def test_members_refusals_are_said_on_the_page(owner, venue, people):
    unknown = owner.post("/seller/riverside/members/", {"username": "nobody", "role": "door"})
    bad_role = owner.post("/seller/riverside/members/", {"username": "gina", "role": "king"})
    last_owner = owner.post(f"/seller/riverside/members/{people[Role.OWNER].username}/remove/")
    not_member = owner.post("/seller/riverside/members/nobody/remove/")

    assert unknown.status_code == 400 and field_errors(page_of(unknown)) == ["no user 'nobody'"]
    assert bad_role.status_code == 400
    assert last_owner.status_code == 409 and "at least one owner" in text_of(last_owner)
    assert not_member.status_code == 404 and "nobody is not a member" in text_of(not_member)
    assert Membership.objects.filter(organizer=venue).count() == len(Role)


# --- webhooks ---------------------------------------------------------------------------------


def test_a_new_endpoints_secret_is_shown_once(owner, venue, settings):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True

    made = owner.post(
        "/seller/riverside/webhooks/",
        {"url": "http://127.0.0.1:9/hook", "events": ["purchase.confirmed"], "description": "crm"},
    )
    later = page_of(owner.get("/seller/riverside/webhooks/"))

    endpoint = WebhookEndpoint.objects.get(organizer=venue)
    assert made.status_code == 201 and endpoint.secret in page_of(made)
    assert endpoint.secret not in later and f'data-endpoint="{endpoint.pk}"' in later
    assert endpoint.events == ["purchase.confirmed"] and endpoint.description == "crm"


def test_an_endpoint_is_disabled_enabled_and_deleted(owner, venue):
    endpoint = WebhookEndpoint.objects.create(
        organizer=venue, url="https://hooks.example/x", events=["purchase.confirmed"],
        secret="whsec_c2VjcmV0", created_at=T0, updated_at=T0,
    )  # fmt: skip
    base = f"/seller/riverside/webhooks/{endpoint.pk}"

    disabled = owner.post(f"{base}/enabled/", {"enabled": "false"})
    endpoint.refresh_from_db()
    assert disabled.status_code == 303 and not endpoint.enabled
    owner.post(f"{base}/enabled/", {"enabled": "true"})
    endpoint.refresh_from_db()
    assert endpoint.enabled
    deleted = owner.post(f"{base}/delete/")
    assert (
        deleted.status_code == 303 and not WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    )


def test_a_bad_endpoint_is_refused_on_its_field_and_anothers_is_missing(owner, venue, settings):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = False
    theirs = WebhookEndpoint.objects.create(
        organizer=OrganizerFactory(slug="theirs"), url="https://hooks.example/y",
        events=["purchase.confirmed"], secret="whsec_c2VjcmV0", created_at=T0, updated_at=T0,
    )  # fmt: skip

    refused = owner.post(
        "/seller/riverside/webhooks/", {"url": "http://127.0.0.1:9/", "events": ["purchase.failed"]}
    )
    delete = owner.post(f"/seller/riverside/webhooks/{theirs.pk}/delete/")
    disable = owner.post(f"/seller/riverside/webhooks/{theirs.pk}/enabled/", {"enabled": "false"})
    nonsense = owner.post("/seller/riverside/webhooks/99999999999999999999999/delete/")

    assert refused.status_code == 400 and field_errors(page_of(refused))
    assert not WebhookEndpoint.objects.filter(organizer=venue).exists()
    assert delete.status_code == disable.status_code == nonsense.status_code == 404
    theirs.refresh_from_db()
    assert theirs.enabled


# --- CSRF and the header's link -----------------------------------------------------------------


def test_every_form_carries_a_csrf_token_and_a_post_without_one_is_refused(people, venue):
    event = EventFactory(organizer=venue, status=EventStatus.DRAFT, seats=["A1"])
    client = Client(enforce_csrf_checks=True)
    client.force_login(people[Role.OWNER])
    for url in (
        "/seller/",
        "/seller/riverside/events/new/",
        f"/seller/riverside/events/{event.pk}/edit/",
        "/seller/riverside/members/",
        "/seller/riverside/webhooks/",
    ):
        page = page_of(client.get(url))
        forms = re.findall(r'<form method="post".*?</form>', page, re.S)
        assert forms and all("csrfmiddlewaretoken" in form for form in forms), url

    refused = client.post(f"/seller/riverside/events/{event.pk}/publish/")

    assert refused.status_code == 403
    event.refresh_from_db()
    assert event.status == EventStatus.DRAFT


def test_the_shops_header_links_to_the_seller_pages_for_members_only(people):
    member = page_of(client_for(people[Role.DOOR]).get("/"))
    buyer = page_of(client_for(UserFactory()).get("/"))

    assert 'href="/seller/"' in member
    assert 'href="/seller/"' not in buyer


# --- the seat map's drawing ---------------------------------------------------------------------


def _mark(ref: str, x: float, y: float, status: str = "available") -> seat_svg.SeatMark:
    return seat_svg.SeatMark(ref, ref[0], int(ref[1:]), "", status, x, y)


def test_the_drawing_places_each_seat_at_its_coordinates_and_escapes_its_ref():
    seats = [_mark("A1", 0, 0), _mark("A2", 10, 0, "sold"), _mark("B1", 0, 10, "held")]
    sneaky = seat_svg.SeatMark('"><script>', "C", 1, "", "available", 10, 10)

    drawing = seat_svg.draw([*seats, sneaky], label="a <map>")

    svg = str(drawing.svg)
    assert not drawing.laid_out and drawing.seats == 4
    # a seat's size is 0.9 of the usual gap in a row (10): its box starts 4.5 before it
    assert 'href="#seat-sold" x="5.500" y="-4.500" width="9.000"' in svg
    assert 'data-seat="B1" data-seat-status="held"' in svg
    assert "<script>" not in svg and "&quot;&gt;&lt;script&gt;" in svg
    assert 'aria-label="a &lt;map&gt;"' in svg


def test_seats_without_coordinates_are_laid_out_by_row_and_number():
    drawing = seat_svg.draw([_mark("A1", 0, 0), _mark("A2", 0, 0), _mark("B1", 0, 0)], label="")

    svg = str(drawing.svg)
    assert drawing.laid_out
    assert re.search(r'x="0\.550" y="-0\.450"[^>]*data-seat="A1"', svg), svg
    assert re.search(r'x="1\.550" y="-0\.450"[^>]*data-seat="A2"', svg), svg
    assert re.search(r'x="0\.550" y="0\.750"[^>]*data-seat="B1"', svg), svg


def test_a_hall_past_the_drawing_limit_shows_its_counts_only(owner, venue, monkeypatch):
    monkeypatch.setattr(dashboard, "MAX_DRAWN", 3)
    event = EventFactory(organizer=venue, seats=["A1", "A2", "A3", "A4"])

    page = page_of(owner.get(f"/seller/riverside/events/{event.pk}/"))

    assert "data-seat-status" not in page and "data-not-drawn" in page
    assert re.search(r'data-seat-count="available">.*?<strong data-count>4<', page)


def test_bad_input_is_refused_in_words_never_a_500(owner, venue):
    draft = EventFactory(organizer=venue, status=EventStatus.DRAFT, seats=["A1"])
    new = "/seller/riverside/events/new/"
    cases = [
        ("get", f"/seller/riverside/events/{10**25}/", None, 404),
        ("get", "/seller/%00/", None, 404),
        ("post", new, event_form(name="x\x00y"), 400),
        ("post", new, {**event_form(), "categories-TOTAL_FORMS": "many"}, 400),
        ("post", new, event_form(starts_at="not a time"), 400),
        ("post", new, event_form(hold_seconds=str(10**40)), 400),
        ("post", new, event_form(**{"categories-0-price": "9" * 12}), 400),
        ("post", new, {**event_form(), "seat_map": csv_file("\x00")}, 400),
        (
            "post",
            f"/seller/riverside/events/{draft.pk}/seat-map/",
            {"seat_map": SimpleUploadedFile("x.csv", b"\xff\xfe\x00not utf-8")},
            400,
        ),
        ("post", "/seller/riverside/members/", {"username": "a\x00b", "role": "door"}, 400),
        ("post", "/seller/riverside/members/a%00b/remove/", {}, 404),
        ("post", "/seller/riverside/webhooks/", {"url": "x\x00", "events": ["nope"]}, 400),
        ("post", f"/seller/riverside/webhooks/{'9' * 30}/enabled/", {"enabled": "x"}, 404),
    ]

    answers = [
        (url, getattr(owner, method)(url, data).status_code) for method, url, data, _ in cases
    ]

    assert answers == [(url, status) for _, url, _, status in cases]
    assert list(Event.objects.filter(organizer=venue)) == [draft]


def test_an_owner_who_gives_up_the_role_or_leaves_goes_where_they_still_may(people, venue):
    second = UserFactory(username="second-owner")
    MembershipFactory(organizer=venue, user=second, role=Role.OWNER)
    client = client_for(second)

    demoted = client.post(
        "/seller/riverside/members/", {"username": "second-owner", "role": "manager"}
    )
    Membership.objects.filter(user=second).update(role=Role.OWNER)
    left = client.post("/seller/riverside/members/second-owner/remove/")

    assert demoted.status_code == 303 and demoted["Location"] == "/seller/riverside/"
    assert left.status_code == 303 and left["Location"] == "/seller/"
    assert not Membership.objects.filter(user=second).exists()
