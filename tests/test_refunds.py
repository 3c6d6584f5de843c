"""Money back, one refund at a time (docs/refunds.md): a refund is a row
opened under its saga's lock, asked of the processor once, looked up after
any doubt, settled with one ledger entry, one email and one webhook, and
chased if it never settles.

In process, on the real database: the fake processor's own tables (its
refunds, its idempotency) answer; time is frozen and moved with freezegun,
and ``drain_outbox`` delivers what is due as the relay and a worker would.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone
from freezegun import freeze_time

from common.money import format_money
from ledger.models import EntryKind, LedgerEntry
from outbox.delivery import message_deliver
from outbox.models import InboxEntry, OutboxMessage
from payments.fake_gateway.models import FakeRefund
from purchases import lock_objects
from purchases import selectors as purchase_selectors
from purchases.errors import BuyerLimitReached
from purchases.models import (
    GatewayAnswer,
    PurchaseSaga,
    Refund,
    ReservationSeat,
    Seat,
)
from purchases.refunds.errors import (
    CancellationNotAllowed,
    InvalidRefund,
    NotRefundable,
    RefundExceedsPaid,
    RefundKeyReused,
)
from purchases.refunds.opening import refundable
from purchases.refunds.selectors import purchase_refunds, refunded_amount
from purchases.services import (
    event_cancel,
    organizer_refund,
    purchase_cancel,
    purchase_refund,
    refund_chase,
    refund_execute,
    saga_charge,
)
from webhooks.models import WebhookDelivery
from webhooks.services import webhook_endpoint_create

from .conftest import drain_outbox, model_fields, new_key, start_purchase
from .factories import EventFactory, OrganizerFactory, UserFactory
from .webhook_receiver import Receiver

T0 = "2026-12-02 12:00:00"
BACKOFF = [60, 120, 240]
CHASE = 3600
HOOKS = [
    "purchase.confirmed",
    "purchase.refunded",
    "purchase.partially_refunded",
    "purchase.cancelled",
    "purchase.needs_attention",
]


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.RECONCILE_BACKOFF_SECONDS = BACKOFF
    settings.REFUND_CHASE_SECONDS = CHASE
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    settings.WEBHOOK_TIMEOUT_SECONDS = 2.0


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def finance(db):
    return UserFactory(username="fiona")


def _endpoint(receiver):
    return webhook_endpoint_create(url=receiver.url("/hook"), events=HOOKS)


def _confirmed(user, event, seats=("A1",), pm="pm_card_visa") -> PurchaseSaga:
    saga = saga_charge(saga_id=start_purchase(user, event, seats=seats, payment_method=pm).pk)
    assert saga.state == "CONFIRMED"
    return saga


def _refund(saga, user, **kwargs) -> Refund:
    kwargs.setdefault("reason", "the show started late")
    return organizer_refund(organizer=saga.event.organizer, saga_id=saga.pk, user=user, **kwargs)


def _entries(refund) -> list[LedgerEntry]:
    return list(LedgerEntry.objects.filter(refund_id=refund.pk))


def _alerts(saga) -> list[OutboxMessage]:
    return list(OutboxMessage.objects.filter(topic="purchase.needs_operator", saga_id=saga.pk))


def _deliveries(saga, event_type) -> list[WebhookDelivery]:
    return list(WebhookDelivery.objects.filter(saga_id=saga.pk, event_type=event_type))


def _calls(gateway, method) -> int:
    return sum(1 for m, _ in gateway.calls if m == method)


def _at_processor(saga) -> list[FakeRefund]:
    return list(FakeRefund.objects.filter(intent_id=saga.gateway_ref).order_by("created"))


def _seat(event, ref) -> str:
    return Seat.objects.get(event=event, ref=ref).status


def _link(saga, ref) -> ReservationSeat:
    seat = Seat.objects.get(event_id=saga.event_id, ref=ref)
    return ReservationSeat.objects.get(reservation_id=saga.reservation_id, seat_id=seat.pk)


def _redeliver(message: OutboxMessage) -> None:
    """The row delivered again, as after a worker that died past its commit."""
    OutboxMessage.objects.filter(pk=message.pk).update(completed_at=None, processing_until=None)
    message_deliver(message_id=message.pk)


def _live(clock, seconds: int, step: int = 60) -> None:
    """``seconds`` of production: every due timer delivered as the relay would."""
    for _ in range(seconds // step):
        clock.tick(step)
        drain_outbox(now=timezone.now())


def _ledger_total(saga) -> int:
    return LedgerEntry.objects.filter(saga_id=saga.pk).aggregate(n=Sum("amount"))["n"] or 0


# --- the refunds' statements written once (docs/performance.md) ------------------------


@pytest.mark.django_db
def test_the_refunds_reads_written_once_read_what_the_orm_reads(alice, bob, finance, gateway):
    event = EventFactory(seats=["A1", "A2", "A3"])
    with freeze_time(T0):
        saga = _confirmed(alice, event, seats=["A1", "A2"])
        other = _confirmed(bob, event, seats=["A3"])
        part = _refund(saga, finance, amount=1200, request_key=new_key())
        drain_outbox(now=timezone.now())
        seats = _refund(saga, finance, seats=["A2"], request_key=new_key())
        _refund(other, finance, request_key=new_key())  # another purchase's: not counted
        drain_outbox(now=timezone.now())
    seats.refresh_from_db()
    for refund in (part, seats):
        with transaction.atomic():
            locked = lock_objects.refund_for_update(refund_id=str(refund.pk), event_id=event.pk)
        assert model_fields(locked) == model_fields(Refund.objects.get(pk=refund.pk))
        facts = purchase_selectors.refund_email_facts(refund_id=refund.pk, event_id=event.pk)
        assert facts == {
            "refund_id": str(refund.pk),
            "saga_id": str(saga.pk),
            "reservation": saga.reservation.ref,
            "buyer": {"username": alice.username, "email": alice.email},
            "amount_display": format_money(refund.amount, refund.currency),
            "seats": refund.seats,
            "public_reason": refund.public_reason,
        }
    assert seats.seats == ["A2"]  # a JSON list, read back as one
    orm = Refund.objects.filter(saga_id=saga.pk, status="succeeded").aggregate(n=Sum("amount"))
    assert refunded_amount(saga) == orm["n"] == 1200 + seats.amount
    # Another event's id, or none: no such refund, as the ORM's get says.
    for refund_id, event_id in ((part.pk, event.pk + 1), (uuid.uuid4(), event.pk)):
        with pytest.raises(Refund.DoesNotExist), transaction.atomic():
            lock_objects.refund_for_update(refund_id=refund_id, event_id=event_id)
        with pytest.raises(Refund.DoesNotExist):
            purchase_selectors.refund_email_facts(refund_id=refund_id, event_id=event_id)
    with pytest.raises(ValidationError), transaction.atomic():
        lock_objects.refund_for_update(refund_id="not-a-uuid", event_id=event.pk)


# --- an organizer's refunds --------------------------------------------------------------


@pytest.mark.django_db
def test_a_partial_refund_then_the_rest_each_settled_once(alice, finance, gateway, receiver):
    event = EventFactory(seats=["A1", "A2", "A3"])
    _endpoint(receiver)
    with freeze_time(T0):
        saga = _confirmed(alice, event, seats=["A1", "A2"])  # 2 x 2500
        drain_outbox(now=timezone.now())
        mail.outbox.clear()

        part = _refund(saga, finance, amount=1200, request_key=new_key())
        assert (part.status, part.amount, part.currency) == ("pending", 1200, "EUR")
        assert (part.source, part.seats, part.released) == ("organizer", [], False)
        assert part.reason == "the show started late"
        assert "late" not in part.public_reason  # the seller's words stay the seller's
        assert _at_processor(saga) == []  # asked after the commit, by its message
        drain_outbox(now=timezone.now())

    part.refresh_from_db()
    assert part.status == "succeeded" and part.settled_at is not None
    assert part.processor_ref.startswith("re_")
    [entry] = _entries(part)
    assert (entry.kind, entry.amount, entry.currency) == (EntryKind.REFUND, -1200, "EUR")
    assert (entry.saga_id, entry.gateway_reference) == (saga.pk, part.processor_ref)
    [made] = _at_processor(saga)
    assert (made.refund_id, made.amount, made.status) == (str(part.pk), 1200, "succeeded")
    # The seats stay the buyer's: an amount refunds no seat.
    assert {_seat(event, "A1"), _seat(event, "A2")} == {"sold"}
    assert _link(saga, "A1").released_at is None and _link(saga, "A2").released_at is None
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "CONFIRMED"
    assert len(_deliveries(saga, "purchase.partially_refunded")) == 1
    assert _deliveries(saga, "purchase.refunded") == []
    heard = [r.json["type"] for r in receiver.requests]
    assert heard.count("purchase.partially_refunded") == 1
    [email] = mail.outbox
    assert email.to == [alice.email]
    assert "12.00" in email.subject and saga.reservation.ref in email.subject
    assert part.public_reason in email.body and "late" not in email.body

    # Redelivered (the email's message, the step's message), nothing again.
    with freeze_time(T0):
        _redeliver(
            OutboxMessage.objects.get(topic="refund.settled", key=f"refund-settled:{part.pk}")
        )
        _redeliver(OutboxMessage.objects.get(key=f"refund-execute:{part.pk}"))
        refund_execute(refund_id=part.pk, event_id=event.pk)  # a worker past its inbox
    assert len(mail.outbox) == 1
    assert _calls(gateway, "create_refund") == 1 and _calls(gateway, "retrieve_refund") == 0
    assert len(_entries(part)) == 1

    # More than what is left: refused, with what is left.
    with pytest.raises(RefundExceedsPaid) as exceeded:
        _refund(saga, finance, amount=3801)
    assert (exceeded.value.refundable, exceeded.value.currency) == (3800, "EUR")
    assert (exceeded.value.code, exceeded.value.status) == ("refund_exceeds_paid", 409)

    # The rest (no amount: everything left).
    with freeze_time(T0) as clock:
        clock.tick(60)
        rest = _refund(saga, finance)
        assert rest.amount == 3800
        drain_outbox(now=timezone.now())
    rest.refresh_from_db()
    assert rest.status == "succeeded"
    assert [e.amount for e in _entries(rest)] == [-3800]
    assert refunded_amount(saga) == 5000 and refundable(saga) == 0
    assert _ledger_total(saga) == 0  # the charge, less its two refunds
    assert len(_deliveries(saga, "purchase.refunded")) == 1
    assert len(_deliveries(saga, "purchase.partially_refunded")) == 1
    assert len(mail.outbox) == 2  # one per refund
    assert sorted(r.amount for r in _at_processor(saga)) == [1200, 3800]
    assert [r.pk for r in purchase_refunds(saga)] == [part.pk, rest.pk]
    with pytest.raises(RefundExceedsPaid) as nothing_left:
        _refund(saga, finance, amount=1)
    assert nothing_left.value.refundable == 0


@pytest.mark.django_db
def test_a_refund_of_seats_releases_them_at_the_price_paid_and_frees_the_buyers_limit(
    alice, bob, finance, gateway
):
    event = EventFactory(seats=["A1", "A2", "A3"], max_seats_per_buyer=2)
    with freeze_time(T0):
        saga = _confirmed(alice, event, seats=["A1", "A2"])
        with pytest.raises(BuyerLimitReached):
            start_purchase(alice, event, seats=["A3"])
        # The seller re-prices the seat: the buyer paid 2500 and gets 2500.
        Seat.objects.filter(event=event, ref="A2").update(price_amount=4000)

        refund = _refund(saga, finance, seats=["A2"], release_seats=True)
        assert (refund.amount, refund.seats, refund.released) == (2500, ["A2"], True)
        # Released in the refund's own commit, before the processor is asked.
        assert _seat(event, "A2") == "available" and _seat(event, "A1") == "sold"
        assert _link(saga, "A2").released_at == timezone.now()
        assert _link(saga, "A1").released_at is None
        drain_outbox(now=timezone.now())

        # Another buyer can have it; and the buyer's limit counts one seat now.
        assert start_purchase(bob, event, seats=["A2"]).state == "PENDING"
        assert start_purchase(alice, event, seats=["A3"]).state == "PENDING"

    refund.refresh_from_db()
    assert refund.status == "succeeded"
    assert [e.amount for e in _entries(refund)] == [-2500]
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "CONFIRMED"
    # Named again: refused (refunded already), the purchase untouched.
    with pytest.raises(InvalidRefund) as again:
        _refund(saga, finance, seats=["A2"])
    assert again.value.field == "seats"


@pytest.mark.django_db
def test_seats_refunded_without_release_stay_sold(alice, finance, gateway):
    event = EventFactory(seats=["A1", "A2"])
    with freeze_time(T0):
        saga = _confirmed(alice, event, seats=["A1", "A2"])
        refund = _refund(saga, finance, seats=["A1"])
    assert (refund.amount, refund.seats, refund.released) == (2500, ["A1"], False)
    assert _seat(event, "A1") == "sold" and _link(saga, "A1").released_at is None


@pytest.mark.django_db
def test_bad_refunds_are_refused_naming_the_field(alice, bob, finance, gateway):
    event = EventFactory(seats=["A1", "A2", "A3"])
    other = EventFactory(seats=["B1"], organizer=OrganizerFactory(slug="another-venue"))
    with freeze_time(T0):
        saga = _confirmed(alice, event, seats=["A1", "A2"])
        pending = start_purchase(bob, event, seats=["A3"])
        cases: dict[str, dict] = {
            "unknown seat": dict(seats=["A3"]),
            "seat twice": dict(seats=["A1", "A1"]),
            "zero": dict(amount=0),
        }
        for name, kwargs in cases.items():
            with pytest.raises(InvalidRefund) as refused:
                _refund(saga, finance, **kwargs)
            assert refused.value.status == 400, name
        with pytest.raises(InvalidRefund) as no_reason:
            _refund(saga, finance, reason="  ", amount=100)
        assert no_reason.value.field == "reason"
        with pytest.raises(NotRefundable):
            _refund(pending, finance, amount=100)
        with pytest.raises(PurchaseSaga.DoesNotExist):  # not this organizer's purchase
            organizer_refund(
                organizer=other.organizer, saga_id=saga.pk, user=finance, reason="x", amount=1
            )
    assert Refund.objects.count() == 0
    assert OutboxMessage.objects.filter(topic__startswith="refund.").count() == 0


@pytest.mark.django_db
def test_the_same_request_key_makes_one_refund_and_another_request_with_it_is_refused(
    alice, finance, gateway
):
    event = EventFactory(seats=["A1", "A2"])
    key = new_key()
    with freeze_time(T0):
        saga = _confirmed(alice, event, seats=["A1", "A2"])
        first = _refund(saga, finance, amount=1000, request_key=key)
        again = _refund(saga, finance, amount=1000, request_key=key)
        drain_outbox(now=timezone.now())
        after = _refund(saga, finance, amount=1000, request_key=key)  # settled since
        with pytest.raises(RefundKeyReused) as reused:
            _refund(saga, finance, amount=2000, request_key=key)
        with pytest.raises(RefundKeyReused):
            _refund(saga, finance, seats=["A1"], request_key=key)
        # No amount (everything left) is another request than 1000.
        with pytest.raises(RefundKeyReused):
            _refund(saga, finance, request_key=key)
    assert first.pk == again.pk == after.pk
    assert (reused.value.code, reused.value.status) == ("idempotency_key_reused", 422)
    assert Refund.objects.count() == 1
    assert len(_at_processor(saga)) == 1


# --- the buyer's cancellation -------------------------------------------------------------


def _policy_event(*, fee=0, price=2500, seats=("A1", "A2", "A3"), days=1):
    until = datetime.fromisoformat(T0).replace(tzinfo=UTC) + timedelta(days=days)
    return EventFactory(
        seats=list(seats),
        seats__price=price,
        buyer_can_cancel_until=until,
        cancel_fee_percent=fee,
    )


@pytest.mark.django_db
def test_the_buyer_cancels_seats_less_the_fee_rounded_in_their_favour(alice, gateway, receiver):
    event = _policy_event(fee=10, price=999)
    _endpoint(receiver)
    with freeze_time(T0):
        saga = _confirmed(alice, event, seats=["A1", "A2", "A3"])  # 2997
        refund = purchase_cancel(saga_id=saga.pk, user=alice, seats=["A2", "A1"], request_key="k1")
        # 1998 less 10 % (199.8, the fee rounded down): 1799.
        assert refund.amount == 1799
        assert (refund.source, sorted(refund.seats), refund.released) == (
            "buyer",
            ["A1", "A2"],
            True,
        )
        assert refund.requested_by_id == alice.pk
        assert "10%" in refund.public_reason
        assert {_seat(event, "A1"), _seat(event, "A2"), _seat(event, "A3")} == {
            "available",
            "sold",
        }
        assert _seat(event, "A3") == "sold"
        drain_outbox(now=timezone.now())

        # The rest, no seats named: the last seat, 999 less 99.
        rest = purchase_cancel(saga_id=saga.pk, user=alice, seats=None, request_key="k2")
        drain_outbox(now=timezone.now())
        with pytest.raises(CancellationNotAllowed):
            purchase_cancel(saga_id=saga.pk, user=alice, seats=None, request_key="k3")

    assert (rest.amount, rest.seats) == (900, ["A3"])
    assert refunded_amount(saga) == 2699 and refundable(saga) == 298  # the fees, kept
    assert len(_deliveries(saga, "purchase.cancelled")) == 1
    assert len(_deliveries(saga, "purchase.partially_refunded")) == 1
    assert _deliveries(saga, "purchase.refunded") == []


@pytest.mark.django_db
def test_a_fee_of_a_small_price_rounds_in_the_buyers_favour(alice, gateway):
    event = _policy_event(fee=15, price=7, seats=("A1",))
    with freeze_time(T0):
        saga = _confirmed(alice, event)
        refund = purchase_cancel(saga_id=saga.pk, user=alice, seats=None, request_key="k")
    assert refund.amount == 6  # 7 less 15 % (1.05 -> 1)


@pytest.mark.django_db
def test_no_seat_named_or_a_whole_price_fee_is_refused_for_what_was_asked(
    alice, bob, finance, gateway
):
    """An error names a field the request sent: no seat named is ``seats``;
    a fee of 100 % leaves nothing to refund, which the buyer cannot fix."""
    event = _policy_event()
    whole_fee = _policy_event(fee=100)
    with freeze_time(T0):
        saga = _confirmed(alice, event, seats=["A1", "A2"])
        kept = _confirmed(bob, whole_fee, seats=["A1"])
        with pytest.raises(InvalidRefund) as none_named:
            _refund(saga, finance, seats=[])
        with pytest.raises(InvalidRefund) as none_cancelled:
            purchase_cancel(saga_id=saga.pk, user=alice, seats=[], request_key="k1")
        with pytest.raises(CancellationNotAllowed):
            purchase_cancel(saga_id=kept.pk, user=bob, seats=None, request_key="k2")
    assert none_named.value.field == none_cancelled.value.field == "seats"
    assert Refund.objects.count() == 0
    assert {_seat(event, "A1"), _seat(event, "A2"), _seat(whole_fee, "A1")} == {"sold"}


@pytest.mark.django_db
def test_the_buyer_may_cancel_until_the_deadline_not_at_it(alice, bob, gateway):
    event = _policy_event(days=1)
    with freeze_time(T0):
        early = _confirmed(alice, event, seats=["A1"])
        late = _confirmed(bob, event, seats=["A2"])
    deadline = event.buyer_can_cancel_until
    with freeze_time(deadline - timedelta(microseconds=1)):
        ok = purchase_cancel(saga_id=early.pk, user=alice, seats=None, request_key="k")
    with freeze_time(deadline), pytest.raises(CancellationNotAllowed) as refused:
        purchase_cancel(saga_id=late.pk, user=bob, seats=None, request_key="k")
    # With now= instead of the clock, the same answer.
    with pytest.raises(CancellationNotAllowed):
        purchase_cancel(
            saga_id=late.pk, user=bob, seats=None, request_key="k2", now=deadline + timedelta(1)
        )
    assert ok.amount == 2500
    assert (refused.value.code, refused.value.status) == ("cancellation_not_allowed", 409)
    assert Refund.objects.filter(saga_id=late.pk).count() == 0
    assert _seat(event, "A2") == "sold"
    # The replay of a cancel made in time answers it, even after the deadline.
    with freeze_time(deadline + timedelta(days=1)):
        assert purchase_cancel(saga_id=early.pk, user=alice, seats=None, request_key="k").pk == (
            ok.pk
        )


@pytest.mark.django_db
def test_no_policy_a_cancelled_event_or_another_buyer_refuse_the_cancel(alice, bob, gateway):
    no_policy = EventFactory(seats=["A1"])
    event = _policy_event()
    with freeze_time(T0):
        plain = _confirmed(alice, no_policy)
        saga = _confirmed(alice, event)
        with pytest.raises(CancellationNotAllowed):
            purchase_cancel(saga_id=plain.pk, user=alice, seats=None, request_key="k")
        with pytest.raises(PurchaseSaga.DoesNotExist):
            purchase_cancel(saga_id=saga.pk, user=bob, seats=None, request_key="k")
        event_cancel(organizer=event.organizer, event_id=event.pk, reason="storm", user=bob)
        with pytest.raises(CancellationNotAllowed):
            purchase_cancel(saga_id=saga.pk, user=alice, seats=None, request_key="k")
    assert Refund.objects.filter(source="buyer").count() == 0


@pytest.mark.django_db
def test_a_cancel_replayed_by_key_is_the_same_refund_and_another_body_is_refused(alice, gateway):
    event = _policy_event()
    with freeze_time(T0):
        saga = _confirmed(alice, event, seats=["A1", "A2"])
        first = purchase_cancel(saga_id=saga.pk, user=alice, seats=["A1"], request_key="k")
        again = purchase_cancel(saga_id=saga.pk, user=alice, seats=["A1"], request_key="k")
        with pytest.raises(RefundKeyReused):
            purchase_cancel(saga_id=saga.pk, user=alice, seats=["A2"], request_key="k")
        # No seats named (all that are left: A2) is another request than A1.
        with pytest.raises(RefundKeyReused):
            purchase_cancel(saga_id=saga.pk, user=alice, seats=None, request_key="k")
    assert first.pk == again.pk
    assert Refund.objects.count() == 1
    assert _seat(event, "A2") == "sold"


# --- the processor's answers ------------------------------------------------------------


@pytest.mark.django_db
def test_a_pending_refund_is_looked_up_on_the_backoff_and_then_succeeds(alice, finance, gateway):
    event = EventFactory(seats=["A1"])
    with freeze_time(T0) as clock:
        saga = _confirmed(alice, event, pm="pm_card_refundPending")
        refund = _refund(saga, finance, amount=1000)
        drain_outbox(now=timezone.now())
        refund.refresh_from_db()
        assert (refund.status, refund.asked, refund.lookups) == ("pending", True, 1)
        assert refund.processor_ref.startswith("re_")  # named by the pending answer
        assert _entries(refund) == []

        clock.tick(BACKOFF[0] - 1)
        drain_outbox(now=timezone.now())
        assert Refund.objects.get(pk=refund.pk).status == "pending"  # not due yet
        assert _calls(gateway, "retrieve_refund") == 0

        clock.tick(1)
        drain_outbox(now=timezone.now())
    refund.refresh_from_db()
    assert refund.status == "succeeded"
    assert _calls(gateway, "create_refund") == 1 and _calls(gateway, "retrieve_refund") == 1
    assert [e.amount for e in _entries(refund)] == [-1000]
    answers = GatewayAnswer.objects.filter(refund_id=refund.pk).order_by("at", "id")
    assert [(a.asked, a.answer) for a in answers] == [
        ("refund_create", "pending"),
        ("refund_lookup", "succeeded"),
    ]


@pytest.mark.django_db
def test_a_pending_refund_driven_by_now_alone(alice, finance, gateway):
    """The step on an injected clock: the look-up is armed on the backoff
    from the answer's own instant."""
    event = EventFactory(seats=["A1"])
    with freeze_time(T0):
        saga = _confirmed(alice, event, pm="pm_card_refundPending")
        refund = _refund(saga, finance, amount=1000)
        t0 = timezone.now()
    refund_execute(refund_id=refund.pk, event_id=event.pk, now=t0)
    timer = OutboxMessage.objects.get(key=f"refund-lookup:{refund.pk}:1")
    assert timer.topic == "refund.execute"
    assert timer.available_at == t0 + timedelta(seconds=BACKOFF[0])
    refund_execute(refund_id=refund.pk, event_id=event.pk, now=t0 + timedelta(seconds=60))
    assert Refund.objects.get(pk=refund.pk).status == "succeeded"
    assert _calls(gateway, "create_refund") == 1


