"""The door scanner (door/pages.py, door/static/door/scanner.js) in a real
browser: headless Chromium (/usr/bin/chromium) driven by Playwright against
the live server, Playwright's auto-waiting assertions, never sleeps. The
check-in needs no worker: no stack runs. The browser, the pages and the
logins are tests/test_pages_browser.py's and tests/test_seller_pages_browser.py's.

1. Online: door staff scan a valid code (ok, its seat), the same code again
   (already checked in, where and when), and the code of a seat refunded
   and released (revoked); the page fits a phone, and so does the owner's
   dashboard, which counts the check-in by gate.
2. Offline, once the list is loaded: a valid code is admitted by the
   browser's own Ed25519 check, a forged one (a byte flipped) refused; back
   online, the queued scans are uploaded (Scan rows offline=True, the
   CheckIn row).
3. Without a browser: who may open the scanner (the seller pages' rules),
   the form without its script, and the check-in by gate on the owner's
   dashboard.
"""

from __future__ import annotations

import base64
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import Page, expect

from door.models import CheckIn, Scan
from door.tickets import tickets_of
from organizers.roles import Role
from purchases.models import PurchaseSaga
from purchases.services import organizer_refund, saga_charge

from . import test_pages_browser as shop_pages
from .conftest import start_purchase
from .factories import EventFactory, MembershipFactory, OrganizerFactory, UserFactory
from .test_seller_pages_browser import PHONE, fits_a_phone
from .test_seller_pages_browser import log_in as log_in_seller

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# The buyer pages' browser (Debian's Chromium, once a module) and its pages,
# each in a context of its own.
browser = shop_pages.browser
pages = shop_pages.pages
# Where the pictures go: docs/images/ with UPDATE_SCREENSHOTS=1 (door-*.png).
shots = shop_pages.shots

WAIT_MS = 20_000  # the machine is shared; the upload retries every 10 s
expect.set_options(timeout=WAIT_MS)


def person(username: str):
    return UserFactory(username=username, password=f"pw-{username}")


@pytest.fixture
def venue():
    venue = OrganizerFactory(slug="harbour", name="Harbour Hall")
    MembershipFactory(organizer=venue, user=person("dora"), role=Role.DOOR)
    return venue


@pytest.fixture
def show(venue):
    return EventFactory(organizer=venue, name="Harbour lights", seats=["A1", "A2", "A3", "A4"])


@pytest.fixture
def codes(show, gateway) -> dict[str, str]:
    """Bruno's confirmed A1, A2 and A3: each seat's code."""
    saga = saga_charge(saga_id=start_purchase(person("bruno"), show, seats=["A1", "A2", "A3"]).pk)
    assert saga.state == "CONFIRMED"
    return {ticket.seat: ticket.code for ticket in tickets_of(saga)}


def refund_a2(venue) -> None:
    """The organizer refunds A2 and puts it back on sale: its ticket is revoked."""
    saga = PurchaseSaga.objects.get(buyer__username="bruno")
    organizer_refund(
        organizer=venue,
        saga_id=saga.pk,
        user=person("fiona"),
        reason="Sold twice",
        seats=["A2"],
        release_seats=True,
    )


def forged(code: str) -> str:
    """``code`` with one byte of its signature flipped: well formed, not signed."""
    raw = bytearray(base64.urlsafe_b64decode(code + "="))
    raw[40] ^= 0x01
    return base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


def scan(page: Page, code: str) -> None:
    page.get_by_label("Ticket code").fill(code)
    page.get_by_role("button", name="Check").click()


def verdict(page: Page):
    return page.locator("[data-scan-result]")


def test_door_staff_scan_a_code_then_again_then_a_refunded_ones(
    codes, venue, show, live_server, pages, shots
):
    refund_a2(venue)
    page = pages(viewport=PHONE)
    log_in_seller(page, live_server.url, "dora", f"/door/{show.pk}/")
    fits_a_phone(page, page.url)
    expect(page.locator("[data-expected]")).to_have_text("2")
    page.get_by_label("Gate").fill("North")

    scan(page, codes["A1"])
    expect(verdict(page)).to_have_attribute("data-scan-result", "ok")
    expect(page.locator("[data-verdict-word]")).to_have_text("✓ Admit")
    expect(page.locator("[data-verdict-seat]")).to_have_text("Seat A1")
    expect(page.locator("[data-admitted]")).to_have_text("1")
    page.screenshot(path=str(shots / "door-scanner-ok.png"), full_page=True)

    scan(page, codes["A1"])
    expect(verdict(page)).to_have_attribute("data-scan-result", "already_checked_in")
    expect(page.locator("[data-verdict-detail]")).to_contain_text("at North")

    scan(page, codes["A2"])
    expect(verdict(page)).to_have_attribute("data-scan-result", "revoked")
    expect(page.locator("[data-verdict-word]")).to_have_text("✕ Revoked")

    assert CheckIn.objects.filter(event=show).count() == 1
    assert list(Scan.objects.filter(event=show).order_by("at").values_list("result", "gate")) == [
        ("ok", "North"),
        ("already_checked_in", "North"),
        ("revoked", "North"),
    ]
    # The gate is remembered on this phone.
    page.reload()
    expect(page.get_by_label("Gate")).to_have_value("North")

    # The owner's dashboard counts it, by gate, and fits a phone too.
    MembershipFactory(organizer=venue, user=person("olga"), role=Role.OWNER)
    owner = pages()
    log_in_seller(owner, live_server.url, "olga", f"/seller/harbour/events/{show.pk}/")
    expect(owner.locator("[data-checkin-admitted]")).to_have_text("1")
    expect(owner.locator('[data-gate="North"] [data-gate-admitted]')).to_have_text("1")
    fits_a_phone(owner, owner.url)


