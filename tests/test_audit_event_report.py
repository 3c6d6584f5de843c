"""The auditor's ``report_equals_ledger`` (purchases/ops/audit/event_reports.py):
the seller's report of an event (seller/reports.py) equals the ledger.

A clean run over every outcome, a refund in flight included, finds nothing,
and the report's money is then the ledger's with its categories adding up to
``net`` when no refund gave back money beside the seats it released (a
purchase with a refund is held to its refund rows by the refund checks
instead: tests/test_audit.py). Each row broken on purpose (a ledger row moved to another event, a
charge or a currency rewritten, a sold seat repriced, money kept by a
purchase that sold nothing) is named, with its event; an event that moves
while the auditor reads it is left to the next run, not misjudged; and the
check's statements do not grow with the number of events."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from freezegun import freeze_time

from ledger.models import LedgerEntry
from purchases.models import Event, PurchaseSaga, Refund, Seat
from purchases.ops.audit import audit_run, event_reports
from purchases.ops.audit.context import AuditContext
from purchases.ops.audit.report import REPORT_EQUALS_LEDGER
from purchases.services import By, organizer_refund, purchase_refund, saga_charge
from seller.reports import event_report

from .conftest import drain_outbox, start_purchase
from .factories import OrganizerFactory, UserFactory
from .test_seller_reads import event_with_categories

T0 = "2026-12-02 12:00:00"
SEATS = {
    "A1": ("stalls", 5000),
    "A2": ("stalls", 5000),
    "B1": ("balcony", 2500),
    "B2": ("balcony", 2500),
    "C1": ("", 1500),
}


@dataclass
class Story:
    event: Event
    other: Event
    confirmed: PurchaseSaga
    refunded: PurchaseSaga
    pending: PurchaseSaga


def _buy(user, event, seats, method="pm_card_visa") -> PurchaseSaga:
    return saga_charge(saga_id=start_purchase(user, event, seats=seats, payment_method=method).pk)


@pytest.fixture
def story(gateway, settings) -> Story:
    """Two events of two organizers: in the first, a confirmed purchase (A1,
    B1), one refunded (B2), one declined (A2), one held (C1); in the other,
    one confirmed purchase."""
    settings.PURCHASE_HOLD_SECONDS = 300
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    event = event_with_categories(OrganizerFactory(slug="riverside"), SEATS)
    other = event_with_categories(OrganizerFactory(slug="elsewhere"), SEATS)
    with freeze_time(T0):
        confirmed = _buy(alice, event, ["A1", "B1"])
        refunded = _buy(bob, event, ["B2"])
        purchase_refund(saga_id=refunded.pk, reason="asked", by=By.operator("carol"))
        _buy(bob, event, ["A2"], "pm_card_chargeDeclined")
        pending = start_purchase(alice, event, seats=["C1"])
        _buy(alice, other, ["A1"])
        drain_outbox()
    return Story(event, other, confirmed, refunded, pending)


def _named(report) -> list[str]:
    return [v.detail for v in report.violations if v.invariant == REPORT_EQUALS_LEDGER]


def _only_mine(report) -> list[str]:
    assert {v.invariant for v in report.violations} == {REPORT_EQUALS_LEDGER}, report.violations
    return _named(report)


def _sql(statement: str, *params) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


# --- clean ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_clean_run_finds_nothing_and_the_report_is_the_ledgers(story):
    with freeze_time(T0):
        report = audit_run()

    assert report.violations == []
    assert report.counts[REPORT_EQUALS_LEDGER] == 0
    money = event_report(event=story.event)
    assert (money["gross"]["amount"], money["refunded"]["amount"]) == (10000, 2500)
    assert money["net"]["amount"] == 7500 == sum(c["gross"]["amount"] for c in money["by_category"])


@pytest.mark.django_db
def test_a_refund_in_flight_keeps_its_money_and_the_run_clean(story, faulty_gateway):
    with freeze_time(T0):
        faulty_gateway.down("create_refund", times=1)  # the answer is lost: looked up later
        in_flight = purchase_refund(
            saga_id=story.confirmed.pk, reason="asked", by=By.operator("carol")
        )
        drain_outbox()
        assert in_flight.state == "CONFIRMED"
        assert Refund.objects.get(saga_id=in_flight.pk).status == "pending"

        report = audit_run()

    assert _named(report) == []
    money = event_report(event=story.event)
    # Its seats went back on sale with the refund's row; its money stays in
    # the ledger until the processor says it went back.
    assert money["seats"]["sold"] == 0
    assert money["net"]["amount"] == 7500
    assert sum(c["gross"]["amount"] for c in money["by_category"]) == 0


@pytest.mark.django_db
def test_a_part_refunded_keeps_the_run_clean(story, gateway):
    with freeze_time(T0):
        organizer_refund(
            organizer=story.event.organizer,
            saga_id=story.confirmed.pk,
            user=UserFactory(),
            reason="late start",
            amount=1000,
        )
        drain_outbox()

        assert _named(audit_run()) == []

    money = event_report(event=story.event)
    assert (money["net"]["amount"], money["seats"]["sold"]) == (6500, 2)


@pytest.mark.django_db
def test_the_command_prints_the_invariant(story):
    out = StringIO()

    with freeze_time(T0):
        call_command("audit_sagas", stdout=out)

    assert [REPORT_EQUALS_LEDGER, "ok"] in [line.split() for line in out.getvalue().splitlines()]


# --- broken on purpose ------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_ledger_row_moved_to_another_event_is_named_for_both(story):
    # The charge of the confirmed purchase now carries the other event's id:
    # the first report would lose 7500 and the second gain it.
    _sql(
        "UPDATE ledger_ledgerentry SET event_id = %s WHERE intent_id = %s",
        story.other.pk,
        story.confirmed.intent_id,
    )

    with freeze_time(T0):
        details = _only_mine(audit_run())

    # By event; the other event's own charge is its A1 (5000).
    assert details == [
        f"event {story.event.pk}: the ledger's charge entries carrying this event sum to 2500, "
        "those of its purchases' intents to 10000",
        f"event {story.other.pk}: the ledger's charge entries carrying this event sum to 12500, "
        "those of its purchases' intents to 5000",
    ]
    # The report counts the entries that are both: the moved charge in neither.
    assert event_report(event=story.event)["gross"]["amount"] == 2500
    assert event_report(event=story.other)["gross"]["amount"] == 5000


@pytest.mark.django_db
def test_a_sold_seat_repriced_is_named(story):
    # A price change must never reach a sold seat: B1 was sold at 2500.
    _sql(
        "UPDATE purchases_seat SET price_amount = 1000 WHERE event_id = %s AND ref = 'B1'",
        story.event.pk,
    )

    with freeze_time(T0):
        details = _only_mine(audit_run())

    assert details == [
        f"event {story.event.pk}: the ledger keeps 7500 for the purchases whose seats are sold, "
        "and those seats are priced 6000: the report's net and its sales by category disagree"
    ]
    money = event_report(event=story.event)
    assert sum(c["gross"]["amount"] for c in money["by_category"]) != money["net"]["amount"]


@pytest.mark.django_db
def test_a_charge_rewritten_in_the_ledger_is_named(story):
    _sql(
        "UPDATE ledger_ledgerentry SET amount = 7000 WHERE intent_id = %s AND kind = 'charge'",
        story.confirmed.intent_id,
    )

    with freeze_time(T0):
        report = audit_run()

    # The gateway's records disagree too: that is its own invariant.
    assert {v.invariant for v in report.violations} == {
        REPORT_EQUALS_LEDGER,
        "ledger_equals_gateway",
    }
    assert _named(report) == [
        f"event {story.event.pk}: the ledger keeps 7000 for the purchases whose seats are sold, "
        "and those seats are priced 7500: the report's net and its sales by category disagree"
    ]


@pytest.mark.django_db
def test_money_in_another_currency_is_named(story):
    _sql(
        "UPDATE ledger_ledgerentry SET currency = 'USD' WHERE intent_id = %s",
        story.refunded.intent_id,
    )

    with freeze_time(T0):
        details = _only_mine(audit_run())

    # The charge (2500) and its refund (-2500) net zero in dollars.
    assert details == [
        f"event {story.event.pk}: the ledger holds 0 USD for its purchases; the event and its "
        "report are in EUR"
    ]


@pytest.mark.django_db
def test_money_kept_by_a_purchase_that_sold_nothing_is_named(story):
    # A charge entry for the held purchase, which nothing confirmed: no seat
    # is sold for it, yet the report's net would count it.
    with freeze_time(T0):
        LedgerEntry.objects.create(
            intent_id=story.pending.intent_id,
            kind="charge",
            amount=1500,
            currency="EUR",
            saga_id=story.pending.pk,
            event_id=story.event.pk,
            created_at=timezone.now(),
        )
        details = _only_mine(audit_run())

    assert details == [
        f"event {story.event.pk}: the ledger keeps 1500 for purchases that hold no sold seat "
        "and were neither confirmed nor undone"
    ]


# --- what the check does not do ---------------------------------------------------------------


@pytest.mark.django_db
def test_an_event_that_moves_while_it_is_read_is_left_to_the_next_run(story, monkeypatch, caplog):
    # Between the ledger's read and the seats', the held purchase is charged:
    # its seat is sold and its money written after the ledger was read. On
    # that mix the event would look broken (seats priced 1500 more than the
    # money); its sagas' fingerprint says it moved.
    read_seats = event_reports._read_seats

    def charge_first(money):
        with freeze_time(T0):
            assert saga_charge(saga_id=story.pending.pk).state == "CONFIRMED"
        read_seats(money)

    monkeypatch.setattr(event_reports, "_read_seats", charge_first)
    caplog.set_level(logging.INFO, logger="purchases.ops.audit.event_reports")

    with freeze_time(T0):
        report = audit_run()

    assert _named(report) == []
    assert "1 event(s) moved during the report check" in caplog.text
    monkeypatch.setattr(event_reports, "_read_seats", read_seats)
    with freeze_time(T0):
        assert _named(audit_run()) == []  # judged by the next run, settled


@pytest.mark.django_db
def test_a_refund_made_while_it_is_read_is_left_to_the_next_run(story, monkeypatch, caplog):
    # Between the ledger's read and the seats', the confirmed purchase is
    # refunded: its seats go back on sale, its saga does not move. On that mix
    # the event would look broken; its refunds' fingerprint says it moved.
    read_seats = event_reports._read_seats

    def refund_first(money):
        with freeze_time(T0):
            purchase_refund(saga_id=story.confirmed.pk, reason="asked")
        read_seats(money)

    monkeypatch.setattr(event_reports, "_read_seats", refund_first)
    caplog.set_level(logging.INFO, logger="purchases.ops.audit.event_reports")

    with freeze_time(T0):
        report = audit_run()

    assert _named(report) == []
    assert "1 event(s) moved during the report check" in caplog.text


@pytest.mark.django_db
def test_the_check_does_not_grow_with_the_number_of_events(story, gateway):
    def statements() -> int:
        ctx = AuditContext(gateway=gateway, now=timezone.now(), cutoff=timezone.now())
        with CaptureQueriesContext(connection) as captured:
            event_reports.check_event_reports(ctx)
        assert ctx.report.violations == []
        return len(captured.captured_queries)

    few = statements()
    with freeze_time(T0):
        for n in range(3):
            event = event_with_categories(OrganizerFactory(slug=f"venue-{n}"), SEATS)
            _buy(UserFactory(), event, ["A1"])
    many = statements()

    assert Event.objects.count() == 5
    assert few == many == 7


@pytest.mark.django_db
def test_the_command_fails_naming_it(story):
    Seat.objects.filter(event=story.event, ref="A1").update(price_amount=1)
    out = StringIO()

    with freeze_time(T0), pytest.raises(CommandError):
        call_command("audit_sagas", stdout=out)

    table = dict(line.split() for line in out.getvalue().splitlines() if len(line.split()) == 2)
    assert table[REPORT_EQUALS_LEDGER] == "1"
