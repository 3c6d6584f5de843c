"""Money back through the API
(docs/api.md, "Money back: refunds and cancellations"): the purchase's
refunds, what has been refunded and until when it may be cancelled; the
buyer's cancellation (the policy's deadline and fee, the seats it names,
its key); the organizer's refunds (amounts, seats, what is left, its key,
the roles that may); an event's cancellation and its progress. Every answer
through the API client, the refunds carried to their end by the outbox
(``drain_outbox``) and the in-process fake processor, on real PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from freezegun import freeze_time
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from organizers.roles import Role
from purchases.models import PurchaseSaga, Refund, Seat
from purchases.services import organizer_refund, saga_charge

from .conftest import drain_outbox, new_key, purchase_body, start_purchase
from .factories import EventFactory, MembershipFactory, OrganizerFactory, UserFactory

pytestmark = pytest.mark.django_db

PRICE = 2599  # a price whose fee does not divide evenly
REFUND_KEYS = {"id", "amount", "currency", "status", "created_at", "seats", "reason"}


def _client(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def _event(*, until=None, fee=0, organizer=None, seats=("A1", "A2", "A3", "A4")):
    """An event on sale whose buyers may cancel until ``until`` (None: never)
    for ``fee`` percent of the seats' prices."""
    extra = {"organizer": organizer} if organizer is not None else {}
    return EventFactory(
        seats=list(seats),
        seats__price=PRICE,
        buyer_can_cancel_until=until,
        cancel_fee_percent=fee,
        **extra,
    )


def _later(days: int = 1) -> datetime:
    return timezone.now() + timedelta(days=days)


def _confirmed(user, event, seats=("A1",), method="pm_card_visa") -> PurchaseSaga:
    saga = saga_charge(saga_id=start_purchase(user, event, seats=seats, payment_method=method).pk)
    assert saga.state == "CONFIRMED"
    return saga


def _cancel(client, saga, body=None, *, key=None):
    return client.post(
        f"/api/purchases/{saga.pk}/cancel/",
        body if body is not None else {},
        format="json",
        headers={"Idempotency-Key": key or new_key()},
    )


def _detail(client, saga) -> dict:
    answer = client.get(f"/api/purchases/{saga.pk}/")
    assert answer.status_code == 200, answer.content
    return answer.json()


def _refund(client, organizer, saga, body, *, key=None):
    return client.post(
        f"/api/organizers/{organizer.slug}/purchases/{saga.pk}/refunds/",
        body,
        format="json",
        headers={"Idempotency-Key": key or new_key()},
    )


def _error(answer, status: int, code: str) -> dict:
    assert answer.status_code == status, answer.content
    data = answer.json()
    assert data["code"] == code, data
    assert isinstance(data["detail"], str) and data["detail"]
    return data


def _seat_status(event, ref: str) -> str:
    return Seat.objects.get(event=event, ref=ref).status


def _member(organizer, role: Role):
    user = UserFactory()
    MembershipFactory(organizer=organizer, user=user, role=role)
    return _client(user)


# --- GET /api/purchases/{id}/: refunds, refunded, cancellable_until ------------------------


def test_a_confirmed_purchase_shows_no_refund_and_until_when_it_may_be_cancelled(
    alice, alice_api, gateway
):
    until = _later(days=2).replace(microsecond=0)
    saga = _confirmed(alice, _event(until=until))
    never = _confirmed(alice, _event(until=None))

    data = _detail(alice_api, saga)

    assert data["refunds"] == []
    assert data["refunded"] == {"amount": 0, "currency": "EUR"}
    assert datetime.fromisoformat(data["cancellable_until"]) == until
    assert data["payment"]["status"] == "captured"
    assert _detail(alice_api, never)["cancellable_until"] is None


def test_a_purchase_not_confirmed_is_not_cancellable(alice, alice_api, gateway):
    saga = start_purchase(alice, _event(until=_later()))

    data = _detail(alice_api, saga)

    assert (data["status"], data["cancellable_until"], data["refunds"]) == ("PENDING", None, [])


