"""Every statement of a purchase's life finds its rows through an index on a
large table whose statistics were never gathered (an on-sale's first minutes,
or a server with autovacuum off, as make bench found one): the plan must not
depend on what ANALYZE would have said.

A statement that joins on the id alone of a table keyed (id, event_id), or
that ANDs a selective condition with one that matches every live row, is
planned from guesses there; make bench measured such a join (the seats of a
confirmation) as a scan of every seat, 24 ms per purchase at 180,000 seats.
"""

import json
import re
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from freezegun import freeze_time

from door.tickets import purchase_tickets, purchases_tickets
from outbox.delivery import claim_unfired
from outbox.services import outbox_publish
from outbox.sweeping import outbox_sweep
from purchases.models import Event, Refund
from purchases.refunds.opening import _links_of as refund_links_of
from purchases.saga.confirm import _links_of as confirm_links_of
from purchases.saga.confirm import reservation_links
from purchases.services import purchase_refund, saga_charge, saga_compensate
from webhooks import lock_objects as webhook_locks
from webhooks import selectors as webhook_selectors
from webhooks.models import WebhookDelivery
from webhooks.services import webhook_endpoint_create

from .conftest import drain_outbox, start_purchase
from .factories import EventFactory, OrganizerFactory, UserFactory
from .late_charge import charged_while_undone
from .webhook_receiver import Receiver

ROWS = 60_000

# The tables a purchase's statements touch that grow with sales.
LARGE = (
    "purchases_seat",
    "purchases_reservation",
    "purchases_reservationseat",
    "purchases_purchasesaga",
    "purchases_sagahistory",
    "outbox_outboxmessage",
    "outbox_inboxentry",
)

_FILL = [
    # Another event's seats, four per reservation below.
    """INSERT INTO purchases_seat (event_id, ref, row, number, price_amount, currency, status,
           section, category, x, y, accessible, block_reason)
       SELECT %(event)s, 'S' || n, 'S', n, 5000, 'EUR', 'held', '', '', 0, 0, false, ''
       FROM generate_series(1, 4 * %(rows)s) AS n""",
    """INSERT INTO purchases_reservation (event_id, ref, buyer_id, status, hold_expires_at,
           total_amount, currency, created_at)
       SELECT %(event)s, 'X' || n, %(buyer)s, 'held', now() + interval '1 hour', 5000,
           'EUR', now()
       FROM generate_series(1, %(rows)s) AS n""",
    # Every link live: the partial index of live links holds them all.
    """INSERT INTO purchases_reservationseat (event_id, reservation_id, seat_id, released_at)
       SELECT %(event)s, r.id, s.id, NULL
       FROM purchases_reservation r
       JOIN purchases_seat s ON s.event_id = r.event_id AND s.ref = 'S' || substr(r.ref, 2)
       WHERE r.event_id = %(event)s""",
    """INSERT INTO purchases_purchasesaga (id, event_id, reservation_id, buyer_id, intent_id,
           payment_method, amount, currency, state, version, attempts, created_at,
           updated_at, trace_context)
       SELECT gen_random_uuid(), %(event)s, r.id, %(buyer)s, 'pi_fill_' || r.id,
           'pm_card_visa', 5000, 'EUR', 'PENDING', 1, 0, now(), now(), ''
       FROM purchases_reservation r WHERE r.event_id = %(event)s""",
    """INSERT INTO purchases_sagahistory (saga_id, event_id, from_state, to_state, at, reason,
           actor, actor_name, version)
       SELECT id, event_id, '', 'PENDING', now(), 'filled', 'system', '', 1
       FROM purchases_purchasesaga WHERE event_id = %(event)s""",
    """INSERT INTO outbox_outboxmessage (topic, payload, key, event_id, created_at,
           available_at, completed_at, deliveries, attempts, last_error, trace_context)
       SELECT 'purchase.confirmed', '{}', 'fill:' || n, %(event)s, now(), now(), now(), 1, 0,
           '', ''
       FROM generate_series(1, %(rows)s) AS n""",
    # And as many holds still running: their expiry timers are rows not yet
    # done, all in the partial index of rows owed (outbox_due_idx).
    """INSERT INTO outbox_outboxmessage (topic, payload, key, event_id, created_at,
           available_at, due_at, deliveries, attempts, last_error, trace_context)
       SELECT 'purchase.hold_expired', '{}', 'hold:' || n, %(event)s, now(),
           now() + interval '1 day', now() + interval '1 day', 0, 0, '', ''
       FROM generate_series(1, %(rows)s) AS n""",
    """INSERT INTO outbox_inboxentry (consumer, message_id, event_id, processed_at)
       SELECT 'fill', id, event_id, now() FROM outbox_outboxmessage
       WHERE event_id = %(event)s AND completed_at IS NOT NULL""",
]