def test_offline_the_browser_judges_codes_and_uploads_them_when_back_online(
    codes, show, live_server, pages, shots
):
    page = pages(viewport=PHONE)
    log_in_seller(page, live_server.url, "dora", f"/door/{show.pk}/")
    ready = page.locator("[data-offline-ready]")
    expect(ready).to_have_attribute("data-offline-ready", "yes")
    connection = page.locator("[data-connection]")
    queue = page.locator("[data-queue-count]")

    page.context.set_offline(True)
    scan(page, codes["A3"])
    expect(verdict(page)).to_have_attribute("data-scan-result", "ok")
    expect(verdict(page)).to_have_attribute("data-scan-offline", "yes")
    expect(page.locator("[data-verdict-seat]")).to_have_text("Seat A3")
    expect(connection).to_have_attribute("data-connection", "offline")
    scan(page, forged(codes["A1"]))
    expect(verdict(page)).to_have_attribute("data-scan-result", "invalid")
    page.screenshot(path=str(shots / "door-scanner-offline.png"), full_page=True)
    scan(page, codes["A3"])
    expect(verdict(page)).to_have_attribute("data-scan-result", "already_checked_in")
    # The repeat refused here is not queued: uploaded, it would count as a
    # second admission.
    expect(queue).to_have_attribute("data-queue-count", "2")
    assert not CheckIn.objects.filter(event=show).exists()

    page.context.set_offline(False)
    expect(queue).to_have_attribute("data-queue-count", "0")
    expect(connection).to_have_attribute("data-connection", "online")
    uploaded = Scan.objects.filter(event=show, offline=True).order_by("at")
    assert [(s.result, s.conflict) for s in uploaded] == [("ok", False), ("invalid", False)]
    (admitted,) = CheckIn.objects.filter(event=show)
    assert admitted.ticket_id == uploaded[0].ticket_id
    expect(page.locator("[data-admitted]")).to_have_text("1")


def test_who_opens_the_scanner_its_form_without_script_and_the_dashboard_by_gate(
    codes, venue, show
):
    path = f"/door/{show.pk}/"
    owner, finance, stranger = person("olga"), person("fiona"), person("sam")
    MembershipFactory(organizer=venue, user=owner, role=Role.OWNER)
    MembershipFactory(organizer=venue, user=finance, role=Role.FINANCE)

    def as_(user) -> Client:
        client = Client()
        client.force_login(user)
        return client

    dora = as_(User.objects.get(username="dora"))

    assert Client().get(path).status_code == 302
    assert as_(stranger).get(path).status_code == 404
    assert dora.get(f"/door/{show.pk + 1000}/").status_code == 404
    refused = as_(finance).get(path)
    assert refused.status_code == 403 and "check tickets in" in refused.content.decode()
    assert dora.put(path).status_code == 405
    page = dora.get(path).content.decode()
    assert 'name="code"' in page and 'data-scan-result=""' in page

    # The form without its script: judged by the server.
    answer = dora.post(path, {"code": codes["A1"], "gate": "North"}).content.decode()
    assert 'data-scan-result="ok"' in answer and "Seat A1" in answer
    dora.post(path, {"code": codes["A3"], "gate": "South"})

    dashboard = as_(owner).get(f"/seller/harbour/events/{show.pk}/").content.decode()
    counts = r"data-checkin-admitted>(\d+)<.*?data-checkin-expected>(\d+)<"
    admitted = re.search(counts, dashboard, re.S)
    assert admitted is not None and admitted.groups() == ("2", "3")
    gates = re.findall(r'data-gate="([^"]*)".*?data-gate-admitted>(\d+)<', dashboard, re.S)
    assert sorted(gates) == [("North", "1"), ("South", "1")]
    assert f'href="{path}"' in dashboard
