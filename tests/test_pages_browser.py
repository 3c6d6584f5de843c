"""The buyer pages in a real browser (docs/api.md, "Pages for buyers"):
headless Chromium (Debian's, /usr/bin/chromium: ``make test`` finds it or
installs it, scripts/ensure-chromium.sh) driven by Playwright, against the
live server with a real Celery worker and relay on Redis and PostgreSQL
(tests/stack.py), the fake gateway over HTTP, each buyer logged in through
the login page (the events and seat maps are public; Buy asks for it).
Playwright's auto-waiting assertions, never sleeps.

With ``UPDATE_SCREENSHOTS=1`` the stories write their pictures into
docs/images/ (shop-seat-map*.png, shop-timeline.png, shop-tickets.png);
otherwise into a temporary folder, so that ``make test`` leaves the checkout
as it was.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from devtools.screenshots import CHROMIUM, CHROMIUM_ARGS
from purchases.models import IdempotencyRecord, PurchaseSaga, Seat

from .conftest import start_purchase
from .factories import EventFactory, UserFactory
from .stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
HALL = [f"{row}{n}" for row in "ABCDE" for n in range(1, 11)]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 375, "height": 812}
# Generous: the machine is shared; the pages poll every 500 ms.
WAIT_MS = 15_000
# The worker's wait for the fake gateway's answer (the stack fixture).
GATEWAY_TIMEOUT_S = 3.0
PURCHASE_URL = re.compile(r"/purchases/([0-9a-f-]{36})/$")
expect.set_options(timeout=WAIT_MS)


# --- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"no {CHROMIUM}: install Debian's package chromium "
            f"(scripts/ensure-chromium.sh, run by make test)"
        )
    # Playwright's sync API keeps an event loop running in this thread; the
    # test's own ORM calls (and pytest-django's flush) are synchronous still.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()


@pytest.fixture
def stack(live_server, tmp_path, broker_queue, settings):
    # The first reconcile probe 3 s after a lost answer: long enough to see
    # "confirming with your bank" on the page, short enough for a test.
    # The worker waits GATEWAY_TIMEOUT_S for an answer (the tests' settings
    # say 1 s): a charge the fake gateway answers after 600 ms must not be
    # lost on a busy machine (CI saw one go UNKNOWN, then CONFIRMED: four
    # steps where three were meant); the lost answers' cards wait longer.
    settings.FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS = GATEWAY_TIMEOUT_S + 0.5
    with Stack.running(
        live_server,
        tmp_path,
        extra_env={
            "RECONCILE_BACKOFF_SECONDS": "3,1,1,1,1,1",
            "PAYMENT_GATEWAY_TIMEOUT_SECONDS": str(GATEWAY_TIMEOUT_S),
        },
    ) as s:
        yield s


@pytest.fixture
def shots(tmp_path) -> Path:
    """Where the pictures go: docs/images/ with UPDATE_SCREENSHOTS=1."""
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        return ROOT / "docs" / "images"
    return tmp_path


@pytest.fixture
def hall():
    return EventFactory(name="boxoffice demo night", seats=HALL, seats__price=5000)


@pytest.fixture
def pages(browser):
    """New browser pages, each in a context of its own (its own cookies)."""
    contexts = []

    def new(viewport=DESKTOP, **kwargs) -> Page:
        context = browser.new_context(viewport=viewport, **kwargs)
        context.set_default_timeout(WAIT_MS)
        contexts.append(context)
        return context.new_page()

    yield new
    for context in contexts:
        context.close()


def buyer(username: str):
    return UserFactory(username=username, password=f"pw-{username}")


def log_in(page: Page, base: str, username: str, path: str) -> None:
    """Open ``path`` (the events and seat maps are public: by the header's
    Log in link), log in on the login page, come back to ``path``."""
    page.goto(f"{base}{path}")
    if "/accounts/login/" not in page.url:
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Log in").click()
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next="))
    fill_login(page, username)
    expect(page).to_have_url(f"{base}{path}")


def fill_login(page: Page, username: str) -> None:
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(f"pw-{username}")
    page.get_by_role("button", name="Log in").click()


def status_of(page: Page):
    return page.locator("[data-purchase-status]")


def saga_on(page: Page) -> PurchaseSaga:
    expect(page).to_have_url(PURCHASE_URL)
    found = PURCHASE_URL.search(page.url)
    assert found is not None
    return PurchaseSaga.objects.get(pk=found.group(1))


def buy(page: Page, *, seats=(), quantity=None, method="pm_card_visa") -> PurchaseSaga:
    for ref in seats:
        page.locator(f'[data-seat="{ref}"]').click()
    if quantity is not None:
        page.get_by_label(re.compile("how many seats")).fill(str(quantity))
    page.locator('select[name="payment_method"]').select_option(method)
    page.locator('[data-action="buy"]').click()
    return saga_on(page)


def seat(page: Page, ref: str):
    return page.locator(f'[data-seat="{ref}"]')


# --- the stories ----------------------------------------------------------------------


def test_a_visa_purchase_moves_to_confirmed_without_a_reload_and_shows_the_tickets(
    stack, live_server, pages, hall, shots, settings
):
    # given: a charge that takes a little while, so that the page sees it coming
    settings.FAKE_GATEWAY_LATENCY_MS = 600
    buyer("alice")
    Seat.objects.filter(event=hall, ref__in=["C4", "C5", "C6"]).update(status="sold")
    Seat.objects.filter(event=hall, ref__in=["B8", "B9"]).update(status="held")
    page = pages()
    log_in(page, live_server.url, "alice", f"/events/{hall.pk}/")
    assert page.evaluate("typeof htmx") == "object"  # served from our static files
    expect(seat(page, "C5")).to_have_attribute("data-seat-status", "sold")
    expect(seat(page, "B8")).to_have_attribute("data-seat-status", "held")
    seat(page, "A5").click()
    expect(page.locator("#seat-A5")).to_be_checked()
    seat(page, "A6").click()
    expect(page.locator("[data-selection]")).to_have_text(re.compile("A5, A6"))
    page.screenshot(path=str(shots / "shop-seat-map.png"), full_page=True)
    phone = pages(PHONE, storage_state=page.context.storage_state())
    phone.goto(page.url)
    # usable at 375 px: the page never scrolls sideways (a hall wider than
    # the screen scrolls inside its own box), and every seat is a target of
    # at least 24 px (WCAG 2.2, "Target Size (Minimum)")
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert phone.locator(".hall-scroll").evaluate("e => getComputedStyle(e).overflowX") == "auto"
    box = seat(phone, "E10").bounding_box()
    assert box["width"] >= 24 and box["height"] >= 24, box
    phone.screenshot(path=str(shots / "shop-seat-map-phone.png"), full_page=True)
    seat(page, "A6").click()  # changed my mind: one seat

    # when
    saga = buy(page, method="pm_card_visa")
    page.evaluate("window.stillTheSamePage = true")

    # then: the status moves on the page itself, no reload
    expect(status_of(page)).to_have_attribute("data-purchase-status", "CONFIRMED")
    assert page.evaluate("window.stillTheSamePage") is True
    expect(page.locator("[data-history-step]")).to_have_count(3)
    expect(page.locator('[data-ticket="A5"] svg')).to_have_count(1)
    expect(page.locator("[data-ticket]")).to_contain_text(saga.reservation.ref)
    expect(page.locator("[data-status-announcer]")).to_contain_text("Confirmed")
    page.screenshot(path=str(shots / "shop-tickets.png"), full_page=True)


def test_an_anonymous_visitor_chooses_logs_in_at_buy_and_comes_back_to_the_same_choice(
    live_server, pages, hall, broker_queue
):
    # On a phone: the shop is shown before anyone logs in, there too.
    gina = buyer("gina")
    page = pages(PHONE)
    page.goto(f"{live_server.url}/")
    header = page.get_by_role("navigation", name="Main")
    expect(header.get_by_role("link", name="Log in")).to_be_visible()
    expect(header.get_by_role("button", name=re.compile("Log out"))).to_have_count(0)
    page.get_by_role("link", name=hall.name).click()
    expect(page).to_have_url(f"{live_server.url}/events/{hall.pk}/")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    seat(page, "C4").click()
    seat(page, "C5").click()
    expect(page.locator("[data-selection]")).to_have_text(re.compile("C4, C5"))
    page.locator('select[name="payment_method"]').select_option("pm_card_timeout_charged")

    # Buy: the login page, and nothing bought yet
    page.locator('[data-action="buy"]').click()
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next="))
    assert not PurchaseSaga.objects.exists()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    fill_login(page, "gina")

    # back on the seat map, the same seats ticked and the same payment method
    expect(page).to_have_url(re.compile(rf"/events/{hall.pk}/\?"))
    expect(page.locator("#seat-C4")).to_be_checked()
    expect(page.locator("#seat-C5")).to_be_checked()
    expect(page.locator("input.seat-input:checked")).to_have_count(2)
    expect(page.locator("[data-selection]")).to_have_text(re.compile("C4, C5"))
    expect(page.locator('select[name="payment_method"]')).to_have_value("pm_card_timeout_charged")
    expect(page.get_by_role("button", name=re.compile("Log out"))).to_be_visible()
    page.locator('[data-action="buy"]').click()

    saga = saga_on(page)
    assert saga.buyer == gina and saga.payment_method == "pm_card_timeout_charged"
    assert sorted(link.seat.ref for link in saga.reservation.seat_links.all()) == ["C4", "C5"]
    expect(status_of(page)).to_have_attribute("data-purchase-status", "PENDING")


def test_a_declined_purchase_shows_the_failure_and_frees_the_seat(stack, live_server, pages, hall):
    buyer("bob")
    page = pages()
    log_in(page, live_server.url, "bob", f"/events/{hall.pk}/")

    buy(page, seats=["A1"], method="pm_card_chargeDeclined")

    expect(status_of(page)).to_have_attribute("data-purchase-status", "COMPENSATED")
    expect(page.locator("#purchase-live")).to_contain_text("the seat was released")
    expect(page.locator("[data-ticket]")).to_have_count(0)
    page.goto(f"{live_server.url}/events/{hall.pk}/")
    expect(seat(page, "A1")).to_have_attribute("data-seat-status", "available")


def test_a_lost_answer_says_we_are_confirming_with_the_bank_then_confirms_one_charge(
    stack, live_server, pages, hall, shots
):
    buyer("carol")
    page = pages()
    log_in(page, live_server.url, "carol", f"/events/{hall.pk}/")

    saga = buy(page, seats=["D4", "D5"], method="pm_card_timeout_charged")

    expect(status_of(page)).to_have_attribute("data-purchase-status", "UNKNOWN")
    expect(status_of(page)).to_have_text("We are confirming with your bank")
    expect(status_of(page)).to_be_visible()
    expect(page.locator("[data-hold-countdown]")).to_contain_text("left")
    page.screenshot(path=str(shots / "shop-timeline.png"), full_page=True)
    # while nothing moves, a poll is a 304 and the page is left as it is
    live = page.locator("#purchase-live")
    live.evaluate("e => { e.dataset.untouched = 'yes'; }")
    with page.expect_response(lambda r: r.url.endswith("/live/") and r.status == 304) as poll:
        pass
    assert poll.value.request.headers["if-none-match"] == poll.value.headers["etag"]
    # (read at once: the next probe may move the purchase at any moment)
    status, untouched = page.evaluate(
        "() => [document.querySelector('[data-purchase-status]').dataset.purchaseStatus,"
        " document.querySelector('#purchase-live').dataset.untouched]"
    )
    assert status != "UNKNOWN" or untouched == "yes", (status, untouched)
    expect(status_of(page)).to_have_attribute("data-purchase-status", "CONFIRMED")
    # settled: the part that replaced the polling one polls no more
    expect(live).not_to_have_attribute("hx-trigger", re.compile(".*"))
    expect(page.locator("[data-history-step]")).to_have_count(4)
    expect(page.locator("[data-ticket]")).to_have_count(2)
    charges = httpx.get(
        f"{live_server.url}/fake-gateway/v1/charges",
        params={"payment_intent": saga.intent_id},
        timeout=10,
    )
    assert charges.status_code == 200 and len(charges.json()) == 1, charges.text


def test_best_available_three_holds_three_adjacent_seats_then_sells_them(
    stack, live_server, pages, hall
):
    buyer("dave")
    page = pages()
    log_in(page, live_server.url, "dave", f"/events/{hall.pk}/")

    # a lost answer keeps the seats held for a few seconds before they are sold
    buy(page, quantity=3, method="pm_card_timeout_charged")

    refs = page.locator("[data-purchase-seat]").all_inner_texts()
    assert len(refs) == 3
    rows, numbers = {ref[0] for ref in refs}, sorted(int(ref[1:]) for ref in refs)
    assert len(rows) == 1 and numbers == list(range(numbers[0], numbers[0] + 3)), refs
    seat_map = page.context.new_page()
    seat_map.goto(f"{live_server.url}/events/{hall.pk}/")
    for ref in refs:
        expect(seat(seat_map, ref)).to_have_attribute("data-seat-status", "held")
    expect(status_of(page)).to_have_attribute("data-purchase-status", "CONFIRMED")
    seat_map.reload()
    for ref in refs:
        expect(seat(seat_map, ref)).to_have_attribute("data-seat-status", "sold")


def test_a_double_click_on_buy_makes_one_purchase(stack, live_server, pages, hall):
    erin = buyer("erin")
    page = pages()
    log_in(page, live_server.url, "erin", f"/events/{hall.pk}/")
    seat(page, "E1").click()

    page.locator('[data-action="buy"]').dblclick()

    saga_on(page)
    expect(status_of(page)).to_have_attribute("data-purchase-status", "CONFIRMED")
    assert PurchaseSaga.objects.filter(buyer=erin).count() == 1
    assert IdempotencyRecord.objects.filter(user=erin).count() == 1


def test_bob_cannot_open_alices_purchase(live_server, pages, hall, broker_queue):
    alice = buyer("alice")
    buyer("bob")
    saga = start_purchase(alice, hall, seats=["A1"])
    page = pages()
    log_in(page, live_server.url, "bob", "/purchases/")

    answer = page.goto(f"{live_server.url}/purchases/{saga.pk}/")

    assert answer.status == 404
    expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
    expect(page.locator("[data-purchase-status]")).to_have_count(0)


def _tab_to(page: Page, selector: str, *, limit: int = 120) -> None:
    """Press Tab until the element ``selector`` has the focus."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate("s => document.activeElement.matches(s)", selector):
            return
    raise AssertionError(f"Tab never reached {selector}")


