"""The operators' admin: the saga list (filters, search), the read-only saga
page with its timeline and the live gateway view, and the runbook actions
(dry run, reason, per-row results, admin log, permissions).

The refund opens a refund row of a confirmed purchase, which stays CONFIRMED
(docs/refunds.md); the processor is asked by the row's message after the
commit. A compensation that owes a refund is one whose charge landed while
the purchase was undone (tests/late_charge.py)."""

from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.utils import timezone
from freezegun import freeze_time

from ledger.models import LedgerEntry
from outbox.models import OutboxMessage
from purchases.models import GatewayAnswer, PurchaseSaga, Refund, SagaHistory, Seat
from purchases.saga.states import SagaState
from purchases.services import By, saga_charge, saga_compensate, saga_transition

from .conftest import drain_outbox, start_purchase
from .factories import EventFactory, UserFactory
from .late_charge import charged_while_undone

CHANGELIST = "/admin/purchases/purchasesaga/"
T0 = "2026-12-02 12:00:00"
BACKOFF = [60, 120, 240, 480, 960, 1920]
SEATS = [f"A{n}" for n in range(1, 9)]
RUNBOOK_TEMPLATES = {
    "admin/purchases/purchasesaga/runbook_confirm.html",
    "admin/purchases/purchasesaga/runbook_result.html",
}


def change_url(saga) -> str:
    return f"{CHANGELIST}{saga.pk}/change/"


@pytest.fixture
def big_event(db):
    return EventFactory(seats=SEATS)


def _staff(username, *codenames):
    user = UserFactory(username=username, is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="purchases", codename__in=codenames)
    )
    return user


@pytest.fixture
def operator(db):
    """On call: may view sagas and run the runbook (not a superuser)."""
    return _staff("carol", "view_purchasesaga", "run_saga_runbook")


@pytest.fixture
def viewer(db):
    """Staff who may look, not act."""
    return _staff("dave", "view_purchasesaga")


@pytest.fixture
def op_client(client, operator):
    client.force_login(operator)
    return client


@pytest.fixture
def long_hold(settings):
    settings.PURCHASE_HOLD_SECONDS = 4 * 3600
    settings.RECONCILE_BACKOFF_SECONDS = BACKOFF


# --- driving sagas into states (through the services) --------------------------------


def _state(saga) -> str:
    return PurchaseSaga.objects.get(pk=saga.pk).state


def pending(user, event, seat, **kw):
    return start_purchase(user, event, seats=[seat], **kw)


def confirmed(user, event, seat, **kw):
    saga = saga_charge(saga_id=pending(user, event, seat, **kw).pk, now=kw.get("now"))
    assert saga.state == "CONFIRMED"
    return saga


def unknown(user, event, seat, payment_method="pm_card_timeout_charged"):
    saga = saga_charge(saga_id=pending(user, event, seat, payment_method=payment_method).pk)
    assert saga.state == "UNKNOWN"
    return saga


def unknown_expired(user, event, seat, payment_method="pm_card_timeout_charged"):
    saga = unknown(user, event, seat, payment_method=payment_method)
    return saga_transition(
        saga_id=saga.pk, to=SagaState.UNKNOWN_EXPIRED, reason="schedule exhausted"
    )


def compensation_pending(user, event, seat, gateway):
    saga = charged_while_undone(user, event, seats=[seat])
    gateway.down("refund", times=1)
    saga = saga_compensate(saga_id=saga.pk, by=By.operator("erin"))
    assert saga.state == "COMPENSATION_PENDING"
    return saga


def compensated(user, event, seat):
    saga = saga_charge(
        saga_id=pending(user, event, seat, payment_method="pm_card_chargeDeclined").pk
    )
    assert saga.state == "COMPENSATED"
    return saga


def _counts() -> dict:
    return {
        "history": SagaHistory.objects.count(),
        "ledger": LedgerEntry.objects.count(),
        "outbox": OutboxMessage.objects.count(),
        "probes": GatewayAnswer.objects.count(),
        "log": LogEntry.objects.count(),
        "states": dict(PurchaseSaga.objects.values_list("pk", "state")),
    }


def _post_action(
    client, action, sagas, *, reason="checked at the gateway", confirm=True, follow=False, **extra
):
    data = {"action": action, "_selected_action": [str(s.pk) for s in sagas], **extra}
    if confirm:
        data.update(confirm="yes", reason=reason)
    else:
        data["index"] = "0"  # the changelist's own action form
    return client.post(CHANGELIST, data, follow=follow)


