"""Accounts (docs/api.md, "Accounts"): ``POST /api/auth/signup/`` (its
answer, a username or email already taken whatever its case, Django's
password validators, bad bodies, two sign-ups at once on real connections),
the sign-up page on the same service and serializer (logged in, then a safe
``next`` only), the throttle the token endpoint, the API and the pages
share, the password reset by email from the mail's link to a login with the
new password, and in Chromium a visitor who signs up from the shop and logs
out."""

from __future__ import annotations

import html
import json
import re
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth import get_user_model, password_validation
from django.core import mail
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.test import Client
from playwright.sync_api import expect
from rest_framework.test import APIClient

from accounts import selectors
from purchases.throttling import TokenThrottle

from .conftest import race
from .factories import UserFactory
from .test_pages_browser import PHONE, browser, pages  # noqa: F401 - the Chromium fixtures

User = get_user_model()
SIGNUP = "/api/auth/signup/"
PAGE = "/accounts/signup/"
STRONG = "plum-harbour-91"


def _body(**changes: Any) -> dict[str, Any]:
    body = {"username": "carol", "email": "carol@example.com", "password": STRONG}
    return {**body, **changes}


def _signup(body: Any, **extra: Any):
    # ASCII, escapes and all: a lone surrogate too.
    return APIClient().post(SIGNUP, json.dumps(body), content_type="application/json", **extra)


def _text(page: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


# --- the API ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_signup_answers_201_with_the_account_whose_password_gets_a_token():
    answer = _signup(_body(email="carol@EXAMPLE.com"))

    assert answer.status_code == 201, answer.content
    user = User.objects.get()
    # The domain in lower case, as Django's user creation stores it.
    assert answer.json() == {"id": user.pk, "username": "carol", "email": "carol@example.com"}
    assert user.is_active and not user.is_staff and not user.is_superuser
    token = APIClient().post(
        "/api/auth/token/", {"username": "carol", "password": STRONG}, format="json"
    )
    assert token.status_code == 200 and token.json()["token"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"username": "alice", "email": "other@example.com"}, "username"),
        ({"username": "ALICE", "email": "other@example.com"}, "username"),
        ({"username": "carol", "email": "alice@example.com"}, "email"),
        ({"username": "carol", "email": "Alice@Example.COM"}, "email"),
    ],
    ids=["username", "username-in-another-case", "email", "email-in-another-case"],
)
def test_a_taken_username_or_email_answers_400_naming_it(alice, changes, field):
    answer = _signup(_body(**changes))

    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] == "invalid"
    assert answer.json()["field"] == field
    assert list(answer.json()["errors"]) == [field]
    assert "already exists" in answer.json()["detail"]
    assert User.objects.count() == 1


@pytest.mark.django_db
def test_both_taken_names_both_fields(alice):
    answer = _signup(_body(username="Alice", email="ALICE@example.com"))

    assert answer.status_code == 400
    assert answer.json()["field"] == "username"
    assert set(answer.json()["errors"]) == {"username", "email"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("username", "password"),
    [
        ("carol", "short1"),
        ("carol", "12345678901"),
        ("carol", "password123"),
        ("carolina.rossi", "carolinarossi"),
    ],
    ids=["too-short", "all-digits", "too-common", "like-the-username"],
)
def test_a_weak_password_answers_400_with_djangos_messages(username, password):
    expected = []
    try:
        password_validation.validate_password(
            password, User(username=username, email="carol@example.com")
        )
    except ValidationError as exc:
        expected = exc.messages
    assert expected, "Django's validators take it: not a weak password"

    answer = _signup(_body(username=username, password=password))

    assert answer.status_code == 400, answer.content
    assert answer.json()["field"] == "password"
    assert answer.json()["errors"] == {"password": expected}
    assert not User.objects.exists()


@pytest.mark.django_db
def test_the_validators_are_djangos_four(settings):
    assert [v["NAME"].rsplit(".", 1)[1] for v in settings.AUTH_PASSWORD_VALIDATORS] == [
        "UserAttributeSimilarityValidator",
        "MinimumLengthValidator",
        "CommonPasswordValidator",
        "NumericPasswordValidator",
    ]


# Bad bodies, refused alike by the API and the page (which posts the same
# fields as a form): a 400 naming the field, no account, never a 500.
@dataclass(frozen=True)
class Bad:
    name: str
    field: str
    changes: dict[str, Any]
    form: bool = True  # a form can say it (not a number, a list, a lone surrogate)

    def body(self) -> dict[str, Any]:
        body = _body(**self.changes)
        return {k: v for k, v in body.items() if v is not None}


