"""The seller's rules, checked by the purchase in the transaction that holds
the seats (docs/api.md, "Events, seat maps and prices": "Purchases now also
check"): the sales window and the event's status, the hold time per event,
the limit of seats per buyer (also for purchases made at the same time, on
real concurrent connections), blocked seats, best available by price
category, and the price a seat is held at when the seller changes prices.
Every refusal writes nothing, and a key's first answer still wins over it."""

from __future__ import annotations

import hashlib
import json
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from freezegun import freeze_time

# Imported before any clock is frozen: DRF's throttles keep time.time as a
# class attribute taken when first imported, and one first imported under
# freezegun (the URL conf loads on the first request) keeps the fake for good.
import purchases.apis  # noqa: F401
from bench.figures import reserve as bench_reserve
from common.time import iso_z
from outbox.models import OutboxMessage
from purchases import lock_objects
from purchases.errors import BuyerLimitReached, UnknownCategory
from purchases.models import (
    Event,
    EventStatus,
    IdempotencyRecord,
    PriceCategory,
    PurchaseSaga,
    ReservationSeat,
    Seat,
    SeatStatus,
)
from purchases.saga import start
from purchases.services import purchase_start, request_fingerprint, saga_charge

from .conftest import new_key, purchase_body, race, row_counts, start_purchase
from .factories import EventFactory, SeatFactory, UserFactory

PURCHASES = "/api/purchases/"
T0 = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)


def post(client, body, *, key=None):
    return client.post(
        PURCHASES, body, format="json", headers={"Idempotency-Key": key or new_key()}
    )


def best_body(event, quantity, **extra) -> dict:
    return {"event": event.pk, "quantity": quantity, "payment_method": "pm_card_visa", **extra}


def seat_statuses(event) -> dict[str, str]:
    return dict(Seat.objects.filter(event=event).values_list("ref", "status"))


def held_refs(event) -> set[str]:
    return {ref for ref, status in seat_statuses(event).items() if status == SeatStatus.HELD}


def buyer_live_seats(user, event) -> int:
    """The seats the buyer holds or bought for the event, counted from the rows."""
    return ReservationSeat.objects.filter(
        event=event,
        released_at__isnull=True,
        reservation__buyer=user,
        reservation__status__in=["HELD", "CONFIRMED"],
    ).count()


def _other_connection() -> psycopg.Connection:
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return psycopg.connect(autocommit=True, **params)


def _wait_until_blocked(other: psycopg.Connection, pid: int, thread: threading.Thread) -> None:
    """Until the backend ``pid`` waits for a lock, or its thread is done (it
    did not wait: the assertions after say what it did)."""
    while (
        thread.is_alive()
        and not other.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", [pid]
        ).fetchone()
    ):
        threading.Event().wait(0.01)


# --- the sales window and the event's status ----------------------------------------------


@pytest.mark.django_db
def test_before_sales_start_is_409_sales_not_open_with_the_start_and_writes_nothing(alice_api):
    event = EventFactory(sales_start=T0 + timedelta(hours=1))
    before = row_counts()

    with freeze_time(T0):
        answer = post(alice_api, purchase_body(event, ["A1"]))
        best = post(alice_api, best_body(event, 2))

    assert answer.status_code == 409, answer.content
    assert answer.json() == {
        "code": "sales_not_open",
        "detail": "sales for this event have not opened yet",
        "sales_start": "2026-12-02T13:00:00Z",
    }
    assert (best.status_code, best.json()["code"]) == (409, "sales_not_open")
    assert row_counts() == before
    assert held_refs(event) == set()


@pytest.mark.django_db
def test_sales_open_at_their_start_and_close_at_their_end(alice_api):
    event = EventFactory(
        seats=["A1", "A2", "A3"], sales_start=T0, sales_end=T0 + timedelta(hours=2)
    )

    with freeze_time(T0):
        opened = post(alice_api, purchase_body(event, ["A1"]))
    with freeze_time(T0 + timedelta(hours=2) - timedelta(microseconds=1)):
        last = post(alice_api, purchase_body(event, ["A2"]))
    before = row_counts()
    with freeze_time(T0 + timedelta(hours=2)):
        closed = post(alice_api, purchase_body(event, ["A3"]))
        closed_best = post(alice_api, best_body(event, 1))

    assert (opened.status_code, last.status_code) == (202, 202)
    assert closed.status_code == 409
    assert closed.json() == {"code": "sales_closed", "detail": "sales for this event are closed"}
    assert closed_best.json()["code"] == "sales_closed"
    assert row_counts() == before
    assert held_refs(event) == {"A1", "A2"}