def test_the_answer_reads_in_the_same_queries_however_many_refunds(alice, alice_api, gateway):
    # Each keeps a seat, so each answer also reads its tickets (a purchase
    # with no ticket left skips that read: not what this compares).
    event = _event(until=_later(), seats=("A1", "A2", "A3", "A4", "A5"))
    one = _confirmed(alice, event, seats=("A1", "A2"))
    many = _confirmed(alice, event, seats=("A3", "A4", "A5"))
    assert _cancel(alice_api, one, {"seats": ["A1"]}).status_code == 202
    for ref in ("A3", "A4"):
        assert _cancel(alice_api, many, {"seats": [ref]}).status_code == 202
    drain_outbox()

    with CaptureQueriesContext(connection) as few:
        assert len(_detail(alice_api, one)["refunds"]) == 1
    with CaptureQueriesContext(connection) as more:
        assert len(_detail(alice_api, many)["refunds"]) == 2

    assert len(more.captured_queries) == len(few.captured_queries)


# --- the buyer cancels -------------------------------------------------------------------------


def test_cancelling_everything_releases_the_seats_and_refunds_the_whole_purchase(
    alice, alice_api, anon_api, gateway, mailoutbox
):
    event = _event(until=_later())
    saga = _confirmed(alice, event, seats=("A1", "A2"))

    answer = _cancel(alice_api, saga)  # no seats named: all of them

    assert answer.status_code == 202, answer.content
    refund = answer.json()["refund"]
    assert set(refund) == REFUND_KEYS
    assert (refund["amount"], refund["currency"], refund["status"]) == (2 * PRICE, "EUR", "pending")
    assert refund["seats"] == ["A1", "A2"]
    # The seats are on sale again at once, the catalog says so.
    assert {_seat_status(event, ref) for ref in ("A1", "A2")} == {"available"}
    seats = {s["ref"]: s["status"] for s in anon_api.get(f"/api/events/{event.pk}/seats/").json()}
    assert (seats["A1"], seats["A2"]) == ("available", "available")
    pending = _detail(alice_api, saga)
    assert pending["refunds"] == [refund]
    assert pending["refunded"] == {"amount": 0, "currency": "EUR"}
    assert pending["status"] == "CONFIRMED"  # money back is not a move of the saga

    # when: the outbox asks the processor
    drain_outbox()

    # then
    data = _detail(alice_api, saga)
    assert [(r["id"], r["status"]) for r in data["refunds"]] == [(refund["id"], "succeeded")]
    assert data["refunded"] == {"amount": 2 * PRICE, "currency": "EUR"}
    assert data["payment"]["status"] == "refunded"
    assert data["cancellable_until"] is None  # nothing left to cancel
    assert [m.to for m in mailoutbox if m.subject.startswith("Refund")] == [[alice.email]]
    assert gateway.calls.count(("create_refund", saga.intent_id)) == 1


def test_a_cancellation_without_a_body_cancels_every_seat(alice, alice_api, gateway):
    saga = _confirmed(alice, _event(until=_later()), seats=("A1", "A2"))

    answer = alice_api.generic(
        "POST",
        f"/api/purchases/{saga.pk}/cancel/",
        "",
        content_type="application/json",
        headers={"Idempotency-Key": new_key()},
    )

    assert answer.status_code == 202, answer.content
    assert answer.json()["refund"]["seats"] == ["A1", "A2"]


def test_cancelling_some_seats_refunds_their_prices_less_the_fee(alice, alice_api, gateway):
    event = _event(until=_later(), fee=10)
    saga = _confirmed(alice, event, seats=("A1", "A2"))

    answer = _cancel(alice_api, saga, {"seats": ["A2"]})
    drain_outbox()

    # 2599 less 10% (259.9, rounded down: the fee kept is 259)
    assert answer.status_code == 202, answer.content
    assert answer.json()["refund"]["amount"] == PRICE - PRICE * 10 // 100 == 2340
    data = _detail(alice_api, saga)
    assert data["refunded"] == {"amount": 2340, "currency": "EUR"}
    assert data["payment"]["status"] == "partially_refunded"
    [entry] = data["refunds"]
    assert (entry["status"], entry["seats"]) == ("succeeded", ["A2"])
    assert "10%" in entry["reason"]
    assert (_seat_status(event, "A1"), _seat_status(event, "A2")) == ("sold", "available")
    # A1 is still the buyer's to cancel; then it is fully refunded (less the fees).
    assert data["cancellable_until"] is not None
    assert _cancel(alice_api, saga, {"seats": ["A1"]}).json()["refund"]["amount"] == 2340
    drain_outbox()
    assert _detail(alice_api, saga)["refunded"]["amount"] == 2 * 2340


