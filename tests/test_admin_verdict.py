"""The saga page for an operator at 3 a.m. (issue 12): the verdict at the top
of the saga page (``purchases.ops.verdict.saga_verdict``: what happened, what
is owed, what drives it next), one time format, collapsed payloads, no empty
sections, reservation and saga statuses that do not read as contradictions;
the list's payment method and status, "needs an operator", time in state,
short ids, with a number of queries that does not grow with the rows; and
money in its currency's decimals on every one of these pages."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.html import escape, strip_tags
from freezegun import freeze_time

from common.time import format_utc_seconds
from ledger.models import LedgerEntry
from outbox.models import OutboxMessage
from payments.interface import RefundOutcome, RefundResult
from purchases.models import GatewayAnswer, PurchaseSaga, Refund, SagaHistory
from purchases.ops.runbook import Action, action_run
from purchases.ops.sweeps import sweep_chase
from purchases.ops.verdict import Verdict, saga_verdict
from purchases.saga.states import SagaState
from purchases.selectors import saga_payment_status
from purchases.services import (
    DRIVES,
    event_create_with_seats,
    purchase_refund,
    saga_charge,
    saga_compensate,
    saga_transition,
)

from .conftest import drain_outbox, start_purchase
from .factories import EventFactory, OrganizerFactory, UserFactory
from .late_charge import charged_while_undone

CHANGELIST = "/admin/purchases/purchasesaga/"
T0 = "2026-12-02 12:00:00"
BACKOFF = [60, 120, 240, 480, 960, 1920]


def change_url(saga) -> str:
    return f"{CHANGELIST}{saga.pk}/change/"


@pytest.fixture(autouse=True)
def _defaults(settings):
    settings.PURCHASE_HOLD_SECONDS = 900
    settings.RECONCILE_BACKOFF_SECONDS = BACKOFF
    settings.RESUME_AFTER_SECONDS = 300
    settings.COMPENSATION_DEADLINE_SECONDS = 86400


@pytest.fixture
def two_seats(db):
    return EventFactory(seats=["A1", "A2", "A3", "A4", "A5", "A6", "A7", "A8"])


@pytest.fixture
def op_client(client, db):
    user = UserFactory(username="carol", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="purchases",
            codename__in=["view_purchasesaga", "run_saga_runbook"],
        )
    )
    client.force_login(user)
    return client


def _fresh(saga) -> PurchaseSaga:
    return PurchaseSaga.objects.get(pk=saga.pk)


def _charge_ref(saga) -> str:
    return LedgerEntry.objects.get(intent_id=saga.intent_id, kind="charge").gateway_reference


class _NotCharged:
    """The gateway's definitive "not_charged" to a refund."""

    def __init__(self, gateway):
        self.gateway = gateway

    def __call__(self, intent_id, *, idempotency_key):
        self.gateway.calls.append(("refund", intent_id))
        return RefundResult(RefundOutcome.NOT_CHARGED, detail="not_charged")


# --- common.time --------------------------------------------------------------------


def test_format_utc_seconds_is_utc_to_the_second():
    from zoneinfo import ZoneInfo  # only this test needs a zone other than UTC

    paris = datetime(2026, 12, 2, 13, 0, 5, 987654, tzinfo=ZoneInfo("Europe/Paris"))

    assert format_utc_seconds(paris) == "2026-12-02 12:00:05 UTC"
    assert format_utc_seconds(datetime(2026, 12, 2, 12, 0, tzinfo=UTC)) == "2026-12-02 12:00:00 UTC"
    assert format_utc_seconds(None) == "—"


# --- the verdict, state by state ------------------------------------------------------
#
# Each builds the saga through the services (the fixtures' fake gateway), at
# frozen times, then reads its verdict. The verdict reads the saga's rows and
# nothing else: it never asks the gateway and writes nothing.

SETTLED = "Nothing: the purchase is settled."


@pytest.mark.django_db
def test_verdict_of_a_visa_purchase(alice, event, gateway):
    with freeze_time(T0):
        saga = saga_charge(saga_id=start_purchase(alice, event).pk)
        drain_outbox()
        verdict = saga_verdict(_fresh(saga))

    assert isinstance(verdict, Verdict)
    assert verdict.headline == (
        f"charged 25.00 EUR once ({_charge_ref(saga)}), 1 seat sold (A1), "
        "confirmation email sent 2026-12-02 12:00:00 UTC"
    )
    assert verdict.next_step == SETTLED
    assert verdict.needs_operator is False
    assert any("charge succeeded" in line for line in verdict.details)