def _results(response) -> dict:
    return {str(r.saga.pk): r for r in response.context["results"]}


def _listed(response) -> set:
    return {s.pk for s in response.context["cl"].result_list}


# --- the list ------------------------------------------------------------------------


@pytest.mark.django_db
def test_list_shows_sagas_in_different_states(op_client, alice, big_event, faulty_gateway):
    sagas = [
        pending(alice, big_event, "A1"),
        confirmed(alice, big_event, "A2"),
        unknown(alice, big_event, "A3"),
        compensated(alice, big_event, "A4"),
    ]

    response = op_client.get(CHANGELIST)

    assert response.status_code == 200
    assert _listed(response) == {s.pk for s in sagas}
    html = response.content.decode()
    for label in ("Pending", "Confirmed", "Unknown", "Compensated"):
        assert f'<td class="field-state">{label}</td>' in html
    assert "25.00 EUR" in html and "alice" in html and big_event.name in html
    for column in ("column-age", "column-total", "column-attempts", "column-in_state"):
        assert column in html


@pytest.mark.django_db
def test_filters_by_state_and_event(op_client, alice, big_event, faulty_gateway):
    other_event = EventFactory(seats=["B1"])
    held = pending(alice, big_event, "A1")
    sold = confirmed(alice, big_event, "A2")
    elsewhere = confirmed(alice, other_event, "B1")

    by_state = op_client.get(CHANGELIST, {"state__exact": "CONFIRMED"})
    by_pending = op_client.get(CHANGELIST, {"state__exact": "PENDING"})
    by_event = op_client.get(CHANGELIST, {"event__id__exact": other_event.pk})

    assert _listed(by_state) == {sold.pk, elsewhere.pk}
    assert _listed(by_pending) == {held.pk}
    assert _listed(by_event) == {elsewhere.pk}


@pytest.mark.django_db
def test_age_bucket_filter(client, operator, alice, big_event, faulty_gateway):
    with freeze_time(T0):
        now = timezone.now()
        young = pending(alice, big_event, "A1", now=now - timedelta(minutes=1))
        five_minutes = pending(alice, big_event, "A2", now=now - timedelta(minutes=5))
        mid = pending(alice, big_event, "A3", now=now - timedelta(minutes=30))
        hours = pending(alice, big_event, "A4", now=now - timedelta(hours=3))
        old = pending(alice, big_event, "A5", now=now - timedelta(days=3))
        client.force_login(operator)

        buckets = {
            b: _listed(client.get(CHANGELIST, {"age": b}))
            for b in ("lt5m", "5m-1h", "1h-1d", "gt1d")
        }
        everything = client.get(CHANGELIST)
        by_age = client.get(CHANGELIST, {"o": "3"})  # the age column (after the checkbox)

    assert buckets == {
        "lt5m": {young.pk},
        "5m-1h": {five_minutes.pk, mid.pk},
        "1h-1d": {hours.pk},
        "gt1d": {old.pk},
    }
    assert [s.pk for s in by_age.context["cl"].result_list] == [
        young.pk,
        five_minutes.pk,
        mid.pk,
        hours.pk,
        old.pk,
    ]
    html = everything.content.decode()
    assert "&lt; 5 min" in html and "&gt; 1 day" in html
    assert "3\xa0days" in html and "30\xa0minutes" in html  # the humanized age column


@pytest.mark.django_db
def test_search_by_saga_id_intent_reservation_and_buyer(
    op_client, alice, bob, big_event, faulty_gateway
):
    first = pending(alice, big_event, "A1")
    second = confirmed(alice, big_event, "A2")
    bobs = pending(bob, big_event, "A3")

    def search(term):
        response = op_client.get(CHANGELIST, {"q": term})
        assert response.status_code == 200
        return _listed(response)

    assert search(str(second.pk)) == {second.pk}
    assert search(f"  {str(second.pk).upper()} ") == {second.pk}
    assert search(second.intent_id) == {second.pk}
    assert search(first.reservation.ref) == {first.pk}
    assert search(first.reservation.ref.lower()) == {first.pk}
    assert search("bob") == {bobs.pk}
    assert search("alice") == {first.pk, second.pk}
    assert search("no-such-thing") == set()


