"""The buyer pages (docs/api.md, "Pages for buyers") with Django's test
client: login, CSRF, the purchase form on the same service as the API (one
purchase per key, its errors in words, its throttle), the purchase page on
the API's history, and the live part's ETag and 304. The browser stories are
in tests/test_pages_browser.py."""

from __future__ import annotations

import html
import re
import uuid
from datetime import UTC, datetime
from urllib.parse import parse_qs, quote

import pytest
import segno
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from purchases.models import Event, IdempotencyRecord, PriceCategory, PurchaseSaga, Seat
from purchases.ops.runbook import Action, action_run
from purchases.services import saga_charge
from shop import display

from .conftest import cache_redis, drain_outbox, row_counts, start_purchase
from .factories import EventFactory, UserFactory
from .test_public_history import FORBIDDEN, NOTE, OPERATOR

pytestmark = pytest.mark.django_db

HALL = [f"{row}{n}" for row in "ABCDE" for n in range(1, 11)]
TEST_METHODS = [
    "pm_card_visa",
    "pm_card_chargeDeclined",
    "pm_card_timeout_charged",
    "pm_card_timeout_not_charged",
    "pm_card_unreachable",
]


# --- reading the pages --------------------------------------------------------------


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def seat_statuses(page: str) -> dict[str, str]:
    return dict(re.findall(r'data-seat="([^"]+)" data-seat-status="([^"]+)"', page))


def history_steps(page: str) -> list[str]:
    return [_text(m) for m in re.findall(r"<li data-history-step[^>]*>(.*?)</li>", page, re.S)]


def purchase_status(page: str) -> str:
    [status] = re.findall(r'data-purchase-status="([A-Z_]+)"', page)
    return status


def problem(page: str) -> tuple[str, str]:
    found = re.search(
        r'<div class="problem"[^>]*data-error="([a-z_]+)"[^>]*>(.*?)</div>', page, re.S
    )
    assert found, "no problem shown"
    return found.group(1), _text(found.group(2))


def form_key(page: str) -> str:
    found = re.search(r'name="idempotency_key" value="([^"]+)"', page)
    assert found is not None, "no idempotency key on the page"
    return found.group(1)


def live_part(page: str) -> str:
    start = page.index('<div id="purchase-live"')
    return page[start : page.index("</main>")]


def page_of(response) -> str:
    return response.content.decode()


def _without_csrf(response) -> str:
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", page_of(response))


# --- fixtures -------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def cache_of_this_test(settings):
    """The catalog's cache under a key prefix of this test's own: these tests
    run in a transaction that never commits, so the moves a commit makes
    (a new event, a seat held) never reach the cache, and another test's
    entries must not be seen (as tests/test_catalog_cache.py does)."""
    config = settings.CACHES["default"]
    prefix = f"{config.get('KEY_PREFIX') or 'boxoffice-test'}-{uuid.uuid4().hex[:12]}"
    settings.CACHES = {"default": {**config, "KEY_PREFIX": prefix}}
    yield prefix
    client = cache_redis(write=True)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def hall():
    return EventFactory(name="demo night", seats=HALL, seats__price=5000)


@pytest.fixture
def alice_page(alice):
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def bob_page(bob):
    client = Client()
    client.force_login(bob)
    return client


def buy(client, event, *, seats=(), quantity=None, method="pm_card_visa", key=None):
    body = {
        "idempotency_key": key or f"page-{uuid.uuid4()}",
        "seats": list(seats),
        "payment_method": method,
    }
    if quantity is not None:
        body["quantity"] = str(quantity)
    return client.post(f"/events/{event.pk}/", body)


def saga_of(response) -> PurchaseSaga:
    assert response.status_code == 303, page_of(response)
    found = re.fullmatch(r"/purchases/([0-9a-f-]{36})/", response["Location"])
    assert found, response["Location"]
    return PurchaseSaga.objects.get(pk=found.group(1))