@pytest.mark.django_db
def test_a_refused_refund_fails_with_one_alert_and_no_money_moved(alice, finance, gateway):
    event = EventFactory(seats=["A1", "A2"])
    with freeze_time(T0) as clock:
        saga = _confirmed(alice, event, seats=["A1", "A2"], pm="pm_card_refundFail")
        refund = _refund(saga, finance, amount=1000)
        drain_outbox(now=timezone.now())
        refund.refresh_from_db()
        assert (refund.status, refund.detail) == ("failed", "expired_or_canceled_card")
        assert refund.settled_at is not None

        # Redelivered: by the relay (the inbox), and to a worker past it.
        _redeliver(OutboxMessage.objects.get(key=f"refund-execute:{refund.pk}"))
        refund_execute(refund_id=refund.pk, event_id=event.pk)
        # Its chaser was stood down: past the deadline, nothing more.
        _live(clock, CHASE + 600, step=600)

    alerts = _alerts(saga)
    assert len(alerts) == 1, [a.payload for a in alerts]
    assert "failed" in alerts[0].payload["why"]
    assert _entries(refund) == [] and _ledger_total(saga) == 5000
    assert _calls(gateway, "create_refund") == 1
    assert refundable(saga) == 5000  # a failed refund gave nothing back
    assert refund_chase(refund_id=refund.pk, event_id=event.pk) is False
    [made] = _at_processor(saga)
    assert made.status == "failed"