@dataclass(frozen=True)
class Crowd:
    buyer: User
    event: Event


def _truncate_large(*, ours: int | None) -> None:
    """Empty the large tables, their files new and their statistics gone,
    after checking that they hold no committed row but those of the event
    ``ours`` (every ``db`` test rolls back). CASCADE reaches the tables that
    reference them (a gateway answer names its saga), as empty."""
    with connection.cursor() as cursor:
        for table in LARGE:
            cursor.execute(
                f"SELECT NOT EXISTS (SELECT FROM {table} WHERE event_id IS DISTINCT FROM %s)",
                [ours],
            )
            assert cursor.fetchone()[0], f"{table} holds committed rows: not ours to truncate"
        cursor.execute(f"TRUNCATE {', '.join(LARGE)} CASCADE")


@pytest.fixture(scope="module")
def crowd(django_db_setup, django_db_blocker):
    """Sixty thousand sales of another event by alice and as many holds
    running, committed once for the module (the fill takes 9 s) and removed
    after its last test. Each test runs in a transaction rolled back at its
    end (``db``: what they check is plans, not locks or commits), so each
    finds the crowd as the fill left it."""
    with django_db_blocker.unblock():
        # As a transactional test before this one would have left them:
        # empty, no dead rows of the tests before (rolled back), no statistics.
        _truncate_large(ours=None)
        buyer = UserFactory(username="alice")
        organizer = OrganizerFactory(slug="crowd-venue")
        other = EventFactory(seats=[], organizer=organizer)
        try:
            with connection.cursor() as cursor:
                for sql in _FILL:
                    cursor.execute(sql, {"event": other.pk, "buyer": buyer.pk, "rows": ROWS})
            yield Crowd(buyer=buyer, event=other)
        finally:
            _truncate_large(ours=other.pk)
            other.delete()
            organizer.delete()
            buyer.delete()


def _assert_never_analyzed() -> None:
    with connection.cursor() as cursor:
        for table in LARGE:
            cursor.execute(
                "SELECT reltuples < 0 OR relpages = 0 FROM pg_class WHERE relname = %s", [table]
            )
            assert cursor.fetchone()[0], f"{table} has statistics: the test would prove nothing"


@pytest.fixture
def alice(crowd, db):
    """The crowd's buyer: the ``alice`` of these tests, committed with it."""
    return crowd.buyer