# --- login ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/purchases/",
        "/purchases/00000000-0000-4000-8000-000000000000/",
        "/purchases/00000000-0000-4000-8000-000000000000/live/",
    ],
)
def test_every_purchase_page_asks_for_a_login_and_comes_back_after_it(client, path):
    answer = client.get(path)

    assert answer.status_code == 302
    assert answer["Location"] == f"/accounts/login/?next={path}"


# --- anyone sees what is sold; Buy asks who you are ------------------------------------


def _links(page: str) -> list[str]:
    return [html.unescape(href) for href in re.findall(r'href="([^"#]+)"', page)]


def test_anyone_sees_the_events_and_the_seat_map_with_log_in_in_the_header(client, hall):
    events = client.get("/")
    seat_map = client.get(f"/events/{hall.pk}/")

    assert events.status_code == 200 and seat_map.status_code == 200
    assert "demo night" in page_of(events) and f'href="/events/{hall.pk}/"' in page_of(events)
    text = page_of(seat_map)
    assert seat_statuses(text) == dict.fromkeys(HALL, "available")
    assert 'data-action="buy"' in text and 'name="payment_method"' in text
    assert 'name="quantity"' in text
    for page, path in ((page_of(events), "/"), (text, f"/events/{hall.pk}/")):
        assert "Log out" not in page and "My purchases" not in page
        assert f'href="/accounts/login/?next={quote(path)}">Log in</a>' in page


def test_every_link_an_anonymous_visitor_sees_leads_somewhere(client, hall):
    seen, todo = set(), ["/", f"/events/{hall.pk}/"]
    while todo:
        path = todo.pop()
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.status_code)
        seen.add(path)
        todo += [
            link
            for link in _links(page_of(answer))
            if link.startswith("/") and not link.startswith("/static/") and link not in seen
        ]
    assert "/accounts/login/?next=/" in seen  # the header's Log in
    assert "/accounts/signup/?next=/" in seen  # the header's Sign up


def test_buy_by_an_anonymous_visitor_asks_for_a_login_and_starts_nothing(client, hall, settings):
    settings.PURCHASE_THROTTLE_RATE = "1/min"

    answer = buy(client, hall, seats=["A2", "B5"], method="pm_card_timeout_charged")

    assert answer.status_code == 303
    login, _, query = answer["Location"].partition("?")
    assert login == "/accounts/login/"
    [back] = parse_qs(query)["next"]
    seat_map, _, choice = back.partition("?")
    assert seat_map == f"/events/{hall.pk}/"
    assert parse_qs(choice) == {
        "seats": ["A2", "B5"],
        "payment_method": ["pm_card_timeout_charged"],
    }
    assert row_counts() == dict.fromkeys(row_counts(), 0)
    assert set(Seat.objects.values_list("status", flat=True)) == {"available"}


@pytest.mark.parametrize("fake_gateway", [True, False])
def test_only_a_test_card_is_carried_through_the_login(client, hall, settings, fake_gateway):
    # A real processor's payment method is the buyer's: the login's URL ends
    # up in access logs, the browser's history and Referer headers.
    settings.FAKE_GATEWAY_ENABLED = fake_gateway
    carried = {}
    for method in ("pm_card_visa", "pm_1Qx9realPaymentMethod"):
        answer = buy(client, hall, seats=["A2"], method=method)
        [back] = parse_qs(answer["Location"].partition("?")[2])["next"]
        carried[method] = parse_qs(back.partition("?")[2]).get("payment_method")

    assert carried == {
        "pm_card_visa": ["pm_card_visa"] if fake_gateway else None,
        "pm_1Qx9realPaymentMethod": None,
    }


def test_the_choice_comes_back_through_the_login_to_the_seat_map(client, alice, hall):
    answer = buy(client, hall, quantity=3, method="pm_card_chargeDeclined")
    login_page = client.get(answer["Location"])
    [back] = parse_qs(answer["Location"].partition("?")[2])["next"]
    assert f'name="next" value="{html.escape(back)}"' in page_of(login_page)

    logged_in = client.post(
        "/accounts/login/", {"username": "alice", "password": "pw", "next": back}
    )
    assert logged_in.status_code == 302 and logged_in["Location"] == back
    text = page_of(client.get(back))

    assert re.search(r'name="quantity"[^>]*value="3"', text)
    assert '<option value="pm_card_chargeDeclined" selected>' in text
    assert "Log out" in text