@pytest.mark.django_db
def test_a_refund_whose_answer_is_lost_is_found_by_a_look_up_never_made_twice(
    alice, finance, gateway
):
    event = EventFactory(seats=["A1"])
    with freeze_time(T0) as clock:
        saga = _confirmed(alice, event, pm="pm_card_refundTimeout")
        refund = _refund(saga, finance)
        drain_outbox(now=timezone.now())
        refund.refresh_from_db()
        assert (refund.status, refund.detail, refund.lookups) == ("pending", "timeout", 1)
        # The message delivered again meanwhile: a look-up, not a second create.
        refund_execute(refund_id=refund.pk, event_id=event.pk)
        _live(clock, 600)
    refund.refresh_from_db()
    assert refund.status == "succeeded"
    assert _calls(gateway, "create_refund") == 1
    [made] = _at_processor(saga)
    assert (made.refund_id, made.amount) == (str(refund.pk), 2500)
    assert [r.refund_id for r in gateway.list_refunds(saga.gateway_ref)] == [str(refund.pk)]
    assert [e.amount for e in _entries(refund)] == [-2500]


@pytest.mark.django_db
def test_lost_creates_and_look_ups_still_make_exactly_one_refund(alice, finance, faulty_gateway):
    event = EventFactory(seats=["A1"])
    with freeze_time(T0) as clock:
        saga = _confirmed(alice, event)
        # The create never reaches the processor, and the look-ups after it
        # are lost three times: then a look-up finds nothing, and it asks again.
        faulty_gateway.down("create_refund", 1)
        faulty_gateway.down("retrieve_refund", 3)
        refund = _refund(saga, finance, amount=2000)
        _live(clock, 3600)
    refund.refresh_from_db()
    assert refund.status == "succeeded"
    assert len(_at_processor(saga)) == 1
    assert [r.amount for r in faulty_gateway.list_refunds(saga.gateway_ref)] == [2000]
    assert [e.amount for e in _entries(refund)] == [-2000]
    answers = list(
        GatewayAnswer.objects.filter(refund_id=refund.pk)
        .order_by("at", "id")
        .values_list("asked", "answer")
    )
    assert answers[0] == ("refund_create", "unknown")
    assert answers[-1] == ("refund_create", "succeeded")
    assert ("refund_lookup", "not_found") in answers