@pytest.mark.django_db
def test_a_cancelled_event_is_409_sales_closed_and_writes_nothing(alice_api):
    event = EventFactory(status=EventStatus.CANCELLED)
    before = row_counts()

    named = post(alice_api, purchase_body(event, ["A1"]))
    best = post(alice_api, best_body(event, 1))

    assert (named.status_code, named.json()["code"]) == (409, "sales_closed")
    assert (best.status_code, best.json()["code"]) == (409, "sales_closed")
    assert row_counts() == before
    assert held_refs(event) == set()


@pytest.mark.django_db
def test_a_draft_is_refused_exactly_like_an_unknown_event(alice_api):
    draft = EventFactory(status=EventStatus.DRAFT)
    missing = draft.pk + 1000
    before = row_counts()

    answers = {
        "draft named": post(alice_api, purchase_body(draft, ["A1"])),
        "draft best": post(alice_api, best_body(draft, 1)),
    }
    unknown = post(alice_api, {**purchase_body(draft, ["A1"]), "event": missing})

    assert unknown.status_code == 400 and unknown.json()["field"] == "event"
    for name, answer in answers.items():
        assert answer.status_code == 400, name
        assert answer.json() == unknown.json(), name
    assert row_counts() == before
    assert held_refs(draft) == set()


@pytest.mark.django_db
def test_the_hold_lasts_the_events_hold_time_or_the_platforms(alice, settings):
    settings.PURCHASE_HOLD_SECONDS = 900
    short = EventFactory(hold_seconds=120)
    default = EventFactory()

    with freeze_time(T0):
        on_short = start_purchase(alice, short)
        on_default = start_purchase(alice, default)

    assert on_short.reservation.hold_expires_at == T0 + timedelta(seconds=120)
    assert on_default.reservation.hold_expires_at == T0 + timedelta(seconds=900)
    for saga in (on_short, on_default):
        timer = OutboxMessage.objects.get(key=f"hold:{saga.pk}")
        assert timer.due_at == saga.reservation.hold_expires_at
        answered = IdempotencyRecord.objects.get(saga=saga).response_body
        assert answered["hold_expires_at"] == iso_z(saga.reservation.hold_expires_at)


@pytest.mark.django_db
def test_the_keys_first_answer_wins_over_a_refusal_by_the_rules(alice_api):
    event = EventFactory(max_seats_per_buyer=2)
    key, body = new_key(), purchase_body(event, ["A1", "A2"])
    first = post(alice_api, body, key=key)
    assert first.status_code == 202

    # Now over the buyer's limit, then closed: the same key and body
    # answer the first answer again; another body is a reused key.
    over = post(alice_api, body, key=key)
    Event.objects.filter(pk=event.pk).update(status=EventStatus.CANCELLED)
    closed = post(alice_api, body, key=key)
    other = post(alice_api, purchase_body(event, ["A3"]), key=key)

    assert (over.status_code, over.content) == (202, first.content)
    assert (closed.status_code, closed.content) == (202, first.content)
    assert (other.status_code, other.json()["code"]) == (422, "idempotency_key_reused")
    assert PurchaseSaga.objects.count() == 1


# --- the limit of seats per buyer ----------------------------------------------------------