LIGATURE = "\ufb03"  # one character; "ffi", three, once stored (NFKC)
BAD = [
    Bad("no-username", "username", {"username": None}),
    Bad("blank-username", "username", {"username": "  "}),
    Bad("username-with-a-space", "username", {"username": "carol rossi"}),
    Bad("username-with-a-slash", "username", {"username": "carol/rossi"}),
    Bad("long-username", "username", {"username": "c" * 151}),
    Bad("username-long-once-stored", "username", {"username": LIGATURE * 60}),
    Bad("nul-in-username", "username", {"username": "car\x00ol"}),
    Bad("surrogate-username", "username", {"username": "car\ud800ol"}, form=False),
    Bad("no-email", "email", {"email": None}),
    Bad("blank-email", "email", {"email": ""}),
    Bad("not-an-email", "email", {"email": "carol"}),
    Bad("long-email", "email", {"email": f"{'c' * 250}@example.com"}),
    Bad("nul-in-email", "email", {"email": "carol\x00@example.com"}),
    Bad("email-a-list", "email", {"email": ["carol@example.com"]}, form=False),
    Bad("no-password", "password", {"password": None}),
    Bad("blank-password", "password", {"password": ""}),
    Bad("nul-in-password", "password", {"password": "plum\x00harbour-91"}),
    Bad("surrogate-password", "password", {"password": "plum-\ud800-91"}, form=False),
]


@pytest.mark.django_db
@pytest.mark.parametrize("bad", BAD, ids=[b.name for b in BAD])
def test_the_api_refuses_a_bad_body_naming_the_field(bad):
    answer = _signup(bad.body())

    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] == "invalid"
    assert answer.json()["field"] == bad.field
    assert not User.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("bad", [b for b in BAD if b.form], ids=[b.name for b in BAD if b.form])
def test_the_page_refuses_the_same_input_naming_the_same_field(client, bad):
    answer = client.post(PAGE, bad.body())

    assert answer.status_code == 400, answer.content[:2000]
    page = answer.content.decode()
    assert 'data-error="invalid"' in page
    assert f'data-error-field="{bad.field}"' in page
    assert not User.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        ("{not json", "application/json", 400, "parse_error"),
        ('["carol"]', "application/json", 400, "invalid"),
        ("username=carol", "application/x-www-form-urlencoded", 415, "unsupported_media_type"),
    ],
    ids=["not-json", "not-an-object", "a-form"],
)
def test_a_body_that_is_no_json_object_is_refused(body, content_type, status, code):
    answer = APIClient().post(SIGNUP, body, content_type=content_type)

    assert answer.status_code == status, answer.content
    assert answer.json()["code"] == code
    assert not User.objects.exists()


@pytest.mark.django_db
def test_a_stale_token_does_not_stand_in_the_way():
    answer = APIClient().post(
        SIGNUP, _body(), format="json", HTTP_AUTHORIZATION="Token stale-token-from-last-week"
    )

    assert answer.status_code == 201, answer.content


# --- two sign-ups at once -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("bodies", "field"),
    [
        ([_body(), _body(email="carl@example.com")], "username"),
        ([_body(), _body(username="Carol", email="carl@example.com")], "username"),
        ([_body(email="Carol@example.com"), _body(username="carl")], "email"),
    ],
    ids=["one-username", "one-username-in-two-cases", "one-email-in-two-cases"],
)
def test_two_signups_at_once_for_one_name_make_one_account_and_a_400(monkeypatch, bodies, field):
    # Both look before either writes (the look-up held until both have
    # looked): only the unique index can tell them apart.
    looked = threading.Barrier(2, timeout=30)
    found: list[list[str]] = []
    look = selectors.account_taken

    def look_then_wait(**names: str) -> list[str]:
        taken = look(**names)
        found.append(taken)
        looked.wait()
        return taken

    monkeypatch.setattr(selectors, "account_taken", look_then_wait)

    answers = race(2, lambda i: _signup(bodies[i]))

    assert found == [[], []]
    assert all(hasattr(a, "status_code") for a in answers), answers  # no exception, no 500
    assert sorted(a.status_code for a in answers) == [201, 400], [a.content for a in answers]
    [refused] = [a for a in answers if a.status_code == 400]
    assert refused.json()["code"] == "invalid"
    assert refused.json()["field"] == field
    assert "already exists" in refused.json()["detail"]
    assert User.objects.count() == 1


# --- the throttle -------------------------------------------------------------------------


@pytest.fixture
def address():
    """A client address of this test's own, its throttle count cleared
    (not the whole cache: other test sessions share it)."""
    ip = "198.51.100.23"
    key = TokenThrottle.cache_format % {"scope": TokenThrottle.scope, "ident": ip}
    cache.delete(key)
    yield ip
    cache.delete(key)