def test_the_seat_map_draws_a_carried_choice_ticked(client, hall):
    Seat.objects.filter(event=hall, ref="C3").update(status="sold")

    text = page_of(
        client.get(f"/events/{hall.pk}/?seats=A2&seats=B5&seats=C3&payment_method=pm_card_visa")
    )

    ticked = set(re.findall(r'value="([A-Z0-9]+)" id="seat-[A-Z0-9]+"\s+checked', text))
    assert ticked == {"A2", "B5"}  # C3 was sold meanwhile: not ticked


@pytest.mark.parametrize(
    "query",
    [
        "seats=A%001&quantity=%00&payment_method=%00",
        "seats=" + "Z" * 5000 + "&quantity=" + "9" * 5000,
        "quantity=abc&payment_method=<script>",
        "&".join(["seats=A1"] * 500),
    ],
)
def test_a_carried_choice_never_breaks_the_seat_map(client, hall, query):
    answer = client.get(f"/events/{hall.pk}/?{query}")

    assert answer.status_code == 200
    assert "<script>" not in page_of(answer).split("</head>", 1)[1]


def test_an_anonymous_visitor_posting_garbage_is_sent_to_log_in_not_a_500(client, hall):
    answer = client.post(
        f"/events/{hall.pk}/",
        {"seats": ["A\x001", "Z" * 5000], "quantity": "\x00", "payment_method": "x" * 5000},
    )

    assert answer.status_code == 303 and answer["Location"].startswith("/accounts/login/")
    assert client.get(parse_qs(answer["Location"].partition("?")[2])["next"][0]).status_code == 200


def test_an_unknown_event_is_a_404_for_anyone(client):
    assert client.get("/events/999999/").status_code == 404


def test_the_login_page_logs_in_and_goes_where_the_buyer_was_going(client, alice, hall):
    form = client.get(f"/accounts/login/?next=/events/{hall.pk}/")
    assert form.status_code == 200
    text = page_of(form)
    assert 'name="username"' in text and 'name="password"' in text
    assert '<label for="id_username">' in text and '<label for="id_password">' in text
    assert f'value="/events/{hall.pk}/"' in text

    wrong = client.post("/accounts/login/", {"username": "alice", "password": "nope"})
    assert wrong.status_code == 200 and "did not match" in page_of(wrong)

    answer = client.post(
        "/accounts/login/", {"username": "alice", "password": "pw", "next": f"/events/{hall.pk}/"}
    )
    assert answer.status_code == 302 and answer["Location"] == f"/events/{hall.pk}/"
    assert client.get(f"/events/{hall.pk}/").status_code == 200


def test_logging_out_is_a_post_and_ends_the_session(alice_page):
    assert alice_page.get("/purchases/").status_code == 200
    assert alice_page.get("/accounts/logout/").status_code == 405

    answer = alice_page.post("/accounts/logout/")

    assert answer.status_code == 302 and answer["Location"] == "/accounts/login/"
    assert alice_page.get("/purchases/").status_code == 302
    assert "Log in</a>" in page_of(alice_page.get("/"))


def test_a_poll_of_a_logged_out_page_reloads_it_instead_of_swapping_the_login_in(alice, client):
    saga = start_purchase(alice, EventFactory(seats=["A1"]))

    answer = client.get(f"/purchases/{saga.pk}/live/", headers={"HX-Request": "true"})

    assert answer.status_code == 200 and answer["HX-Refresh"] == "true"
    assert answer.content == b""


# --- CSRF -----------------------------------------------------------------------------


