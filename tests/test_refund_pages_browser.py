"""Money back in a real browser (docs/refunds.md): headless Chromium
(/usr/bin/chromium) driven by Playwright against the live server, with a
real Celery worker and relay on Redis and PostgreSQL (tests/stack.py) asking
the fake gateway over HTTP. Playwright's auto-waiting assertions, never
sleeps. The browser, the pages and the logins are tests/test_pages_browser.py's
and tests/test_seller_pages_browser.py's.

1. A buyer cancels from the purchase page: the amount is shown before
   anything is cancelled; a double click on the confirmation makes one
   refund; the refund shows pending, and the page, left open, follows the
   worker's look-up to "Refunded in full".
2. An owner cancels an event from its dashboard (a reason, then a
   confirmation step) and watches the run's progress, left open, reach done.

The purchases are confirmed before the stack starts (the in-process fake
gateway, whose rows the HTTP one serves too); the refunds are the stack's.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from organizers.roles import Role
from purchases.models import Event, EventStatus, PurchaseSaga, Refund, Reservation, Seat
from purchases.services import saga_charge

from . import test_pages_browser as shop_pages
from .conftest import start_purchase
from .factories import EventFactory, MembershipFactory, OrganizerFactory, UserFactory
from .stack import Stack
from .test_pages_browser import log_in as log_in_buyer
from .test_pages_browser import status_of
from .test_seller_pages_browser import fits_a_phone
from .test_seller_pages_browser import log_in as log_in_seller

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# The buyer pages' browser (Debian's Chromium, once a module) and its pages,
# each in a context of its own.
browser = shop_pages.browser
pages = shop_pages.pages
# Where the pictures go: docs/images/ with UPDATE_SCREENSHOTS=1 (refund-*.png).
shots = shop_pages.shots

# Generous: the machine is shared; the purchase page polls every 500 ms, the
# cancellation's progress every second.
WAIT_MS = 20_000
expect.set_options(timeout=WAIT_MS)
SEATS = [f"A{n}" for n in range(1, 9)]


@pytest.fixture
def stack(live_server, tmp_path, broker_queue):
    # A refund of a pm_card_refundPending charge stays pending until its
    # first look-up, 2 s after it was asked: long enough to see it pending.
    with Stack.running(
        live_server, tmp_path, extra_env={"RECONCILE_BACKOFF_SECONDS": "2,1,1,1,1,1"}
    ) as s:
        yield s


@pytest.fixture
def venue():
    return OrganizerFactory(slug="riverside", name="Riverside Hall")


@pytest.fixture
def show(venue):
    """On sale; buyers may cancel for a week, no fee; seats at 25.00 EUR."""
    return EventFactory(
        organizer=venue,
        name="Harbour lights",
        seats=SEATS,
        buyer_can_cancel_until=timezone.now() + timedelta(days=7),
        cancel_fee_percent=0,
    )


def person(username: str):
    return UserFactory(username=username, password=f"pw-{username}")


def confirmed(user, event, seats, method="pm_card_visa") -> PurchaseSaga:
    saga = saga_charge(saga_id=start_purchase(user, event, seats=seats, payment_method=method).pk)
    assert saga.state == "CONFIRMED"
    return saga


def refund_of(page: Page):
    return page.locator("[data-refund]")


@pytest.fixture
def alices_purchase(show, gateway) -> PurchaseSaga:
    """A1 and A2, paid with the card whose refunds stay pending until looked up."""
    return confirmed(person("alice"), show, ["A1", "A2"], method="pm_card_refundPending")


def test_a_buyer_cancels_from_the_purchase_page_and_sees_it_refunded_in_full(
    alices_purchase, stack, live_server, pages, show, shots
):
    path = f"/purchases/{alices_purchase.pk}/"
    page = pages()
    log_in_buyer(page, live_server.url, "alice", path)
    expect(status_of(page)).to_have_attribute("data-purchase-status", "CONFIRMED")
    expect(page.locator("[data-ticket]")).to_have_count(2)
    fits_a_phone(page, page.url)

    # Cancel: the amount, before anything is cancelled
    page.locator('[data-action="cancel"]').click()
    expect(page.locator("[data-refund-quote]")).to_have_text("50.00 EUR")
    expect(page.locator("[data-quote-seats]")).to_have_text("A1, A2")
    assert not Refund.objects.exists()
    fits_a_phone(page, page.url)
    page.screenshot(path=str(shots / "refund-cancel-confirm.png"), full_page=True)

    # Confirm, twice over: one refund, pending, and the seats back on sale
    page.locator('[data-action="confirm-cancel"]').dblclick()
    expect(page).to_have_url(f"{live_server.url}{path}")
    expect(refund_of(page)).to_have_attribute("data-refund-status", "pending")
    expect(status_of(page)).to_have_text("Refund on its way")
    expect(page.locator("[data-ticket]")).to_have_count(0)
    assert Refund.objects.count() == 1
    assert set(
        Seat.objects.filter(event=show, ref__in=["A1", "A2"]).values_list("status", flat=True)
    ) == {"available"}
    page.evaluate("window.stillTheSamePage = true")

    # The worker's look-up settles it; the page follows, no reload
    expect(refund_of(page)).to_have_attribute("data-refund-status", "succeeded")
    expect(status_of(page)).to_have_text("Refunded in full")
    expect(status_of(page)).to_have_attribute("data-refund-state", "full")
    expect(page.locator("[data-refunded]")).to_have_text("50.00 EUR")
    expect(page.locator("[data-status-announcer]")).to_contain_text("Refunded in full")
    assert page.evaluate("window.stillTheSamePage") is True
    assert Refund.objects.get().status == "succeeded"
    page.screenshot(path=str(shots / "refund-in-full.png"), full_page=True)
    page.reload()
    expect(status_of(page)).to_have_text("Refunded in full")
    expect(page.locator('[data-action="cancel"]')).to_have_count(0)
    assert Refund.objects.count() == 1


@pytest.fixture
def sold_out_night(show, gateway) -> list[PurchaseSaga]:
    """Three buyers' confirmed purchases of the show."""
    return [
        confirmed(person(name), show, seats)
        for name, seats in (("bob", ["A1"]), ("carol", ["A2", "A3"]), ("dave", ["A4"]))
    ]