@pytest.mark.django_db
def test_verdict_of_a_declined_purchase(alice, event, gateway):
    with freeze_time(T0):
        saga = start_purchase(alice, event, payment_method="pm_card_chargeDeclined")
        assert saga_charge(saga_id=saga.pk).state == "COMPENSATED"
        drain_outbox()
        verdict = saga_verdict(_fresh(saga))

    assert verdict.headline == (
        "not charged, 1 seat released (A1), failure email sent 2026-12-02 12:00:00 UTC"
    )
    assert verdict.next_step == SETTLED
    assert verdict.needs_operator is False
    assert any("declined" in line for line in verdict.details)


@pytest.mark.django_db
def test_verdict_of_a_reconciled_purchase(alice, event, gateway):
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
        assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"
        clock.tick(60)
        drain_outbox()
        assert _fresh(saga).state == "CONFIRMED"
        verdict = saga_verdict(_fresh(saga))

    assert verdict.headline == (
        f"charged 25.00 EUR once ({_charge_ref(saga)}), 1 seat sold (A1), "
        "confirmation email sent 2026-12-02 12:01:00 UTC"
    )
    assert verdict.next_step == SETTLED
    assert verdict.needs_operator is False
    assert any("reconciled" in line and "probe 1" in line for line in verdict.details)


@pytest.mark.django_db
def test_verdict_of_a_refunded_purchase(alice, two_seats, gateway):
    with freeze_time(T0) as clock:
        saga = saga_charge(saga_id=start_purchase(alice, two_seats, seats=["A1", "A2"]).pk)
        drain_outbox()
        clock.tick(600)
        assert purchase_refund(saga_id=saga.pk, reason="customer asked").state == "CONFIRMED"
        drain_outbox()
        verdict = saga_verdict(_fresh(saga))

    refund = Refund.objects.get(saga_id=saga.pk)
    assert verdict.headline == (
        f"charged 50.00 EUR once ({_charge_ref(saga)}), 2 seats given back by refunds "
        "(A1, A2), confirmation email sent 2026-12-02 12:00:00 UTC; refunded 50.00 EUR in "
        "full, refund email sent 2026-12-02 12:10:00 UTC"
    )
    assert verdict.next_step == SETTLED
    assert verdict.needs_operator is False
    assert (
        f"refund {refund.pk} of 50.00 EUR: customer service refunded 2026-12-02 12:10:00 UTC, "
        "succeeded 2026-12-02 12:10:00 UTC; for seats A1, A2; released A1, A2; "
        "asked of the processor; "
        f"processor's {refund.processor_ref}; why: customer asked"
    ) in verdict.details


@pytest.mark.django_db
def test_verdict_of_a_refund_in_flight_and_of_one_the_processor_refused(
    alice, bob, two_seats, faulty_gateway
):
    with freeze_time(T0) as clock:
        saga = saga_charge(saga_id=start_purchase(alice, two_seats, seats=["A1", "A2"]).pk)
        drain_outbox()
        faulty_gateway.down("create_refund", times=1)
        purchase_refund(saga_id=saga.pk, reason="customer asked")
        drain_outbox()  # asked; the answer lost: looked up on the backoff
        in_flight = saga_verdict(_fresh(saga))
        refused = saga_charge(
            saga_id=start_purchase(
                bob, two_seats, seats=["A3"], payment_method="pm_card_refundFail"
            ).pk
        )
        purchase_refund(saga_id=refused.pk, reason="customer asked")
        clock.tick(5)
        drain_outbox()
        failed = saga_verdict(_fresh(refused))

    assert in_flight.headline.endswith("; a refund of 50.00 EUR pending")
    assert in_flight.next_step.startswith("The refund is looked up of the processor at ")
    assert in_flight.needs_operator is False
    assert any("armed: the refund's deadline at" in line for line in in_flight.details)
    refund = Refund.objects.get(saga_id=refused.pk)
    assert f"a refund of 25.00 EUR FAILED ({refund.detail})" in failed.headline
    assert failed.next_step.startswith(f"An operator decides about the refused refund {refund.pk}")
    assert failed.needs_operator is True
    assert any(
        line.startswith("alert raised") and "(unanswered)" in line for line in failed.details
    )


