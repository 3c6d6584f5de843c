"""The waiting room's page in a real browser, phone-sized (headless
Chromium, as tests/test_pages_browser.py): Buy on the seat map of an event
whose room lets buyers in in turn lands on ``/events/{id}/queue/``, whose
place moves by itself as the room's ticks let buyers in, until the turn
comes. The ticks run in this process (beat's task is one call of them)."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from purchases import admission
from purchases.models import WaitingRoom, WaitingRoomEntry

from .factories import EventFactory, UserFactory
from .test_pages_browser import PHONE, browser, log_in, seat  # noqa: F401 - the fixture

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_buy_waits_in_line_and_the_place_moves_until_the_turn(live_server, browser, settings):  # noqa: F811
    settings.WAITING_ROOM_MIN_CHARGE_RATE = 2.0  # 2 let in at a time, nothing measured
    event = EventFactory(seats=[f"A{n}" for n in range(1, 11)], waiting_room=True, hold_seconds=4)
    admission.rooms_tick()  # the room, drawn at once (no sales start)
    WaitingRoom.objects.filter(event=event).update(active=True)
    ahead = [UserFactory(username=f"ahead{k}") for k in range(3)]
    for user in ahead:
        admission.join(event_id=event.pk, user_id=user.pk)
    UserFactory(username="dana", password="pw-dana")

    context = browser.new_context(viewport=PHONE, base_url=live_server.url)
    page = context.new_page()
    log_in(page, live_server.url, "dana", f"/events/{event.pk}/")
    seat(page, "A5").click()
    page.get_by_role("button", name="Buy").click()

    expect(page).to_have_url(re.compile(rf"/events/{event.pk}/queue/$"))
    live = page.locator("#queue-live")
    expect(live).to_have_attribute("data-queue-status", "waiting")
    expect(page.locator("[data-position]")).to_have_text("4")

    admission.rooms_tick()  # two let in: dana is third in line... now second
    expect(page.locator("[data-position]")).to_have_text("2")

    # Those two started their purchases (their turns used, nothing to charge
    # left): the next tick lets two more in, dana among them.
    WaitingRoomEntry.objects.filter(event=event, admitted_at__isnull=False).update(
        used_at=timezone.now()
    )
    admission.rooms_tick()
    expect(live).to_have_attribute("data-queue-status", "admitted")
    expect(live).to_contain_text("It is your turn")
    page.get_by_role("link", name="Choose seats").click()
    expect(page).to_have_url(re.compile(rf"/events/{event.pk}/$"))
    seat(page, "A5").click()
    page.get_by_role("button", name="Buy").click()
    expect(page).to_have_url(re.compile(r"/purchases/[0-9a-f-]{36}/$"))
    context.close()
