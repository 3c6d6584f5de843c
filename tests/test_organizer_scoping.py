"""Every route under ``/api/organizers/{slug}/``, walked from the URL conf
(docs/api.md, "Organizers and roles"): no route can ship unscoped.

The routes are read from ``get_resolver()``, not listed here: a new route is
walked the day it is added. For each route and each method its view serves,
in a world of its own (an organizer with one member of each role, a
stranger, an endpoint of the organizer with a delivery; a method that may
write builds it anew for each role):

- the view declares the action it takes (``required_action`` or
  ``required_actions``, organizers/permissions.py), or the route fails;
- without credentials it is ``401``;
- a stranger gets exactly the answer of a missing organizer (``404``, the
  same body);
- each role the matrix (``organizers.roles.MAY``) refuses the action gets
  ``403 permission_denied``, and each role it allows gets past the scoping
  (neither ``403`` nor ``404``: a ``400`` for an empty body is fine).

A path parameter the walker has no sample for fails the route too: give it
one in ``_world`` (and, when a route needs another value than the others,
in ``ROUTE_SAMPLES``). The last tests show that the walker catches a view that
forgets the organizer, and one that declares no action.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.urls import URLResolver, get_resolver, path
from rest_framework.authtoken.models import Token
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.test import APIClient
from rest_framework.views import APIView

from organizers.permissions import OrganizerScopedApi, declared_action
from organizers.roles import MAY, Role
from purchases.models import EventStatus
from purchases.services import event_cancel, purchase_start
from webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint

from .factories import EventFactory, MembershipFactory, OrganizerFactory, UserFactory

SCOPED = "api/organizers/<"  # a route under an organizer's slug
METHODS = ("get", "post", "put", "patch", "delete")
MISSING_SLUG = "no-such-organizer"
PARAMETER = re.compile(r"<(?:[^>:]+:)?(?P<name>[^>]+)>")
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Route:
    route: str  # as the URL conf writes it, e.g. api/organizers/<str:slug>/members/
    view: Callable

    @property
    def view_class(self) -> type | None:
        return getattr(self.view, "view_class", None)

    def methods(self) -> list[str]:
        """The methods the view serves (a function view: every one, so that
        the walker asks each)."""
        cls = self.view_class
        return [m.upper() for m in METHODS if cls is None or hasattr(cls, m)]


def url_routes(patterns, prefix: str = "") -> Iterator[tuple[str, Callable]]:
    """Every route of ``patterns`` (a URL conf's), as written, with its view
    (the seller pages' walker uses it too: tests/test_seller_pages.py)."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from url_routes(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern.callback


def organizer_routes(urlconf=None) -> list[Route]:
    """Every route of the URL conf under an organizer's slug."""
    return [
        Route(route, view)
        for route, view in url_routes(get_resolver(urlconf).url_patterns)
        if route.startswith(SCOPED)
    ]


# --- a world per call ---------------------------------------------------------------------


@dataclass
class World:
    members: dict[Role, User]
    stranger: User
    samples: dict[str, object]  # a value for each path parameter


# A route whose parameter takes another sample than the others': the route,
# then {parameter: the name of its sample in World.samples}.
ROUTE_SAMPLES: dict[str, dict[str, str]] = {
    # Only a cancelled event has a cancellation to read.
    "api/organizers/<str:slug>/events/<str:event_id>/cancellation/": {
        "event_id": "cancelled_event_id"
    },
}


def _samples_for(route: str, samples: dict[str, object]) -> dict[str, object]:
    return {
        **samples,
        **{name: samples[sample] for name, sample in ROUTE_SAMPLES.get(route, {}).items()},
    }


def _world() -> World:
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
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint,
        message_id=f"msg_{endpoint.pk}",
        event_type="purchase.confirmed",
        saga_id="00000000-0000-0000-0000-000000000001",
        body="{}",
        status=DeliveryStatus.FAILED,
        created_at=T0,
    )
    # A draft of the organizer's, with a seat map (the seller's routes take it).
    event = EventFactory(organizer=organizer, status=EventStatus.DRAFT, seats=["A1", "A2"])
    # A purchase of one of its events on sale (a refund's route takes it)...
    on_sale = EventFactory(organizer=organizer, seats=["A1"])
    purchase = purchase_start(
        user=UserFactory(),
        idempotency_key="walker",
        event_id=on_sale.pk,
        seat_refs=["A1"],
        payment_method="pm_card_visa",
        now=T0,
    )
    # ...and a cancelled one (its cancellation's progress is read).
    cancelled = EventFactory(organizer=organizer, seats=["A1"])
    event_cancel(
        organizer=organizer,
        event_id=cancelled.pk,
        reason="the venue flooded",
        user=members[Role.OWNER],
        now=T0,
    )
    return World(
        members=members,
        stranger=UserFactory(),
        samples={
            "slug": organizer.slug,
            "event_id": event.pk,
            "cancelled_event_id": cancelled.pk,
            "saga_id": purchase.saga_id,
            "endpoint_id": endpoint.pk,
            "delivery_id": delivery.pk,
            # A member the owner may remove (the last owner may not go).
            "username": members[Role.DOOR].username,
        },
    )


class NoSample(Exception):
    pass


def _filled(route: str, samples: dict[str, object]) -> str:
    def value(match: re.Match) -> str:
        name = match.group("name")
        if name not in samples:
            raise NoSample(name)
        return str(samples[name])

    return "/" + PARAMETER.sub(value, route)


def _call(user, method: str, url: str):
    client = APIClient()
    if user is not None:
        token, _ = Token.objects.get_or_create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    body: dict | None = {} if method in ("POST", "PUT", "PATCH") else None
    return getattr(client, method.lower())(url, body, format="json")


def _body(answer):
    try:
        return answer.json()
    except ValueError:
        return answer.content


# --- the walk ------------------------------------------------------------------------------


def scoping_problems(route: Route, method: str) -> list[str]:
    """What is wrong with ``method`` on ``route``, as sentences (none: it is
    scoped, and each role gets what the matrix says)."""
    problems = []
    where = f"{method} /{route.route}"
    action = declared_action(route.view_class, method) if route.view_class else None
    if action is None:
        problems.append(f"{where}: the view declares no action (required_action)")
    try:
        world = _world()
        samples = _samples_for(route.route, world.samples)
        url = _filled(route.route, samples)
        missing = _filled(route.route, {**samples, "slug": MISSING_SLUG})
    except NoSample as exc:
        return [*problems, f"{where}: the walker has no sample for <{exc}>: give it one"]

    anonymous = _call(None, method, url)
    if anonymous.status_code != 401:
        problems.append(f"{where}: without credentials {anonymous.status_code}, not 401")
    stranger, nothing = _call(world.stranger, method, url), _call(world.stranger, method, missing)
    if nothing.status_code != 404:
        problems.append(f"{where}: a missing organizer answers {nothing.status_code}, not 404")
    if (stranger.status_code, _body(stranger)) != (nothing.status_code, _body(nothing)):
        problems.append(
            f"{where}: a stranger gets {stranger.status_code} {_body(stranger)!r}, not what "
            f"a missing organizer gets ({nothing.status_code} {_body(nothing)!r})"
        )
    # A call that may write gets a world of its own per role (an allowed call
    # may delete what it names); a read changes nothing, so the stranger's
    # world serves every role.
    reads = method in ("GET", "HEAD", "OPTIONS")
    for role in Role:
        world = world if reads else _world()
        samples = _samples_for(route.route, world.samples)
        answer = _call(world.members[role], method, _filled(route.route, samples))
        if action is not None and role in MAY[action]:
            if answer.status_code in (403, 404):
                problems.append(
                    f"{where}: {role} may {action}, yet got {answer.status_code} {_body(answer)!r}"
                )
        elif (answer.status_code, _body(answer).get("code")) != (403, "permission_denied"):
            problems.append(
                f"{where}: {role} may not {action or 'anything'}, yet got "
                f"{answer.status_code} {_body(answer)!r}"
            )
    return problems


ROUTES = organizer_routes()
CASES = [(route, method) for route in ROUTES for method in route.methods()]


def test_the_walker_finds_the_organizer_scoped_routes():
    found = {route.route for route in ROUTES}

    assert {
        "api/organizers/<str:slug>/",
        "api/organizers/<str:slug>/members/",
        "api/organizers/<str:slug>/members/<str:username>/",
        "api/organizers/<str:slug>/webhook-endpoints/",
        "api/organizers/<str:slug>/webhook-endpoints/<str:endpoint_id>/deliveries/"
        "<str:delivery_id>/resend/",
        # The door's (door/urls.py).
        "api/organizers/<str:slug>/events/<str:event_id>/checkin/",
        "api/organizers/<str:slug>/events/<str:event_id>/checkin/list/",
        "api/organizers/<str:slug>/events/<str:event_id>/checkin/upload/",
        "api/organizers/<str:slug>/events/<str:event_id>/checkin/progress/",
    } <= found
    assert len(CASES) > len(ROUTES)  # some routes serve several methods


@pytest.mark.parametrize(
    "route, method", CASES, ids=[f"{method} /{route.route}" for route, method in CASES]
)
@pytest.mark.django_db
def test_every_organizer_route_is_scoped_and_follows_the_matrix(route, method):
    assert scoping_problems(route, method) == []


# --- the walker catches what it is for ---------------------------------------------------------


class _ForgetsTheOrganizer(APIView):
    """Any signed-in user: the slug is taken and never checked."""

    permission_classes = [IsAuthenticated]

    def get(self, request, slug):
        return Response({"slug": slug, "secret": "everyone's"})


class _DeclaresNoAction(OrganizerScopedApi):
    def get(self, request, slug):
        return Response({})


_FAKE_URLS = types.ModuleType("fake_organizer_urls")
_FAKE_URLS.urlpatterns = [  # type: ignore[attr-defined]  # a module made here
    path("api/organizers/<str:slug>/leaky/", _ForgetsTheOrganizer.as_view()),
    path("api/organizers/<str:slug>/undeclared/", _DeclaresNoAction.as_view()),
    path("api/organizers/<str:slug>/things/<str:thing_id>/", _DeclaresNoAction.as_view()),
    path("api/elsewhere/<str:slug>/", _ForgetsTheOrganizer.as_view()),
]


@pytest.mark.django_db
def test_the_walker_catches_an_unscoped_route_and_one_without_an_action(settings):
    settings.ROOT_URLCONF = _FAKE_URLS
    routes = {route.route: route for route in organizer_routes(_FAKE_URLS)}
    assert set(routes) == {
        "api/organizers/<str:slug>/leaky/",
        "api/organizers/<str:slug>/undeclared/",
        "api/organizers/<str:slug>/things/<str:thing_id>/",
    }

    leaky = scoping_problems(routes["api/organizers/<str:slug>/leaky/"], "GET")
    undeclared = scoping_problems(routes["api/organizers/<str:slug>/undeclared/"], "GET")
    unknown = scoping_problems(routes["api/organizers/<str:slug>/things/<str:thing_id>/"], "GET")

    assert leaky[0].endswith("the view declares no action (required_action)")
    assert any("a stranger gets 200" in p for p in leaky)
    assert sum("may not anything, yet got 200" in p for p in leaky) == len(Role)
    assert undeclared == [
        "GET /api/organizers/<str:slug>/undeclared/: the view declares no action (required_action)"
    ]
    assert unknown[-1].endswith("the walker has no sample for <thing_id>: give it one")