@pytest.mark.django_db
def test_verdict_of_an_unknown_with_its_probe_armed(alice, event, gateway):
    with freeze_time(T0):
        saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
        assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"
        calls = list(gateway.calls)
        verdict = saga_verdict(_fresh(saga))

    assert verdict.headline == (
        "UNKNOWN: not known yet whether 25.00 EUR was charged (the charge's answer was lost: "
        "timeout); 1 seat held (A1)"
    )
    assert verdict.next_step == (
        "Reconcile probe 1 of 6 at 2026-12-02 12:01:00 UTC; the hold expires "
        "2026-12-02 12:15:00 UTC, then the intent is cancelled and the purchase compensated "
        "(or confirmed, if the gateway says it was charged). Should it stop moving, the "
        f"resumer will act: {DRIVES[SagaState.UNKNOWN].why}."
    )
    assert verdict.needs_operator is False
    assert gateway.calls == calls  # a verdict never asks the gateway


@pytest.mark.django_db
def test_verdict_of_an_escalated_unknown_expired(alice, event, faulty_gateway, settings):
    settings.RECONCILE_BACKOFF_SECONDS = [60]
    settings.PURCHASE_HOLD_SECONDS = 4 * 3600
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
        faulty_gateway.down("retrieve")
        assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"
        clock.tick(60)
        drain_outbox()
        assert _fresh(saga).state == "UNKNOWN_EXPIRED"
        verdict = saga_verdict(_fresh(saga))

    assert verdict.headline == (
        "UNKNOWN_EXPIRED: needs an operator (alert raised 2026-12-02 12:01:00 UTC: "
        "reconciliation exhausted) — not known whether 25.00 EUR was charged; "
        "1 seat held (A1)"
    )
    assert verdict.next_step == (
        "Check the gateway (“Ask the gateway”), then confirm after manual check (charged) "
        "or compensate after manual check (not charged); nothing automatic decides it. "
        "Meanwhile the hold expiry at 2026-12-02 16:00:00 UTC cancels the intent and "
        "compensates, or confirms if the gateway says it was charged."
    )
    assert verdict.needs_operator is True


@pytest.mark.django_db
def test_verdict_of_a_compensation_pending_retrying_the_refund(alice, event, faulty_gateway):
    with freeze_time(T0) as clock:
        saga = charged_while_undone(alice, event)
        clock.tick(600)
        faulty_gateway.down("refund", times=1)
        assert saga_compensate(saga_id=saga.pk).state == "COMPENSATION_PENDING"
        verdict = saga_verdict(_fresh(saga))

    assert verdict.headline == (
        "COMPENSATION_PENDING: refund of 25.00 EUR not confirmed yet (the gateway answered "
        "unknown: timeout, 2026-12-02 12:10:00 UTC); retrying; 1 seat still held (A1)"
    )
    assert verdict.next_step == (
        "Refund retry 1 at 2026-12-02 12:11:00 UTC; the hold expiry at 2026-12-02 12:15:00 "
        "UTC pushes the compensation along; the chaser alerts if "
        "it is not refunded by 2026-12-03 12:10:00 UTC. Should it stop moving, the resumer "
        f"will act: {DRIVES[SagaState.COMPENSATION_PENDING].why}."
    )
    assert verdict.needs_operator is False


@pytest.mark.django_db
def test_verdict_of_a_compensation_pending_waiting_for_an_operator(
    alice, event, gateway, monkeypatch
):
    with freeze_time(T0) as clock:
        saga = charged_while_undone(alice, event)
        clock.tick(600)
        monkeypatch.setattr(gateway, "refund", _NotCharged(gateway))
        assert saga_compensate(saga_id=saga.pk).state == "COMPENSATION_PENDING"
        drain_outbox()
        assert _fresh(saga).awaiting_operator_since is not None
        verdict = saga_verdict(_fresh(saga))

    assert verdict.headline == (
        "COMPENSATION_PENDING: needs an operator since 2026-12-02 12:10:00 UTC — the gateway "
        "says there is no charge to refund (not_charged) while the ledger holds 25.00 EUR "
        f"({_charge_ref(saga)}); 1 seat still held (A1)"
    )
    assert verdict.next_step == (
        "Compare the ledger with the gateway's view (“Ask the gateway”), then confirm after "
        "manual check (the gateway holds none of the money) or compensate after manual check "
        "(retry the refund); no retry or resumer moves it."
    )
    assert verdict.needs_operator is True
    # raised by the compensation's refund, in its commit: unanswered
    assert (
        "alert raised 2026-12-02 12:10:00 UTC: the gateway has no charge for a refund the "
        "ledger owes (unanswered)" in verdict.details
    )


