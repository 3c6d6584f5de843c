"""The API's token look-up is remembered in the cache, and forgotten at once
when the token is deleted or its user saved (purchases/authentication.py)."""

import time

import pytest
from django.contrib.auth.models import Permission
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token

from purchases.authentication import cache_key

from .factories import UserFactory

ME = "/api/purchases/"  # any authenticated read


def _token_reads(client, path=ME) -> tuple[int, int]:
    """(status, how many queries read the token table)."""
    with CaptureQueriesContext(connection) as queries:
        status = client.get(path).status_code
    return status, sum("authtoken_token" in q["sql"] for q in queries)


@pytest.fixture(autouse=True)
def _remember(settings):
    settings.AUTH_TOKEN_CACHE_SECONDS = 60


@pytest.mark.django_db
def test_a_token_is_read_once_then_remembered(alice_api):
    assert _token_reads(alice_api) == (200, 1)
    assert _token_reads(alice_api) == (200, 0)
    assert _token_reads(alice_api) == (200, 0)


@pytest.mark.django_db
def test_the_remembered_user_is_the_user(alice, alice_api):
    _token_reads(alice_api)
    answer = alice_api.get(ME)  # served from the cache
    assert answer.status_code == 200
    remembered = cache.get(cache_key(Token.objects.get(user=alice).key))
    assert remembered[:2] == [alice.pk, alice.username]
    assert "password" not in str(remembered) and alice.password not in remembered


@pytest.mark.django_db
def test_the_cache_never_holds_the_token_itself(alice, alice_api):
    _token_reads(alice_api)
    key = Token.objects.get(user=alice).key
    assert key not in cache_key(key)


@pytest.mark.django_db
def test_a_deleted_token_is_refused_at_once(alice, alice_api):
    _token_reads(alice_api)
    Token.objects.filter(user=alice).delete()
    assert alice_api.get(ME).status_code == 401


@pytest.mark.django_db
def test_a_user_deactivated_is_refused_at_once(alice, alice_api):
    _token_reads(alice_api)
    alice.is_active = False
    alice.save()
    assert alice_api.get(ME).status_code == 401


@pytest.mark.django_db
def test_staff_taken_away_is_seen_at_once(api_staff):
    client, user = api_staff
    assert client.get("/api/webhook-endpoints/").status_code == 200
    user.is_staff = False
    user.save()
    assert client.get("/api/webhook-endpoints/").status_code == 403


@pytest.mark.django_db
def test_what_no_signal_sees_is_bounded_by_the_setting(alice, alice_api, settings):
    settings.AUTH_TOKEN_CACHE_SECONDS = 1
    _token_reads(alice_api)
    type(alice).objects.filter(pk=alice.pk).update(is_active=False)  # no signal

    assert alice_api.get(ME).status_code == 200  # remembered, for at most a second
    time.sleep(1.2)
    assert alice_api.get(ME).status_code == 401


@pytest.mark.django_db
def test_a_refused_token_is_never_remembered(anon_api):
    anon_api.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert _token_reads(anon_api) == (401, 1)
    assert _token_reads(anon_api) == (401, 1)


@pytest.mark.django_db
def test_zero_turns_the_cache_off(alice_api, settings):
    settings.AUTH_TOKEN_CACHE_SECONDS = 0
    assert _token_reads(alice_api) == (200, 1)
    assert _token_reads(alice_api) == (200, 1)


@pytest.fixture
def api_staff():
    from rest_framework.test import APIClient

    user = UserFactory(username="carol", is_staff=True)
    # The webhooks' staff API takes a permission besides is_staff.
    user.user_permissions.add(Permission.objects.get(codename="view_webhookendpoint"))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client, user


@pytest.mark.django_db
def test_the_user_served_from_the_cache_has_the_users_own_fields(alice):
    # A regression: the remembered values were handed to Model.from_db in our
    # order, which takes them in the model's field order, so the user served
    # from the cache had its username as is_superuser (truthy) and
    # is_superuser as is_active: every cached token looked like an inactive
    # superuser to has_perm and to the admin.
    from common.users import USER_FIELDS
    from purchases.authentication import CachedTokenAuthentication

    key = Token.objects.create(user=alice).key
    auth = CachedTokenAuthentication()
    from_database, _ = auth.authenticate_credentials(key)
    from_cache, _ = auth.authenticate_credentials(key)
    assert cache.get(cache_key(key)) is not None  # the second one was the cache's
    assert {name: getattr(from_cache, name) for name in USER_FIELDS} == {
        name: getattr(from_database, name) for name in USER_FIELDS
    }
    assert from_cache.is_superuser is False and from_cache.is_active is True