@pytest.mark.django_db
def test_a_made_refund_whose_answers_are_lost_is_never_made_again(alice, finance, faulty_gateway):
    event = EventFactory(seats=["A1"])
    with freeze_time(T0) as clock:
        saga = _confirmed(alice, event, pm="pm_card_refundTimeout")
        faulty_gateway.down("retrieve_refund", 4)
        refund = _refund(saga, finance, amount=2000)
        for _ in range(5):
            refund_execute(refund_id=refund.pk, event_id=event.pk)  # deliveries piling up
        _live(clock, 3600)
    refund.refresh_from_db()
    assert refund.status == "succeeded"
    assert _calls(faulty_gateway, "create_refund") == 1
    assert len(_at_processor(saga)) == 1
    assert len(_entries(refund)) == 1


@pytest.mark.django_db
def test_a_refunds_message_delivered_again_keeps_one_chain_of_look_ups(
    alice, finance, faulty_gateway
):
    """The first message delivered again after the create's doubt (its
    worker died before its inbox entry): one look-up is armed, not two
    chains of them."""
    event = EventFactory(seats=["A1"])
    with freeze_time(T0) as clock:
        saga = _confirmed(alice, event)
        faulty_gateway.down("create_refund")
        faulty_gateway.down("retrieve_refund")
        refund = _refund(saga, finance, amount=500)
        drain_outbox(now=timezone.now())
        first = OutboxMessage.objects.get(key=f"refund-execute:{refund.pk}")
        clock.tick(5)
        InboxEntry.objects.filter(message=first).delete()
        _redeliver(first)
        armed = OutboxMessage.objects.filter(
            topic="refund.execute", completed_at__isnull=True, cancelled_at__isnull=True
        )
        assert armed.count() == 1, list(armed.values_list("key", "available_at"))
        _live(clock, 3600)
    asked = _calls(faulty_gateway, "create_refund") + _calls(faulty_gateway, "retrieve_refund")
    # One chain on the backoff (60, 120, 240, 240...): the create and ~15 look-ups.
    assert asked <= 17, asked