def test_the_same_key_answers_the_same_refund_and_another_body_is_refused(
    alice, alice_api, gateway
):
    saga = _confirmed(alice, _event(until=_later()), seats=("A1", "A2"))

    first = _cancel(alice_api, saga, {"seats": ["A1"]}, key="cancel-1")
    again = _cancel(alice_api, saga, {"seats": ["A1"]}, key="cancel-1")
    reused = _cancel(alice_api, saga, {"seats": ["A2"]}, key="cancel-1")

    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    _error(reused, 422, "idempotency_key_reused")
    assert Refund.objects.filter(saga_id=saga.pk).count() == 1
    assert _seat_status(saga.event, "A2") == "sold"


def test_a_replay_after_the_refund_succeeded_is_the_same_refund(alice, alice_api, gateway):
    saga = _confirmed(alice, _event(until=_later()))
    first = _cancel(alice_api, saga, key="cancel-1").json()["refund"]
    drain_outbox()

    again = _cancel(alice_api, saga, key="cancel-1")

    assert again.status_code == 202
    assert again.json()["refund"] == {**first, "status": "succeeded"}
    assert Refund.objects.filter(saga_id=saga.pk).count() == 1


@pytest.mark.parametrize(
    "headers, code",
    [
        ({}, "idempotency_key_missing"),
        ({"Idempotency-Key": ""}, "idempotency_key_missing"),
        ({"Idempotency-Key": "k" * 256}, "idempotency_key_invalid"),
        ({"Idempotency-Key": "clé"}, "idempotency_key_invalid"),
    ],
)
def test_the_key_is_required_as_for_a_purchase(alice, alice_api, event, gateway, headers, code):
    saga = _confirmed(alice, _event(until=_later()))
    # The same answers as POST /api/purchases/ gives.
    purchase = alice_api.post(
        "/api/purchases/", purchase_body(event), format="json", headers=headers
    )

    answer = alice_api.post(f"/api/purchases/{saga.pk}/cancel/", {}, format="json", headers=headers)

    assert (answer.status_code, answer.json()) == (purchase.status_code, purchase.json())
    _error(answer, 400, code)
    assert not Refund.objects.exists()


def test_another_users_purchase_is_the_same_404_as_a_missing_one(
    alice, alice_api, bob_api, gateway
):
    saga = _confirmed(alice, _event(until=_later()))

    others = _cancel(bob_api, saga)
    missing = bob_api.post(
        f"/api/purchases/{uuid.uuid4()}/cancel/",
        {},
        format="json",
        headers={"Idempotency-Key": "k"},
    )
    malformed = bob_api.post(
        "/api/purchases/not-a-uuid/cancel/", {}, format="json", headers={"Idempotency-Key": "k"}
    )
    detail = bob_api.get(f"/api/purchases/{saga.pk}/")

    _error(others, 404, "not_found")
    assert others.json() == missing.json() == malformed.json() == detail.json()
    assert not Refund.objects.exists()
    assert _seat_status(saga.event, "A1") == "sold"


def test_without_credentials_it_is_401(anon_api, alice, gateway):
    saga = _confirmed(alice, _event(until=_later()))

    _error(_cancel(anon_api, saga), 401, "not_authenticated")


