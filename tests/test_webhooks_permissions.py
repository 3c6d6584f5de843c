"""Who may do what on the webhooks' staff API (docs/api.md, "Webhooks"):
staff holding the Django model permission the admin asks for the same act,
one permission per route and method; anonymous ``401``, anyone else ``403``.

The routes walked are read from the URL conf (``webhooks/urls.py``) and the
methods from each view, so a route or a method added later without a line
in ``ALLOWED_BY`` below fails here rather than going unchecked.
"""

from __future__ import annotations

import socket

import pytest
from django.contrib.auth.models import Permission
from django.urls import URLPattern, reverse
from rest_framework.test import APIClient

from purchases.services import saga_charge
from webhooks import urls as webhook_urls
from webhooks.models import WebhookDelivery
from webhooks.services import webhook_endpoint_create

from .conftest import _client_for, drain_outbox, start_purchase
from .factories import EventFactory, UserFactory
from .test_webhooks_api import webhook_state

pytestmark = pytest.mark.django_db

ALL = ["purchase.confirmed", "purchase.failed", "purchase.refunded", "purchase.needs_attention"]

VIEW = "view_webhookendpoint"
ADD = "add_webhookendpoint"
CHANGE = "change_webhookendpoint"
DELETE = "delete_webhookendpoint"
VIEW_DELIVERIES = "view_webhookdelivery"
CHANGE_DELIVERIES = "change_webhookdelivery"
RESEND = "resend_webhookdelivery"

# (URL name, method): the webhooks permissions (codenames) any one of which
# lets a staff user in, as the admin decides the same act: reading an
# endpoint takes view or change (Django's admin lets change read), a new
# secret takes change (the admin's "Rotate secret…"), the delivery log the
# deliveries' view or change (the same rule on their read-only admin), a
# resend its own permission, with one of TOGETHER's.
ALLOWED_BY: dict[tuple[str, str], set[str]] = {
    ("webhook-endpoint-list", "get"): {VIEW, CHANGE},
    ("webhook-endpoint-list", "post"): {ADD},
    ("webhook-endpoint-detail", "get"): {VIEW, CHANGE},
    ("webhook-endpoint-detail", "patch"): {CHANGE},
    ("webhook-endpoint-detail", "delete"): {DELETE},
    ("webhook-endpoint-rotate-secret", "post"): {CHANGE},
    ("webhook-delivery-list", "get"): {VIEW_DELIVERIES, CHANGE_DELIVERIES},
    ("webhook-delivery-resend", "post"): {RESEND},
}
# A permission that opens a call only with one of these too: the admin's
# Resend action is on the deliveries' list, which the user must reach.
TOGETHER = {RESEND: {VIEW_DELIVERIES, CHANGE_DELIVERIES}}
# What an allowed call answers (the world below makes each one succeed).
SERVED = {"get": 200, "head": 200, "options": 200, "post": 201, "patch": 200, "delete": 204}
SERVED_BY_NAME = {
    ("webhook-endpoint-rotate-secret", "post"): 200,
    ("webhook-delivery-resend", "post"): 202,
}


def _routes() -> list[tuple[str, str, type]]:
    """(URL name, path with ``{endpoint}``/``{delivery}`` for its ids, view
    class) of every route of the URL conf."""
    routes = []
    for pattern in webhook_urls.urlpatterns:
        assert isinstance(pattern, URLPattern) and pattern.name, pattern
        ids = {"endpoint_id": "ENDPOINT-ID", "delivery_id": "DELIVERY-ID"}
        path = reverse(
            pattern.name, kwargs={k: v for k, v in ids.items() if k in str(pattern.pattern)}
        )
        path = path.replace("ENDPOINT-ID", "{endpoint}").replace("DELIVERY-ID", "{delivery}")
        # as_view() sets view_class on the function (not in the stubs).
        routes.append((pattern.name, path, pattern.callback.view_class))  # type: ignore[attr-defined]
    return routes


def _paths() -> dict[str, str]:
    return {name: path for name, path, _ in _routes()}


def _methods(view_class) -> list[str]:
    served = [m for m in view_class.http_method_names if hasattr(view_class, m)]
    # Django answers HEAD with GET's handler (View.setup); OPTIONS is DRF's.
    return served + (["head"] if "get" in served and "head" not in served else [])


def _calls() -> list[tuple[str, str]]:
    """Every (URL name, method) the URL conf serves."""
    return [(name, method) for name, _, view in _routes() for method in _methods(view)]


def _allowed_by(name: str, method: str) -> set[str]:
    if method == "head":
        return ALLOWED_BY[(name, "get")]
    if method == "options":  # what the route takes: for whoever may use it at all
        return set().union(*(perms for (n, _), perms in ALLOWED_BY.items() if n == name))
    return ALLOWED_BY[(name, method)]


def _opens(codenames: set[str], name: str, method: str) -> bool:
    """Whether a staff user holding exactly these codenames may make the call."""
    return any(
        codename in _allowed_by(name, method)
        and (codename not in TOGETHER or bool(TOGETHER[codename] & codenames))
        for codename in codenames
    )


def _served(name: str, method: str) -> int:
    return SERVED_BY_NAME.get((name, method), SERVED[method])


def _ordered(calls):
    # Deletes last: each walk has one world, and a delete ends it.
    return sorted(calls, key=lambda call: call[1] == "delete")


def test_every_route_and_method_of_the_url_conf_has_its_expected_permissions():
    calls = _calls()
    # A new route or method must say here who may use it.
    assert {c for c in calls if c[1] not in ("head", "options")} == set(ALLOWED_BY)
    assert {name for name, _ in calls} == set(_paths())
    assert all(_allowed_by(*call) for call in calls)


