"""A request under ``/api/organizers/{slug}/`` reads its token and the
caller's membership in one statement (purchases/authentication.py), and
so sees a deleted token, a deactivated user or a changed role at its next
request in every process: the token cache (purchases/authentication.py) is
not asked there."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from organizers.models import Membership
from organizers.roles import Role
from purchases.authentication import cache_key

from .factories import MembershipFactory, OrganizerFactory, UserFactory

ANY_ROUTE = "/api/purchases/"  # a route outside the organizers', which remembers the token


@pytest.fixture(autouse=True)
def _remember(settings):
    settings.AUTH_TOKEN_CACHE_SECONDS = 60


@pytest.fixture
def door(db):
    """A door member of an organizer, with a token, and its client."""
    membership = MembershipFactory(organizer=OrganizerFactory(slug="arena"), role=Role.DOOR)
    token = Token.objects.create(user=membership.user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return membership, token, client


def _get(client, path="/api/organizers/arena/"):
    with CaptureQueriesContext(connection) as queries:
        answer = client.get(path)
    return answer, [q["sql"] for q in queries]


@pytest.mark.django_db
def test_the_token_and_the_membership_are_one_statement(door):
    _membership, token, client = door
    answer, statements = _get(client)  # door staff may view their organizer
    assert answer.status_code == 200, answer.content
    reads = [s for s in statements if "authtoken_token" in s or "membership" in s]
    assert len(reads) == 1, reads
    assert "authtoken_token" in reads[0] and "organizers_membership" in reads[0]
    assert cache.get(cache_key(token.key)) is None  # the cache neither asked nor told


@pytest.mark.django_db
def test_a_stranger_gets_the_missing_organizers_answer_from_the_same_statement(door):
    _membership, _token, client = door
    OrganizerFactory(slug="elsewhere")
    stranger, statements = _get(client, "/api/organizers/elsewhere/")
    missing, _ = _get(client, "/api/organizers/no-such-one/")
    assert stranger.status_code == missing.status_code == 404
    assert stranger.json() == missing.json()
    assert sum("authtoken_token" in s for s in statements) == 1
    assert not any("membership" in s and "authtoken_token" not in s for s in statements)


@pytest.mark.django_db
def test_a_role_changed_takes_effect_at_the_next_request(door):
    membership, _token, client = door
    members = "/api/organizers/arena/members/"
    assert client.get(members).status_code == 403  # door may not manage members
    Membership.objects.filter(pk=membership.pk).update(role=Role.OWNER)
    assert client.get(members).status_code == 200


@pytest.mark.django_db
def test_what_the_cache_remembers_does_not_let_a_deactivated_user_in(door):
    # The user deactivated by SQL (no signal forgets the cached token): the
    # cache still remembers them active, as it may for
    # AUTH_TOKEN_CACHE_SECONDS on other routes; under the organizer they are
    # refused at once, in DRF's words.
    membership, token, client = door
    assert client.get(ANY_ROUTE).status_code == 200
    assert cache.get(cache_key(token.key)) is not None
    type(membership.user).objects.filter(pk=membership.user_id).update(is_active=False)
    assert client.get(ANY_ROUTE).status_code == 200  # the cache's bound, as documented
    answer = client.get("/api/organizers/arena/")
    assert answer.status_code == 401
    assert answer.json()["detail"] == "User inactive or deleted."


@pytest.mark.django_db
def test_a_token_deleted_by_sql_is_refused_at_once(door):
    _membership, token, client = door
    client.get(ANY_ROUTE)  # remembered
    with connection.cursor() as cursor:  # no signal
        cursor.execute("DELETE FROM authtoken_token WHERE key = %s", [token.key])
    answer = client.get("/api/organizers/arena/")
    assert answer.status_code == 401
    assert answer.json()["detail"] == "Invalid token."


@pytest.mark.django_db
def test_a_malformed_slug_is_the_missing_organizer(door):
    _membership, _token, client = door
    answer = client.get("/api/organizers/bad%00slug/")
    assert answer.status_code == 404


@pytest.mark.django_db
def test_a_session_is_authorized_by_its_own_read_of_the_membership(door):
    membership, _token, _client = door
    membership.role = Role.OWNER
    membership.save()
    client = APIClient()
    client.force_login(membership.user)
    answer, statements = _get(client)
    assert answer.status_code == 200
    assert not any("authtoken_token" in s for s in statements)
    assert any("organizers_membership" in s for s in statements)


@pytest.mark.django_db
def test_the_user_read_with_the_membership_has_the_users_own_fields(door):
    # The user is built from the statement's columns in the model's order
    # (the regression of tests/test_token_cache.py, here for this read).
    from common.users import USER_FIELDS
    from organizers.selectors import token_membership

    membership, token, _client = door
    user = membership.user
    user.is_staff, user.email = True, "door@example.com"
    user.save()
    found = token_membership(key=token.key, slug="arena")
    assert found is not None and found.membership is not None
    assert {name: getattr(found.user, name) for name in USER_FIELDS} == {
        name: getattr(user, name) for name in USER_FIELDS
    }
    assert found.membership.pk == membership.pk and found.membership.organizer.slug == "arena"
    elsewhere = token_membership(key=token.key, slug="elsewhere")
    assert elsewhere is not None and elsewhere.membership is None
    assert token_membership(key="no-such-token", slug="arena") is None


@pytest.mark.django_db
def test_another_users_read_is_not_taken_for_this_one(door, rf):
    # The permission takes the authentication's read only for the request's
    # own user and slug.
    from organizers.permissions import caller_membership
    from organizers.selectors import TokenMembership

    membership, _token, _client = door
    other = UserFactory(username="mallory")
    request = rf.get("/")
    request.user = other
    request.auth = Token(key="k", user=membership.user)
    request.auth.organizer_membership = TokenMembership(
        user=membership.user, slug="arena", membership=membership
    )
    with pytest.raises(Exception) as refused:
        caller_membership(request, "arena")
    assert type(refused.value).__name__ == "OrganizerNotFound"