@pytest.fixture
def crowded(crowd, db):
    """Sixty thousand sales of another event and as many holds running,
    never analyzed: not before the test, nor after its EXPLAINs."""
    _assert_never_analyzed()
    yield crowd.event
    _assert_never_analyzed()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _plan(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


def _scans(sql: str, tables: tuple[str, ...] = LARGE) -> list[str]:
    """The sequential scans of the large tables in the statement's plan, its
    bitmap ANDs (the planner's way of combining two conditions it could not
    tell apart: a reservation's links AND every live link), and the rows
    looked for by id but read through another index."""
    plan = _plan(sql)
    scans = [t for t in re.findall(r"Seq Scan on (\w+)", plan) if t in tables]
    # A row named by its id but found by another index, the id a filter on
    # what that index returned (the delivery's lease read every row owed).
    by_other = re.findall(r"Filter: .*\(id = \d+\)", plan)
    return scans + ["BitmapAnd"] * plan.count("BitmapAnd") + ["id as a filter"] * len(by_other)


def _leading_columns(sql: str, table: str) -> list[str]:
    """The first column of each index of ``table`` the statement's plan reads."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
        plan = cursor.fetchone()[0]
        plan = plan if isinstance(plan, list) else json.loads(plan)
        names = []

        def walk(node):
            if "Index Name" in node:
                names.append(node["Index Name"])
            for child in node.get("Plans", []):
                walk(child)

        walk(plan[0]["Plan"])
        cursor.execute(
            "SELECT a.attname FROM unnest(%s::text[]) AS n (name)"
            " JOIN pg_class c ON c.relname = n.name JOIN pg_index i ON i.indexrelid = c.oid"
            " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
            " WHERE i.indrelid = %s::regclass",
            [names, table],
        )
        return [row[0] for row in cursor.fetchall()]


def _planned_by_guess(captured, tables: tuple[str, ...] = LARGE) -> list[str]:
    bad = []
    for query in captured:
        sql = query["sql"]
        if not re.match(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", sql, re.IGNORECASE):
            continue
        if scans := _scans(sql, tables):
            bad.append(f"{', '.join(scans)}: {sql[:300]}\n{_plan(sql)}")
    return bad


@pytest.mark.django_db
def test_a_purchases_statements_read_by_index_without_statistics(
    crowded, alice, gateway, receiver, settings
):
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    webhook_endpoint_create(
        url=receiver.url("/hook"),
        events=["purchase.confirmed", "purchase.failed", "purchase.refunded"],
        description="seller",
    )
    event = EventFactory(seats=["A1", "A2", "A3", "A4"])

    with CaptureQueriesContext(connection) as ctx:
        sold = start_purchase(alice, event, seats=["A1", "A2"])
        saga_charge(saga_id=sold.pk)
        declined = start_purchase(
            alice, event, seats=["A3"], payment_method="pm_card_chargeDeclined"
        )
        saga_charge(saga_id=declined.pk)
        drain_outbox()
        # A refund row (the purchase stays CONFIRMED), asked by its message.
        purchase_refund(saga_id=sold.pk, reason="the buyer asked")
        drain_outbox()
        # A compensation that owes a refund: a charge landed while undone.
        undone = saga_compensate(saga_id=charged_while_undone(alice, event, seats=["A4"]).pk)
        drain_outbox()

    sold.refresh_from_db()
    declined.refresh_from_db()
    assert (sold.state, declined.state, undone.state) == ("CONFIRMED", "COMPENSATED", "COMPENSATED")
    assert Refund.objects.get(saga_id=sold.pk).status == "succeeded"
    types = sorted(r.json["type"] for r in receiver.requests)
    assert types == [
        "purchase.confirmed",
        "purchase.failed",
        "purchase.refunded",
        "purchase.refunded",
    ], types
    bad = _planned_by_guess(ctx.captured_queries)
    assert bad == [], "\n\n".join(bad)


@pytest.mark.django_db
def test_the_reconcile_and_the_hold_expiry_read_by_index_without_statistics(
    crowded, alice, gateway, settings
):
    settings.PURCHASE_HOLD_SECONDS = 900
    event = EventFactory(seats=["A1", "A2"])

    with freeze_time("2026-12-02 12:00:00") as clock, CaptureQueriesContext(connection) as ctx:
        found = start_purchase(alice, event, seats=["A1"], payment_method="pm_card_timeout_charged")
        lost = start_purchase(alice, event, seats=["A2"], payment_method="pm_card_unreachable")
        saga_charge(saga_id=found.pk)
        saga_charge(saga_id=lost.pk)
        for _ in range(17):  # the probes, then the hold runs out
            clock.tick(60)
            drain_outbox()

    found.refresh_from_db()
    lost.refresh_from_db()
    assert (found.state, lost.state) == ("CONFIRMED", "COMPENSATED")
    bad = _planned_by_guess(ctx.captured_queries)
    assert bad == [], "\n\n".join(bad)


@pytest.mark.django_db
def test_the_limits_statements_read_by_index_without_statistics(crowded, alice):
    """Sixty thousand reservations of the same buyer for another event,
    never analyzed: the buyer's lock and the count of the buyer's seats
    each find their rows by an index (the limit per buyer:
    tests/test_purchase_rules.py)."""
    event = EventFactory(max_seats_per_buyer=4)
    start_purchase(alice, event, seats=["A1"])

    with CaptureQueriesContext(connection) as ctx:
        start_purchase(alice, event, seats=["A2"])

    sql = [q["sql"] for q in ctx.captured_queries]
    assert any("pg_advisory_xact_lock" in s for s in sql)
    [count] = [s for s in sql if "count(" in s.lower()]
    assert "reservation_event_buyer_idx" in _plan(count), _plan(count)
    bad = _planned_by_guess(ctx.captured_queries)
    assert bad == [], "\n\n".join(bad)


# The tests below add 60,000 rows each of their own, rolled back: dead rows
# that would make a table look larger to the plans of a test after them, so
# they come last, the one with rows in the LARGE tables last of all.

# A webhook endpoint's history: a delivery of every sale and its attempt.
_FILL_WEBHOOKS = [
    """INSERT INTO webhooks_webhookdelivery (endpoint_id, message_id, event_type, saga_id,
           event_id, body, status, armed_attempt, next_attempt_at, created_at, delivered_at,
           failed_at)
       SELECT %(endpoint)s, 'msg_' || replace(s.id::text, '-', ''), 'purchase.confirmed', s.id,
           s.event_id,
           '{}', 'delivered', 1, NULL, now(), now(), NULL
       FROM purchases_purchasesaga s WHERE s.event_id = %(event)s""",
    """INSERT INTO webhooks_webhookattempt (delivery_id, event_id, number, resend, at,
           status_code, latency_ms, error, response_excerpt)
       SELECT d.id, d.event_id, 1, false, now(), 204, 1.0, '', ''
       FROM webhooks_webhookdelivery d WHERE d.event_id = %(event)s""",
]
WEBHOOK_TABLES = ("webhooks_webhookdelivery", "webhooks_webhookattempt")


@pytest.mark.django_db
def test_a_sweeps_webhook_attempts_read_by_index_without_statistics(
    crowded, alice, gateway, receiver, settings
):
    """Sixty thousand deliveries and attempts of another event, never
    analyzed: the sweep's read of its claim (whether each attempt was made),
    its lock and its record, an attempt read alone, and a saga's and an
    endpoint's deliveries with their attempts (the admin, the API), each by
    index (the deliveries have no index of their own on the saga or the
    endpoint: webhooks/migrations/0004_fewer_indexes.py)."""
    settings.WEBHOOK_ALLOW_LOCAL_URLS = True
    endpoints = [
        webhook_endpoint_create(url=receiver.url(f"/{n}"), events=["purchase.confirmed"])
        for n in ("a", "b")
    ]
    with connection.cursor() as cursor:
        for sql in _FILL_WEBHOOKS:
            cursor.execute(sql, {"event": crowded.pk, "endpoint": endpoints[0].pk})
    event = EventFactory(seats=["A1"])
    saga_charge(saga_id=start_purchase(alice, event, seats=["A1"]).pk)

    with CaptureQueriesContext(connection) as ctx:
        assert outbox_sweep(topic="webhook.delivery", gather=0) == "delivered=2 failed=0"
        delivery = WebhookDelivery.objects.filter(endpoint=endpoints[0], event_id=event.pk).get()
        found = webhook_locks.delivery_with_attempt_made(delivery_id=delivery.pk, attempt=1)
        of_saga = webhook_selectors.deliveries_for_saga(saga_id=delivery.saga_id)
        of_endpoint = list(webhook_selectors.endpoint_deliveries(endpoint_id=endpoints[1].pk)[:20])

    assert found is not None and found[1] is True
    assert sorted(d.endpoint_id for d in of_saga) == sorted(e.pk for e in endpoints)
    assert [len(d.attempts.all()) for d in of_saga] == [1, 1]
    assert [d.saga_id for d in of_endpoint] == [delivery.saga_id]
    # Read through an index that leads with the saga, not a walk of a whole
    # index that holds it second (which no Seq Scan would show).
    saga_read = next(
        q["sql"]
        for q in ctx.captured_queries
        if 'FROM "webhooks_webhookdelivery"' in q["sql"] and '."saga_id" =' in q["sql"]
    )
    assert _leading_columns(saga_read, "webhooks_webhookdelivery") == ["saga_id"]
    assert sorted(r.path for r in receiver.requests) == ["/a", "/b"]
    bad = _planned_by_guess(ctx.captured_queries, tables=LARGE + WEBHOOK_TABLES)
    assert bad == [], "\n\n".join(bad)


@pytest.mark.django_db
def test_a_sweeps_claim_reads_only_the_rows_never_fired(crowded):
    """Sixty thousand webhook rows in flight (fired, due again within the
    grace): the claim of a sweep reads its own index, of rows never fired."""
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO outbox_outboxmessage (topic, payload, event_id, created_at,
                   available_at, due_at, fired_at, processing_until, deliveries, attempts,
                   last_error, trace_context)
               SELECT 'webhook.delivery', '{}', %(event)s, now(), now(),
                   now() + interval '20 s', now(), now() + interval '20 s', 0, 0, '', ''
               FROM generate_series(1, %(rows)s) AS n""",
            {"event": crowded.pk, "rows": ROWS},
        )
    with transaction.atomic():
        row = outbox_publish(topic="webhook.delivery", payload={}, event_id=crowded.pk)

    with CaptureQueriesContext(connection) as ctx:
        claimed = claim_unfired(topic="webhook.delivery", limit=5, now=timezone.now())

    assert [m.pk for m in claimed] == [row.pk]
    [claim] = [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().startswith("UPDATE")]
    assert "outbox_unfired_idx" in _plan(claim), _plan(claim)
    bad = _planned_by_guess(ctx.captured_queries)
    assert bad == [], "\n\n".join(bad)