# --- the chaser ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_refund_pending_past_its_deadline_alerts_once(alice, finance, faulty_gateway):
    event = EventFactory(seats=["A1"])
    with freeze_time(T0) as clock:
        saga = _confirmed(alice, event)
        faulty_gateway.down("create_refund")
        faulty_gateway.down("retrieve_refund")
        refund = _refund(saga, finance, amount=500)
        _live(clock, CHASE - 600, step=300)
        assert _alerts(saga) == []
        _live(clock, 3 * CHASE, step=300)
        alerts = _alerts(saga)
        assert refund_chase(refund_id=refund.pk, event_id=event.pk) is False  # once
        # The processor answers again: settled, and no second alert.
        faulty_gateway.up("create_refund")
        faulty_gateway.up("retrieve_refund")
        _live(clock, 3600, step=300)
    assert len(alerts) == 1, [a.payload for a in alerts]
    assert "deadline" in alerts[0].payload["why"]
    assert Refund.objects.get(pk=refund.pk).status == "succeeded"
    assert len(_alerts(saga)) == 1
    assert len(_at_processor(saga)) == 1


@pytest.mark.django_db
def test_a_settled_refund_is_never_chased(alice, finance, gateway):
    event = EventFactory(seats=["A1"])
    with freeze_time(T0) as clock:
        saga = _confirmed(alice, event)
        refund = _refund(saga, finance, amount=500)
        drain_outbox(now=timezone.now())
        _live(clock, 2 * CHASE, step=600)
    assert Refund.objects.get(pk=refund.pk).status == "succeeded"
    assert _alerts(saga) == []
    assert refund_chase(refund_id=refund.pk, event_id=event.pk) is False
    chase = OutboxMessage.objects.get(key=f"refund-chase:{refund.pk}")
    assert chase.cancelled_at is not None


