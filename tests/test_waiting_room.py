"""The on-sale waiting room (purchases/admission.py, docs/waiting-room.md):
nothing held while a buyer waits; those who came before the opening drawn
once in a random order, later ones in the order they came; let in while the
purchases to charge fit in what a hold serves; a pass that names its buyer
and its event and expires; the API's 503 and the buyer's page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import signing
from django.test import Client
from freezegun import freeze_time

from purchases import admission
from purchases.models import Seat, SeatStatus, WaitingRoom, WaitingRoomEntry
from seller.services import event_publish

from .conftest import _client_for, new_key, purchase_body, race, start_purchase
from .factories import EventFactory, OrganizerFactory, UserFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
OPENS = T0 + timedelta(minutes=10)
SEATS = [f"A{n}" for n in range(1, 41)]


@pytest.fixture
def room_settings(settings):
    # A budget of 2 purchases to charge: before any charge is measured, a
    # probe of one second at the floor's 2 a second.
    settings.WAITING_ROOM_MIN_CHARGE_RATE = 2.0
    settings.WAITING_ROOM_HOLD_SHARE = 0.5
    settings.WAITING_ROOM_PASS_SECONDS = 120
    return settings


@pytest.fixture
def onsale(room_settings):
    return EventFactory(seats=SEATS, waiting_room=True, hold_seconds=4, sales_start=OPENS)


def buyers(n: int) -> list:
    return [UserFactory(username=f"buyer{k}") for k in range(n)]


def post(user, event, seat: str, *, key: str | None = None, **headers):
    return _client_for(user).post(
        "/api/purchases/",
        purchase_body(event, seats=[seat]),
        format="json",
        HTTP_IDEMPOTENCY_KEY=key or new_key(),
        **headers,
    )


def tick(event, at: datetime) -> bool:
    with freeze_time(at):
        admission.rooms_tick()
    return WaitingRoom.objects.get(event=event).active


def numbers(event) -> dict[str, Any]:
    # A buyer's number in the event's room (None before the draw).
    return {
        e.buyer.username: e.number
        for e in WaitingRoomEntry.objects.filter(event=event).select_related("buyer")
    }


def test_before_the_opening_buyers_wait_unnumbered_and_nothing_is_held(onsale):
    people = buyers(3)
    tick(onsale, T0)
    with freeze_time(T0):
        answers = [post(u, onsale, f"A{k + 1}") for k, u in enumerate(people)]

    for answer in answers:
        assert answer.status_code == 503
        body = answer.json()
        assert body["code"] == "waiting_room"
        assert body["position"] is None
        assert body["sales_start"] == "2026-12-07T12:10:00Z"
        assert body["retry_after"] == int(answer["Retry-After"]) == 30
    assert set(numbers(onsale).values()) == {None}
    assert not Seat.objects.filter(event=onsale).exclude(status=SeatStatus.AVAILABLE).exists()


def test_the_opening_draws_the_early_ones_once_at_random_and_later_ones_queue_in_order(onsale):
    early, late = buyers(12), [UserFactory(username=f"late{k}") for k in range(3)]
    tick(onsale, T0)
    with freeze_time(T0):
        for k, u in enumerate(early):
            post(u, onsale, f"A{k + 1}")
    after = OPENS + timedelta(seconds=1)
    tick(onsale, after)  # the draw; 2 let in at once (the budget)
    drawn = numbers(onsale)
    assert sorted(drawn.values()) == list(range(1, 13))
    arrival = [drawn[u.username] for u in early]
    assert arrival != sorted(arrival), "the draw kept the order of arrival"
    with freeze_time(after):
        for u in late:
            assert post(u, onsale, "A40").json()["code"] == "waiting_room"
    assert [numbers(onsale)[u.username] for u in late] == [13, 14, 15]

    tick(onsale, after + timedelta(seconds=1))  # the draw is not made again
    assert {k: v for k, v in numbers(onsale).items() if k.startswith("buyer")} == drawn


def test_draws_of_many_rooms_are_not_one_order():
    """Twelve buyers, five rooms: the same order five times is a draw that
    is not random (odds of 1 in 12!^4 otherwise)."""
    people = buyers(12)
    orders = set()
    for _ in range(5):
        event = EventFactory(seats=["A1"], waiting_room=True, sales_start=OPENS)
        tick(event, T0)
        for u in people:
            admission.join(event_id=event.pk, user_id=u.pk, now=T0)
        tick(event, OPENS)
        order = numbers(event)
        orders.add(tuple(order[u.username] for u in people))
    assert len(orders) > 1


def test_buyers_are_let_in_in_number_order_while_the_charges_fit_in_the_hold(onsale, gateway):
    people = buyers(5)
    tick(onsale, T0)
    with freeze_time(T0):
        for u in people:
            post(u, onsale, "A1")
    at = OPENS + timedelta(seconds=1)
    tick(onsale, at)
    by_number = sorted(people, key=lambda u: numbers(onsale)[u.username])
    first, second, third = by_number[:3]
    with freeze_time(at):
        assert post(first, onsale, "A1").status_code == 202
        assert post(second, onsale, "A2").status_code == 202
        waiting = post(third, onsale, "A3")
    assert waiting.status_code == 503
    assert waiting.json()["position"] == 1  # next: numbers 1 and 2 are in
    assert WaitingRoom.objects.get(event=onsale).admitted_through == 2

    # Two purchases to charge fill the budget: nobody more is let in.
    assert tick(onsale, at + timedelta(seconds=1)) is True
    assert WaitingRoom.objects.get(event=onsale).admitted_through == 2
    # Charged (the fake answers at once): the next two are let in.
    from purchases.services import saga_charge

    for saga_id in onsale_sagas(onsale):
        saga_charge(saga_id=saga_id)
    tick(onsale, at + timedelta(seconds=2))
    assert WaitingRoom.objects.get(event=onsale).admitted_through == 4
    with freeze_time(at + timedelta(seconds=2)):
        assert post(third, onsale, "A3").status_code == 202


def onsale_sagas(event) -> list[str]:
    from purchases.models import PurchaseSaga

    return [str(pk) for pk in PurchaseSaga.objects.filter(event=event).values_list("pk", flat=True)]


def test_a_room_with_room_to_spare_lets_everyone_through_and_numbers_nobody(room_settings):
    event = EventFactory(seats=SEATS, waiting_room=True, hold_seconds=600)
    assert tick(event, T0) is False
    alice, bob = buyers(2)
    with freeze_time(T0):
        assert post(alice, event, "A1").status_code == 202
        assert post(bob, event, "A2").status_code == 202
    assert not WaitingRoomEntry.objects.filter(event=event).exists()


def test_a_room_switched_off_is_not_asked(onsale):
    tick(onsale, T0)
    onsale.waiting_room = False
    onsale.save(update_fields=["waiting_room"])
    (alice,) = buyers(1)
    with freeze_time(T0):
        answer = post(alice, onsale, "A1")
    assert answer.status_code == 409
    assert answer.json()["code"] == "sales_not_open"


def _admitted(onsale, n: int = 1):
    people = buyers(n)
    tick(onsale, T0)
    with freeze_time(T0):
        for u in people:
            post(u, onsale, "A1")
    tick(onsale, OPENS)
    return sorted(people, key=lambda u: numbers(onsale)[u.username])


def test_the_pass_names_its_buyer_and_event_and_lets_only_them_in(onsale):
    alice, bob, carol = _admitted(onsale, 3)  # alice and bob let in, carol waits
    with freeze_time(OPENS):
        place = _client_for(alice).get(f"/api/events/{onsale.pk}/queue/").json()
    assert place["status"] == "admitted"
    assert place["pass_expires_at"] == "2026-12-07T12:12:00Z"
    token = place["pass"]
    assert admission.pass_admits(token, event_id=onsale.pk, user_id=alice.pk, now=OPENS)

    forged = token[:-2] + ("AA" if token[-2:] != "AA" else "BB")
    other_event = EventFactory(seats=["A1"], waiting_room=True)
    for_other_event = admission.pass_issue(
        event_id=other_event.pk, user_id=carol.pk, admitted_at=OPENS
    )
    unsigned = signing.dumps({"e": onsale.pk, "u": carol.pk, "a": OPENS.timestamp()}, salt="other")
    with freeze_time(OPENS):
        for bad in (token, forged, for_other_event, unsigned):  # alice's, for carol
            answer = post(carol, onsale, "A9", HTTP_WAITING_ROOM_PASS=bad)
            assert answer.status_code == 503, bad
            assert answer.json()["code"] == "waiting_room"
        assert post(alice, onsale, "A1", HTTP_WAITING_ROOM_PASS=token).status_code == 202
    assert WaitingRoomEntry.objects.get(event=onsale, buyer=alice).used_at is not None
    assert not admission.pass_admits(forged, event_id=onsale.pk, user_id=alice.pk, now=OPENS)
    assert not admission.pass_admits(token, event_id=onsale.pk, user_id=bob.pk, now=OPENS)


def test_an_expired_pass_and_a_lapsed_turn_go_to_the_back(onsale):
    alice, *_ = _admitted(onsale, 5)  # 1 and 2 let in; 3, 4 and 5 wait
    with freeze_time(OPENS):
        token = _client_for(alice).get(f"/api/events/{onsale.pk}/queue/").json()["pass"]
    late = OPENS + timedelta(seconds=121)
    assert not admission.pass_admits(token, event_id=onsale.pk, user_id=alice.pk, now=late)
    # The first two let their turn pass unused: 3 and 4 are let in, 5 waits.
    assert tick(onsale, late) is True
    with freeze_time(late):
        answer = post(alice, onsale, "A1", HTTP_WAITING_ROOM_PASS=token)
    assert answer.status_code == 503
    assert numbers(onsale)[alice.username] == 6
    assert answer.json()["position"] == 2


def test_the_throttle_is_not_spent_by_waiting_and_a_replay_still_answers(onsale, tight_throttle):
    (alice,) = _admitted(onsale, 1)
    with freeze_time(OPENS):
        key = new_key()
        assert post(alice, onsale, "A1", key=key).status_code == 202
    # Now the room lets nobody in (alice's admission is used, the room is
    # full with a budget of 1 purchase).
    onsale.hold_seconds = 2
    onsale.save(update_fields=["hold_seconds"])
    WaitingRoom.objects.filter(event=onsale).update(active=True)
    (bob,) = [UserFactory(username="bob2")]
    with freeze_time(OPENS):
        for _ in range(6):  # over "3/min"
            assert post(bob, onsale, "A2").json()["code"] == "waiting_room"
        assert post(alice, onsale, "A1", key=key).status_code == 202  # the replay


def test_joins_at_once_get_one_number_each(transactional_db, room_settings):
    event = EventFactory(seats=["A1"], waiting_room=True)
    people = buyers(8)
    tick(event, T0)  # drawn at once: no sales start
    WaitingRoom.objects.filter(event=event).update(active=True)

    results = race(8, lambda i: admission.join(event_id=event.pk, user_id=people[i].pk, now=T0))

    assert [r.status for r in results] == ["waiting"] * 8
    assert sorted(numbers(event).values()) == list(range(1, 9))
    assert sorted(r.position for r in results) == list(range(1, 9))


def test_the_queue_api_and_its_refusals(onsale, alice_api, anon_api):
    assert anon_api.get(f"/api/events/{onsale.pk}/queue/").status_code == 401
    assert alice_api.get("/api/events/999999/queue/").status_code == 404
    assert alice_api.get("/api/events/nope/queue/").status_code == 404
    tick(onsale, T0)
    with freeze_time(T0):
        assert alice_api.get(f"/api/events/{onsale.pk}/queue/").json() == {"status": "not_in_room"}
        joined = alice_api.post(f"/api/events/{onsale.pk}/queue/").json()
    assert joined == {
        "status": "waiting",
        "position": None,
        "retry_after": 30,
        "sales_start": "2026-12-07T12:10:00Z",
    }
    plain = EventFactory(seats=["A1"])
    assert alice_api.get(f"/api/events/{plain.pk}/queue/").json() == {"status": "open"}


def test_publishing_decides_the_room_by_the_seat_count(settings):
    settings.WAITING_ROOM_MIN_SEATS = 3
    organizer = OrganizerFactory(slug="hall")
    big = EventFactory(organizer=organizer, seats=["A1", "A2", "A3"], status="draft")
    small = EventFactory(organizer=organizer, seats=["A1", "A2"], status="draft")
    kept = EventFactory(organizer=organizer, seats=["A1"], status="draft", waiting_room=True)
    for event in (big, small, kept):
        event_publish(organizer=organizer, event_id=event.pk)
        event.refresh_from_db()
    assert (big.waiting_room, small.waiting_room, kept.waiting_room) == (True, False, True)


def test_buy_on_the_page_goes_to_the_queue_page_with_the_place(onsale):
    alice, bob, carol = _admitted(onsale, 3)
    page = Client()
    page.force_login(carol)
    with freeze_time(OPENS):
        seat_map = page.get(f"/events/{onsale.pk}/")
        assert seat_map.status_code == 200
        bought = page.post(
            f"/events/{onsale.pk}/",
            {
                "seats": ["A5"],
                "payment_method": "pm_card_visa",
                "idempotency_key": new_key(),
            },
        )
        assert bought.status_code == 303
        assert bought["Location"] == f"/events/{onsale.pk}/queue/"
        queue = page.get(bought["Location"])
    assert queue.status_code == 200
    html = queue.content.decode()
    assert 'data-queue-status="waiting"' in html
    assert 'data-position="1"' in html
    assert f'hx-get="/events/{onsale.pk}/queue/live/"' in html


def test_the_sellers_dashboard_and_the_admin_show_the_room(onsale, admin_client):
    from organizers.models import Membership
    from organizers.roles import Role

    owner = UserFactory(username="owner-person")
    Membership.objects.create(organizer=onsale.organizer, user=owner, role=Role.OWNER)
    _admitted(onsale, 5)  # 2 let in, 3 waiting
    page = Client()
    page.force_login(owner)
    html = page.get(f"/seller/{onsale.organizer.slug}/events/{onsale.pk}/").content.decode()
    assert 'data-waiting-room="active"' in html
    assert "data-room-waiting>3<" in html
    assert "data-room-admitted>2<" in html

    admin_page = admin_client.get(f"/admin/purchases/event/{onsale.pk}/change/").content.decode()
    assert "letting buyers in in turn: 3 waiting, 2 let in" in admin_page


def test_a_room_opens_an_hour_before_its_sale(room_settings):
    later = EventFactory(seats=["A1"], waiting_room=True, sales_start=T0 + timedelta(hours=2))
    (alice,) = buyers(1)
    with freeze_time(T0):
        admission.rooms_tick()
        assert not WaitingRoom.objects.filter(event=later).exists()
        assert post(alice, later, "A1").json()["code"] == "sales_not_open"
    with freeze_time(T0 + timedelta(hours=1, seconds=1)):
        admission.rooms_tick()
        assert post(alice, later, "A1").json()["code"] == "waiting_room"


def test_a_buyer_let_in_and_refused_for_seats_spends_the_turn(onsale):
    alice, bob, carol = _admitted(onsale, 3)  # alice and bob let in
    Seat.objects.filter(event=onsale).exclude(ref="A1").update(status=SeatStatus.SOLD)
    Seat.objects.filter(event=onsale, ref="A1").update(status=SeatStatus.HELD)
    with freeze_time(OPENS):
        answer = post(alice, onsale, "A1")
    assert answer.json()["code"] == "seat_unavailable"
    assert WaitingRoomEntry.objects.get(event=onsale, buyer=alice).used_at is not None
    assert WaitingRoomEntry.objects.get(event=onsale, buyer=bob).used_at is None


def test_a_sold_out_event_lets_everyone_waiting_in_to_be_told_so(onsale):
    people = _admitted(onsale, 6)  # 2 let in, 4 waiting
    Seat.objects.filter(event=onsale).update(status=SeatStatus.SOLD)
    assert tick(onsale, OPENS + timedelta(seconds=1)) is False
    assert WaitingRoom.objects.get(event=onsale).admitted_through == 6
    with freeze_time(OPENS + timedelta(seconds=1)):
        answer = _client_for(people[-1]).post(
            "/api/purchases/",
            {"event": onsale.pk, "quantity": 1, "payment_method": "pm_card_visa"},
            format="json",
            HTTP_IDEMPOTENCY_KEY=new_key(),
        )
    assert answer.json()["code"] == "not_enough_seats"


def test_nobody_more_is_let_in_while_the_oldest_purchase_waits_too_long(room_settings):
    """The workers busy elsewhere: the measured rate says there is room, the
    oldest purchase not charged yet says there is not."""
    room_settings.WAITING_ROOM_MIN_CHARGE_RATE = 10.0  # a budget of 20 over 2 s
    event = EventFactory(seats=SEATS, waiting_room=True, hold_seconds=4)
    tick(event, T0)  # drawn at once, nobody waiting: starts go through
    start_purchase(UserFactory(username="early"), event, seats=["A40"], now=T0)
    WaitingRoom.objects.filter(event=event).update(active=True)
    for u in buyers(4):
        admission.join(event_id=event.pk, user_id=u.pk, now=T0)

    tick(event, T0 + timedelta(milliseconds=500))  # waited 0.5 s of the 1 s allowed
    assert WaitingRoom.objects.get(event=event).admitted_through == 4
    WaitingRoom.objects.filter(event=event).update(active=True)  # a crowd again
    late = [UserFactory(username=f"late{k}") for k in range(2)]
    for u in late:
        assert admission.join(event_id=event.pk, user_id=u.pk, now=T0).status == "waiting"
    # Waited 1 s: nobody more, though the budget (10, 5 used) has room.
    assert tick(event, T0 + timedelta(seconds=1)) is True
    assert WaitingRoom.objects.get(event=event).admitted_through == 4