@pytest.mark.django_db
def test_signups_and_token_requests_share_the_token_throttle_per_address(settings, address):
    settings.AUTH_TOKEN_THROTTLE_RATE = "3/min"
    page = Client(REMOTE_ADDR=address)

    first = _signup(_body(), REMOTE_ADDR=address)
    token = APIClient().post(
        "/api/auth/token/",
        {"username": "carol", "password": "a guess"},
        format="json",
        REMOTE_ADDR=address,
    )
    second = page.post(PAGE, _body(username="dora", email="dora@example.com"))
    past_the_rate = [
        _signup(_body(username="erin", email="erin@example.com"), REMOTE_ADDR=address),
        Client(REMOTE_ADDR=address).post(PAGE, _body(username="erin", email="erin@example.com")),
        Client(REMOTE_ADDR=address).post(
            "/accounts/password-reset/", {"email": "carol@example.com"}
        ),
    ]

    assert (first.status_code, token.status_code, second.status_code) == (201, 400, 303)
    assert [a.status_code for a in past_the_rate] == [429, 429, 429]
    assert past_the_rate[0].json()["code"] == "throttled"
    for answer in past_the_rate:
        assert 0 < int(answer["Retry-After"]) <= 60
    assert "Too many attempts" in past_the_rate[1].content.decode()
    assert set(User.objects.values_list("username", flat=True)) == {"carol", "dora"}
    assert mail.outbox == []


# --- the sign-up page ---------------------------------------------------------------------


@pytest.mark.django_db
def test_the_page_makes_the_account_logs_in_and_goes_to_next(client):
    form = client.get(f"{PAGE}?next=/events/7/%3Fseats%3DA1")
    assert form.status_code == 200
    assert 'name="next" value="/events/7/?seats=A1"' in form.content.decode()

    answer = client.post(PAGE, {**_body(), "next": "/events/7/?seats=A1"})

    assert answer.status_code == 303, answer.content[:2000]
    assert answer["Location"] == "/events/7/?seats=A1"
    user = User.objects.get()
    assert (user.username, user.email) == ("carol", "carol@example.com")
    assert user.check_password(STRONG)
    assert client.get("/purchases/").status_code == 200  # logged in
    assert "Log out" in client.get("/").content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "next_url",
    ["https://evil.example/", "//evil.example/", "http://testserver.evil.example/", ""],
)
def test_the_page_goes_to_the_events_when_next_is_not_of_this_site(client, next_url):
    answer = client.post(PAGE, {**_body(), "next": next_url})

    assert answer.status_code == 303
    assert answer["Location"] == "/"
    assert User.objects.filter(username="carol").exists()


@pytest.mark.django_db
def test_the_page_refuses_a_taken_name_and_a_weak_password_in_words(client, alice):
    taken = client.post(PAGE, _body(username="Alice"))
    weak = client.post(PAGE, _body(password="password"))

    assert taken.status_code == 400
    assert 'data-error-field="username"' in taken.content.decode()
    assert "A user with that username already exists." in _text(taken.content.decode())
    assert weak.status_code == 400
    assert 'data-error-field="password"' in weak.content.decode()
    assert "This password is too common." in _text(weak.content.decode())
    assert User.objects.count() == 1
    # What was typed comes back, but for the password.
    assert 'value="Alice"' in taken.content.decode()
    assert STRONG not in taken.content.decode()


@pytest.mark.django_db
def test_a_logged_in_visitor_is_sent_on(client, alice):
    client.force_login(alice)

    answer = client.get(f"{PAGE}?next=/purchases/")

    assert answer.status_code == 302 and answer["Location"] == "/purchases/"


@pytest.mark.django_db
def test_the_header_offers_sign_up_and_log_in_coming_back_and_log_out_once_in(client, alice):
    events = client.get("/").content.decode()
    signup = client.get(f"{PAGE}?next=/purchases/").content.decode()
    login = client.get("/accounts/login/?next=/purchases/").content.decode()
    reset = client.get("/accounts/password-reset/").content.decode()

    assert 'href="/accounts/signup/?next=/">Sign up</a>' in events
    assert 'href="/accounts/login/?next=/">Log in</a>' in events
    # The account pages carry on to where the visitor was going.
    assert 'href="/accounts/login/?next=/purchases/">Log in</a>' in signup
    assert 'aria-current="page">Sign up</a>' in signup
    assert 'href="/accounts/signup/?next=/purchases/">Sign up</a>' in login
    assert 'href="/accounts/password-reset/"' in signup
    assert 'href="/accounts/signup/?next=/">Sign up</a>' in reset
    client.force_login(alice)
    mine = client.get("/").content.decode()
    assert "Sign up" not in mine and ">Log in</a>" not in mine
    assert 'action="/accounts/logout/"' in mine