def test_every_form_needs_its_csrf_token(alice, hall):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)

    refused = buy(client, hall, seats=["A1"])
    assert refused.status_code == 403
    assert not PurchaseSaga.objects.exists()
    assert client.post("/accounts/logout/").status_code == 403

    page = page_of(client.get(f"/events/{hall.pk}/"))
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert found is not None, "no CSRF token on the page"
    token = found.group(1)
    answer = client.post(
        f"/events/{hall.pk}/",
        {
            "csrfmiddlewaretoken": token,
            "idempotency_key": form_key(page),
            "seats": ["A1"],
            "payment_method": "pm_card_visa",
        },
    )
    assert answer.status_code == 303
    assert PurchaseSaga.objects.count() == 1


def test_the_login_form_needs_its_csrf_token(alice):
    client = Client(enforce_csrf_checks=True)
    answer = client.post("/accounts/login/", {"username": "alice", "password": "pw"})
    assert answer.status_code == 403


# --- the catalog ------------------------------------------------------------------------


def test_the_events_page_lists_the_catalog(alice_page, hall):
    text = page_of(alice_page.get("/"))

    assert "demo night" in text and f'href="/events/{hall.pk}/"' in text
    assert "50</strong> seats available" in text
    assert '<html lang="en">' in text and 'href="#main"' in text


def test_the_seat_map_lays_out_the_hall_with_every_control_labelled(alice_page, hall, alice):
    start_purchase(alice, hall, seats=["C5"])  # held
    Seat.objects.filter(event=hall, ref="E10").update(status="sold")

    answer = alice_page.get(f"/events/{hall.pk}/")

    assert answer.status_code == 200
    text = page_of(answer)
    statuses = seat_statuses(text)
    assert list(statuses) == HALL  # rows A-E, seats 1-10, in order
    assert statuses["C5"] == "held" and statuses["E10"] == "sold"
    assert {s for ref, s in statuses.items() if ref not in ("C5", "E10")} == {"available"}
    # each seat a labelled checkbox; a taken one cannot be ticked
    assert len(re.findall(r'<input type="checkbox" class="seat-input" name="seats"', text)) == 50
    assert re.search(r'value="C5" id="seat-C5"\s+disabled', text)
    assert "Row C, seat 5, 50.00 EUR, held by another buyer" in text
    assert "Row A, seat 1, 50.00 EUR, free" in text
    # the legend: shapes and words, and the price
    assert "striped, dashed edge" in text and "50.00 EUR</strong> a seat" in text
    # the form
    assert re.search(r'<input type="number" name="quantity" id="id_quantity"', text)
    assert '<label for="id_quantity">' in text and '<label for="id_payment_method">' in text
    options = re.findall(r'<option value="([^"]+)"', text)
    assert options == TEST_METHODS
    assert re.search(r'<select name="payment_method"[^>]*id="id_payment_method"', text)
    assert 'data-action="buy"' in text and form_key(text)


def test_without_the_fake_gateway_the_payment_method_is_a_token_to_type(alice_page, hall, settings):
    settings.FAKE_GATEWAY_ENABLED = False

    text = page_of(alice_page.get(f"/events/{hall.pk}/"))

    assert "<select" not in text and "pm_card_chargeDeclined" not in text
    assert re.search(r'<input type="text" name="payment_method"[^>]*id="id_payment_method"', text)


def test_the_seat_map_is_served_from_the_catalogs_cache(alice_page, hall):
    alice_page.get(f"/events/{hall.pk}/")  # fills the cache

    with CaptureQueriesContext(connection) as queries:
        assert alice_page.get(f"/events/{hall.pk}/").status_code == 200

    assert not [q["sql"] for q in queries if "purchases_seat" in q["sql"]]


def test_an_unknown_event_is_a_404(alice_page):
    assert alice_page.get("/events/999999/").status_code == 404


# --- buying from the page ------------------------------------------------------------


def test_the_form_starts_a_purchase_as_the_api_does_and_shows_it(alice_page, alice, hall):
    page = page_of(alice_page.get(f"/events/{hall.pk}/"))

    answer = buy(alice_page, hall, seats=["B3", "B4"], key=form_key(page))

    saga = saga_of(answer)
    assert saga.buyer == alice and saga.payment_method == "pm_card_visa"
    assert sorted(saga.reservation.seat_links.values_list("seat__ref", flat=True)) == ["B3", "B4"]
    assert IdempotencyRecord.objects.get(saga=saga).key == form_key(page)
    shown = page_of(alice_page.get(answer["Location"]))
    assert purchase_status(shown) == "PENDING"
    assert "Seats held" in shown and "data-hold-countdown" in shown
    assert 'hx-trigger="every 500ms"' in shown