@pytest.mark.parametrize(
    "body, detail",
    [
        ({"seats": "A1"}, "Expected a list"),
        ({"seats": [1]}, "Not a valid string"),
        ({"seats": []}, "may not be empty"),
        ({"seats": ["A1", "A1"]}, "named twice"),
        ({"seats": ["A3"]}, "not seats of this purchase: A3"),  # another buyer's seat
        ({"seats": ["Z9"]}, "not seats of this purchase: Z9"),  # no such seat
    ],
)
def test_a_bad_list_of_seats_is_400_naming_seats(alice, alice_api, bob, gateway, body, detail):
    event = _event(until=_later())
    saga = _confirmed(alice, event, seats=("A1", "A2"))
    _confirmed(bob, event, seats=("A3",))

    answer = _cancel(alice_api, saga, body)

    data = _error(answer, 400, "invalid")
    assert data["field"] == "seats"
    assert detail in data["detail"]
    assert not Refund.objects.exists()
    assert {_seat_status(event, r) for r in ("A1", "A2", "A3")} == {"sold"}


def test_a_seat_cancelled_already_is_400_naming_seats(alice, alice_api, gateway):
    saga = _confirmed(alice, _event(until=_later()), seats=("A1", "A2"))
    assert _cancel(alice_api, saga, {"seats": ["A1"]}).status_code == 202

    again = _cancel(alice_api, saga, {"seats": ["A1", "A2"]})

    data = _error(again, 400, "invalid")
    assert data["field"] == "seats" and "A1" in data["detail"]
    assert Refund.objects.filter(saga_id=saga.pk).count() == 1


def test_nothing_left_to_cancel_is_409(alice, alice_api, gateway):
    saga = _confirmed(alice, _event(until=_later()), seats=("A1", "A2"))
    assert _cancel(alice_api, saga).status_code == 202

    _error(_cancel(alice_api, saga), 409, "cancellation_not_allowed")


def test_no_policy_a_cancelled_event_or_a_purchase_not_confirmed_is_409(alice, alice_api, gateway):
    never = _confirmed(alice, _event(until=None))
    cancelled_event = _event(until=_later())
    cancelled = _confirmed(alice, cancelled_event)
    cancelled_event.status = "cancelled"
    cancelled_event.save(update_fields=["status"])
    pending = start_purchase(alice, _event(until=_later()))

    for saga in (never, cancelled, pending):
        _error(_cancel(alice_api, saga), 409, "cancellation_not_allowed")
        assert _detail(alice_api, saga)["cancellable_until"] is None
    assert not Refund.objects.exists()


def test_the_policys_deadline_is_the_last_moment_to_cancel(alice, alice_api, gateway):
    deadline = datetime(2031, 6, 1, 18, 0, tzinfo=UTC)
    event = _event(until=deadline)
    late, in_time = (_confirmed(alice, event, seats=(ref,)) for ref in ("A1", "A2"))

    # Frozen around the calls only (none of them is throttled).
    with freeze_time(deadline - timedelta(seconds=1)):
        shown = _detail(alice_api, in_time)["cancellable_until"]
        accepted = _cancel(alice_api, in_time)
    with freeze_time(deadline):
        gone = _detail(alice_api, late)["cancellable_until"]
        refused = _cancel(alice_api, late)

    assert datetime.fromisoformat(shown) == deadline
    assert accepted.status_code == 202, accepted.content
    assert gone is None
    assert "passed" in _error(refused, 409, "cancellation_not_allowed")["detail"]
    assert _seat_status(event, "A1") == "sold"


def test_a_purchase_the_organizer_refunded_in_full_has_nothing_left_for_the_buyer(
    alice, alice_api, gateway
):
    event = _event(until=_later())
    saga = _confirmed(alice, event, seats=("A1", "A2"))
    owner = UserFactory()
    organizer_refund(
        organizer=event.organizer, saga_id=saga.pk, user=owner, reason="goodwill", amount=2 * PRICE
    )

    data = _error(_cancel(alice_api, saga, {"seats": ["A1"]}), 409, "refund_exceeds_paid")

    assert (data["refundable"], data["currency"]) == (0, "EUR")
    assert _seat_status(event, "A1") == "sold"
    assert _detail(alice_api, saga)["cancellable_until"] is None


# --- the organizer refunds -----------------------------------------------------------------