# --- the world each walk acts on ------------------------------------------------------


@pytest.fixture(autouse=True)
def _webhook_settings(settings):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    settings.WEBHOOK_TIMEOUT_SECONDS = 1.0
    settings.WEBHOOK_RETRY_SECONDS = []  # one attempt, then failed


@pytest.fixture
def world(gateway):
    """An endpoint on a closed port of 127.0.0.1 with one failed (so
    resendable) delivery, made by a real confirmed purchase."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/hook"
    endpoint = webhook_endpoint_create(url=url, events=ALL)
    saga = saga_charge(
        saga_id=start_purchase(UserFactory(username="buyer"), EventFactory(seats=["A1"])).pk
    )
    assert saga.state == "CONFIRMED"
    drain_outbox()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == "failed"
    return {"endpoint": endpoint.pk, "delivery": delivery.pk, "url": url}


def _call(client, world, name: str, method: str):
    path = _paths()[name].format(**world)
    body = {
        ("webhook-endpoint-list", "post"): {"url": world["url"], "events": ALL},
        ("webhook-endpoint-detail", "patch"): {"description": "changed"},
        ("webhook-delivery-resend", "post"): {"reason": "checking permissions"},
    }.get((name, method))
    if body is not None:
        return getattr(client, method)(path, body, format="json")
    return getattr(client, method)(path)


def _staff(*codenames: str, **flags) -> APIClient:
    user = UserFactory(username="staff-" + ("-".join(codenames) or "none"), is_staff=True, **flags)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="webhooks", codename__in=codenames)
    )
    return _client_for(user)


def _walk(client, world) -> dict[tuple[str, str], int]:
    """Every call of the URL conf, once each; refused ones must change nothing."""
    answers = {}
    for name, method in _ordered(_calls()):
        before = webhook_state()
        response = _call(client, world, name, method)
        answers[(name, method)] = response.status_code
        if response.status_code in (401, 403):
            assert webhook_state() == before, (name, method)
            if method != "head":
                code = "not_authenticated" if response.status_code == 401 else "permission_denied"
                assert response.json()["code"] == code, response.content
    return answers


# --- the walks ------------------------------------------------------------------------


def test_anonymous_is_401_everywhere(world):
    assert set(_walk(APIClient(), world).values()) == {401}


def test_a_staff_user_without_permissions_is_403_everywhere(world):
    assert set(_walk(_staff(), world).values()) == {403}


def test_a_user_holding_every_permission_but_not_staff_is_403_everywhere(world):
    user = UserFactory(username="not-staff")
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="webhooks"))

    assert set(_walk(_client_for(user), world).values()) == {403}


def test_a_superuser_is_served_everywhere(world):
    answers = _walk(_staff(is_superuser=True), world)

    assert answers == {call: _served(*call) for call in _calls()}


def _webhook_codenames() -> list[str]:
    # Every permission of the app (the attempts' too), not only those the
    # API asks for: any other one must open nothing.
    from django.apps import apps

    return sorted(
        f"{action}_{model._meta.model_name}"
        for model in apps.get_app_config("webhooks").get_models()
        for action in model._meta.default_permissions
    ) + [RESEND]


@pytest.mark.parametrize("codename", _webhook_codenames())
def test_one_permission_opens_exactly_what_it_matches(world, codename):
    answers = _walk(_staff(codename), world)

    expected = {call: _served(*call) if _opens({codename}, *call) else 403 for call in _calls()}
    assert answers == expected


@pytest.mark.parametrize(
    "codenames",
    [(RESEND, VIEW_DELIVERIES), (RESEND, CHANGE_DELIVERIES), (RESEND, VIEW)],
    ids="+".join,
)
def test_resend_opens_with_what_reaches_the_deliveries_as_in_the_admin(world, codenames):
    answers = _walk(_staff(*codenames), world)

    expected = {call: _served(*call) if _opens(set(codenames), *call) else 403 for call in _calls()}
    assert answers == expected
    resend = ("webhook-delivery-resend", "post")
    assert (answers[resend] == 202) is (VIEW not in codenames)


def test_a_permission_taken_away_is_seen_at_once(world, settings):
    settings.AUTH_TOKEN_CACHE_SECONDS = 60  # the user is remembered, not its permissions
    user = UserFactory(username="vic", is_staff=True)
    view = Permission.objects.get(content_type__app_label="webhooks", codename=VIEW)
    user.user_permissions.add(view)
    client = _client_for(user)
    assert client.get("/api/webhook-endpoints/").status_code == 200

    user.user_permissions.remove(view)

    assert client.get("/api/webhook-endpoints/").status_code == 403


def test_the_refusal_names_the_permission_it_takes(world):
    response = _staff(VIEW).delete(f"/api/webhook-endpoints/{world['endpoint']}/")

    assert response.status_code == 403
    assert "webhooks.delete_webhookendpoint" in response.json()["detail"]


def test_the_permissions_hold_on_a_remembered_token(world, settings):
    # The token's user comes from the cache from the second request on
    # (purchases/authentication.py): it must be the same user, active and
    # not a superuser, for has_perm to answer as the database says.
    settings.AUTH_TOKEN_CACHE_SECONDS = 60
    client = _staff(VIEW)

    answers = [client.get("/api/webhook-endpoints/").status_code for _ in range(3)]
    deleted = client.delete(f"/api/webhook-endpoints/{world['endpoint']}/")

    assert answers == [200, 200, 200]
    assert deleted.status_code == 403