def test_a_double_post_with_the_same_key_makes_one_purchase(alice_page, hall):
    key = "page-double-click"

    first = buy(alice_page, hall, seats=["A1"], key=key)
    second = buy(alice_page, hall, seats=["A1"], key=key)

    assert saga_of(first) == saga_of(second)
    assert PurchaseSaga.objects.count() == 1


def test_the_same_key_for_other_seats_is_told_in_words(alice_page, hall):
    saga_of(buy(alice_page, hall, seats=["A1"], key="page-reused"))

    answer = buy(alice_page, hall, seats=["A2"], key="page-reused")

    assert answer.status_code == 422
    code, text = problem(page_of(answer))
    assert code == "idempotency_key_reused" and "already used" in text
    assert PurchaseSaga.objects.count() == 1


def test_a_taken_seat_is_told_in_words_on_a_refreshed_map(alice_page, bob, hall):
    start_purchase(bob, hall, seats=["A1"])

    answer = buy(alice_page, hall, seats=["A1", "A2"])

    assert answer.status_code == 409
    text = page_of(answer)
    code, words = problem(text)
    assert code == "seat_unavailable" and "seat A1 was just taken" in words
    assert seat_statuses(text)["A1"] == "held"
    assert re.search(r'value="A2" id="seat-A2"\s+checked', text)  # the choice is kept
    assert PurchaseSaga.objects.filter(buyer__username="alice").count() == 0


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "Choose your seats on the map, or say how many"),
        ({"seats": ["Z99"]}, "not in this hall"),
        ({"seats": HALL[:11]}, "Seats: at most 10 seats per purchase"),
        ({"quantity": "0"}, "greater than or equal to 1"),
        ({"quantity": "11"}, "How many seats: at most 10 seats per purchase"),
        ({"quantity": "two"}, "How many seats: A valid integer is required"),
        ({"seats": ["A1"], "quantity": "2"}, "Tick seats on the map or say how many"),
        ({"seats": ["A\x001"]}, "Seats: Null characters are not allowed"),
        ({"seats": ["A1"], "payment_method": ""}, "Payment method: This field may not be blank"),
    ],
)
def test_an_invalid_choice_is_told_in_words(alice_page, hall, body, says):
    answer = alice_page.post(
        f"/events/{hall.pk}/",
        {"idempotency_key": "page-invalid", "payment_method": "pm_card_visa", **body},
    )

    assert answer.status_code == 400
    code, words = problem(page_of(answer))
    assert code == "invalid" and says in words, words
    assert not PurchaseSaga.objects.exists()


def test_the_purchase_throttle_of_the_api_answers_429_with_a_page(alice_page, hall, settings):
    settings.PURCHASE_THROTTLE_RATE = "2/min"

    answers = [buy(alice_page, hall, seats=[ref]) for ref in ("A1", "A2", "A3")]

    assert [a.status_code for a in answers] == [303, 303, 429]
    assert int(answers[2]["Retry-After"]) > 0
    assert "Too many purchases" in page_of(answers[2])
    assert PurchaseSaga.objects.count() == 2


def test_the_page_spends_the_throttle_as_the_api_does(alice_page, hall, settings):
    settings.PURCHASE_THROTTLE_RATE = "1/min"
    first_key = "page-first"

    # bad input (the form's or the service's) and a reused key spend nothing ...
    assert buy(alice_page, hall, seats=["A\x001"]).status_code == 400
    assert buy(alice_page, hall, seats=["Z99"]).status_code == 400
    first = buy(alice_page, hall, seats=["A1"], key=first_key)
    assert first.status_code == 303
    assert buy(alice_page, hall, seats=["A2"], key=first_key).status_code == 422
    # ... a stored answer replays whatever the count says ...
    again = buy(alice_page, hall, seats=["A1"], key=first_key)
    assert again.status_code == 303 and again["Location"] == first["Location"]
    # ... and a new start is throttled
    assert buy(alice_page, hall, seats=["A3"]).status_code == 429
    assert PurchaseSaga.objects.count() == 1