@pytest.mark.parametrize("role", [Role.FINANCE, Role.OWNER])
def test_finance_or_an_owner_refunds_an_amount(alice, alice_api, gateway, role):
    event = _event(until=None)
    saga = _confirmed(alice, event, seats=("A1", "A2"))
    seller = _member(event.organizer, role)

    answer = _refund(seller, event.organizer, saga, {"amount": 1000, "reason": "late start"})

    assert answer.status_code == 202, answer.content
    data = answer.json()
    assert (data["amount"], data["currency"], data["status"]) == (1000, "EUR", "pending")
    assert (data["purchase"], data["reason"], data["release_seats"]) == (
        str(saga.pk),
        "late start",
        False,
    )
    assert data["seats"] == []
    assert {_seat_status(event, r) for r in ("A1", "A2")} == {"sold"}
    drain_outbox()
    buyer = _detail(alice_api, saga)
    [entry] = buyer["refunds"]
    assert (entry["id"], entry["status"], entry["amount"]) == (data["id"], "succeeded", 1000)
    # The buyer reads a sentence for buyers, never the organizer's reason.
    assert "late start" not in str(buyer)
    assert entry["reason"] == data["buyer_reason"]
    assert buyer["refunded"] == {"amount": 1000, "currency": "EUR"}
    assert buyer["payment"]["status"] == "partially_refunded"


def test_an_organizer_refunds_seats_and_puts_them_back_on_sale(alice, alice_api, gateway):
    event = _event(until=None)
    saga = _confirmed(alice, event, seats=("A1", "A2", "A3"))
    owner = _member(event.organizer, Role.OWNER)

    kept = _refund(owner, event.organizer, saga, {"seats": ["A1"], "reason": "broken seat"})
    released = _refund(
        owner,
        event.organizer,
        saga,
        {"seats": ["A2"], "reason": "double booked", "release_seats": True},
    )

    assert (kept.status_code, released.status_code) == (202, 202)
    assert (kept.json()["amount"], kept.json()["release_seats"]) == (PRICE, False)
    assert (released.json()["amount"], released.json()["release_seats"]) == (PRICE, True)
    assert [_seat_status(event, r) for r in ("A1", "A2", "A3")] == ["sold", "available", "sold"]
    # What is left, refunded by the organizer with neither amount nor seats.
    rest = _refund(owner, event.organizer, saga, {"reason": "the rest"})
    assert rest.json()["amount"] == PRICE
    drain_outbox()
    buyer = _detail(alice_api, saga)
    assert buyer["refunded"] == {"amount": 3 * PRICE, "currency": "EUR"}
    assert buyer["payment"]["status"] == "refunded"
    assert [r["status"] for r in buyer["refunds"]] == ["succeeded"] * 3


def test_more_than_what_is_left_is_409_with_what_is_refundable(alice, gateway):
    event = _event(until=None)
    saga = _confirmed(alice, event, seats=("A1", "A2"))
    owner = _member(event.organizer, Role.OWNER)
    assert _refund(owner, event.organizer, saga, {"amount": 1000, "reason": "x"}).status_code == 202

    data = _error(
        _refund(owner, event.organizer, saga, {"amount": 2 * PRICE, "reason": "too much"}),
        409,
        "refund_exceeds_paid",
    )

    assert (data["refundable"], data["currency"]) == (2 * PRICE - 1000, "EUR")
    assert Refund.objects.filter(saga_id=saga.pk).count() == 1


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "reason"),
        ({"reason": "   "}, "reason"),
        ({"reason": 7}, "reason"),
        ({"reason": "x" * 501}, "reason"),
        ({"reason": "x", "amount": "100"}, "amount"),
        ({"reason": "x", "amount": 0}, "amount"),
        ({"reason": "x", "amount": 1.5}, "amount"),
        ({"reason": "x", "seats": "A1"}, "seats"),
        ({"reason": "x", "seats": []}, "seats"),
        ({"reason": "x", "seats": ["A9"]}, "seats"),
        ({"reason": "x", "release_seats": "yes"}, "release_seats"),
    ],
)
def test_a_bad_refund_is_400_naming_the_field(alice, gateway, body, field):
    event = _event(until=None)
    saga = _confirmed(alice, event)
    owner = _member(event.organizer, Role.OWNER)

    data = _error(_refund(owner, event.organizer, saga, body), 400, "invalid")

    assert data["field"] == field, data
    assert not Refund.objects.exists()


