"""The seller pages in a real browser (docs/api.md, "Pages for sellers"):
headless Chromium (Debian's, /usr/bin/chromium) driven by Playwright against
the live server with a real Celery worker and relay on Redis and PostgreSQL
(tests/stack.py), the fake gateway over HTTP. Playwright's auto-waiting
assertions, never sleeps.

1. An owner creates an event, uploads a seat map with an error and sees it
   by line, fixes it, publishes; a buyer buys a seat in the shop; the
   owner's dashboard, left open, shows the seat sold and the money.
2. A door member sees the events but no sales, no New event button, and
   the 403 page on the dashboard, the edit and the members pages.

Each page is also opened 375 px wide: it never scrolls sideways.
"""

from __future__ import annotations

import os
import re

import pytest
from playwright.sync_api import Page, ViewportSize, expect, sync_playwright

from devtools.screenshots import CHROMIUM, CHROMIUM_ARGS
from organizers.roles import Role
from purchases.models import Event, EventStatus, PurchaseSaga

from .factories import EventFactory, MembershipFactory, OrganizerFactory, UserFactory
from .stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

DESKTOP: ViewportSize = {"width": 1280, "height": 900}
PHONE: ViewportSize = {"width": 375, "height": 812}
WAIT_MS = 20_000  # the dashboard polls every 5 s; the machine is shared
expect.set_options(timeout=WAIT_MS)

HEADER = "section,row,number,ref,category,x,y,accessible\n"
HALL = HEADER + "".join(
    f"Stalls,{row},{n},{row}{n},{'front' if row in 'AB' else 'back'},{n * 3},{i * 3},false\n"
    for i, row in enumerate("ABCD")
    for n in range(1, 9)
)
# Line 5 gives A3's ref to a second seat.
BROKEN_HALL = HALL.replace("Stalls,A,4,A4,", "Stalls,A,4,A3,", 1)


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"no {CHROMIUM}: install Debian's package chromium (scripts/ensure-chromium.sh)"
        )
    with pytest.MonkeyPatch.context() as patch:
        # Playwright's sync API runs an event loop in this thread; the
        # test's own ORM calls are synchronous still.
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()


@pytest.fixture
def stack(live_server, tmp_path, broker_queue):
    with Stack.running(live_server, tmp_path) as s:
        yield s


@pytest.fixture
def pages(browser):
    """New browser pages, each in a context of its own (its own cookies)."""
    contexts = []

    def new(viewport=DESKTOP) -> Page:
        context = browser.new_context(viewport=viewport)
        context.set_default_timeout(WAIT_MS)
        contexts.append(context)
        return context.new_page()

    yield new
    for context in contexts:
        context.close()


def person(username: str):
    return UserFactory(username=username, password=f"pw-{username}")


def log_in(page: Page, base: str, username: str, path: str) -> None:
    """Open ``path`` (a seller page sends a visitor to the login page; a
    shop page is public: by its header's Log in link), log in, and come
    back to it."""
    page.goto(f"{base}{path}")
    if "/accounts/login/" not in page.url:
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Log in").click()
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next="))
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(f"pw-{username}")
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{base}{path}")


# What sticks out past the screen's right edge (for the failure's message).
WIDER_THAN_THE_SCREEN = """w => [...document.querySelectorAll('body *')]
  .filter(e => e.getBoundingClientRect().right > w)
  .slice(0, 8)
  .map(e => e.tagName + (e.id ? '#' + e.id : '') + '.' + e.className
            + ' ' + Math.round(e.getBoundingClientRect().right))"""


def fits_a_phone(page: Page, url: str) -> None:
    """``url`` at 375 px, with ``page``'s cookies: nothing scrolls sideways
    but a box of its own (a wide table, the seat map)."""
    phone = page.context.browser.new_context(  # type: ignore[union-attr]  # launched here
        viewport=PHONE, storage_state=page.context.storage_state()
    )
    try:
        small = phone.new_page()
        small.goto(url)
        expect(small.locator("h1")).to_be_visible()
        width = small.evaluate("document.documentElement.scrollWidth")
        wide = small.evaluate(WIDER_THAN_THE_SCREEN, PHONE["width"])
        assert width <= PHONE["width"], f"{url} is {width} px wide at 375 px: {wide}"
    finally:
        phone.close()


def fill_event(page: Page) -> None:
    page.locator("#id_name").fill("Harbour lights")
    page.get_by_label("Starts at (UTC)").fill("2031-06-01T20:00")
    page.get_by_label("Currency").fill("EUR")
    rows = page.locator("[data-category-row]")
    rows.nth(0).get_by_label("Code").fill("front")
    rows.nth(0).get_by_label("Name").fill("Front stalls")
    rows.nth(0).get_by_label("Price").fill("40")
    rows.nth(1).get_by_label("Code").fill("back")
    rows.nth(1).get_by_label("Name").fill("Back stalls")
    rows.nth(1).get_by_label("Price").fill("25.50")


def csv_upload(text: str) -> dict:
    return {"name": "hall.csv", "mimeType": "text/csv", "buffer": text.encode()}