# --- the saga page --------------------------------------------------------------------


@pytest.mark.django_db
def test_saga_page_shows_the_timeline_of_a_reconciled_purchase(
    op_client, alice, event, gateway, long_hold
):
    # given: a charge whose answer was lost, reconciled by the first probe
    with freeze_time(T0) as clock:
        saga = start_purchase(alice, event, payment_method="pm_card_timeout_charged")
        assert saga_charge(saga_id=saga.pk).state == "UNKNOWN"
        clock.tick(60)
        drain_outbox()
    assert _state(saga) == "CONFIRMED"
    calls_before = list(gateway.calls)

    # when
    response = op_client.get(change_url(saga))

    # then: the whole story, and no gateway call
    assert response.status_code == 200
    assert gateway.calls == calls_before
    assert "gateway_view" not in response.context
    html = response.content.decode()
    history = [(h.from_state, h.to_state) for h in response.context["history"]]
    assert history == [
        (None, "PENDING"),
        ("PENDING", "CHARGING"),
        ("CHARGING", "UNKNOWN"),
        ("UNKNOWN", "CONFIRMED"),
    ]
    assert "reconciled: charged at the gateway" in html
    assert [(p.asked, p.answer, p.attempt) for p in response.context["gateway_answers"]] == [
        ("charge", "unknown", 0),
        ("retrieve", "succeeded", 1),
    ]
    hold = next(r for r in response.context["outbox"] if r.message.key == f"hold:{saga.pk}")
    assert (hold.kind, hold.status) == ("timer", "cancelled")
    assert hold.message.cancelled_at is not None and hold.message.fired_at is None
    assert "purchase.hold_expired" in html and "purchase.reconcile" in html
    assert [(e.kind, e.amount) for e, _ in response.context["ledger"]] == [("charge", 2500)]
    assert "25.00 EUR" in html
    assert saga.reservation.ref in html and "A1" in html
    assert "Ask the gateway" in html
    # read-only: no save buttons
    assert 'name="_save"' not in html and 'name="_continue"' not in html

    # when: the operator asks the gateway
    response = op_client.get(change_url(saga), {"gateway": "1"})

    # then: one live look-up, shown with its charge (and its refunds: a
    # charge partly refunded stays "succeeded", its refunds say what it keeps)
    assert response.status_code == 200
    assert gateway.calls[len(calls_before) :] == [
        ("retrieve", saga.intent_id),
        ("list_charges", saga.intent_id),
        ("list_refunds", saga.intent_id),
    ]
    view = response.context["gateway_view"]
    assert view["status"] == "succeeded"
    [(charge, amount)] = view["charges"]
    assert (charge.status, charge.amount, amount) == ("succeeded", 2500, "25.00 EUR")
    assert view["agrees_with_ledger"] is True
    html = response.content.decode()
    assert '<strong class="gateway-status">succeeded</strong>' in html
    assert charge.id in html


@pytest.mark.django_db
def test_saga_page_renders_when_the_gateway_does_not_answer(
    op_client, alice, event, faulty_gateway, monkeypatch
):
    from payments.interface import GatewayUnavailable

    saga = unknown(alice, event, "A1")
    faulty_gateway.down("retrieve")

    def unavailable(intent_id):
        raise GatewayUnavailable("list charges: timeout")

    monkeypatch.setattr(faulty_gateway, "list_charges", unavailable)

    response = op_client.get(change_url(saga), {"gateway": "1"})

    assert response.status_code == 200
    view = response.context["gateway_view"]
    assert (view["status"], view["detail"]) == ("unknown", "timeout")
    assert view["charges_error"] == "list charges: timeout"
    assert "Charges: list charges: timeout" in response.content.decode()
    # a look-up from the admin is not evidence: nothing written
    assert GatewayAnswer.objects.filter(saga=saga, asked="retrieve").count() == 0


@pytest.mark.django_db
def test_saga_page_cannot_be_changed(op_client, alice, event, gateway):
    saga = confirmed(alice, event, "A1")

    response = op_client.post(change_url(saga), {"state": "COMPENSATED"})

    assert response.status_code == 403
    assert _state(saga) == "CONFIRMED"
    assert op_client.get(f"{CHANGELIST}add/").status_code == 403
    assert op_client.get(f"{change_url(saga)[:-7]}delete/").status_code == 403