# --- the runbook's refund ---------------------------------------------------------------


@pytest.mark.django_db
def test_the_operators_refund_gives_back_everything_left_and_releases_the_seats(
    alice, finance, gateway, receiver
):
    event = EventFactory(seats=["A1", "A2"])
    _endpoint(receiver)
    with freeze_time(T0):
        saga = _confirmed(alice, event, seats=["A1", "A2"])
        part = _refund(saga, finance, amount=1000)
        drain_outbox(now=timezone.now())
        returned = purchase_refund(saga_id=saga.pk, reason="customer asked")
        assert returned.state == "CONFIRMED"
        drain_outbox(now=timezone.now())

    refund = Refund.objects.get(saga_id=saga.pk, source="operator")
    assert (refund.amount, sorted(refund.seats), refund.released) == (4000, ["A1", "A2"], True)
    assert refund.status == "succeeded" and refund.reason == "customer asked"
    assert {_seat(event, "A1"), _seat(event, "A2")} == {"available"}
    assert PurchaseSaga.objects.get(pk=saga.pk).state == "CONFIRMED"
    assert Refund.objects.get(pk=part.pk).status == "succeeded"
    assert _ledger_total(saga) == 0
    assert len(_deliveries(saga, "purchase.refunded")) == 1
    assert saga.history.filter(reason__contains="customer asked").exists()
    with pytest.raises(RefundExceedsPaid):
        purchase_refund(saga_id=saga.pk, reason="again")