@pytest.mark.django_db
def test_the_limit_counts_held_and_confirmed_seats_and_not_released_ones(
    alice, alice_api, bob, gateway
):
    event = EventFactory(seats=[f"A{n}" for n in range(1, 9)], max_seats_per_buyer=4)
    other_event = EventFactory(seats=["A1", "A2"], max_seats_per_buyer=4)
    bought = start_purchase(alice, event, seats=["A1", "A2"])
    saga_charge(saga_id=bought.pk)
    start_purchase(alice, event, seats=["A3"])  # held
    start_purchase(alice, other_event, seats=["A1", "A2"])  # another event's
    start_purchase(bob, event, seats=["A4", "A5"])  # another buyer's
    assert PurchaseSaga.objects.get(pk=bought.pk).state == "CONFIRMED"
    before = row_counts()

    refused = post(alice_api, purchase_body(event, ["A6", "A7"]))
    refused_best = post(alice_api, best_body(event, 2))

    assert refused.status_code == 409, refused.content
    body = refused.json()
    assert (body["code"], body["limit"], body["held_or_bought"]) == ("buyer_limit_reached", 4, 3)
    assert refused_best.json() == body
    assert row_counts() == before
    # One more fits, exactly to the limit; then nothing more.
    assert post(alice_api, purchase_body(event, ["A6"])).status_code == 202
    full = post(alice_api, best_body(event, 1))
    assert (full.json()["code"], full.json()["held_or_bought"]) == ("buyer_limit_reached", 4)
    assert buyer_live_seats(alice, event) == 4


@pytest.mark.django_db
def test_seats_released_no_longer_count(alice, alice_api, gateway):
    event = EventFactory(seats=[f"A{n}" for n in range(1, 6)], max_seats_per_buyer=3)
    declined = start_purchase(
        alice, event, seats=["A1", "A2"], payment_method="pm_card_chargeDeclined"
    )
    start_purchase(alice, event, seats=["A3"])
    over = post(alice_api, purchase_body(event, ["A4"]))
    assert (over.status_code, over.json()["held_or_bought"]) == (409, 3)

    saga_charge(saga_id=declined.pk)  # declined: compensated, its seats released

    assert PurchaseSaga.objects.get(pk=declined.pk).state == "COMPENSATED"
    assert buyer_live_seats(alice, event) == 1
    again = post(alice_api, purchase_body(event, ["A1", "A4"]))
    assert again.status_code == 202, again.content
    assert buyer_live_seats(alice, event) == 3


@pytest.mark.django_db(transaction=True)
def test_five_purchases_by_one_buyer_at_once_never_pass_the_limit():
    # given: a limit of 4, five purchases of 2 seats each, all at once on
    # five real connections
    event = EventFactory(seats=[f"A{n}" for n in range(1, 11)], max_seats_per_buyer=4)
    buyer = UserFactory(username="scalper")

    results = race(
        5,
        lambda i: purchase_start(
            user=buyer,
            idempotency_key=new_key(),
            event_id=event.pk,
            seat_refs=[f"A{2 * i + 1}", f"A{2 * i + 2}"],
            payment_method="pm_card_visa",
        ),
    )

    # then: two pass, the others are told the limit and the four seats held
    won = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, BuyerLimitReached)]
    assert len(won) == 2 and len(refused) == 3, results
    assert {(r.limit, r.held_or_bought) for r in refused} == {(4, 4)}
    assert buyer_live_seats(buyer, event) == 4
    assert len(held_refs(event)) == 4
    assert PurchaseSaga.objects.filter(buyer=buyer).count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_purchase_waits_for_the_buyers_purchase_in_flight_then_counts_it(monkeypatch):
    """Deterministic: the first purchase has counted and is paused before it
    commits; the second, by the same buyer, must wait for it (on the buyer's
    lock), then count its seats. Without the lock the second counts nothing
    and both pass a limit of 3 with 2 seats each."""
    event = EventFactory(seats=[f"A{n}" for n in range(1, 5)], max_seats_per_buyer=3)
    buyer = UserFactory(username="twice")
    counted, go = threading.Event(), threading.Event()
    real_check = start._check_buyer_limit
    outcomes: dict[str, object] = {}
    pids: dict[str, int] = {}

    def check_then_pause(saga, **kwargs):
        real_check(saga, **kwargs)
        if threading.current_thread().name == "first":
            counted.set()
            go.wait(60)

    monkeypatch.setattr(start, "_check_buyer_limit", check_then_pause)

    def buy(name: str, refs: list[str]) -> None:
        pids[name] = connection.cursor().connection.info.backend_pid
        try:
            outcomes[name] = purchase_start(
                user=buyer,
                idempotency_key=new_key(),
                event_id=event.pk,
                seat_refs=refs,
                payment_method="pm_card_visa",
            )
        except Exception as exc:  # noqa: BLE001 - the verdict is the outcome
            outcomes[name] = exc
        finally:
            connection.close()

    first = threading.Thread(target=buy, args=("first", ["A1", "A2"]), name="first")
    second = threading.Thread(target=buy, args=("second", ["A3", "A4"]), name="second")
    first.start()
    assert counted.wait(60)
    with _other_connection() as other:
        second.start()
        while "second" not in pids and second.is_alive():
            threading.Event().wait(0.01)
        _wait_until_blocked(other, pids["second"], second)
        go.set()
        first.join(60)
        second.join(60)

    assert not isinstance(outcomes["first"], Exception), outcomes
    refusal = outcomes["second"]
    assert isinstance(refusal, BuyerLimitReached), outcomes
    assert (refusal.limit, refusal.held_or_bought) == (3, 2)
    assert held_refs(event) == {"A1", "A2"}