# The states the brief does not list: each live one still names what drives it
# next, from the driver table the resumer uses.
def _to(*states):
    def build(alice, event):
        saga = start_purchase(alice, event)
        for state in states:
            saga = saga_transition(saga_id=saga.pk, to=state, reason=f"test: {state}")
        return saga

    return build


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("state", "build"),
    [
        ("PENDING", _to()),
        ("CHARGING", _to("CHARGING")),
        ("PAYMENT_FAILED", _to("CHARGING", "PAYMENT_FAILED")),
        ("EXPIRED", _to("EXPIRED")),
        ("COMPENSATING", _to("EXPIRED", "COMPENSATING")),
    ],
)
def test_every_live_state_names_what_drives_it_next(alice, event, gateway, state, build):
    with freeze_time(T0):
        saga = build(alice, event)
        verdict = saga_verdict(_fresh(saga))

    assert verdict.headline.startswith(f"{state}: ")
    assert DRIVES[state].why in verdict.next_step
    assert "2026-12-02 12:05:00 UTC" in verdict.next_step  # the resumer's earliest go
    assert "1 seat held (A1)" in verdict.headline or "1 seat still held (A1)" in verdict.headline
    assert verdict.needs_operator is False


@pytest.mark.django_db
def test_an_unanswered_alert_needs_an_operator_until_one_acts(
    alice, event, faulty_gateway, settings
):
    settings.COMPENSATION_DEADLINE_SECONDS = 3600
    with freeze_time(T0) as clock:
        saga = charged_while_undone(alice, event)
        faulty_gateway.down("refund")
        saga_compensate(saga_id=saga.pk)
        clock.tick(2 * 3600)
        sweep_chase()  # past the deadline: one alert
        raised = saga_verdict(_fresh(saga))
        clock.tick(60)
        action_run(
            saga_id=saga.pk,
            action=Action.COMPENSATE_MANUAL,
            operator="carol",
            reason="gateway down, retrying by hand",
            gateway=faulty_gateway,
        )
        answered = saga_verdict(_fresh(saga))

    assert _fresh(saga).state == "COMPENSATION_PENDING"
    assert raised.needs_operator is True
    assert "alert raised 2026-12-02 14:00:00 UTC" in raised.headline
    assert answered.needs_operator is False


@pytest.mark.django_db
def test_a_dead_letter_needs_an_operator(op_client, alice, event, gateway):
    with freeze_time(T0):
        saga = saga_charge(saga_id=start_purchase(alice, event).pk)
        # the confirmation's redelivery schedule ran out (as the relay marks it)
        OutboxMessage.objects.filter(saga_id=saga.pk, topic="purchase.confirmed").update(
            dead_at=timezone.now(),
            fired_at=timezone.now(),
            deliveries=13,
            last_error="purchases.consumers.confirmation_email: SMTPException: down",
        )
        verdict = saga_verdict(_fresh(saga))
        listing = op_client.get(CHANGELIST).content.decode()

    assert verdict.needs_operator is True
    assert verdict.headline.endswith(
        "confirmation email NOT sent: a dead letter since 2026-12-02 12:00:00 UTC"
    )
    assert verdict.next_step.startswith("Fix the failing consumer, then replay the dead letter")
    assert _cell(_row(listing, saga), "needs_operator") == "yes"


@pytest.mark.django_db
def test_a_verdict_reads_and_writes_nothing_else(alice, event, gateway):
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    drain_outbox()
    counts = (
        SagaHistory.objects.count(),
        OutboxMessage.objects.count(),
        LedgerEntry.objects.count(),
        GatewayAnswer.objects.count(),
    )
    calls = list(gateway.calls)

    with CaptureQueriesContext(connection) as queries:
        saga_verdict(_fresh(saga))

    assert gateway.calls == calls
    assert (
        SagaHistory.objects.count(),
        OutboxMessage.objects.count(),
        LedgerEntry.objects.count(),
        GatewayAnswer.objects.count(),
    ) == counts
    assert all(q["sql"].lstrip().upper().startswith("SELECT") for q in queries.captured_queries)