def test_a_purchase_with_the_keyboard_only(stack, live_server, pages, hall):
    buyer("frank")
    page = pages()
    page.goto(f"{live_server.url}/events/{hall.pk}/")

    # log in: Tab to the header's link, Enter, Tab, type, Enter
    _tab_to(page, 'nav a[href^="/accounts/login/"]')
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next="))
    _tab_to(page, "input[name=username]")
    page.keyboard.type("frank")
    _tab_to(page, "input[name=password]")
    page.keyboard.type("pw-frank")
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{live_server.url}/events/{hall.pk}/")

    # the skip link comes first
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to main content")).to_be_focused()

    # a seat: Tab to it, its focus is visible, Space ticks it
    _tab_to(page, "#seat-A3")
    face = page.locator('[data-seat="A3"] .seat-face')
    assert face.evaluate("e => getComputedStyle(e).outlineStyle") == "solid"
    page.keyboard.press("Space")
    expect(page.locator("#seat-A3")).to_be_checked()
    # Enter ticks a seat too (and does not send the form)
    _tab_to(page, "#seat-A4")
    page.keyboard.press("Enter")
    expect(page.locator("#seat-A4")).to_be_checked()
    page.keyboard.press("Space")
    expect(page.locator("#seat-A4")).not_to_be_checked()
    expect(page).to_have_url(f"{live_server.url}/events/{hall.pk}/")

    # the payment method keeps its first choice (pm_card_visa); Enter on buy
    _tab_to(page, "select[name=payment_method]")
    expect(page.locator("select[name=payment_method]")).to_have_value("pm_card_visa")
    _tab_to(page, '[data-action="buy"]')
    page.keyboard.press("Enter")

    saga = saga_on(page)
    expect(status_of(page)).to_have_attribute("data-purchase-status", "CONFIRMED")
    assert [link.seat.ref for link in saga.reservation.seat_links.select_related("seat")] == ["A3"]