def test_an_owner_creates_uploads_publishes_and_sees_a_buyers_purchase(stack, live_server, pages):
    base = live_server.url
    venue = OrganizerFactory(slug="harbour", name="Harbour Hall")
    MembershipFactory(organizer=venue, user=person("olga"), role=Role.OWNER)
    person("bruno")
    owner = pages()
    log_in(owner, base, "olga", "/seller/harbour/")
    for path in (
        "/seller/",
        "/seller/harbour/",
        "/seller/harbour/members/",
        "/seller/harbour/webhooks/",
    ):
        fits_a_phone(owner, f"{base}{path}")

    # a new event, with a seat map whose line 5 repeats a ref
    owner.get_by_role("link", name="New event").click()
    fits_a_phone(owner, owner.url)
    fill_event(owner)
    owner.get_by_label("Seat map (CSV)").set_input_files(csv_upload(BROKEN_HALL))
    owner.get_by_role("button", name="Create the draft").click()
    errors = owner.locator("[data-seat-map-error]")
    expect(errors).to_have_count(1)
    expect(errors.first).to_have_text(re.compile(r"^line 5: ref — .*A3"))
    assert not Event.objects.filter(organizer=venue).exists()

    # fixed: the draft is made, then published
    owner.get_by_label("Seat map (CSV)").set_input_files(csv_upload(HALL))
    owner.get_by_role("button", name="Create the draft").click()
    expect(owner.locator("[data-event-status]")).to_have_attribute("data-event-status", "draft")
    expect(owner.locator("[data-seat-count]")).to_have_attribute("data-seat-count", "32")
    event = Event.objects.get(organizer=venue)
    fits_a_phone(owner, owner.url)
    owner.get_by_role("button", name="Publish").click()
    expect(owner).to_have_url(f"{base}/seller/harbour/events/{event.pk}/")
    expect(owner.locator("[data-event-status]")).to_have_attribute("data-event-status", "on_sale")
    expect(owner.locator('[data-seat="C5"]')).to_have_attribute("data-seat-status", "available")
    expect(owner.locator("[data-gross]")).to_have_text("0.00 EUR")
    fits_a_phone(owner, owner.url)

    # a buyer buys C5 in the shop while the dashboard stays open
    buyer = pages()
    log_in(buyer, base, "bruno", f"/events/{event.pk}/")
    buyer.locator('[data-seat="C5"]').click()
    buyer.locator('select[name="payment_method"]').select_option("pm_card_visa")
    buyer.locator('[data-action="buy"]').click()
    expect(buyer.locator("[data-purchase-status]")).to_have_attribute(
        "data-purchase-status", "CONFIRMED"
    )

    # the dashboard moves by itself (its live part polls)
    owner.evaluate("window.stillTheSamePage = true")
    expect(owner.locator('[data-seat="C5"]')).to_have_attribute("data-seat-status", "sold")
    expect(owner.locator("[data-gross]")).to_have_text("25.50 EUR")
    expect(owner.locator('[data-seat-count="sold"] [data-count]')).to_have_text("1")
    saga = PurchaseSaga.objects.get(event=event)
    row = owner.locator(f'[data-purchase="{saga.pk}"]')
    expect(row).to_contain_text("bruno")
    expect(row).to_contain_text("C5")
    assert owner.evaluate("window.stillTheSamePage") is True
    event.refresh_from_db()
    assert event.status == EventStatus.ON_SALE


def test_a_door_member_sees_the_events_but_no_sales(live_server, pages):
    base = live_server.url
    venue = OrganizerFactory(slug="harbour", name="Harbour Hall")
    MembershipFactory(organizer=venue, user=person("dora"), role=Role.DOOR)
    event = EventFactory(organizer=venue, name="Harbour lights", seats=["A1", "A2"])
    page = pages()
    log_in(page, base, "dora", "/seller/harbour/")

    row = page.locator(f'[data-event="{event.pk}"]')
    expect(row).to_contain_text("Harbour lights")
    # no dashboard, no edit: the door scanner only
    expect(row.get_by_role("link")).to_have_count(1)
    expect(row.get_by_role("link", name="Scanner")).to_have_attribute("href", f"/door/{event.pk}/")
    expect(page.get_by_role("link", name="New event")).to_have_count(0)
    nav = page.get_by_role("navigation", name="Harbour Hall")
    expect(nav.get_by_role("link", name="Members")).to_have_count(0)
    expect(nav.get_by_role("link", name="Webhooks")).to_have_count(0)
    expect(page.locator("[data-role]")).to_have_text("door")
    fits_a_phone(page, page.url)

    for path in (
        f"/seller/harbour/events/{event.pk}/",
        f"/seller/harbour/events/{event.pk}/edit/",
        "/seller/harbour/events/new/",
        "/seller/harbour/members/",
        "/seller/harbour/webhooks/",
    ):
        answer = page.goto(f"{base}{path}")
        assert answer is not None and answer.status == 403, path
        expect(page.locator('[data-error="permission_denied"]')).to_contain_text("door")
        expect(page.locator("[data-gross], [data-seat-status], [data-purchase]")).to_have_count(0)