def test_the_refunds_key_replays_and_refuses_another_body(alice, gateway):
    event = _event(until=None)
    saga = _confirmed(alice, event)
    finance = _member(event.organizer, Role.FINANCE)
    body = {"amount": 500, "reason": "late"}

    first = _refund(finance, event.organizer, saga, body, key="r-1")
    again = _refund(finance, event.organizer, saga, body, key="r-1")
    other = _refund(finance, event.organizer, saga, {**body, "amount": 600}, key="r-1")
    missing = finance.post(
        f"/api/organizers/{event.organizer.slug}/purchases/{saga.pk}/refunds/", body, format="json"
    )

    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json() == first.json()
    _error(other, 422, "idempotency_key_reused")
    _error(missing, 400, "idempotency_key_missing")
    assert Refund.objects.filter(saga_id=saga.pk).count() == 1


def test_a_purchase_of_another_organizers_event_is_404(alice, gateway):
    ours = OrganizerFactory()
    theirs = _event(until=None, organizer=OrganizerFactory())
    saga = _confirmed(alice, theirs)
    owner = _member(ours, Role.OWNER)
    body = {"amount": 100, "reason": "mine?"}

    others = _refund(owner, ours, saga, body)
    missing = _refund(owner, ours, PurchaseSaga(pk=uuid.uuid4()), body)

    _error(others, 404, "not_found")
    assert others.json() == missing.json()
    assert not Refund.objects.exists()


def test_a_purchase_not_confirmed_is_not_refundable(alice, gateway):
    event = _event(until=None)
    saga = start_purchase(alice, event)
    owner = _member(event.organizer, Role.OWNER)

    _error(_refund(owner, event.organizer, saga, {"reason": "x"}), 409, "not_refundable")


@pytest.mark.parametrize("role", [Role.MANAGER, Role.DOOR])
def test_a_manager_or_the_door_may_not_refund(alice, gateway, role):
    event = _event(until=None)
    saga = _confirmed(alice, event)
    member = _member(event.organizer, role)

    _error(_refund(member, event.organizer, saga, {"reason": "x"}), 403, "permission_denied")
    assert not Refund.objects.exists()


def test_a_stranger_gets_404(alice, bob_api, gateway):
    event = _event(until=None)
    saga = _confirmed(alice, event)

    _error(_refund(bob_api, event.organizer, saga, {"reason": "x"}), 404, "not_found")


# --- an event's cancellation -----------------------------------------------------------------


def _cancel_event(client, event, body):
    return client.post(
        f"/api/organizers/{event.organizer.slug}/events/{event.pk}/cancel/", body, format="json"
    )


def _progress(client, event):
    return client.get(f"/api/organizers/{event.organizer.slug}/events/{event.pk}/cancellation/")


def _run_for(seconds: int) -> None:
    """The relay, a second at a time (the run opens its refunds at its pace)."""
    start = timezone.now()
    for second in range(seconds + 1):
        drain_outbox(now=start + timedelta(seconds=second))