# --- best available ------------------------------------------------------------------


def test_best_available_holds_adjacent_seats_from_the_page(alice_page, alice, hall):
    answer = buy(alice_page, hall, quantity=3)

    saga = saga_of(answer)
    seats = sorted(saga.reservation.seat_links.values_list("seat__row", "seat__number"))
    assert len(seats) == 3 and len({row for row, _ in seats}) == 1
    numbers = [n for _, n in seats]
    assert numbers == list(range(numbers[0], numbers[0] + 3))


def test_not_enough_adjacent_seats_is_told_in_words(alice_page, bob):
    event = EventFactory(seats=["A1", "A2", "A3"])
    start_purchase(bob, event, seats=["A2"])

    answer = buy(alice_page, event, quantity=2)

    assert answer.status_code == 409
    code, words = problem(page_of(answer))
    assert code == "not_enough_seats" and "2 seats are free" in words


# --- the purchase page ---------------------------------------------------------------


def test_a_confirmed_purchase_shows_the_apis_history_and_its_tickets(
    alice_page, alice, alice_api, hall, gateway
):
    saga = saga_charge(saga_id=start_purchase(alice, hall, seats=["A1", "A2"]).pk)

    text = page_of(alice_page.get(f"/purchases/{saga.pk}/"))

    assert purchase_status(text) == "CONFIRMED"
    api = alice_api.get(f"/api/purchases/{saga.pk}/").json()
    assert [step.split(" ", 1)[1] for step in history_steps(text)] == [
        h["reason"] for h in api["history"]
    ]
    tickets = re.findall(r'<li class="ticket" data-ticket="([^"]+)">(.*?)</li>', text, re.S)
    assert [seat for seat, _ in tickets] == ["A1", "A2"]
    assert all("<svg" in body and saga.reservation.ref in body for _, body in tickets)
    # each code a full QR code (not a Micro QR) of the ticket's signed code,
    # the API's (tests/test_tickets_buyer.py verifies its signature)
    signed = {t["seat"]: t["code"] for t in api["tickets"]}
    for seat, body in tickets:
        code = signed[seat]
        drawn = segno.make_qr(code, error="m").svg_inline(
            scale=5, border=2, title=code, svgclass="qr", lineclass=None
        )
        assert drawn in body
    assert "hx-trigger" not in text  # settled: nothing to poll
    assert "data-hold-countdown" not in text


def test_a_declined_purchase_says_the_seat_was_released(alice_page, alice, hall, gateway):
    saga = saga_charge(
        saga_id=start_purchase(alice, hall, payment_method="pm_card_chargeDeclined").pk
    )
    assert saga.state == "COMPENSATED"

    text = page_of(alice_page.get(f"/purchases/{saga.pk}/"))

    assert purchase_status(text) == "COMPENSATED"
    assert "nothing was charged and the seat was released" in _text(text)
    assert "Your tickets" not in text


def test_a_refunded_purchase_says_so_and_shows_no_note_of_the_operator(
    alice_page, alice, alice_api, hall, gateway
):
    saga = saga_charge(saga_id=start_purchase(alice, hall).pk)
    action_run(saga_id=saga.pk, action=Action.REFUND, operator=OPERATOR, reason=NOTE)
    drain_outbox()  # the refund row asks the processor (docs/refunds.md)

    text = page_of(alice_page.get(f"/purchases/{saga.pk}/"))
    live = page_of(alice_page.get(f"/purchases/{saga.pk}/live/"))

    assert purchase_status(text) == "CONFIRMED"  # a refund does not move the saga
    assert 'data-refund-state="full"' in text
    assert "Refunded in full" in _text(text)
    assert "Our customer service refunded your purchase." in _text(text)
    for shown in (live_part(text), live):
        assert [word for word in FORBIDDEN if word in _text(shown).lower()] == []
    api = alice_api.get(f"/api/purchases/{saga.pk}/").json()
    assert [step.split(" ", 1)[1] for step in history_steps(live)] == [
        h["reason"] for h in api["history"]
    ]