@pytest.mark.django_db
def test_saga_page_of_an_escalated_saga_offers_its_runbook(op_client, alice, event, gateway):
    saga = unknown_expired(alice, event, "A1")

    response = op_client.get(change_url(saga))

    assert "Needs an operator" in response.content.decode()
    assert [name for name, _ in response.context["runbook_actions"]] == [
        "reconcile_now",
        "confirm_after_manual_check",
        "compensate_after_manual_check",
    ]

    # the page's button leads to the dry run
    dry_run = op_client.post(
        CHANGELIST,
        {"action": "confirm_after_manual_check", "_selected_action": str(saga.pk), "index": "0"},
    )
    assert dry_run.templates[0].name == "admin/purchases/purchasesaga/runbook_confirm.html"
    assert _state(saga) == "UNKNOWN_EXPIRED"


# --- runbook actions: each one, allowed -------------------------------------------------


def _reconcile_unknown(alice, event, gw):
    return unknown(alice, event, "A1")


def _resume_pending(alice, event, gw):
    return pending(alice, event, "A1")


def _confirm_unknown_expired(alice, event, gw):
    return unknown_expired(alice, event, "A1")


def _confirm_compensation_pending(alice, event, gw):
    saga = compensation_pending(alice, event, "A1", gw)
    # The refund landed at the processor; its answer was lost on the way back.
    gw.refund(saga.intent_id, idempotency_key=f"refund:{saga.intent_id}")
    return saga


def _compensate_unknown_expired(alice, event, gw):
    return unknown_expired(alice, event, "A1", payment_method="pm_card_timeout_not_charged")


def _compensate_compensation_pending(alice, event, gw):
    return compensation_pending(alice, event, "A1", gw)


def _refund_confirmed(alice, event, gw):
    return confirmed(alice, event, "A1")


ALLOWED = [
    # action, given, expected state, expected seat status, ledger (kind, amount)
    ("reconcile_now", _reconcile_unknown, "CONFIRMED", "sold", [("charge", 2500)]),
    ("resume_now", _resume_pending, "CONFIRMED", "sold", [("charge", 2500)]),
    (
        "confirm_after_manual_check",
        _confirm_unknown_expired,
        "CONFIRMED",
        "sold",
        [("charge", 2500)],
    ),
    (
        "confirm_after_manual_check",
        _confirm_compensation_pending,
        "COMPENSATED",
        "available",
        [("charge", 2500), ("refund", -2500)],
    ),
    ("compensate_after_manual_check", _compensate_unknown_expired, "COMPENSATED", "available", []),
    (
        "compensate_after_manual_check",
        _compensate_compensation_pending,
        "COMPENSATED",
        "available",
        [("charge", 2500), ("refund", -2500)],
    ),
    # A refund row: the purchase stays CONFIRMED, its seat back on sale; the
    # processor is asked by the row's message, after the commit.
    ("refund", _refund_confirmed, "CONFIRMED", "available", [("charge", 2500)]),
]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("action", "given", "expected", "seat", "ledger"),
    ALLOWED,
    ids=[f"{a[0]}-from-{a[1].__name__.split('_', 2)[-1]}" for a in ALLOWED],
)
def test_each_action_runs_through_the_admin(
    op_client, operator, alice, event, faulty_gateway, action, given, expected, seat, ledger
):
    # given
    saga = given(alice, event, faulty_gateway)
    before = saga.state
    last_history = SagaHistory.objects.filter(saga=saga).latest("id").pk

    # when
    response = _post_action(op_client, action, [saga], reason="seen at the gateway")

    # then
    assert response.status_code == 200
    row = _results(response)[str(saga.pk)]
    assert (row.outcome, row.before, row.after) == ("done", before, expected)
    assert _state(saga) == expected
    assert Seat.objects.get(event=event, ref="A1").status == seat
    assert (
        list(
            LedgerEntry.objects.filter(saga_id=saga.pk).order_by("id").values_list("kind", "amount")
        )
        == ledger
    )
    new_history = SagaHistory.objects.filter(saga=saga, pk__gt=last_history)
    assert new_history.exists()
    assert {h.actor for h in new_history if h.to_state == expected} == {"operator"}
    log = LogEntry.objects.get(object_id=str(saga.pk), user=operator)
    assert log.action_flag == CHANGE
    assert action in log.change_message and "seen at the gateway" in log.change_message
    moved = f"{before} → {expected}" if before != expected else f"still {expected}"
    assert f"done: {moved}" in log.change_message
    assert "1 done, 0 refused, 0 failed" in response.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("action", "given", "expected", "seat", "ledger"),
    ALLOWED,
    ids=[f"{a[0]}-from-{a[1].__name__.split('_', 2)[-1]}" for a in ALLOWED],
)
def test_each_action_names_the_operator_in_the_history(
    op_client, alice, event, faulty_gateway, action, given, expected, seat, ledger
):
    saga = given(alice, event, faulty_gateway)
    last_history = SagaHistory.objects.filter(saga=saga).latest("id").pk

    _post_action(op_client, action, [saga], reason="seen at the gateway")

    # the operator's reason is on the record first, then every move names them
    new = list(SagaHistory.objects.filter(saga=saga, pk__gt=last_history).order_by("id"))
    assert "seen at the gateway" in new[0].reason
    moves = [h for h in new if h.to_state == expected]
    assert moves and all((h.actor, h.actor_name) == ("operator", "carol") for h in moves)