# --- the saga page --------------------------------------------------------------------


def _unknown(alice, event):
    saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
    assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"
    return _fresh(saga)


@pytest.mark.django_db
def test_the_saga_page_opens_with_the_verdict(op_client, alice, event, gateway):
    with freeze_time(T0):
        saga = _unknown(alice, event)
        response = op_client.get(change_url(saga))
        expected = saga_verdict(saga)

    html = response.content.decode()
    verdict = response.context["verdict"]
    assert verdict == expected
    box = html.index('id="saga-verdict"')
    assert box < html.index('id="purchasesaga_form"')  # above everything else
    assert escape(verdict.headline) in html
    assert escape(verdict.next_step) in html


@pytest.mark.django_db
def test_an_escalated_saga_page_says_it_needs_an_operator_in_the_verdict(
    op_client, alice, event, gateway
):
    saga = _unknown(alice, event)
    saga = saga_transition(
        saga_id=saga.pk, to=SagaState.UNKNOWN_EXPIRED, reason="schedule exhausted"
    )

    html = op_client.get(change_url(saga)).content.decode()

    assert 'class="saga-verdict saga-verdict-needs-operator"' in html
    verdict_box = html[html.index('id="saga-verdict"') : html.index('id="purchasesaga_form"')]
    assert "needs an operator" in verdict_box.lower()


_TIMES = re.compile(
    r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(?::\d{2})?(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2}| UTC)?"
)
_DJANGO_DATES = re.compile(
    r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\w*\.? \d{1,2}, \d{4}"
)


def _outside_payloads(html: str) -> str:
    return re.sub(r'<details class="saga-payload">.*?</details>', "", html, flags=re.S)


@pytest.mark.django_db
def test_the_saga_page_writes_every_time_one_way(op_client, alice, event, gateway):
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
        saga_charge(saga_id=saga.pk)
        clock.tick(60)
        drain_outbox()
        saga = purchase_refund(saga_id=saga.pk, reason="asked")
        drain_outbox()
        response = op_client.get(change_url(saga), {"gateway": "1"})

    html = _outside_payloads(response.content.decode())
    times = _TIMES.findall(html)
    assert times, "no time on the page?"
    assert {
        t for t in times if not re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC", t)
    } == set()
    assert _DJANGO_DATES.findall(html) == []
    assert "noon" not in html and "midnight" not in html
    assert "2026-12-02 12:00:00 UTC" in html and "2026-12-02 12:01:00 UTC" in html


@pytest.mark.django_db
def test_payloads_are_collapsed(op_client, alice, event, gateway):
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    drain_outbox()
    rows = OutboxMessage.objects.filter(saga_id=saga.pk).count()

    html = op_client.get(change_url(saga)).content.decode()

    assert rows >= 2
    assert html.count('<details class="saga-payload">') == rows
    assert '"saga_id": ' not in _outside_payloads(html)


@pytest.mark.django_db
def test_a_section_without_rows_says_so_in_one_line(op_client, alice, event, gateway):
    saga = start_purchase(alice, event)  # no gateway answer, no ledger entry yet

    html = op_client.get(change_url(saga)).content.decode()

    assert "<td colspan" not in html  # no table whose only row says it is empty
    assert "Nothing asked of the gateway yet." in html
    assert "No ledger entries: no charge recorded." in html
    assert '<th colspan="2">net</th>' not in html


@pytest.mark.django_db
def test_reservation_and_saga_statuses_read_together(op_client, alice, bob, two_seats, gateway):
    in_flight = _unknown(alice, two_seats)
    sold = saga_charge(saga_id=start_purchase(alice, two_seats, seats=["A2"]).pk)
    refunded = purchase_refund(saga_id=sold.pk, reason="asked")
    resold = saga_charge(saga_id=start_purchase(bob, two_seats, seats=["A2"]).pk)
    undone = saga_compensate(saga_id=charged_while_undone(alice, two_seats, seats=["A3"]).pk)

    def page(saga):
        return op_client.get(change_url(saga)).content.decode()

    assert "HELD while the purchase is in flight (the saga is UNKNOWN)" in page(in_flight)
    assert "CONFIRMED: the seats are sold (the saga is CONFIRMED)" in page(resold)
    assert "CANCELLED because the saga is COMPENSATED" in page(undone)
    refunded_page = page(refunded)
    # A refund gives seats back, the purchase stays CONFIRMED; the seat went
    # to bob since: not this reservation's any more.
    assert "1 seat given back by refunds (A2)" in refunded_page
    assert "; now sold to another purchase" in refunded_page