def test_an_unknown_charge_says_we_are_confirming_with_the_bank(alice_page, alice, hall, gateway):
    saga = saga_charge(
        saga_id=start_purchase(alice, hall, payment_method="pm_card_timeout_charged").pk
    )
    assert saga.state == "UNKNOWN"

    text = page_of(alice_page.get(f"/purchases/{saga.pk}/"))

    assert purchase_status(text) == "UNKNOWN"
    assert "We are confirming with your bank" in text
    assert "data-hold-countdown" in text and 'hx-trigger="every 500ms"' in text


def test_another_users_purchase_is_a_404_exactly_like_a_missing_one(alice, bob_page, hall):
    saga = start_purchase(alice, hall)
    missing = uuid.uuid4()

    for path in (f"/purchases/{saga.pk}/", f"/purchases/{saga.pk}/live/"):
        theirs = bob_page.get(path)
        nothing = bob_page.get(path.replace(str(saga.pk), str(missing)))
        assert theirs.status_code == nothing.status_code == 404
        # the same page, but for the CSRF token of its logout form (masked anew each time)
        assert _without_csrf(theirs) == _without_csrf(nothing)


def test_the_live_part_answers_304_while_the_purchase_has_not_moved(
    alice_page, alice, hall, gateway
):
    saga = start_purchase(alice, hall)
    live = f"/purchases/{saga.pk}/live/"
    poll = {"HX-Request": "true"}

    first = alice_page.get(live, headers=poll)
    assert first.status_code == 200 and first["ETag"] == 'W/"v1"'
    assert purchase_status(page_of(first)) == "PENDING"
    # the element polls with the version it shows
    assert "If-None-Match&quot;: &quot;W/\\&quot;v1\\&quot;&quot;" in page_of(first)

    with CaptureQueriesContext(connection) as queries:
        again = alice_page.get(live, headers={**poll, "If-None-Match": first["ETag"]})
    assert again.status_code == 304 and again.content == b""
    assert again["ETag"] == first["ETag"]
    # the session, its user, the saga's version: nothing else
    assert len(queries) <= 3, [q["sql"] for q in queries]

    saga_charge(saga_id=saga.pk)
    moved = alice_page.get(live, headers={**poll, "If-None-Match": first["ETag"]})
    assert moved.status_code == 200 and moved["ETag"] != first["ETag"]
    assert purchase_status(page_of(moved)) == "CONFIRMED"
    assert "hx-trigger" not in page_of(moved)  # settled: the poll stops here


# --- my purchases --------------------------------------------------------------------


def test_my_purchases_are_listed_newest_first_a_page_at_a_time(alice_page, alice, bob):
    event = EventFactory(seats=[f"A{n}" for n in range(1, 23)])
    sagas = [start_purchase(alice, event, seats=[f"A{n}"]) for n in range(1, 22)]
    start_purchase(bob, event, seats=["A22"])

    first = page_of(alice_page.get("/purchases/"))
    second = page_of(alice_page.get("/purchases/?page=2"))

    listed = re.findall(r'<tr data-purchase="([^"]+)">', first + second)
    assert listed == [str(s.pk) for s in reversed(sagas)]
    assert "Page 1 of 2" in first and 'rel="next"' in first
    assert alice_page.get("/purchases/?page=3").status_code == 404


def test_the_admins_view_site_link_is_the_events_page(admin_client):
    assert admin_client.get("/").status_code == 200


def test_a_staff_user_cannot_see_a_buyers_purchase_either(admin_client, alice, hall):
    # Admins read sagas in the admin; the buyer pages are per buyer.
    saga = start_purchase(alice, hall)
    assert admin_client.get(f"/purchases/{saga.pk}/").status_code == 404