# --- blocked seats ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_blocked_seat_named_is_409_seat_unavailable_and_writes_nothing(alice_api):
    event = EventFactory()
    Seat.objects.filter(event=event, ref="A2").update(
        status=SeatStatus.UNAVAILABLE, block_reason="sound desk"
    )
    before = row_counts()

    answer = post(alice_api, purchase_body(event, ["A1", "A2"]))

    assert answer.status_code == 409
    assert (answer.json()["code"], answer.json()["seats"]) == ("seat_unavailable", ["A2"])
    assert row_counts() == before
    assert seat_statuses(event) == {
        "A1": "available",
        "A2": "unavailable",
        "A3": "available",
        "A4": "available",
    }


@pytest.mark.django_db
def test_best_available_skips_blocked_seats_and_the_rows_middle_stays_the_whole_rows(
    alice_api,
):
    # A1-A3 blocked: the row still spans 1-10 (centre 5.5), so 5-6, not the
    # middle of what is left (7, which would give 6-7).
    event = EventFactory(seats=[f"A{n}" for n in range(1, 11)])
    Seat.objects.filter(event=event, ref__in=["A1", "A2", "A3", "A5"]).update(
        status=SeatStatus.UNAVAILABLE
    )

    two = post(alice_api, best_body(event, 2))
    refused = post(alice_api, best_body(event, 5))

    assert two.status_code == 202, two.content
    assert two.json()["seats"] == ["A6", "A7"]  # A5 blocked: 6-7 (6.5) is nearest 5.5
    assert seat_statuses(event)["A5"] == "unavailable"
    assert refused.status_code == 409
    assert (refused.json()["code"], refused.json()["available"]) == ("not_enough_seats", 4)


# --- best available by category --------------------------------------------------------


def _categorised_hall():
    """Row A: A1-A5 premium at 9000, A6-A10 standard at 4000; row B standard."""
    event = EventFactory(seats=[])
    PriceCategory.objects.create(
        event=event, code="premium", name="Premium", price_amount=9000, currency="EUR"
    )
    PriceCategory.objects.create(
        event=event, code="standard", name="Standard", price_amount=4000, currency="EUR"
    )
    for row in "AB":
        for n in range(1, 11):
            premium = row == "A" and n <= 5
            SeatFactory(
                event=event,
                ref=f"{row}{n}",
                category="premium" if premium else "standard",
                price_amount=9000 if premium else 4000,
            )
    return event