def test_an_owner_cancels_an_event_and_watches_every_buyer_refunded(
    sold_out_night, stack, live_server, pages, show, venue, settings, shots
):
    # Slow enough to watch: one refund a second.
    settings.REFUND_RATE_PER_SECOND = 1
    MembershipFactory(organizer=venue, user=person("olga"), role=Role.OWNER)
    dashboard = f"/seller/riverside/events/{show.pk}/"
    page = pages()
    log_in_seller(page, live_server.url, "olga", dashboard)

    # A reason, then the confirmation step: nothing is cancelled before it
    page.get_by_label("Why is it cancelled?").fill("Storm warning: the hall is closed")
    page.locator('[data-action="cancel-event"]').click()
    expect(page.locator("[data-confirm-step]")).to_contain_text("3 buyers refunded")
    expect(page.locator("[data-impact-paid]")).to_have_text("100.00 EUR")
    assert Event.objects.get(pk=show.pk).status == EventStatus.ON_SALE
    fits_a_phone(page, page.url)
    page.locator('[data-action="confirm-cancel-event"]').click()

    # The dashboard, left open, follows the run to its end
    expect(page).to_have_url(f"{live_server.url}{dashboard}")
    progress = page.locator("#cancellation-live")
    expect(progress).to_have_attribute("data-cancellation", "running")
    page.evaluate("window.stillTheSamePage = true")
    expect(page.locator('[data-event-status="cancelled"]')).to_be_visible()
    expect(progress).to_have_attribute("data-cancellation", "done")
    expect(page.locator('[data-progress="purchases"]')).to_have_text("3")
    expect(page.locator('[data-progress="refunded"]')).to_have_text("3")
    expect(page.locator('[data-progress="failed"]')).to_have_text("0")
    expect(page.locator('[data-progress="owed"]')).to_have_text("0.00 EUR")
    expect(page.locator('[data-cancellation-status="done"]')).to_contain_text("done")
    assert page.evaluate("window.stillTheSamePage") is True
    fits_a_phone(page, page.url)
    page.screenshot(path=str(shots / "refund-event-cancelled.png"), full_page=True)

    refunds = Refund.objects.filter(event=show)
    assert sorted(refunds.values_list("status", flat=True)) == ["succeeded"] * 3
    assert sorted(r.saga_id for r in refunds) == sorted(s.pk for s in sold_out_night)
    assert not re.search(r"data-action=\"cancel-event\"", page.content())


def test_finance_refunds_a_seat_from_the_sellers_purchase_page(
    show, gateway, stack, live_server, pages, venue
):
    saga = confirmed(person("erin"), show, ["A5", "A6"])
    # The ref's random part once held "A6" (CI drew RBBBBCA69EE7C764) and the
    # seat's label then also named the panel the ref titles: pin such a ref,
    # so the form's seat is found by its own role and exact name, every run.
    Reservation.objects.filter(pk=saga.reservation_id).update(ref=f"RA6A6A6A6A6A6{show.pk:X}")
    MembershipFactory(organizer=venue, user=person("fiona"), role=Role.FINANCE)
    page = pages()
    log_in_seller(page, live_server.url, "fiona", f"/seller/riverside/events/{show.pk}/")

    # From the dashboard's newest purchases to the purchase's page
    page.locator(f'[data-open-purchase="{saga.pk}"]').click()
    expect(page.locator(f'[data-purchase-panel="{saga.pk}"]')).to_be_visible()
    expect(page.locator("[data-refundable]")).to_have_text("50.00 EUR")
    fits_a_phone(page, page.url)

    # One seat, back on sale, with the organizer's reason
    page.get_by_role("checkbox", name="A6", exact=True).check()
    page.get_by_label(re.compile("Put the seats back on sale")).check()
    page.get_by_label("Reason").fill("Broken seat, moved the buyer")
    page.locator('[data-action="refund"]').click()

    expect(page.locator("[data-notice]")).to_contain_text("Refund of 25.00 EUR opened")
    expect(page.locator('[data-panel-seat="A6"]')).to_have_attribute("data-released", "true")
    expect(page.locator("[data-refundable]")).to_have_text("25.00 EUR")
    expect(page.locator("[data-refund]")).to_contain_text("Broken seat, moved the buyer")
    refund = Refund.objects.get(saga_id=saga.pk)
    assert (refund.amount, refund.seats, refund.source) == (2500, ["A6"], "organizer")
    assert Seat.objects.get(event=show, ref="A6").status == "available"