# --- the list -----------------------------------------------------------------------


def _row(html: str, saga) -> str:
    [row] = [r for r in re.findall(r"<tr.*?</tr>", html, flags=re.S) if f'title="{saga.pk}"' in r]
    return row


def _cell(row: str, column: str) -> str:
    found = re.search(rf'<t[dh] class="field-{column}[^"]*">(.*?)</t[dh]>', row, flags=re.S)
    assert found, f"no {column} column"
    return strip_tags(found.group(1)).replace("&nbsp;", "").strip()


def _zoo(alice, bob, event, gateway, monkeypatch):
    """One saga per column value the list must show."""
    visa = saga_charge(saga_id=start_purchase(alice, event, seats=["A1"]).pk)
    pending = start_purchase(bob, event, seats=["A2"])
    unknown = saga_charge(
        saga_id=start_purchase(
            alice, event, seats=["A3"], payment_method="pm_card_timeout_charged"
        ).pk
    )
    escalated = saga_charge(
        saga_id=start_purchase(
            bob, event, seats=["A4"], payment_method="pm_card_timeout_charged"
        ).pk
    )
    escalated = saga_transition(
        saga_id=escalated.pk, to=SagaState.UNKNOWN_EXPIRED, reason="exhausted"
    )
    declined = saga_charge(
        saga_id=start_purchase(
            alice, event, seats=["A5"], payment_method="pm_card_chargeDeclined"
        ).pk
    )
    refunded = purchase_refund(
        saga_id=saga_charge(saga_id=start_purchase(bob, event, seats=["A6"]).pk).pk, reason="asked"
    )
    drain_outbox()  # the refund row's message asks the processor
    waiting = charged_while_undone(alice, event, seats=["A7"])
    with monkeypatch.context() as patch:
        patch.setattr(gateway, "refund", _NotCharged(gateway))
        waiting = saga_compensate(saga_id=waiting.pk)
    return {
        "visa": visa,
        "pending": pending,
        "unknown": unknown,
        "escalated": escalated,
        "declined": declined,
        "refunded": refunded,
        "waiting": waiting,
    }


@pytest.mark.django_db
def test_the_list_shows_payment_needs_an_operator_and_time_in_state(
    op_client, alice, bob, two_seats, gateway, monkeypatch
):
    with freeze_time(T0) as clock:
        sagas = _zoo(alice, bob, two_seats, gateway, monkeypatch)
        clock.tick(3 * 60)
        response = op_client.get(CHANGELIST)

    assert response.status_code == 200
    html = response.content.decode()
    rows = {name: _row(html, s) for name, s in sagas.items()}
    status = {name: _cell(row, "payment_status") for name, row in rows.items()}
    assert status == {name: saga_payment_status(_fresh(s)) for name, s in sagas.items()}
    assert status == {
        "visa": "captured",
        "pending": "not_started",
        "unknown": "unknown",
        "escalated": "unknown",
        "declined": "not_captured",
        "refunded": "refunded",
        "waiting": "captured",
    }
    needs = {name: _cell(row, "needs_operator") == "yes" for name, row in rows.items()}
    assert needs == {name: saga_verdict(_fresh(s)).needs_operator for name, s in sagas.items()}
    assert {name for name, yes in needs.items() if yes} == {"escalated", "waiting"}
    assert _cell(rows["declined"], "payment_method") == "pm_card_chargeDeclined"
    assert {_cell(row, "in_state") for row in rows.values()} == {"3\xa0minutes"}


@pytest.mark.django_db
def test_the_needs_an_operator_filter(op_client, alice, bob, two_seats, gateway, monkeypatch):
    sagas = _zoo(alice, bob, two_seats, gateway, monkeypatch)

    yes = op_client.get(CHANGELIST, {"needs_operator": "yes"})
    no = op_client.get(CHANGELIST, {"needs_operator": "no"})

    assert {s.pk for s in yes.context["cl"].result_list} == {
        sagas["escalated"].pk,
        sagas["waiting"].pk,
    }
    assert len(no.context["cl"].result_list) == len(sagas) - 2


