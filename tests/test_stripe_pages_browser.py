"""The buyer pages in Stripe mode (docs/stripe.md, "The buyer's pages"), in
headless Chromium against localstripe: its Stripe.js stand-in in the page,
its API behind our adapter in a real worker and relay (tests/stack.py), and
its signed events posted to the live server's ``/payments/stripe/events/``.

The seat map takes the card with Stripe.js's card Element and posts only
the payment method's id; the purchase page opens the bank's confirmation
(3-D Secure) for a purchase in REQUIRES_ACTION and follows the saga live.
localstripe's stand-in shows its confirmation as a dialog in the page, with
"Complete authentication" and "Fail authentication" buttons, which the
tests click as a buyer would. Playwright's auto-waiting assertions, never
sleeps; a saga's outcome is waited for up to ``SAGA_MS``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Page, Request, expect

from payments.registry import override_gateway
from payments.stripe.adapter import StripePaymentGateway
from purchases.models import PurchaseSaga, Seat
from purchases.services import purchase_processor_event, saga_charge
from stripe_events.models import StripeEvent

from .conftest import start_purchase
from .stack import Stack
from .stripe_harness import (  # noqa: F401 - the fixtures, used by name
    CARD_3DS,
    LOCALSTRIPE_KEY,
    Localstripe,
    localstripe,
    localstripe_url,
)
from .test_pages_browser import (  # noqa: F401 - the Chromium fixtures, used by name
    PHONE,
    browser,
    buyer,
    hall,
    log_in,
    pages,
    saga_on,
    seat,
    status_of,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PUBLISHABLE_KEY = "pk_test_boxofficepages"
WEBHOOK_SECRET = "whsec_boxofficepages"
CARD_VISA_NUMBER = "4242424242424242"
# How long a saga may take to settle on the page: a worker, a relay, a
# webhook localstripe sends a second late, on a shared machine.
SAGA_MS = 30_000
# An authentication is looked up every second: localstripe sends no event
# when one fails, so the look-up is what finds it (Stripe itself sends
# payment_intent.payment_failed). Sixty: a minute for the buyer to answer.
PROBE_EVERY_SECOND = ",".join(["1"] * 60)
WEBHOOK_NAME = "boxoffice-stripe-pages"
# Where localstripe's events go once a test is over: a closed port on this machine.
NOWHERE = "http://127.0.0.1:9/"


# --- fixtures -------------------------------------------------------------------------


@pytest.fixture
def stripe_mode(settings, localstripe_url) -> Iterator[dict[str, str]]:  # noqa: F811
    """Stripe mode for this process (the live server's pages and views) on
    localstripe, with an adapter built for it; the same settings as
    environment variables for the stack's processes."""
    env = {
        "PAYMENT_GATEWAY": "stripe",
        "STRIPE_SECRET_KEY": LOCALSTRIPE_KEY,
        "STRIPE_PUBLISHABLE_KEY": PUBLISHABLE_KEY,
        "STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "STRIPE_API_BASE": localstripe_url,
        "STRIPE_JS_URL": f"{localstripe_url}/js.stripe.com/v3/",
    }
    for name, value in env.items():
        setattr(settings, name, value)
    gateway = StripePaymentGateway(api_key=LOCALSTRIPE_KEY, api_base=localstripe_url)
    with override_gateway(gateway):
        yield env
    gateway.close()


@pytest.fixture
def stripe_stack(stripe_mode, live_server, tmp_path, broker_queue, localstripe_url):  # noqa: F811
    """A worker and a relay in Stripe mode, and localstripe's events signed
    with the test's secret to this live server."""
    _point_localstripe_events(localstripe_url, f"{live_server.url}/payments/stripe/events/")
    try:
        with Stack.running(
            live_server,
            tmp_path,
            extra_env={**stripe_mode, "RECONCILE_BACKOFF_SECONDS": PROBE_EVERY_SECOND},
        ) as stack:
            yield stack
    finally:
        _point_localstripe_events(localstripe_url, NOWHERE)


def _point_localstripe_events(base: str, url: str) -> None:
    answer = httpx.post(
        f"{base}/_config/webhooks/{WEBHOOK_NAME}",
        json={"url": url, "secret": WEBHOOK_SECRET},
        timeout=10,
    )
    answer.raise_for_status()


class Traffic:
    """What the browser sent, request by request (URL and body)."""

    def __init__(self, page: Page) -> None:
        self.sent: list[tuple[str, bytes]] = []
        page.on("request", self._seen)

    def _seen(self, request: Request) -> None:
        self.sent.append((request.url, request.post_data_buffer or b""))

    def to(self, base: str) -> list[tuple[str, bytes]]:
        return [(url, body) for url, body in self.sent if url.startswith(base)]


def buy_with_card(page: Page, *, seats: list[str], number: str) -> PurchaseSaga:
    """Tick ``seats``, type a card into the card Element (localstripe's
    stand-in inputs), press Buy: the purchase page."""
    for ref in seats:
        seat(page, ref).click()
    card = page.locator("[data-stripe-card]")
    card.locator('input[placeholder="number"]').fill(number)
    card.locator('input[placeholder="exp_month"]').fill("12")
    card.locator('input[placeholder="exp_year"]').fill("34")
    card.locator('input[placeholder="cvc"]').fill("123")
    page.locator('[data-action="buy"]').click()
    return saga_on(page)


def intents_of(localstripe: Localstripe, saga: PurchaseSaga) -> list[dict]:  # noqa: F811
    return localstripe.payment_intents_of(saga.intent_id)


def succeeded(intents: list[dict]) -> list[dict]:
    return [pi for pi in intents if pi["status"] == "succeeded"]


def confirmation(page: Page):
    """The bank's confirmation as localstripe's stand-in shows it."""
    return page.get_by_role("button", name="Complete authentication")


# --- the page without a browser ------------------------------------------------------


def test_the_seat_map_takes_a_card_with_stripe_js_and_offers_no_test_cards(
    stripe_mode,
    client,
    hall,  # noqa: F811
):
    # anonymous: nothing of Stripe's yet; the card comes after the login
    page = client.get(f"/events/{hall.pk}/").content.decode()
    assert stripe_mode["STRIPE_JS_URL"] not in page
    assert "You give your card after logging in" in page

    # logged in: Stripe.js from STRIPE_JS_URL, the public key, the Element's
    # place, an empty payment method, and none of the fake's test cards
    client.force_login(buyer("olga"))
    page = client.get(f"/events/{hall.pk}/").content.decode()
    assert f'<script src="{stripe_mode["STRIPE_JS_URL"]}" defer data-stripe-js></script>' in page
    assert f'<meta name="stripe-publishable-key" content="{PUBLISHABLE_KEY}">' in page
    assert LOCALSTRIPE_KEY not in page and WEBHOOK_SECRET not in page
    assert "data-stripe-card" in page
    assert '<input type="hidden" name="payment_method" value="" data-payment-method>' in page
    assert '<select name="payment_method"' not in page and "pm_card_" not in page


def test_with_the_fake_gateway_the_seat_map_is_as_it_was(settings, client, hall):  # noqa: F811
    settings.PAYMENT_GATEWAY = "fake"
    settings.FAKE_GATEWAY_ENABLED = True
    client.force_login(buyer("olga"))

    page = client.get(f"/events/{hall.pk}/").content.decode()

    assert '<select name="payment_method"' in page and "pm_card_chargeDeclined" in page
    assert "stripe-publishable-key" not in page and "data-stripe-card" not in page
    assert "js.stripe.com" not in page


def test_the_client_secret_is_on_its_owners_page_only_while_the_bank_waits(
    stripe_mode,
    client,
    hall,  # noqa: F811
    localstripe,  # noqa: F811
):
    # given: alice's purchase with the 3-D Secure card, charged: it waits on her bank
    alice, bob = buyer("alice"), buyer("bob")
    saga = start_purchase(alice, hall, seats=["A1"], payment_method=localstripe.card(CARD_3DS))
    saga_charge(saga_id=saga.pk)
    saga.refresh_from_db()
    assert saga.state == "REQUIRES_ACTION" and saga.action_secret.startswith("pi_")
    secret = saga.action_secret

    # then: her page and its live part carry the secret, for Stripe.js
    client.force_login(alice)
    page = client.get(f"/purchases/{saga.pk}/").content.decode()
    live = client.get(f"/purchases/{saga.pk}/live/").content.decode()
    assert f'data-client-secret="{secret}"' in page and f'data-client-secret="{secret}"' in live
    assert f'<script src="{stripe_mode["STRIPE_JS_URL"]}" defer data-stripe-js></script>' in page
    assert 'data-action="authenticate"' in page

    # bob's answers are 404s, with nothing of it
    client.force_login(bob)
    for path in (f"/purchases/{saga.pk}/", f"/purchases/{saga.pk}/live/"):
        answer = client.get(path)
        assert answer.status_code == 404 and secret not in answer.content.decode()

    # settled (authentication failed), her page no longer carries it
    localstripe.authenticate(saga.processor_ref, secret, success=False)
    purchase_processor_event(saga_id=saga.pk, why="test: the buyer failed 3-D Secure")
    saga.refresh_from_db()
    assert saga.state == "COMPENSATED"
    client.force_login(alice)
    page = client.get(f"/purchases/{saga.pk}/").content.decode()
    assert secret not in page and "data-authenticate" not in page
    assert stripe_mode["STRIPE_JS_URL"] not in page  # settled: nothing to load


# --- the stories in Chromium ---------------------------------------------------------


def test_a_3d_secure_card_is_confirmed_with_the_bank_on_the_page_then_confirmed_live(
    stripe_stack,
    live_server,
    pages,  # noqa: F811
    hall,  # noqa: F811
    localstripe,  # noqa: F811
):
    buyer("alice")
    page = pages()
    traffic = Traffic(page)
    log_in(page, live_server.url, "alice", f"/events/{hall.pk}/")
    expect(page.locator('select[name="payment_method"]')).to_have_count(0)

    saga = buy_with_card(page, seats=["B5"], number=CARD_3DS)
    page.evaluate("window.stillTheSamePage = true")

    # the bank's confirmation opens by itself, on the purchase page
    expect(status_of(page)).to_have_attribute(
        "data-purchase-status", "REQUIRES_ACTION", timeout=SAGA_MS
    )
    expect(status_of(page)).to_have_text("Confirm the payment with your bank")
    authentication = page.locator("[data-authenticate]")
    expect(authentication).to_have_attribute("data-authentication", "open")
    expect(authentication.get_by_role("button", name="Confirm with my bank")).to_be_disabled()
    expect(confirmation(page)).to_be_visible()

    # when: the buyer completes it
    confirmation(page).click()

    # then: confirmed on the same page, live; one PaymentIntent succeeded
    expect(status_of(page)).to_have_attribute("data-purchase-status", "CONFIRMED", timeout=SAGA_MS)
    assert page.evaluate("window.stillTheSamePage") is True
    expect(page.locator("[data-authenticate]")).to_have_count(0)
    expect(page.locator('[data-ticket="B5"] svg')).to_have_count(1)
    expect(page.locator('[data-history-step][data-history-to="REQUIRES_ACTION"]')).to_have_count(1)
    saga.refresh_from_db()
    assert saga.processor == "stripe" and saga.processor_ref.startswith("pi_")
    intents = intents_of(localstripe, saga)
    assert [pi["id"] for pi in succeeded(intents)] == [saga.processor_ref], intents
    assert succeeded(intents)[0]["amount"] == saga.amount
    # the card's number went to the processor, never to boxoffice
    assert not [url for url, body in traffic.to(live_server.url) if CARD_3DS.encode() in body]
    assert [url for url, body in traffic.sent if CARD_3DS.encode() in body]


def test_on_a_phone_a_lost_connection_to_the_bank_is_tried_again_with_the_button(
    stripe_stack,
    live_server,
    pages,  # noqa: F811
    hall,  # noqa: F811
    localstripe,  # noqa: F811
):
    buyer("pia")
    page = pages(PHONE)
    log_in(page, live_server.url, "pia", f"/events/{hall.pk}/")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    # The first answer of the buyer's bank never arrives (the connection drops).
    lost: list[str] = []

    def drop_the_first(route):
        if not lost:
            lost.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    page.route(re.compile(r".*/_authenticate\b.*"), drop_the_first)
    saga = buy_with_card(page, seats=["C3"], number=CARD_3DS)
    confirmation(page).click()  # the one whose answer is lost

    # the page says so, and its button opens the confirmation again
    authentication = page.locator("[data-authenticate]")
    expect(authentication).to_have_attribute("data-authentication", "failed", timeout=SAGA_MS)
    expect(status_of(page)).to_have_attribute("data-purchase-status", "REQUIRES_ACTION")
    again = authentication.get_by_role("button", name="Try again")
    expect(again).to_be_visible()
    box = again.bounding_box()
    assert box is not None and box["height"] >= 44 and box["width"] >= PHONE["width"] * 0.8, box
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert len(lost) == 1

    again.click()
    confirmation(page).click()

    expect(status_of(page)).to_have_attribute("data-purchase-status", "CONFIRMED", timeout=SAGA_MS)
    assert len(succeeded(intents_of(localstripe, saga))) == 1


def test_a_failed_authentication_shows_nothing_charged_and_frees_the_seat(
    stripe_stack,
    live_server,
    pages,  # noqa: F811
    hall,  # noqa: F811
    localstripe,  # noqa: F811
):
    buyer("bob")
    page = pages()
    log_in(page, live_server.url, "bob", f"/events/{hall.pk}/")

    saga = buy_with_card(page, seats=["A1"], number=CARD_3DS)
    page.get_by_role("button", name="Fail authentication").click()

    expect(status_of(page)).to_have_attribute(
        "data-purchase-status", "COMPENSATED", timeout=SAGA_MS
    )
    expect(page.locator("#purchase-live")).to_contain_text("nothing was charged")
    expect(page.locator("[data-ticket]")).to_have_count(0)
    expect(page.locator("[data-authenticate]")).to_have_count(0)
    intents = intents_of(localstripe, saga)
    assert intents and not succeeded(intents), intents
    assert all(pi["latest_charge"] is None for pi in intents), intents
    page.goto(f"{live_server.url}/events/{hall.pk}/")
    expect(seat(page, "A1")).to_have_attribute("data-seat-status", "available")
    assert Seat.objects.get(event=hall, ref="A1").status == "available"


def test_a_card_without_3d_secure_confirms_and_stripes_event_reaches_us(
    stripe_stack,
    live_server,
    pages,  # noqa: F811
    hall,  # noqa: F811
    localstripe,  # noqa: F811
):
    buyer("carol")
    page = pages()
    log_in(page, live_server.url, "carol", f"/events/{hall.pk}/")

    saga = buy_with_card(page, seats=["D4", "D5"], number=CARD_VISA_NUMBER)

    expect(status_of(page)).to_have_attribute("data-purchase-status", "CONFIRMED", timeout=SAGA_MS)
    expect(page.locator("[data-ticket]")).to_have_count(2)
    expect(page.locator('[data-history-step][data-history-to="REQUIRES_ACTION"]')).to_have_count(0)
    saga.refresh_from_db()
    intents = intents_of(localstripe, saga)
    assert [pi["id"] for pi in succeeded(intents)] == [saga.processor_ref], intents
    # localstripe's signed payment_intent.succeeded came in through our
    # endpoint (a second after the charge; polled with a deadline)
    deadline = time.monotonic() + SAGA_MS / 1000
    while not StripeEvent.objects.filter(
        type="payment_intent.succeeded", object_id=saga.processor_ref
    ).exists():
        assert time.monotonic() < deadline, "no payment_intent.succeeded was recorded"
        time.sleep(0.2)  # localstripe, another process, sends it when it will