@pytest.mark.django_db
def test_a_category_restricts_the_block_to_its_seats(alice_api):
    event = _categorised_hall()

    standard = post(alice_api, best_body(event, 2, category="standard"))
    premium = post(alice_api, best_body(event, 2, category="premium"))
    refused = post(alice_api, best_body(event, 4, category="premium"))
    anything = post(alice_api, best_body(event, 2))

    # Row A's middle is 5.5, over all its seats: of the standard seats, 6-7
    # is nearest it (not row B, nor the middle of A6-A10); of the premium,
    # 4-5. Three premium seats are left (A1-A3): not four. Of any category,
    # 2-3 and 8-9 are as near: the lower.
    assert standard.json()["seats"] == ["A6", "A7"], standard.content
    assert standard.json()["total"] == {"amount": 8000, "currency": "EUR"}
    assert premium.json()["seats"] == ["A4", "A5"]
    assert premium.json()["total"] == {"amount": 18000, "currency": "EUR"}
    assert refused.status_code == 409
    assert (refused.json()["code"], refused.json()["available"]) == ("not_enough_seats", 3)
    assert anything.json()["seats"] == ["A2", "A3"]


@pytest.mark.django_db
def test_an_unknown_category_is_400_naming_the_field_and_writes_nothing(alice_api):
    event = _categorised_hall()
    other = EventFactory(seats=[])
    PriceCategory.objects.create(
        event=other, code="balcony", name="Balcony", price_amount=1, currency="EUR"
    )
    before = row_counts()

    for code in ("balcony", "nope"):  # another event's category is not this one's
        answer = post(alice_api, best_body(event, 1, category=code))
        assert answer.status_code == 400, answer.content
        assert (answer.json()["code"], answer.json()["field"]) == ("invalid", "category")
        assert answer.json()["errors"] == {"category": [answer.json()["detail"]]}
    assert row_counts() == before
    with pytest.raises(UnknownCategory):
        purchase_start(
            user=UserFactory(),
            idempotency_key=new_key(),
            event_id=event.pk,
            quantity=1,
            category="nope",
            payment_method="pm_card_visa",
        )


@pytest.mark.django_db
def test_an_unknown_category_gives_its_throttle_step_back(alice_api, tight_throttle):
    event = _categorised_hall()

    refusals = [post(alice_api, best_body(event, 1, category="nope")) for _ in range(4)]
    started = [post(alice_api, best_body(event, 1, category="standard")) for _ in range(3)]

    assert {r.status_code for r in refusals} == {400}
    assert [r.status_code for r in started] == [202, 202, 202]


def test_the_category_is_in_the_fingerprint_only_when_given():
    def old(body: dict) -> str:  # the canonical form before categories
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    plain = request_fingerprint(event_id=7, quantity=2, payment_method="pm_card_visa")
    named = request_fingerprint(event_id=7, seat_refs=["A1"], payment_method="pm_card_visa")
    of_category = request_fingerprint(
        event_id=7, quantity=2, category="stalls", payment_method="pm_card_visa"
    )

    assert plain == old({"event": 7, "quantity": 2, "payment_method": "pm_card_visa"})
    assert named == old({"event": 7, "seats": ["A1"], "payment_method": "pm_card_visa"})
    assert of_category == old(
        {"event": 7, "quantity": 2, "category": "stalls", "payment_method": "pm_card_visa"}
    )
    assert len({plain, named, of_category}) == 3


@pytest.mark.django_db
def test_the_same_key_with_another_category_is_422(alice_api):
    event = _categorised_hall()
    key = new_key()
    first = post(alice_api, best_body(event, 1, category="standard"), key=key)

    again = post(alice_api, best_body(event, 1, category="standard"), key=key)
    other = post(alice_api, best_body(event, 1, category="premium"), key=key)
    without = post(alice_api, best_body(event, 1), key=key)

    assert (again.status_code, again.content) == (202, first.content)
    assert {other.status_code, without.status_code} == {422}


def _two_sections(event, *, sold: list[str]) -> None:
    """Stalls A1-A4 and Balcony A1-A4 (refs S-A1.., B-A1..): one row label in
    two sections."""
    for section, prefix in (("Stalls", "S"), ("Balcony", "B")):
        for n in range(1, 5):
            SeatFactory(event=event, ref=f"{prefix}-A{n}", section=section, row="A", number=n)
    Seat.objects.filter(event=event, ref__in=sold).update(status=SeatStatus.SOLD)