@pytest.mark.django_db
def test_the_refund_action_opens_a_refund_the_relay_asks_of_the_processor(
    op_client, alice, event, faulty_gateway
):
    saga = confirmed(alice, event, "A1")

    _post_action(op_client, "refund", [saga], reason="the buyer cannot come")
    asked_in_the_request = [c for c in faulty_gateway.calls if "refund" in c[0]]
    drain_outbox()

    assert asked_in_the_request == []
    refund = Refund.objects.get(saga_id=saga.pk)
    assert (refund.status, refund.source, refund.amount) == ("succeeded", "operator", 2500)
    assert "the buyer cannot come (by carol)" in refund.reason
    assert _state(saga) == "CONFIRMED"
    assert list(
        LedgerEntry.objects.filter(saga_id=saga.pk).order_by("id").values_list("kind", "amount")
    ) == [("charge", 2500), ("refund", -2500)]
    page = op_client.get(change_url(saga)).content.decode()
    assert f"refund {refund.pk} of 25.00 EUR: customer service refunded" in page


# --- runbook actions: refused -----------------------------------------------------------

REFUSED = [
    ("refund", compensated, "not allowed from COMPENSATED"),
    ("confirm_after_manual_check", confirmed, "not allowed from CONFIRMED"),
    ("compensate_after_manual_check", confirmed, "not allowed from CONFIRMED"),
    ("reconcile_now", compensated, "not allowed from COMPENSATED"),
    ("resume_now", unknown_expired, "not allowed from UNKNOWN_EXPIRED"),
    ("refund", pending, "not allowed from PENDING"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("action", "given", "why"), REFUSED, ids=[f"{a}-on-{g.__name__}" for a, g, _ in REFUSED]
)
def test_an_action_the_table_forbids_is_refused_and_changes_nothing(
    op_client, alice, event, faulty_gateway, action, given, why
):
    saga = given(alice, event, "A1")
    calls = len(faulty_gateway.calls)
    before = _counts()

    response = _post_action(op_client, action, [saga])

    assert response.status_code == 200
    row = _results(response)[str(saga.pk)]
    assert (row.outcome, row.message) == ("refused", why)
    assert _counts() == before  # no history, ledger, outbox, probe, nor admin log
    assert len(faulty_gateway.calls) == calls
    assert "0 done, 1 refused, 0 failed" in response.content.decode()


@pytest.mark.django_db
def test_compensating_an_intent_the_gateway_says_was_charged_is_refused(
    op_client, operator, alice, event, gateway
):
    # given: escalated, but the charge did land
    saga = unknown_expired(alice, event, "A1", payment_method="pm_card_timeout_charged")
    last_history = SagaHistory.objects.latest("id").pk

    response = _post_action(op_client, "compensate_after_manual_check", [saga])

    row = _results(response)[str(saga.pk)]
    assert row.outcome == "refused"
    assert "charged: confirm instead" in row.message
    assert _state(saga) == "UNKNOWN_EXPIRED"
    assert Seat.objects.get(event=event, ref="A1").status == "held"
    # the history holds the operator's note, and no move
    [note] = SagaHistory.objects.filter(pk__gt=last_history)
    assert (note.from_state, note.to_state) == ("UNKNOWN_EXPIRED", "UNKNOWN_EXPIRED")
    assert (note.actor, note.actor_name) == ("operator", "carol")
    # the attempt is in the admin log, with its verdict
    log = LogEntry.objects.get(object_id=str(saga.pk), user=operator)
    assert "refused" in log.change_message


@pytest.mark.django_db
def test_the_dry_run_of_reconcile_now_says_what_it_will_do(
    op_client, alice, big_event, faulty_gateway
):
    never_charged = pending(alice, big_event, "A1")
    declined = pending(alice, big_event, "A2", payment_method="pm_card_chargeDeclined")
    saga_transition(saga_id=declined.pk, to=SagaState.CHARGING, reason="charge started")
    saga_transition(saga_id=declined.pk, to=SagaState.PAYMENT_FAILED, reason="charge declined")

    response = _post_action(op_client, "reconcile_now", [never_charged, declined], confirm=False)
    plans = {str(s.pk): p for s, p in response.context["rows"]}
    calls = len(faulty_gateway.calls)
    _post_action(op_client, "reconcile_now", [never_charged, declined])

    # what it did: charged one card, released the other's seat
    assert faulty_gateway.calls[calls:] == [("charge", never_charged.intent_id)]
    assert _state(never_charged) == "CONFIRMED" and _state(declined) == "COMPENSATED"
    # what the operator was told it would do
    assert "charge" in plans[str(never_charged.pk)].gateway_calls
    assert plans[str(declined.pk)].seats_freed == ["A2"]


# --- bulk, dry run, reason, moved on --------------------------------------------------


@pytest.mark.django_db
def test_bulk_action_with_mixed_rows_reports_each_and_runs_only_the_allowed(
    op_client, operator, alice, bob, big_event, faulty_gateway
):
    refundable = [confirmed(alice, big_event, "A1"), confirmed(bob, big_event, "A2")]
    done_already = compensated(alice, big_event, "A3")
    held = pending(bob, big_event, "A4")

    response = _post_action(op_client, "refund", [*refundable, done_already, held])

    results = _results(response)
    assert {k: (r.outcome, r.after) for k, r in results.items()} == {
        str(refundable[0].pk): ("done", "CONFIRMED"),
        str(refundable[1].pk): ("done", "CONFIRMED"),
        str(done_already.pk): ("refused", "COMPENSATED"),
        str(held.pk): ("refused", "PENDING"),
    }
    assert results[str(held.pk)].message == "not allowed from PENDING"
    assert [_state(s) for s in refundable] == ["CONFIRMED", "CONFIRMED"]
    assert {r.saga_id for r in Refund.objects.all()} == {s.pk for s in refundable}
    assert _state(held) == "PENDING"
    assert Seat.objects.get(event=big_event, ref="A4").status == "held"
    assert set(LogEntry.objects.filter(user=operator).values_list("object_id", flat=True)) == {
        str(s.pk) for s in refundable
    }
    assert "2 done, 2 refused, 0 failed" in response.content.decode()


@pytest.mark.django_db
def test_one_rows_failure_does_not_stop_the_others(
    op_client, alice, big_event, faulty_gateway, monkeypatch
):
    from purchases import services

    first, second = confirmed(alice, big_event, "A1"), confirmed(alice, big_event, "A2")
    refund = services.purchase_refund

    def exploding_refund(*, saga_id, **kwargs):
        if str(saga_id) == str(first.pk):
            raise RuntimeError("refund step crashed")
        return refund(saga_id=saga_id, **kwargs)

    monkeypatch.setattr(services, "purchase_refund", exploding_refund)

    response = _post_action(op_client, "refund", [first, second])

    results = _results(response)
    assert results[str(first.pk)].outcome == "failed"
    assert "refund step crashed" in results[str(first.pk)].message
    assert (results[str(second.pk)].outcome, _state(second)) == ("done", "CONFIRMED")
    assert [r.saga_id for r in Refund.objects.all()] == [second.pk]


@pytest.mark.django_db
def test_a_bulk_action_over_too_many_sagas_runs_nothing(
    op_client, alice, big_event, faulty_gateway, monkeypatch
):
    monkeypatch.setattr("purchases.ops.admin.RUNBOOK_MAX_SAGAS", 1)
    sagas = [confirmed(alice, big_event, "A1"), confirmed(alice, big_event, "A2")]
    before = _counts()

    response = _post_action(op_client, "refund", sagas, follow=True)

    assert "at most 1 at a time. Nothing was run." in response.content.decode()
    assert _counts() == before


@pytest.mark.django_db
def test_the_dry_run_shows_the_plan_and_writes_nothing(op_client, alice, big_event, faulty_gateway):
    refundable = confirmed(alice, big_event, "A1")
    held = pending(alice, big_event, "A2")
    calls = len(faulty_gateway.calls)
    before = _counts()

    response = _post_action(op_client, "refund", [refundable, held], confirm=False)

    assert response.status_code == 200
    assert response.templates[0].name == "admin/purchases/purchasesaga/runbook_confirm.html"
    plans = {str(s.pk): p for s, p in response.context["rows"]}
    allowed = plans[str(refundable.pk)]
    assert (
        allowed.allowed,
        allowed.refund,
        allowed.seats_freed,
        allowed.emails,
        allowed.gateway_calls,
    ) == (True, True, ["A1"], ["refund"], ["create_refund"])
    assert allowed.ledger == "refund -25.00 EUR once the processor confirms it"
    refused = plans[str(held.pk)]
    assert (refused.allowed, refused.why) == (False, "not allowed from PENDING")
    html = response.content.decode()
    assert 'name="reason"' in html and 'name="confirm"' in html
    assert f'name="version_{refundable.pk}" value="{refundable.version}"' in html
    assert "1</strong> allowed, <strong>1</strong> refused" in html
    # nothing happened
    assert _counts() == before
    assert len(faulty_gateway.calls) == calls


@pytest.mark.django_db
@pytest.mark.parametrize("reason", ["", "   "])
def test_a_missing_reason_runs_nothing(op_client, alice, event, faulty_gateway, reason):
    saga = confirmed(alice, event, "A1")
    before = _counts()

    response = _post_action(op_client, "refund", [saga], reason=reason)

    assert response.status_code == 200
    assert response.templates[0].name == "admin/purchases/purchasesaga/runbook_confirm.html"
    assert "A reason is required" in response.content.decode()
    assert _counts() == before


@pytest.mark.django_db
def test_a_saga_that_moved_since_the_dry_run_is_refused(op_client, alice, event, faulty_gateway):
    # given: the operator saw it UNKNOWN_EXPIRED at version v ...
    saga = unknown_expired(alice, event, "A1", payment_method="pm_card_timeout_not_charged")
    seen = saga.version
    # ... then it moved to COMPENSATION_PENDING, where the same action means
    # something else (confirm a refund, not a charge)
    saga = saga_transition(saga_id=saga.pk, to=SagaState.COMPENSATING, reason="operator elsewhere")
    saga_transition(saga_id=saga.pk, to=SagaState.COMPENSATION_PENDING, reason="refund retry")
    before = _counts()

    response = _post_action(
        op_client, "confirm_after_manual_check", [saga], **{f"version_{saga.pk}": str(seen)}
    )

    row = _results(response)[str(saga.pk)]
    assert row.outcome == "refused" and "moved on since the dry run" in row.message
    assert _counts() == before


# --- permissions -------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_non_staff_user_is_sent_to_the_admin_login(client, alice, event, gateway):
    saga = confirmed(alice, event, "A1")
    client.force_login(alice)

    for url in (CHANGELIST, change_url(saga)):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")
    response = _post_action(client, "refund", [saga])
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert _state(saga) == "CONFIRMED"


@pytest.mark.django_db
def test_staff_without_the_permission_can_look_but_not_act(client, viewer, alice, event, gateway):
    saga = confirmed(alice, event, "A1")
    client.force_login(viewer)

    listing = client.get(CHANGELIST)
    page = client.get(change_url(saga))

    assert listing.status_code == 200 and _listed(listing) == {saga.pk}
    html = listing.content.decode()
    assert "action-checkbox" not in html
    for action in (
        "reconcile_now",
        "resume_now",
        "confirm_after_manual_check",
        "compensate_after_manual_check",
        "refund",
    ):
        assert f'value="{action}"' not in html
    assert page.status_code == 200
    assert "runbook_actions" not in page.context
    assert 'id="saga-runbook"' not in page.content.decode()

    # a forged POST does nothing, neither the dry run nor the run
    before = _counts()
    calls = len(gateway.calls)
    for confirm in (False, True):
        response = _post_action(client, "refund", [saga], confirm=confirm)
        assert response.status_code == 200
        assert not {t.name for t in response.templates} & RUNBOOK_TEMPLATES
    assert _counts() == before
    assert len(gateway.calls) == calls
    assert _state(saga) == "CONFIRMED"


@pytest.mark.django_db
def test_staff_with_the_permission_are_offered_every_action(op_client, alice, event, gateway):
    confirmed(alice, event, "A1")

    html = op_client.get(CHANGELIST).content.decode()

    assert "action-checkbox" in html
    for action in (
        "reconcile_now",
        "resume_now",
        "confirm_after_manual_check",
        "compensate_after_manual_check",
        "refund",
    ):
        assert f'value="{action}"' in html
    assert 'value="delete_selected"' not in html


@pytest.mark.django_db
def test_staff_without_the_view_permission_cannot_open_the_sagas(client, alice, event, gateway):
    saga = confirmed(alice, event, "A1")
    client.force_login(_staff("frank", "run_saga_runbook"))

    assert client.get(CHANGELIST).status_code == 403
    assert client.get(change_url(saga), {"gateway": "1"}).status_code == 403
    assert gateway.calls == [("charge", saga.intent_id)]  # no look-up for the unauthorized


# --- a manual confirmation asks the gateway; the override is explicit ------------------


@pytest.mark.django_db
def test_the_confirm_dry_run_shows_the_gateways_answer_and_refuses_a_contradiction(
    op_client, alice, event, gateway
):
    # escalated, and nothing was ever charged
    saga = unknown_expired(alice, event, "A1", payment_method="pm_card_timeout_not_charged")

    dry_run = _post_action(op_client, "confirm_after_manual_check", [saga], confirm=False)
    [(_, plan)] = dry_run.context["rows"]
    ran = _post_action(op_client, "confirm_after_manual_check", [saga])

    assert not plan.allowed and "gateway disagrees" in plan.why
    assert "no charge" in dry_run.content.decode()
    assert 'name="override"' not in dry_run.content.decode()
    assert _results(ran)[str(saga.pk)].outcome == "refused"
    assert _state(saga) == "UNKNOWN_EXPIRED"
    assert not LedgerEntry.objects.filter(intent_id=saga.intent_id).exists()


@pytest.mark.django_db
def test_the_override_is_offered_when_the_gateway_cannot_be_reached_and_marks_the_money(
    op_client, alice, event, gateway, monkeypatch
):
    from payments.interface import GatewayUnavailable

    saga = unknown_expired(alice, event, "A1")  # charged; the answer was lost

    def unreachable(intent_id):
        raise GatewayUnavailable("list charges: timeout")

    monkeypatch.setattr(gateway, "list_charges", unreachable)

    dry_run = _post_action(op_client, "confirm_after_manual_check", [saga], confirm=False)
    without = _post_action(op_client, "confirm_after_manual_check", [saga])
    with_override = _post_action(op_client, "confirm_after_manual_check", [saga], override="on")

    html = dry_run.content.decode()
    assert "cannot be reached" in html and 'name="override"' in html
    assert _results(without)[str(saga.pk)].outcome == "refused"
    assert "override" in _results(without)[str(saga.pk)].message
    assert _results(with_override)[str(saga.pk)].outcome == "done"
    assert _state(saga) == "CONFIRMED"
    entry = LedgerEntry.objects.get(intent_id=saga.intent_id)
    assert entry.override and "override" in entry.note


@pytest.mark.django_db
def test_the_gateway_view_of_a_partly_refunded_purchase_agrees_with_the_ledger(
    op_client, alice, event, gateway
):
    """A charge partly refunded stays "succeeded" at the processor: what it
    keeps is its charge less its refunds, as the ledger says (counting the
    charge alone, the page called a correct purchase a disagreement)."""
    from purchases.services import organizer_refund

    saga = saga_charge(saga_id=start_purchase(alice, event).pk)
    organizer_refund(
        organizer=event.organizer, saga_id=saga.pk, user=alice, reason="late", amount=1000
    )
    drain_outbox()
    assert Refund.objects.get(saga=saga).status == "succeeded"

    response = op_client.get(change_url(saga), {"gateway": "1"})

    view = response.context["gateway_view"]
    [(charge, _)] = view["charges"]
    assert (charge.status, charge.amount) == ("succeeded", 2500)
    assert view["captured"] == "15.00 EUR"
    assert view["agrees_with_ledger"] is True