@pytest.mark.django_db
def test_the_list_shows_short_ids_with_the_full_id_at_hand(op_client, alice, event, gateway):
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    full = str(saga.pk)

    html = op_client.get(CHANGELIST).content.decode()
    found = op_client.get(CHANGELIST, {"q": full[:8]})
    found_upper = op_client.get(CHANGELIST, {"q": full[:8].upper()})

    assert f'title="{full}"' in html
    assert f">{full[:8]}<" in html  # what the eye scans
    assert full[8:] in html  # the rest is there to copy (selected with the short part)
    assert [s.pk for s in found.context["cl"].result_list] == [saga.pk]
    assert [s.pk for s in found_upper.context["cl"].result_list] == [saga.pk]


def _list_queries(client) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(CHANGELIST)
    assert response.status_code == 200
    return len(queries.captured_queries)


@pytest.mark.django_db
def test_the_list_reads_the_same_number_of_queries_for_2_and_10_sagas(
    op_client, alice, bob, gateway, monkeypatch
):
    event = EventFactory(seats=[f"A{n}" for n in range(1, 11)])

    def add(n, seat):
        builders = [
            lambda: saga_charge(saga_id=start_purchase(alice, event, seats=[seat]).pk),
            lambda: start_purchase(bob, event, seats=[seat]),
            lambda: purchase_refund(
                saga_id=saga_charge(saga_id=start_purchase(alice, event, seats=[seat]).pk).pk,
                reason="asked",
            ),
            lambda: saga_transition(
                saga_id=saga_charge(
                    saga_id=start_purchase(
                        bob, event, seats=[seat], payment_method="pm_card_timeout_charged"
                    ).pk
                ).pk,
                to=SagaState.UNKNOWN_EXPIRED,
                reason="exhausted",
            ),
            lambda: saga_charge(
                saga_id=start_purchase(
                    alice, event, seats=[seat], payment_method="pm_card_chargeDeclined"
                ).pk
            ),
        ]
        builders[n % len(builders)]()

    for n in range(2):
        add(n, f"A{n + 1}")
    drain_outbox()
    two = _list_queries(op_client)
    for n in range(2, 10):
        add(n, f"A{n + 1}")
    drain_outbox()
    ten = _list_queries(op_client)

    assert PurchaseSaga.objects.count() == 10
    assert ten == two, f"{two} queries for 2 sagas, {ten} for 10"


# --- money in its currency's decimals, on every page ----------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("currency", "price", "shown", "wrong"),
    [
        ("KWD", 1234, "1.234 KWD", "12.34"),
        ("JPY", 5000, "5,000 JPY", "50.00"),
    ],
)
def test_every_amount_on_the_saga_pages_has_its_currencys_decimals(
    op_client, alice, gateway, currency, price, shown, wrong
):
    event = event_create_with_seats(
        organizer=OrganizerFactory(),
        name=f"{currency} night",
        rows="A",
        seats_per_row=1,
        starts_at=timezone.now() + timedelta(days=7),
        price_amount=price,
        currency=currency,
    )
    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    drain_outbox()
    selected = {"_selected_action": [str(saga.pk)], "action": "refund"}

    listing = op_client.get(CHANGELIST).content.decode()
    page = op_client.get(change_url(saga), {"gateway": "1"}).content.decode()
    dry_run = op_client.post(CHANGELIST, {**selected, "index": "0"}).content.decode()
    results = op_client.post(CHANGELIST, {**selected, "confirm": "yes", "reason": "asked"})
    drain_outbox()  # the refund row's message asks the processor
    refunded = op_client.get(change_url(saga)).content.decode()

    assert f'<td class="field-total">{shown}</td>' in listing
    assert f"charged {shown} once" in page
    assert f"open a refund of {shown}" in dry_run and f"refund -{shown}" in dry_run
    assert f"open a refund of {shown}" not in results.content.decode()  # done, not planned
    assert f"refunded {shown} in full" in refunded and f"-{shown}" in refunded
    for html in (listing, page, dry_run, results.content.decode(), refunded):
        assert wrong not in _outside_payloads(html)