@pytest.mark.django_db
def test_rows_of_two_sections_with_one_label_are_two_rows(alice_api):
    # Left: Balcony A1 and Stalls A2, numbers 1 and 2 of rows labelled "A":
    # not next to each other (taken as one row "A", they would be).
    apart = EventFactory(seats=[])
    _two_sections(apart, sold=["B-A2", "B-A3", "B-A4", "S-A1", "S-A3", "S-A4"])
    # Balcony first (sections by name), its pair left; then the Stalls'.
    both = EventFactory(seats=[])
    _two_sections(both, sold=["B-A2", "B-A3"])

    refused = post(alice_api, best_body(apart, 2))
    stalls = post(alice_api, best_body(both, 2))

    assert refused.status_code == 409, refused.content
    assert (refused.json()["code"], refused.json()["available"]) == ("not_enough_seats", 2)
    assert stalls.json()["seats"] == ["S-A2", "S-A3"], stalls.content


# --- the price a seat is held at -------------------------------------------------------


def _reprice_on_another_connection(event, refs, amount) -> None:
    """The seller's price change, committed by another connection."""
    with _other_connection() as other:
        other.execute(
            "UPDATE purchases_seat SET price_amount = %s WHERE event_id = %s AND ref = ANY(%s)",
            [amount, event.pk, list(refs)],
        )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("chosen", ["named", "best"])
def test_a_price_changed_between_the_read_and_the_hold_is_the_price_paid(monkeypatch, chosen):
    # given: the start reads the seats (no lock) at 2500 each; the seller's
    # new price, 3000, commits before the start holds them
    event = EventFactory(seats=["A1", "A2"], seats__price=2500)
    buyer = UserFactory(username="late")
    name = "_event_and_seats_by_ref" if chosen == "named" else "_best_available_candidates"
    real_read = getattr(start, name)
    reads: list[int] = []

    def read_then_reprice(*args, **kwargs):
        found = real_read(*args, **kwargs)
        if not reads:
            _reprice_on_another_connection(event, ["A1", "A2"], 3000)
        reads.append(1)
        return found

    monkeypatch.setattr(start, name, read_then_reprice)
    key = new_key()
    choice = {"seat_refs": ["A1", "A2"]} if chosen == "named" else {"quantity": 2}

    # when
    started = purchase_start(
        user=buyer,
        idempotency_key=key,
        event_id=event.pk,
        payment_method="pm_card_visa",
        **choice,
    )

    # then: the purchase is at the price the seats were held at, everywhere
    assert started.purchase["total"] == {"amount": 6000, "currency": "EUR"}
    saga = PurchaseSaga.objects.select_related("reservation").get(pk=started.saga_id)
    assert (saga.amount, saga.reservation.total_amount) == (6000, 6000)
    stored = IdempotencyRecord.objects.get(user=buyer, key=key).response_body
    assert stored["total"] == {"amount": 6000, "currency": "EUR"}
    replay = purchase_start(
        user=buyer,
        idempotency_key=key,
        event_id=event.pk,
        payment_method="pm_card_visa",
        **choice,
    )
    assert (replay.created, replay.purchase) == (False, started.purchase)


@pytest.mark.django_db
def test_a_seat_released_is_on_offer_at_its_categorys_price_today(alice, gateway):
    event = EventFactory(seats=[])
    stalls = PriceCategory.objects.create(
        event=event, code="stalls", name="Stalls", price_amount=5000, currency="EUR"
    )
    SeatFactory(event=event, ref="A1", category="stalls", price_amount=5000)
    SeatFactory(event=event, ref="A2", category="", price_amount=2500)  # no category
    declined = start_purchase(
        alice, event, seats=["A1", "A2"], payment_method="pm_card_chargeDeclined"
    )
    # The seller's price change while A1 is held: the category, not the held seat.
    PriceCategory.objects.filter(pk=stalls.pk).update(price_amount=6500)

    saga_charge(saga_id=declined.pk)

    assert PurchaseSaga.objects.get(pk=declined.pk).state == "COMPENSATED"
    prices = dict(Seat.objects.filter(event=event).values_list("ref", "price_amount"))
    assert prices == {"A1": 6500, "A2": 2500}
    assert set(seat_statuses(event).values()) == {"available"}


