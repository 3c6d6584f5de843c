"""A refund retried again and again (issue 30, item 9): the buyer's history
tells each repeated step once, with how many times it happened and the
latest time (``"times"``), in the API and on the live page; the admin keeps
every row (docs/api.md, "The buyer's history")."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db.models import F
from django.test import Client
from freezegun import freeze_time

from purchases.buyer_history import BuyerMove, collapse
from purchases.models import PurchaseSaga, SagaHistory
from purchases.services import saga_compensate

from .factories import UserFactory
from .late_charge import charged_while_undone
from .test_pages import history_steps, page_of
from .test_public_history import CANCELLING, CHARGING, DECLINED, REFUNDED, STARTED

pytestmark = pytest.mark.django_db

AGAIN = "We are trying the refund again"
LONGER = "The refund is taking longer than usual; we will keep trying"
T0 = "2026-12-02 12:00:00"
RETRIES = 40


def _retried(alice, event, gw, clock, retries: int = RETRIES) -> PurchaseSaga:
    """A purchase undone after its charge landed (the compensation owes a
    refund: a confirmed purchase's refunds are rows, not moves) whose refund
    the gateway never confirms: the first attempt and ``retries`` more, a
    minute apart, each a real move COMPENSATION_PENDING -> COMPENSATING ->
    COMPENSATION_PENDING."""
    saga = charged_while_undone(alice, event)
    gw.down("refund")
    clock.tick(60)
    saga = saga_compensate(saga_id=saga.pk)
    for _ in range(retries):
        clock.tick(60)
        saga = saga_compensate(saga_id=saga.pk)
    assert saga.state == "COMPENSATION_PENDING"
    return saga


def _told(data) -> list[tuple]:
    return [(h["from"], h["to"], h["reason"], h["times"]) for h in data["history"]]


def test_forty_refund_retries_read_as_a_handful_of_steps_with_their_counts(
    alice, alice_api, event, faulty_gateway
):
    # given
    with freeze_time(T0) as clock:
        saga = _retried(alice, event, faulty_gateway, clock)
        last_move = clock()
    # the 85 moves (the admin keeps them, and the notes besides)
    assert SagaHistory.objects.filter(saga=saga).exclude(from_state=F("to_state")).count() == 85

    # when
    response = alice_api.get(f"/api/purchases/{saga.pk}/")

    # then
    data = response.json()
    assert _told(data) == [
        (None, "PENDING", STARTED, 1),
        ("PENDING", "CHARGING", CHARGING, 1),
        ("CHARGING", "PAYMENT_FAILED", DECLINED, 1),
        ("PAYMENT_FAILED", "COMPENSATING", CANCELLING, 1),
        ("COMPENSATION_PENDING", "COMPENSATING", AGAIN, RETRIES),
        ("COMPENSATING", "COMPENSATION_PENDING", LONGER, RETRIES + 1),
    ]
    # each step at its latest time: the timeline still reads in order, and
    # its last step is where the purchase stands
    ats = [h["at"] for h in data["history"]]
    assert ats == sorted(ats)
    assert data["history"][-1]["at"].startswith(last_move.strftime("%Y-%m-%dT%H:%M"))
    assert data["history"][-1]["to"] == data["status"]
    assert len(response.content) < 2_000


def test_the_last_retry_that_succeeds_ends_the_story(alice, alice_api, event, faulty_gateway):
    with freeze_time(T0) as clock:
        saga = _retried(alice, event, faulty_gateway, clock, retries=3)
        faulty_gateway.up("refund")
        clock.tick(60)
        assert saga_compensate(saga_id=saga.pk).state == "COMPENSATED"

    data = alice_api.get(f"/api/purchases/{saga.pk}/").json()

    assert _told(data)[3:] == [
        ("PAYMENT_FAILED", "COMPENSATING", CANCELLING, 1),
        ("COMPENSATING", "COMPENSATION_PENDING", LONGER, 4),
        ("COMPENSATION_PENDING", "COMPENSATING", AGAIN, 4),
        ("COMPENSATING", "COMPENSATED", REFUNDED, 1),
    ]


def test_the_live_page_shows_one_step_per_repeat_with_its_count_and_follows_new_retries(
    alice, event, faulty_gateway
):
    page = Client()
    page.force_login(alice)
    poll = {"HX-Request": "true"}
    with freeze_time(T0) as clock:
        saga = _retried(alice, event, faulty_gateway, clock)
        live = f"/purchases/{saga.pk}/live/"

        # when
        first = page.get(live, headers=poll)

        # then: six steps, oldest first, the repeated ones with their count
        steps = history_steps(page_of(first))
        assert len(steps) == 6
        assert steps[4].endswith(f"{AGAIN} ({RETRIES} times, latest at 12:41:00)"), steps[4]
        assert steps[5].endswith(f"{LONGER} ({RETRIES + 1} times, latest at 12:41:00)")
        assert steps[3].endswith(CANCELLING)  # once: no count
        times = re.findall(r'data-history-times="(\d+)"', page_of(first))
        assert times == ["1", "1", "1", "1", str(RETRIES), str(RETRIES + 1)]

        # and another retry still reaches the page: it moves the version
        # that the poll's ETag is, so the count and the time change
        held = {**poll, "If-None-Match": first["ETag"]}
        assert page.get(live, headers=held).status_code == 304
        clock.tick(60)
        saga_compensate(saga_id=saga.pk)
        moved = page.get(live, headers=held)
    assert moved.status_code == 200 and moved["ETag"] != first["ETag"]
    steps = history_steps(page_of(moved))
    assert len(steps) == 6
    assert steps[4].endswith(f"{AGAIN} ({RETRIES + 1} times, latest at 12:42:00)"), steps[4]


def test_the_admin_still_shows_every_retry(client, alice, event, faulty_gateway):
    # given
    staff = UserFactory(username="dave", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="purchases", codename="view_purchasesaga"
        )
    )
    with freeze_time(T0) as clock:
        saga = _retried(alice, event, faulty_gateway, clock)
    client.force_login(staff)

    # when
    response = client.get(f"/admin/purchases/purchasesaga/{saga.pk}/change/")

    # then: every row, each retry on its own
    assert response.status_code == 200
    rows = response.context["history"]
    assert len(rows) == SagaHistory.objects.filter(saga=saga).count()
    retries = [
        h for h in rows if (h.from_state, h.to_state) == ("COMPENSATION_PENDING", "COMPENSATING")
    ]
    assert len(retries) == RETRIES


def _move(source, target, minute, reason="r") -> BuyerMove:
    return BuyerMove(
        source, target, datetime(2026, 1, 1, 12, tzinfo=UTC) + timedelta(minutes=minute), reason
    )


def test_collapse_keeps_single_steps_and_puts_each_repeat_where_it_last_happened():
    a, b, c = _move(None, "PENDING", 0, "a"), _move("PENDING", "X", 1, "b"), _move("X", "Y", 2, "c")
    assert collapse([a, b, c]) == [a, b, c]  # nothing repeats: as it was, times 1
    assert {m.times for m in collapse([a, b, c])} == {1}

    cycle = [
        a,
        _move("P", "Q", 1, "q"),
        _move("Q", "P", 2, "p"),
        _move("P", "Q", 3, "q"),
        _move("Q", "P", 4, "p"),
        _move("P", "Q", 5, "q"),
    ]
    told = collapse(cycle)
    assert [(m.reason, m.times, m.at.minute) for m in told] == [
        ("a", 1, 0),
        ("p", 2, 4),
        ("q", 3, 5),
    ]
