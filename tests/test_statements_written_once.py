"""The statements written once as SQL on PostgreSQL (docs/performance.md,
"Statements written once"): the saga's lock and move
(purchases/lock_objects.py, purchases/saga/transition.py), a webhook
delivery's read, lock and attempt record (webhooks/lock_objects.py,
webhooks/attempts.py), common.rows' helpers. They read and write exactly
what the ORM's versions did, lock what those locked, and refuse what those
refused."""

import re
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from common import rows
from outbox.models import OutboxMessage
from payments.fake_gateway.models import FakeIntent
from purchases import lock_objects
from purchases.errors import StaleSaga
from purchases.models import Event, PurchaseSaga, Reservation, SagaHistory, Seat
from purchases.saga.start import _event_and_seats_by_ref
from purchases.saga.states import SagaState
from purchases.saga.transition import By, move
from webhooks import lock_objects as webhook_locks
from webhooks.attempts import _record_attempts_once
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhooks.services import webhook_endpoint_create, webhook_publish

from .conftest import model_fields, start_purchase

S = SagaState


def _other_connection() -> psycopg.Connection:
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return psycopg.connect(autocommit=True, **params)


@pytest.mark.django_db
def test_the_lock_reads_every_field_of_the_saga_and_its_reservation_as_the_orm_does(alice, event):
    saga = start_purchase(alice, event)
    at = timezone.now().replace(microsecond=123456)
    PurchaseSaga.objects.filter(pk=saga.pk).update(
        compensation_started_at=at,
        awaiting_operator_since=at + timedelta(seconds=1),
        trace_context="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    expected = PurchaseSaga.objects.select_related("reservation").get(pk=saga.pk)

    with transaction.atomic():
        locked = lock_objects.saga_for_update(saga_id=str(saga.pk))  # a task's str id

    assert model_fields(locked) == model_fields(expected)
    assert locked.compensation_started_at == at
    assert model_fields(locked.reservation) == model_fields(expected.reservation)
    assert isinstance(locked.reservation, Reservation)
    assert locked._state.adding is False and locked._state.db == "default"


@pytest.mark.django_db
def test_the_lock_refuses_an_unknown_or_malformed_id_as_the_orm_does():
    with transaction.atomic(), pytest.raises(PurchaseSaga.DoesNotExist):
        lock_objects.saga_for_update(saga_id="00000000-0000-0000-0000-000000000000")
    with transaction.atomic(), pytest.raises(ValidationError):
        lock_objects.saga_for_update(saga_id="not-a-uuid")


@pytest.mark.django_db(transaction=True)
def test_the_lock_holds_the_saga_and_leaves_its_reservation_free(alice, event):
    saga = start_purchase(alice, event)
    with _other_connection() as other, transaction.atomic():
        lock_objects.saga_for_update(saga_id=saga.pk)

        with pytest.raises(psycopg.errors.LockNotAvailable):
            other.execute(
                "SELECT 1 FROM purchases_purchasesaga WHERE id = %s FOR UPDATE NOWAIT", [saga.pk]
            )
        # The reservation came along unlocked: another transaction may lock it.
        with other.transaction():
            other.execute(
                "SELECT 1 FROM purchases_reservation WHERE id = %s FOR UPDATE NOWAIT",
                [saga.reservation_id],
            )


@pytest.mark.django_db
def test_a_move_writes_the_saga_and_its_history_row_in_one_statement(
    alice, event, django_assert_num_queries
):
    saga = start_purchase(alice, event)
    PurchaseSaga.objects.filter(pk=saga.pk).update(awaiting_operator_since=timezone.now())
    at = timezone.now() + timedelta(seconds=5)

    with transaction.atomic():
        locked = lock_objects.saga_for_update(saga_id=saga.pk)
        with django_assert_num_queries(1):
            move(
                locked,
                S.CHARGING,
                reason="x" * 600,
                at=at,
                by=By.operator("olga"),
                count_attempt=True,
            )

    stored = PurchaseSaga.objects.get(pk=saga.pk)
    assert (stored.state, stored.version, stored.attempts) == ("CHARGING", 2, 1)
    assert stored.updated_at == at and stored.awaiting_operator_since is None
    assert stored.compensation_started_at is None
    assert model_fields(locked) | {"trace_context": stored.trace_context} == model_fields(stored)
    [row] = SagaHistory.objects.filter(saga=saga, to_state="CHARGING")
    assert (row.from_state, row.at, row.actor, row.actor_name, row.version) == (
        "PENDING",
        at,
        "operator",
        "olga",
        2,
    )
    assert row.reason == "x" * 500 and row.event_id == saga.event_id


@pytest.mark.django_db
def test_the_first_compensating_move_stamps_its_start_and_a_later_one_keeps_it(alice, event):
    saga = start_purchase(alice, event)
    first = timezone.now()
    later = first + timedelta(minutes=5)
    with transaction.atomic():
        locked = lock_objects.saga_for_update(saga_id=saga.pk)
        move(locked, S.EXPIRED, reason="hold ran out", at=first)
        move(locked, S.COMPENSATING, reason="compensating", at=first)
        move(locked, S.COMPENSATION_PENDING, reason="refund failed", at=later)
        move(locked, S.COMPENSATING, reason="refund retry", at=later)

    stored = PurchaseSaga.objects.get(pk=saga.pk)
    assert stored.compensation_started_at == first == locked.compensation_started_at
    assert stored.version == 5 and stored.attempts == 0


@pytest.mark.django_db
def test_a_stale_move_is_refused_and_writes_no_history(alice, event):
    saga = start_purchase(alice, event)
    with transaction.atomic():
        stale = lock_objects.saga_for_update(saga_id=saga.pk)
        PurchaseSaga.objects.filter(pk=saga.pk).update(version=7)  # moved behind our back
        before = SagaHistory.objects.filter(saga=saga).count()

        with pytest.raises(StaleSaga):
            move(stale, S.CHARGING, reason="charge started", at=timezone.now())

        assert SagaHistory.objects.filter(saga=saga).count() == before
        assert (stale.state, stale.version) == ("PENDING", 1)


# --- a webhook delivery: its read before the POST, its lock, its attempt's record ------


@pytest.fixture
def delivery(alice, event, settings):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    webhook_endpoint_create(
        url="http://127.0.0.1:9/hook", events=["purchase.confirmed", "purchase.failed"]
    )
    saga = start_purchase(alice, event)
    return _confirmation(saga.pk, saga.event_id)


def _confirmation(saga_id, event_id) -> WebhookDelivery:
    """The one delivery of the saga's confirmation written now."""
    with transaction.atomic():
        [written] = webhook_publish(
            event_type="purchase.confirmed",
            saga_id=saga_id,
            event_id=event_id,
            data={"id": str(saga_id)},
            now=timezone.now(),
        )
    return written


def _attempt(delivery, number: int, **overrides) -> bool:
    columns = {
        "delivery_id": delivery.pk,
        "event_id": delivery.event_id,
        "number": number,
        "resend": False,
        "at": timezone.now(),
        "status_code": 500,
        "latency_ms": 12.5,
        "error": "HTTP 500",
        "response_excerpt": "oops",
    }
    return bool(_record_attempts_once([WebhookAttempt(**(columns | overrides))]))


def _second_delivery(delivery) -> WebhookDelivery:
    """Another endpoint's delivery of the same saga's confirmation."""
    webhook_endpoint_create(url="http://127.0.0.1:9/other", events=["purchase.confirmed"])
    return _confirmation(delivery.saga_id, delivery.event_id)


def _made(delivery, attempt: int) -> bool:
    found = webhook_locks.delivery_with_attempt_made(delivery_id=delivery.pk, attempt=attempt)
    assert found is not None
    return found[1]


@pytest.mark.django_db
def test_a_deliverys_read_has_every_field_of_it_and_its_endpoint_as_the_orm_does(delivery):
    expected = WebhookDelivery.objects.select_related("endpoint").get(pk=delivery.pk)

    found = webhook_locks.delivery_with_attempt_made(delivery_id=delivery.pk, attempt=1)
    assert found is not None
    read, made = found
    assert made is False
    assert model_fields(read) == model_fields(expected)
    assert model_fields(read.endpoint) == model_fields(expected.endpoint)
    assert read.endpoint.events == ["purchase.confirmed", "purchase.failed"]  # JSON, decoded

    _attempt(delivery, 1)
    assert _made(delivery, 1) is True
    assert _made(delivery, 2) is False
    assert (
        webhook_locks.delivery_with_attempt_made(delivery_id=delivery.pk + 999, attempt=1) is None
    )


@pytest.mark.django_db(transaction=True)
def test_a_deliverys_lock_holds_it_and_leaves_its_endpoint_free(delivery):
    with _other_connection() as other, transaction.atomic():
        locked = webhook_locks.delivery_for_update(delivery_id=delivery.pk)
        assert locked is not None and model_fields(locked) == model_fields(delivery) | {
            "status": locked.status
        }
        assert locked.endpoint.pk == delivery.endpoint_id

        with pytest.raises(psycopg.errors.LockNotAvailable):
            other.execute(
                "SELECT 1 FROM webhooks_webhookdelivery WHERE id = %s FOR UPDATE NOWAIT",
                [delivery.pk],
            )
        with other.transaction():
            other.execute(
                "SELECT 1 FROM webhooks_webhookendpoint WHERE id = %s FOR UPDATE NOWAIT",
                [delivery.endpoint_id],
            )
    assert webhook_locks.delivery_for_update(delivery_id=delivery.pk + 999) is None


@pytest.mark.django_db
def test_several_attempts_are_read_in_one_statement_as_each_alone_is(delivery):
    second = _second_delivery(delivery)
    _attempt(delivery, 1)
    pairs = [(delivery.pk, 1), (delivery.pk, 2), (second.pk, 1), (second.pk + 999, 1)]

    with CaptureQueriesContext(connection) as sent:
        read = webhook_locks.deliveries_with_attempt_made(pairs)
    assert len(sent.captured_queries) == 1

    assert sorted(read) == sorted(pairs[:3])  # the unknown delivery left out
    for (pk, attempt), (found, made) in read.items():
        alone = webhook_locks.delivery_with_attempt_made(delivery_id=pk, attempt=attempt)
        assert alone is not None
        assert made is alone[1] and made is (pk == delivery.pk and attempt == 1)
        assert model_fields(found) == model_fields(alone[0])
        assert model_fields(found.endpoint) == model_fields(alone[0].endpoint)


@pytest.mark.django_db(transaction=True)
def test_several_deliveries_are_locked_in_one_statement_as_the_orm_reads_them(delivery):
    second = _second_delivery(delivery)
    expected = WebhookDelivery.objects.select_related("endpoint").in_bulk([delivery.pk, second.pk])

    with _other_connection() as other, transaction.atomic():
        locked = webhook_locks.deliveries_for_update(
            delivery_ids=[second.pk, delivery.pk, second.pk, delivery.pk + 999]
        )
        assert list(locked) == [delivery.pk, second.pk]  # in the order of their ids
        for pk, read in locked.items():
            assert model_fields(read) == model_fields(expected[pk])
            assert model_fields(read.endpoint) == model_fields(expected[pk].endpoint)
        for pk in (delivery.pk, second.pk):
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute(
                    "SELECT 1 FROM webhooks_webhookdelivery WHERE id = %s FOR UPDATE NOWAIT", [pk]
                )
    assert webhook_locks.deliveries_for_update(delivery_ids=[delivery.pk + 999]) == {}


@pytest.mark.django_db
def test_several_rows_updated_in_one_statement_hold_what_the_orms_save_writes(delivery):
    second = _second_delivery(delivery)
    names = ["status", "delivered_at", "failed_at", "armed_attempt", "next_attempt_at"]
    at = timezone.now().replace(microsecond=654321)
    ours = [WebhookDelivery.objects.get(pk=pk) for pk in (delivery.pk, second.pk)]
    ours[0].status, ours[0].delivered_at, ours[0].next_attempt_at = "delivered", at, None
    ours[1].armed_attempt, ours[1].next_attempt_at = 2, at + timedelta(seconds=5)
    # failed_at is NULL in every row: its values still have the column's type.

    with CaptureQueriesContext(connection) as sent:
        assert rows.update_fields_many(ours, names) == 2
    assert len(sent.captured_queries) == 1
    for obj in ours:
        by_orm = WebhookDelivery.objects.get(pk=obj.pk)
        assert {n: getattr(by_orm, n) for n in names} == {n: getattr(obj, n) for n in names}
    assert WebhookDelivery.objects.get(pk=second.pk).status == "pending"
    assert rows.update_fields_many([], names) == 0


@pytest.mark.django_db
def test_an_attempt_is_recorded_once_whatever_the_second_recorder_says(delivery):
    at = timezone.now()

    assert _attempt(delivery, 1, at=at) is True
    assert _attempt(delivery, 1, status_code=200, error="") is False
    assert _attempt(delivery, 2) is True

    first = WebhookAttempt.objects.get(delivery=delivery, number=1)
    assert (first.status_code, first.error, first.at, first.latency_ms) == (
        500,
        "HTTP 500",
        at,
        12.5,
    )
    assert (first.response_excerpt, first.resend, first.event_id) == (
        "oops",
        False,
        delivery.event_id,
    )
    assert WebhookAttempt.objects.filter(delivery=delivery).count() == 2


@pytest.mark.django_db
def test_deliveries_are_inserted_once_and_returned_as_the_database_holds_them(delivery):
    # A second endpoint: the fixture's delivery is the first endpoint's.
    webhook_endpoint_create(url="http://127.0.0.1:9/other", events=["purchase.confirmed"])
    now = timezone.now()

    def publish():
        with transaction.atomic():
            return webhook_publish(
                event_type="purchase.confirmed",
                saga_id=delivery.saga_id,
                event_id=delivery.event_id,
                data={"id": str(delivery.saga_id)},
                now=now,
            )

    [second] = publish()  # the first endpoint has this type for this saga already

    assert second.endpoint_id != delivery.endpoint_id and second.pk > delivery.pk
    assert model_fields(second) == model_fields(WebhookDelivery.objects.get(pk=second.pk))
    assert second.next_attempt_at == now and second.armed_attempt == 1
    assert publish() == []
    assert WebhookDelivery.objects.filter(saga_id=delivery.saga_id).count() == 2


def _assert_key_share_locked(other: psycopg.Connection, *, locked: int, free: int) -> None:
    """Seen from ``other`` while a saga's commit is open: endpoint ``locked``
    is key-share locked (a change waits for no saga's commit; a delete,
    FOR UPDATE, does), endpoint ``free`` is not locked at all."""
    with other.transaction():
        other.execute(
            "SELECT 1 FROM webhooks_webhookendpoint WHERE id = %s FOR NO KEY UPDATE NOWAIT",
            [locked],
        )
    with pytest.raises(psycopg.errors.LockNotAvailable):
        other.execute(
            "SELECT 1 FROM webhooks_webhookendpoint WHERE id = %s FOR UPDATE NOWAIT", [locked]
        )
    with other.transaction():
        other.execute(
            "SELECT 1 FROM webhooks_webhookendpoint WHERE id = %s FOR UPDATE NOWAIT", [free]
        )


@pytest.mark.django_db(transaction=True)
def test_the_enabled_endpoints_are_read_as_the_orm_reads_them_and_key_share_locked(settings):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    first = webhook_endpoint_create(url="http://127.0.0.1:9/a", events=["purchase.confirmed"])
    webhook_endpoint_create(url="http://127.0.0.1:9/b", events=["purchase.failed"])
    off = webhook_endpoint_create(url="http://127.0.0.1:9/c", events=["purchase.refunded"])
    WebhookEndpoint.objects.filter(pk=off.pk).update(enabled=False)
    expected = list(
        WebhookEndpoint.objects.filter(enabled=True).order_by("pk").values_list("pk", "events")
    )

    with _other_connection() as other, transaction.atomic():
        read = webhook_locks.enabled_endpoints_key_share()
        assert read == expected and len(read) == 2  # JSON decoded, the disabled one left out

        _assert_key_share_locked(other, locked=first.pk, free=off.pk)


@pytest.mark.django_db
def test_a_row_created_once_holds_what_the_orms_create_holds(alice, event):
    saga = start_purchase(alice, event)
    at = timezone.now()
    columns = {
        "topic": "purchase.confirmed",
        "payload": {"saga_id": str(saga.pk), "seats": ["A-1"]},
        "key": None,
        "event_id": event.pk,
        "saga_id": saga.pk,
        "created_at": at,
        "available_at": at,
        "due_at": at + timedelta(seconds=5),
    }

    made = rows.create(OutboxMessage(**columns))
    by_orm = OutboxMessage.objects.create(**columns)

    assert made.pk is not None and made.pk != by_orm.pk and not made._state.adding
    read, expected = OutboxMessage.objects.get(pk=made.pk), OutboxMessage.objects.get(pk=by_orm.pk)
    assert model_fields(read) | {"id": None} == model_fields(expected) | {"id": None}
    assert read.payload == {"saga_id": str(saga.pk), "seats": ["A-1"]}  # JSON, not its text
    assert (read.attempts, read.last_error, read.trace_context) == (0, "", "")

    # A key given by the caller (the saga's UUID) is kept, and a second
    # insert of it is refused as the ORM's would be.
    history = rows.create(
        SagaHistory(saga=saga, event_id=event.pk, to_state=S.PENDING, at=at, version=9)
    )
    assert SagaHistory.objects.get(pk=history.pk).version == 9
    with pytest.raises(IntegrityError), transaction.atomic():
        rows.create(PurchaseSaga.objects.get(pk=saga.pk))


@pytest.mark.django_db
def test_the_seats_named_in_a_purchase_are_read_as_the_orm_reads_them(event):
    refs = [s.ref for s in Seat.objects.filter(event=event).order_by("-id")[:3]]
    asked = [*refs, "Z-99"]  # one unknown: left out, as the ORM leaves it
    fields = ["id", "ref", "price_amount", "currency"]
    expected = list(
        Seat.objects.filter(event=event, ref__in=asked).order_by("id").values_list(*fields)
    )
    rules = ["status", "sales_start", "sales_end", "hold_seconds", "max_seats_per_buyer"]
    Event.objects.filter(pk=event.pk).update(
        sales_end=timezone.now() + timedelta(days=1), hold_seconds=300, max_seats_per_buyer=6
    )
    expected_rules = Event.objects.values_list(*rules).get(pk=event.pk)

    # The event's rules come in the same statement (the reserve's round trips).
    rules_read, read = _event_and_seats_by_ref(event.pk, asked)

    assert [tuple(getattr(s, f) for f in fields) for s in read] == expected and len(read) == 3
    assert rules_read is not None
    assert tuple(getattr(rules_read, f) for f in rules) == expected_rules
    # The event without any seat named: its rules, no seats; no event: neither.
    rules_alone, none_read = _event_and_seats_by_ref(event.pk, ["Z-99"])
    assert rules_alone == rules_read and none_read == []
    assert _event_and_seats_by_ref(event.pk + 999, refs) == (None, [])


@pytest.mark.django_db
def test_a_moves_deliveries_written_in_one_statement_hold_what_row_by_row_writes(
    event, settings, django_capture_on_commit_callbacks
):
    """With its data in hand, a move's webhooks are one statement on
    PostgreSQL (the subscribed endpoints key-share locked, the deliveries,
    their first attempts' outbox rows): the same rows, and the same hand-over
    after the commit, as the statements one by one (the path a move whose
    data is still to read takes)."""
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    settings.OUTBOX_HAND_OVER_ON_COMMIT = True
    listening = webhook_endpoint_create(url="http://127.0.0.1:9/a", events=["purchase.confirmed"])
    webhook_endpoint_create(url="http://127.0.0.1:9/b", events=["purchase.failed"])
    now = timezone.now()
    data = {"purchase": {"id": "p", "status": "CONFIRMED"}, "version": 3}

    def publish(saga_id, data):
        with transaction.atomic():
            return webhook_publish(
                event_type="purchase.confirmed",
                saga_id=saga_id,
                event_id=event.pk,
                data=data,
                now=now,
            )

    with (
        CaptureQueriesContext(connection) as statements,
        django_capture_on_commit_callbacks(execute=False) as at_once_after,
    ):
        [at_once] = publish(uuid.uuid4(), data)
    with django_capture_on_commit_callbacks(execute=False) as one_by_one_after:
        [one_by_one] = publish(uuid.uuid4(), lambda: data)

    written = [q["sql"] for q in statements.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(written) == 1, written
    assert at_once.endpoint_id == one_by_one.endpoint_id == listening.pk
    assert model_fields(at_once) == model_fields(WebhookDelivery.objects.get(pk=at_once.pk))
    assert re.fullmatch(r"msg_[0-9a-f]{32}", at_once.message_id)
    assert at_once.message_id != one_by_one.message_id

    def alike(obj) -> dict:
        return model_fields(obj) | {"id": None, "saga_id": None, "message_id": None}

    assert alike(at_once) == alike(WebhookDelivery.objects.get(pk=one_by_one.pk))
    rows_of = {
        d.pk: OutboxMessage.objects.get(key=f"webhook:{d.pk}:1") for d in (at_once, one_by_one)
    }
    first, second = rows_of[at_once.pk], rows_of[one_by_one.pk]
    assert first.payload == {"delivery_id": at_once.pk, "attempt": 1}
    assert (first.saga_id, first.event_id) == (at_once.saga_id, event.pk)
    ignored = {"id": None, "key": None, "payload": None, "saga_id": None}
    assert model_fields(first) | ignored == model_fields(second) | ignored

    # Each row handed over after the commit, as outbox_publish arranges it.
    def handed(callbacks) -> list:
        return [(c.func.__name__, c.args) for c in callbacks]

    assert handed(at_once_after) == [("hand_over_on_commit", (first.pk, "webhook.delivery"))]
    assert handed(one_by_one_after) == [("hand_over_on_commit", (second.pk, "webhook.delivery"))]
    # A second publish of the type for the saga writes nothing.
    with django_capture_on_commit_callbacks(execute=False) as again:
        assert publish(at_once.saga_id, data) == []
    assert again == [] and WebhookDelivery.objects.filter(saga_id=at_once.saga_id).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_moves_one_statement_key_share_locks_the_endpoints_it_writes_for(event, settings):
    """As the row-by-row read does (the test above it): a delete of an
    endpoint the move writes for waits for the move's commit, a change does
    not; an endpoint not subscribed to the type is not locked."""
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    listening = webhook_endpoint_create(url="http://127.0.0.1:9/a", events=["purchase.confirmed"])
    deaf = webhook_endpoint_create(url="http://127.0.0.1:9/b", events=["purchase.failed"])

    with _other_connection() as other, transaction.atomic():
        [written] = webhook_publish(
            event_type="purchase.confirmed",
            saga_id=uuid.uuid4(),
            event_id=event.pk,
            data={"purchase": {}},
            now=timezone.now(),
        )
        assert written.endpoint_id == listening.pk
        _assert_key_share_locked(other, locked=listening.pk, free=deaf.pk)


@pytest.mark.django_db(transaction=True)
def test_insert_or_lock_inserts_a_new_row_and_locks_an_existing_one_as_it_is():
    at = timezone.now()
    intent_id = f"pi_{uuid.uuid4().hex}"

    def attempt(status: str, amount: int) -> FakeIntent:
        return rows.insert_or_lock(
            FakeIntent(
                intent_id=intent_id,
                status=status,
                amount=amount,
                currency="EUR",
                payment_method="pm_card_visa",
                created=at,
                updated=at,
            )
        )

    with _other_connection() as other:
        with transaction.atomic():
            made = attempt("requires_payment", 2500)
            assert model_fields(made) == model_fields(FakeIntent.objects.get(pk=intent_id))

        with transaction.atomic():
            # The row as it is, not as the second attempt would have written it.
            again = attempt("canceled", 9)
            assert (again.status, again.amount) == ("requires_payment", 2500)
            assert model_fields(again) == model_fields(made)
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute(
                    "SELECT 1 FROM fake_gateway_fakeintent WHERE intent_id = %s FOR UPDATE NOWAIT",
                    [intent_id],
                )
        # Released with the commit.
        with other.transaction():
            other.execute(
                "SELECT 1 FROM fake_gateway_fakeintent WHERE intent_id = %s FOR UPDATE NOWAIT",
                [intent_id],
            )
    assert FakeIntent.objects.filter(pk=intent_id).count() == 1