@pytest.mark.django_db(transaction=True)
def test_a_release_waits_for_a_price_change_in_flight_and_takes_its_price(gateway):
    """The seller's price change has updated the category, not committed yet
    (its seat update passed over the held seat): the release waits for it
    and offers the seat at the new price, not the old one behind its back."""
    event = EventFactory(seats=[])
    stalls = PriceCategory.objects.create(
        event=event, code="stalls", name="Stalls", price_amount=5000, currency="EUR"
    )
    SeatFactory(event=event, ref="A1", category="stalls", price_amount=5000)
    declined = start_purchase(
        UserFactory(username="declined"), event, payment_method="pm_card_chargeDeclined"
    )
    worker: dict = {}

    def compensate():
        worker["pid"] = connection.cursor().connection.info.backend_pid
        try:
            saga_charge(saga_id=declined.pk)
        finally:
            connection.close()

    with _other_connection() as seller, _other_connection() as watcher:
        with seller.transaction():
            seller.execute(
                "UPDATE purchases_pricecategory SET price_amount = 7000 WHERE id = %s", [stalls.pk]
            )
            thread = threading.Thread(target=compensate)
            thread.start()
            while "pid" not in worker and thread.is_alive():
                threading.Event().wait(0.01)
            _wait_until_blocked(watcher, worker["pid"], thread)
        thread.join(60)

    assert PurchaseSaga.objects.get(pk=declined.pk).state == "COMPENSATED"
    seat = Seat.objects.get(event=event, ref="A1")
    assert (seat.status, seat.price_amount) == ("available", 7000)


# --- what the reserve sends ------------------------------------------------------------


def _shapes(captured) -> list[str]:
    return [bench_reserve.shape(q["sql"]) for q in captured]


@pytest.mark.django_db(transaction=True)
def test_the_reserve_is_the_benchs_script_and_a_limit_costs_two_statements():
    """The event's rules ride on the seats' read: a reserve of named seats is
    the ten round trips of bench/reserve.sql (as before the rules); an event
    with a limit per buyer adds the buyer's lock and the count, and only
    it. Best available reads the rules on their own, then the seats."""
    free = EventFactory(seats=["A1", "A2"])
    limited = EventFactory(seats=["A1", "A2"], max_seats_per_buyer=4)
    buyer = UserFactory(username="counted")

    def reserve(event, **choice):
        with CaptureQueriesContext(connection) as ctx:
            purchase_start(
                user=buyer,
                idempotency_key=new_key(),
                event_id=event.pk,
                payment_method="pm_card_visa",
                **choice,
            )
        return _shapes(ctx.captured_queries), [q["sql"] for q in ctx.captured_queries]

    plain, plain_sql = reserve(free, seat_refs=["A1"])
    with_limit, limit_sql = reserve(limited, seat_refs=["A1"])
    best, _ = reserve(free, quantity=1)

    script = [bench_reserve.shape(s) for s in bench_reserve.script_statements()]
    assert plain == script, (plain, script)
    assert len(plain) == 10
    assert not [s for s in plain_sql if "advisory" in s or "count(" in s.lower()]
    assert with_limit == [
        *plain[:2],
        "SELECT purchases_event",
        "SELECT purchases_reservationseat",
        *plain[2:],
    ]
    assert "pg_advisory_xact_lock" in limit_sql[2]
    # (Its hold is tried in a savepoint: lock_objects.seats_hold_all_skip_locked.)
    assert best == [
        plain[0],
        "SELECT purchases_event",
        "WITH purchases_seat",
        plain[2],
        "SAVEPOINT",
        plain[3],
        "RELEASE",
        *plain[4:],
    ]


@pytest.mark.django_db
def test_the_buyers_lock_key_names_the_event_and_the_buyer():
    keys = {lock_objects._buyer_lock_key(event_id=e, buyer_id=b) for e in (1, 2) for b in (1, 2)}
    assert len(keys) == 4
    assert all(-(2**63) <= k < 2**63 for k in keys)
    assert lock_objects._buyer_lock_key(event_id=1, buyer_id=2) == lock_objects._buyer_lock_key(
        event_id=1, buyer_id=2
    )