# --- password reset -----------------------------------------------------------------------

LINK = re.compile(r"http://testserver(/accounts/password-reset/[^/\s]+/[^/\s]+/)")


@pytest.mark.django_db
def test_a_password_reset_mails_one_link_that_sets_a_new_password(client):
    UserFactory(username="dora", email="dora@example.com", password="old-harbour-12")

    asked = client.post("/accounts/password-reset/", {"email": "DORA@example.com"})

    assert asked.status_code == 302 and asked["Location"] == "/accounts/password-reset/sent/"
    assert "data-reset-sent" in client.get(asked["Location"]).content.decode()
    [sent] = mail.outbox
    assert sent.to == ["dora@example.com"]
    assert sent.subject == "Reset your boxoffice password"
    link = LINK.search(str(sent.body))
    assert link is not None, sent.body

    # The link: the token moves into the session, out of the URL.
    opened = client.get(link.group(1))
    assert opened.status_code == 302 and opened["Location"].endswith("/set-password/")
    form = client.get(opened["Location"])
    assert form.status_code == 200 and 'name="new_password1"' in form.content.decode()
    weak = client.post(opened["Location"], {"new_password1": "dora", "new_password2": "dora"})
    assert weak.status_code == 200 and "This password is too short." in _text(weak.content.decode())
    done = client.post(
        opened["Location"],
        {"new_password1": "fresh-harbour-34", "new_password2": "fresh-harbour-34"},
    )
    assert done.status_code == 302 and done["Location"] == "/accounts/password-reset/done/"
    assert "data-reset-complete" in client.get(done["Location"]).content.decode()

    # Logged in with the new password, not with the old one; the link is spent.
    fresh = Client()
    refused = fresh.post("/accounts/login/", {"username": "dora", "password": "old-harbour-12"})
    assert refused.status_code == 200
    logged_in = fresh.post("/accounts/login/", {"username": "dora", "password": "fresh-harbour-34"})
    assert logged_in.status_code == 302
    assert fresh.get("/purchases/").status_code == 200
    again = Client().get(link.group(1), follow=True)
    assert 'data-error="invalid_link"' in again.content.decode()


@pytest.mark.django_db
def test_a_reset_for_an_unknown_address_says_the_same_and_sends_nothing(client):
    asked = client.post("/accounts/password-reset/", {"email": "nobody@example.com"})

    assert asked.status_code == 302 and asked["Location"] == "/accounts/password-reset/sent/"
    assert mail.outbox == []


# --- in a browser -------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_visitor_signs_up_from_the_shop_on_a_phone_and_logs_out(
    live_server,
    pages,  # noqa: F811 - the fixture imported above
):
    page = pages(viewport=PHONE)
    base = live_server.url
    nav = page.get_by_role("navigation", name="Main")

    page.goto(f"{base}/")
    nav.get_by_role("link", name="Sign up").click()
    expect(page).to_have_url(f"{base}/accounts/signup/?next=/")
    page.get_by_label("Username").fill("erin")
    page.get_by_label("Email").fill("erin@example.com")
    page.get_by_label("Password").fill("12345678")
    page.get_by_role("button", name="Sign up").click()
    expect(page.get_by_role("alert")).to_contain_text("No account made")
    expect(page.locator("#signup-password-error")).to_contain_text("This password is too common.")
    page.get_by_label("Password").fill(STRONG)
    page.get_by_role("button", name="Sign up").click()

    expect(page).to_have_url(f"{base}/")
    expect(nav.get_by_role("link", name="My purchases")).to_be_visible()
    expect(nav.get_by_role("link", name="Sign up")).to_have_count(0)
    nav.get_by_role("button", name=re.compile(r"^Log out")).click()

    expect(page).to_have_url(re.compile(r"/accounts/login/"))
    expect(nav.get_by_role("link", name="Sign up")).to_be_visible()
    expect(nav.get_by_role("link", name="My purchases")).to_have_count(0)
    assert User.objects.filter(username="erin", email="erin@example.com").exists()


@pytest.mark.django_db
def test_password_guesses_at_the_login_page_count_against_the_same_throttle(settings, address):
    """The session login page is the token endpoint without JSON: guesses
    there are counted with the others, or the page is a way around them."""
    settings.AUTH_TOKEN_THROTTLE_RATE = "3/min"
    UserFactory(username="carol")
    guesses = [
        Client(REMOTE_ADDR=address).post(
            "/accounts/login/", {"username": "carol", "password": f"guess {n}"}
        )
        for n in range(4)
    ]
    assert [g.status_code for g in guesses] == [200, 200, 200, 429]
    assert 0 < int(guesses[-1]["Retry-After"]) <= 60
    assert "Too many attempts" in guesses[-1].content.decode()