def test_a_user_without_purchases_is_told_so(client):
    UserFactory(username="dana")
    client.login(username="dana", password="pw")
    assert "No purchases yet" in page_of(client.get("/purchases/"))


# --- the seller's seat maps on the buyer's page ---------------------------------------


def test_a_blocked_seat_is_drawn_not_for_sale_and_an_accessible_one_says_so(alice_page, hall):
    Seat.objects.filter(event=hall, ref="B2").update(status="unavailable", block_reason="desk")
    Seat.objects.filter(event=hall, ref="A1").update(accessible=True, section="Stalls")

    text = page_of(alice_page.get(f"/events/{hall.pk}/"))

    assert seat_statuses(text)["B2"] == "unavailable"
    assert re.search(r'value="B2" id="seat-B2"\s+disabled', text)
    assert "Row B, seat 2, 50.00 EUR, not for sale" in text
    assert "Row A, seat 1, 50.00 EUR, free, wheelchair space" in text
    assert 'data-section-drawn="Stalls"' in text
    assert "desk" not in text  # the seller's reason is the seller's


def test_a_large_hall_is_drawn_one_section_at_a_time(alice_page, settings, monkeypatch):
    # given: a hall past what the page draws at once, in two sections
    monkeypatch.setattr(display, "DRAWN_AT_ONCE", 4)
    event = EventFactory(seats=["A1", "A2", "A3", "B1", "B2", "B3"])
    Seat.objects.filter(event=event, ref__startswith="B").update(section="Balcony")
    Seat.objects.filter(event=event, ref__startswith="A").update(section="Stalls")
    Seat.objects.filter(event=event, ref="B3").update(status="sold")

    # when
    overview = page_of(alice_page.get(f"/events/{event.pk}/"))
    balcony = page_of(alice_page.get(f"/events/{event.pk}/?section=Balcony"))

    # then: the sections with what each has free, and no seat until one is chosen
    assert seat_statuses(overview) == {}
    assert re.search(
        r'data-section="Balcony"><a href="\?section=Balcony"[^>]*>Balcony</a>: 2 of 3', overview
    )
    assert re.search(
        r'data-section="Stalls"><a href="\?section=Stalls"[^>]*>Stalls</a>: 3 of 3', overview
    )
    assert list(seat_statuses(balcony)) == ["B1", "B2", "B3"]
    # best available still chooses over the whole hall
    assert 'name="quantity"' in overview


def test_best_available_in_a_category_from_the_page(alice_page, hall):
    for code in ("stalls", "balcony"):
        PriceCategory.objects.create(
            event=hall, code=code, name=code, price_amount=5000, currency="EUR"
        )
    Seat.objects.filter(event=hall, ref__startswith="E").update(category="balcony")
    Seat.objects.filter(event=hall).exclude(ref__startswith="E").update(category="stalls")
    text = page_of(alice_page.get(f"/events/{hall.pk}/"))
    assert '<option value="balcony">balcony</option>' in text

    answer = alice_page.post(
        f"/events/{hall.pk}/",
        {
            "idempotency_key": "page-category",
            "quantity": "2",
            "category": "balcony",
            "payment_method": "pm_card_visa",
        },
    )

    saga = saga_of(answer)
    assert all(ref.startswith("E") for ref in saga.reservation.seats.values_list("ref", flat=True))


@pytest.mark.parametrize(
    "rules, code, says",
    [
        ({"sales_end": datetime(2020, 1, 1, tzinfo=UTC)}, "sales_closed", "are closed"),
        ({"max_seats_per_buyer": 1}, "buyer_limit_reached", "at most 1 seat for this event"),
    ],
)
def test_the_sellers_rules_are_told_in_words(alice_page, hall, rules, code, says):
    Event.objects.filter(pk=hall.pk).update(**rules)

    answer = buy(alice_page, hall, seats=["A1", "A2"])

    assert answer.status_code == 409
    shown, words = problem(page_of(answer))
    assert shown == code and says in words, words
    assert not PurchaseSaga.objects.exists()