# An index of one of these tables that leads with the event alone: read for
# a purchase, it walks every seat or link of a large event (figure 10's
# on-sale found the tickets' and the links' reads doing so, 150-1,000 ms
# each once its event's seats and links were many and never analyzed).
_EVENT_ONLY_INDEX = re.compile(r"Index Scan (?:Backward )?(?:using|on) (\w+_event_id_\w+)")
EVENT_WIDE = ("purchases_seat", "purchases_reservationseat")


def _event_walks(captured) -> list[str]:
    """Each captured statement whose plan reads a seat or a link table by an
    index of the event alone, with its plan."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = ANY(%s::regclass[]) AND i.indnatts = 1"
            " AND i.indkey[0] = (SELECT attnum FROM pg_attribute"
            "   WHERE attrelid = i.indrelid AND attname = 'event_id')",
            [list(EVENT_WIDE)],
        )
        event_only = {row[0] for row in cursor.fetchall()}
    assert event_only, "the tables have no index of the event alone: the test proves nothing"
    walks = []
    for query in captured:
        sql = query["sql"]
        if not re.match(r"\s*(SELECT|WITH)\b", sql, re.IGNORECASE):
            continue
        plan = _plan(sql)
        if set(_EVENT_ONLY_INDEX.findall(plan)) & event_only:
            walks.append(f"{sql[:300]}\n{plan}")
    return walks


@pytest.mark.django_db
def test_a_large_events_own_purchases_read_their_links_and_tickets_by_key(crowded, gateway):
    """The crowd's own event (240,000 seats, 60,000 reservations and their
    links, never analyzed): a purchase of two of its seats, confirmed, its
    email's tickets, and a refund's and a burst's read of its links, each
    find the purchase's links by its reservation and each seat by its key,
    never by walking the event."""
    buyer = UserFactory()
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO purchases_seat (event_id, ref, row, number, price_amount, currency,
                   status, section, category, x, y, accessible, block_reason)
               SELECT %s, 'A' || n, 'A', n, 5000, 'EUR', 'available', '', '', 0, 0, false, ''
               FROM generate_series(1, 2) AS n""",
            [crowded.pk],
        )
    sold = start_purchase(buyer, crowded, seats=["A1", "A2"])
    saga_charge(saga_id=sold.pk)
    sold.refresh_from_db()
    assert sold.state == "CONFIRMED"

    with CaptureQueriesContext(connection) as ctx:
        drain_outbox()
        single = purchase_tickets(saga_id=str(sold.pk), event_id=crowded.pk)
        many = purchases_tickets([(str(sold.pk), crowded.pk)])
        links = reservation_links(sold)
        burst_links = confirm_links_of(crowded.pk, [sold.reservation_id])
        refund_links = refund_links_of([sold])

    assert sorted(t.seat for t in single) == ["A1", "A2"]
    assert [t.code for t in many[str(sold.pk)]] == [t.code for t in single]
    assert sorted(link.seat_ref for link in links) == ["A1", "A2"]
    assert sorted(link.seat_ref for link in burst_links[sold.reservation_id]) == ["A1", "A2"]
    assert len(refund_links[sold.reservation_id]) == 2
    walks = _event_walks(ctx.captured_queries)
    assert walks == [], "\n\n".join(walks)
    bad = _planned_by_guess(ctx.captured_queries)
    assert bad == [], "\n\n".join(bad)