def test_cancelling_an_event_refunds_every_purchase_once(
    alice, bob, alice_api, gateway, mailoutbox
):
    event = _event(until=None, seats=("A1", "A2", "A3", "A4"))
    paid = _confirmed(alice, event, seats=("A1", "A2"))
    refused = _confirmed(bob, event, seats=("A3",), method="pm_card_refundFail")
    in_flight = start_purchase(bob, event, seats=("A4",))
    owner = _member(event.organizer, Role.OWNER)
    finance = _member(event.organizer, Role.FINANCE)

    answer = _cancel_event(owner, event, {"reason": "the venue flooded"})

    assert answer.status_code == 202, answer.content
    started = answer.json()
    assert started["status"] == "running"
    assert (started["purchases"], started["refunded"], started["failed"]) == (2, 0, 0)
    assert started["owed"] == 2
    assert started["owed_amount"] == {"amount": 3 * PRICE, "currency": "EUR"}
    assert (started["in_flight"], started["reason"]) == (1, "the venue flooded")
    # Sales stop at once.
    late = alice_api.post(
        "/api/purchases/",
        purchase_body(event, seats=["A4"]),
        format="json",
        headers={"Idempotency-Key": new_key()},
    )
    _error(late, 409, "sales_closed")

    _run_for(5)

    done = _progress(finance, event)
    assert done.status_code == 200, done.content
    data = done.json()
    assert data["status"] == "done" and data["finished_at"] is not None
    assert (data["purchases"], data["refunded"], data["failed"], data["in_flight"]) == (2, 1, 1, 0)
    assert data["owed"] == 1  # the purchase whose refund was refused
    assert data["owed_amount"] == {"amount": PRICE, "currency": "EUR"}
    buyer = _detail(alice_api, paid)
    assert [(r["status"], r["amount"]) for r in buyer["refunds"]] == [("succeeded", 2 * PRICE)]
    assert buyer["payment"]["status"] == "refunded"
    assert PurchaseSaga.objects.get(pk=in_flight.pk).state == "COMPENSATED"
    assert Refund.objects.get(saga_id=refused.pk).status == "failed"
    refund_mails = [m.to for m in mailoutbox if m.subject.startswith("Refund")]
    assert refund_mails == [[alice.email]]  # one, and none for the refused refund
    # Cancelling again changes nothing: the same run.
    again = _cancel_event(owner, event, {"reason": "again"})
    assert again.status_code == 202
    assert {**again.json(), "reason": None} == {**data, "reason": None}
    assert again.json()["reason"] == "the venue flooded"
    assert Refund.objects.filter(saga_id=paid.pk).count() == 1


def test_an_event_not_cancelled_has_no_cancellation(gateway):
    event = _event(until=None)
    finance = _member(event.organizer, Role.FINANCE)

    _error(_progress(finance, event), 404, "not_found")


@pytest.mark.parametrize("body", [{}, {"reason": " "}, {"reason": ["x"]}, {"reason": "x" * 501}])
def test_an_event_is_cancelled_for_a_reason(gateway, body):
    event = _event(until=None)
    owner = _member(event.organizer, Role.OWNER)

    data = _error(_cancel_event(owner, event, body), 400, "invalid")

    assert data["field"] == "reason"
    event.refresh_from_db()
    assert event.status == "on_sale"


def test_only_an_owner_cancels_an_event_and_finance_and_managers_read_it(gateway):
    event = _event(until=None)
    organizer = event.organizer
    members = {role: _member(organizer, role) for role in Role}

    refused = {
        role: _cancel_event(members[role], event, {"reason": "x"}).status_code
        for role in (Role.MANAGER, Role.FINANCE, Role.DOOR)
    }
    assert _cancel_event(members[Role.OWNER], event, {"reason": "x"}).status_code == 202
    read = {role: _progress(members[role], event).status_code for role in Role}

    assert refused == dict.fromkeys((Role.MANAGER, Role.FINANCE, Role.DOOR), 403)
    assert read == {Role.OWNER: 200, Role.MANAGER: 200, Role.FINANCE: 200, Role.DOOR: 403}


def test_another_organizers_event_is_404(gateway):
    theirs = _event(until=None, organizer=OrganizerFactory())
    ours = OrganizerFactory()
    owner = _member(ours, Role.OWNER)
    url = f"/api/organizers/{ours.slug}/events/{theirs.pk}/"

    cancel = owner.post(f"{url}cancel/", {"reason": "x"}, format="json")
    progress = owner.get(f"{url}cancellation/")
    malformed = owner.post(f"/api/organizers/{ours.slug}/events/x/cancel/", {"reason": "x"})

    for answer in (cancel, progress, malformed):
        _error(answer, 404, "not_found")
    theirs.refresh_from_db()
    assert theirs.status == "on_sale"
