"""The seller's reads of an event's sales (docs/api.md, "Sales and
reports"): the purchases (list, status filter, search, pages, queries per
page), the CSV export (header, every row across batches, filters, injection
guard) and the report (seats by status, the ledger's money, sales by
category), each scoped to the organizer: another organizer's event is the
same 404 as a missing one, a door member is refused. A refund is a row of
its own that never moves the purchase (docs/refunds.md, "The rows"): a
purchase refunded in part or in full stays CONFIRMED, and its row's
``payment_status`` and ``refunded`` say, from the ledger, what was given
back."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from freezegun import freeze_time
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from ledger.models import EntryKind, LedgerEntry
from organizers.roles import Role
from purchases.models import Event, PriceCategory, PurchaseSaga, Seat
from purchases.services import By, organizer_refund, purchase_refund, saga_charge
from seller import reports
from seller.read_serializers import CSV_HEADER

from .conftest import drain_outbox, start_purchase
from .factories import EventFactory, MembershipFactory, OrganizerFactory, SeatFactory, UserFactory

T0 = "2026-12-02 12:00:00"
ROW_KEYS = {"id", "status", "payment_status", "buyer", "seats", "total", "refunded", "created_at"}


def _client(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def event_with_categories(organizer, seats: dict[str, tuple[str, int]]) -> Event:
    """An on-sale EUR event of ``organizer``: stalls (5000) and balcony
    (2500) categories, and ``seats`` as {ref: (category, price)}."""
    event = EventFactory(organizer=organizer, seats=[])
    PriceCategory.objects.create(
        event=event, code="stalls", name="Stalls", price_amount=5000, currency="EUR"
    )
    PriceCategory.objects.create(
        event=event, code="balcony", name="Balcony", price_amount=2500, currency="EUR"
    )
    for ref, (category, price) in seats.items():
        SeatFactory(event=event, ref=ref, category=category, price_amount=price)
    return event


def _confirmed(user, event, seats, method="pm_card_visa") -> PurchaseSaga:
    return saga_charge(saga_id=start_purchase(user, event, seats=seats, payment_method=method).pk)


@dataclass
class Sales:
    event: Event
    other_event: Event  # the same organizer's
    foreign_event: Event  # another organizer's
    members: dict
    buyers: dict
    sagas: dict

    def url(self, tail: str, event: Event | None = None) -> str:
        pk = (event or self.event).pk
        return f"/api/organizers/riverside/events/{pk}/{tail}"

    def get(self, tail: str, role=Role.OWNER, event: Event | None = None, **params):
        return _client(self.members[role]).get(self.url(tail, event), params)


@pytest.fixture
def sales(gateway) -> Sales:
    """One purchase of each kind, a minute apart: alice's confirmed (stalls
    A1 and balcony B1), bob's confirmed then refunded in full by customer
    service (B2, back on sale; the purchase stays CONFIRMED), carol's
    declined (A2), dave's confirmed seat of no category (C1), erin's held
    (B3); D1 blocked. And purchases of the organizer's other event and of
    another organizer's event, which no answer may show."""
    organizer = OrganizerFactory(slug="riverside")
    members = {role: UserFactory(username=f"riverside-{role}") for role in Role}
    for role, user in members.items():
        MembershipFactory(organizer=organizer, user=user, role=role)
    buyers = {
        name: UserFactory(username=name, email=f"{name}@Example.com")
        for name in ("alice", "bob", "carol", "dave", "erin")
    }
    event = event_with_categories(
        organizer,
        {
            "A1": ("stalls", 5000),
            "A2": ("stalls", 5000),
            "B1": ("balcony", 2500),
            "B2": ("balcony", 2500),
            "B3": ("balcony", 2500),
            "C1": ("", 1500),
            "D1": ("stalls", 5000),
        },
    )
    other_event = EventFactory(organizer=organizer, seats=["A1"])
    foreign_event = EventFactory(organizer=OrganizerFactory(slug="elsewhere"), seats=["A1"])
    with freeze_time(T0) as clock:
        sagas = {"alice": _confirmed(buyers["alice"], event, ["A1", "B1"])}
        clock.tick(60)
        sagas["bob"] = _confirmed(buyers["bob"], event, ["B2"])
        purchase_refund(saga_id=sagas["bob"].pk, reason="asked", by=By.operator("carol"))
        clock.tick(60)
        sagas["carol"] = _confirmed(buyers["carol"], event, ["A2"], "pm_card_chargeDeclined")
        clock.tick(60)
        sagas["dave"] = _confirmed(buyers["dave"], event, ["C1"])
        clock.tick(60)
        sagas["erin"] = start_purchase(buyers["erin"], event, seats=["B3"])
        _confirmed(buyers["alice"], other_event, ["A1"])
        _confirmed(buyers["alice"], foreign_event, ["A1"])
        drain_outbox()  # bob's refund is asked of the processor, and succeeds
    Seat.objects.filter(event=event, ref="D1").update(status="unavailable")
    sagas = {name: PurchaseSaga.objects.get(pk=saga.pk) for name, saga in sagas.items()}
    assert {name: saga.state for name, saga in sagas.items()} == {
        "alice": "CONFIRMED",
        "bob": "CONFIRMED",
        "carol": "COMPENSATED",
        "dave": "CONFIRMED",
        "erin": "PENDING",
    }
    return Sales(event, other_event, foreign_event, members, buyers, sagas)


def _ids(answer) -> list[str]:
    return [row["id"] for row in answer.json()["results"]]


# --- the list ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_list_is_the_events_purchases_newest_first_in_the_rows_shape(sales):
    answer = sales.get("purchases/")

    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["count"], body["next"], body["previous"]) == (5, None, None)
    order = ["erin", "dave", "carol", "bob", "alice"]
    assert _ids(answer) == [str(sales.sagas[name].pk) for name in order]
    rows = {row["id"]: row for row in body["results"]}
    assert all(set(row) == ROW_KEYS for row in rows.values())
    alice = rows[str(sales.sagas["alice"].pk)]
    assert alice == {
        "id": str(sales.sagas["alice"].pk),
        "status": "CONFIRMED",
        "payment_status": "captured",
        "buyer": {"username": "alice", "email": "alice@Example.com"},
        "seats": ["A1", "B1"],
        "total": {"amount": 7500, "currency": "EUR"},
        "refunded": {"amount": 0, "currency": "EUR"},
        "created_at": "2026-12-02T12:00:00Z",
    }
    # Refunded in full: the purchase stays CONFIRMED; the ledger says refunded.
    bob = rows[str(sales.sagas["bob"].pk)]
    assert (bob["status"], bob["payment_status"], bob["refunded"], bob["seats"]) == (
        "CONFIRMED",
        "refunded",
        {"amount": 2500, "currency": "EUR"},
        ["B2"],
    )
    # Declined: undone with nothing charged, so nothing refunded.
    carol = rows[str(sales.sagas["carol"].pk)]
    assert (carol["status"], carol["payment_status"], carol["refunded"]["amount"]) == (
        "COMPENSATED",
        "not_captured",
        0,
    )
    erin = rows[str(sales.sagas["erin"].pk)]
    assert (erin["status"], erin["payment_status"]) == ("PENDING", "not_started")


@pytest.mark.django_db
def test_the_status_filter_takes_a_saga_state_and_refuses_anything_else(sales):
    confirmed = sales.get("purchases/", status="CONFIRMED")
    pending = sales.get("purchases/", status="PENDING")
    unknown = sales.get("purchases/", status="confirmed")
    empty = sales.get("purchases/", status="")

    # bob's purchase, refunded in full, is still CONFIRMED
    assert _ids(confirmed) == [str(sales.sagas[n].pk) for n in ("dave", "bob", "alice")]
    assert _ids(pending) == [str(sales.sagas["erin"].pk)]
    assert empty.json()["count"] == 5  # no filter
    assert unknown.status_code == 400
    assert unknown.json()["code"] == "invalid"
    assert unknown.json()["field"] == "status"
    assert "CONFIRMED" in unknown.json()["errors"]["status"][0]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "search, found",
    [
        ("ALI", ["alice"]),  # username, any case, contains
        ("example.COM", ["erin", "dave", "carol", "bob", "alice"]),  # email
        ("bob@ex", ["bob"]),
        ("nobody", []),
        ("   ", ["erin", "dave", "carol", "bob", "alice"]),  # blank: no search
    ],
)
def test_search_by_buyer_username_or_email(sales, search, found):
    answer = sales.get("purchases/", search=search)

    assert answer.status_code == 200
    assert _ids(answer) == [str(sales.sagas[name].pk) for name in found]


@pytest.mark.django_db
def test_search_by_purchase_id_or_reservation_ref_exactly(sales):
    dave = sales.sagas["dave"]
    ref = dave.reservation.ref

    assert _ids(sales.get("purchases/", search=str(dave.pk))) == [str(dave.pk)]
    assert _ids(sales.get("purchases/", search=ref)) == [str(dave.pk)]
    assert _ids(sales.get("purchases/", search=ref.lower())) == [str(dave.pk)]
    assert _ids(sales.get("purchases/", search=ref[:-1])) == []  # exact, not contains
    # Another organizer's purchase is not found by its id either.
    foreign = PurchaseSaga.objects.get(event=sales.foreign_event)
    assert _ids(sales.get("purchases/", search=str(foreign.pk))) == []


@pytest.mark.django_db
@pytest.mark.parametrize("search", ["x" * 255, "a\x00b"])
def test_a_search_no_row_could_match_is_400_not_500(sales, search):
    answer = sales.get("purchases/", search=search)

    assert answer.status_code == 400
    assert (answer.json()["code"], answer.json()["field"]) == ("invalid", "search")


@pytest.mark.django_db
def test_the_list_is_paginated(gateway):
    organizer = OrganizerFactory(slug="riverside")
    owner = UserFactory()
    MembershipFactory(organizer=organizer, user=owner, role=Role.OWNER)
    event = EventFactory(organizer=organizer, seats=[f"A{n}" for n in range(1, 26)])
    buyer = UserFactory()
    with freeze_time(T0) as clock:
        for n in range(1, 26):
            start_purchase(buyer, event, seats=[f"A{n}"])
            clock.tick(1)
    url = f"/api/organizers/riverside/events/{event.pk}/purchases/"
    client = _client(owner)

    first = client.get(url).json()
    second = client.get(first["next"]).json()
    past = client.get(url, {"page": 3})
    garbage = client.get(url, {"page": "x"})

    newest_first = [
        str(pk) for pk in PurchaseSaga.objects.order_by("-created_at").values_list("pk", flat=True)
    ]
    assert first["count"] == 25 and len(first["results"]) == 20
    assert [r["id"] for r in first["results"] + second["results"]] == newest_first
    assert second["previous"] is not None and second["next"] is None
    assert past.status_code == garbage.status_code == 404
    assert past.json()["code"] == "not_found"


def _queries(client, url) -> int:
    client.get(url)  # warm: the token's user is cached after the first request
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.django_db
def test_the_queries_of_a_page_do_not_grow_with_its_rows(gateway):
    organizer = OrganizerFactory(slug="riverside")
    owner = UserFactory()
    MembershipFactory(organizer=organizer, user=owner, role=Role.FINANCE)
    event = EventFactory(organizer=organizer, seats=[f"A{n}" for n in range(1, 25)])
    client = _client(owner)
    url = f"/api/organizers/riverside/events/{event.pk}/purchases/"

    def buy(refs) -> None:
        # Refunded twice (two ledger entries), once in part, once the rest.
        saga = _confirmed(UserFactory(), event, refs)
        organizer_refund(organizer=organizer, saga_id=saga.pk, user=owner, reason="r", amount=100)
        purchase_refund(saga_id=saga.pk, reason="asked", by=By.operator("carol"))
        drain_outbox()

    buy(["A1", "A2"])
    few = _queries(client, url)
    for n in range(3, 23, 2):
        buy([f"A{n}", f"A{n + 1}"])
    many = _queries(client, url)

    assert PurchaseSaga.objects.filter(event=event).count() == 11
    assert few == many


# --- the CSV export ---------------------------------------------------------------------------


def _csv(answer) -> list[list[str]]:
    assert answer.status_code == 200, answer.content
    text = b"".join(answer.streaming_content).decode()
    return list(csv.reader(io.StringIO(text)))


@pytest.mark.django_db
def test_the_csv_has_the_header_and_the_lists_rows_as_an_attachment(sales):
    answer = sales.get("purchases.csv", role=Role.FINANCE)

    assert answer["Content-Type"] == "text/csv; charset=utf-8"
    assert (
        answer["Content-Disposition"]
        == f'attachment; filename="event-{sales.event.pk}-purchases.csv"'
    )
    lines = _csv(answer)
    assert (
        lines[0]
        == list(CSV_HEADER)
        == (
            "id,status,buyer_username,buyer_email,seats,total_amount,refunded_amount,currency,"
            "created_at,payment_status"
        ).split(",")
    )
    listed = sales.get("purchases/").json()["results"]
    assert [line[0] for line in lines[1:]] == [row["id"] for row in listed]
    assert lines[-1] == [
        str(sales.sagas["alice"].pk),
        "CONFIRMED",
        "alice",
        "alice@Example.com",
        "A1 B1",
        "7500",
        "0",
        "EUR",
        "2026-12-02T12:00:00Z",
        "captured",
    ]
    bob = next(line for line in lines if line[2] == "bob")
    assert (bob[1], bob[5], bob[6], bob[9]) == ("CONFIRMED", "2500", "2500", "refunded")


@pytest.mark.django_db
def test_the_csv_takes_the_lists_filters(sales):
    confirmed = _csv(sales.get("purchases.csv", status="CONFIRMED"))
    searched = _csv(sales.get("purchases.csv", search="BOB"))
    bad = sales.get("purchases.csv", status="nope")
    # Asking for CSV does not change that an error is JSON.
    bad_csv = _client(sales.members[Role.OWNER]).get(
        sales.url("purchases.csv"), {"status": "nope"}, HTTP_ACCEPT="text/csv"
    )

    assert [line[2] for line in confirmed[1:]] == ["dave", "bob", "alice"]
    assert [line[2] for line in searched[1:]] == ["bob"]
    for answer in (bad, bad_csv):
        assert answer.status_code == 400
        assert answer["Content-Type"] == "application/json"
        assert (answer.json()["code"], answer.json()["field"]) == ("invalid", "status")


@pytest.mark.django_db
def test_the_csv_has_every_row_across_batches_even_at_one_instant(gateway, monkeypatch):
    # Batches of 2 by keyset, and every purchase made at the same instant:
    # the id breaks the ties, no row is lost or repeated.
    monkeypatch.setattr(reports, "BATCH_SIZE", 2)
    organizer = OrganizerFactory(slug="riverside")
    owner = UserFactory()
    MembershipFactory(organizer=organizer, user=owner, role=Role.MANAGER)
    event = EventFactory(organizer=organizer, seats=[f"A{n}" for n in range(1, 8)])
    with freeze_time(T0):
        for n in range(1, 8):
            start_purchase(UserFactory(), event, seats=[f"A{n}"])

    lines = _csv(_client(owner).get(f"/api/organizers/riverside/events/{event.pk}/purchases.csv"))

    expected = PurchaseSaga.objects.filter(event=event).order_by("-created_at", "-id")
    assert [line[0] for line in lines[1:]] == [str(saga.pk) for saga in expected]
    assert len(lines) == 1 + 7


@pytest.mark.django_db
def test_the_csv_guards_against_formulas(gateway):
    organizer = OrganizerFactory(slug="riverside")
    owner = UserFactory()
    MembershipFactory(organizer=organizer, user=owner, role=Role.OWNER)
    event = EventFactory(organizer=organizer, seats=["A1", "A2"])
    start_purchase(UserFactory(username="-2+3", email="=HYPERLINK(1)@evil.example"), event, ["A1"])
    start_purchase(UserFactory(username="@SUM", email="+1@evil.example"), event, ["A2"])

    lines = _csv(_client(owner).get(f"/api/organizers/riverside/events/{event.pk}/purchases.csv"))

    cells = {(line[2], line[3]) for line in lines[1:]}
    assert cells == {("'-2+3", "'=HYPERLINK(1)@evil.example"), ("'@SUM", "'+1@evil.example")}


# --- the report -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_report_counts_seats_and_the_ledgers_money_by_category(sales):
    answer = sales.get("report/", role=Role.MANAGER)

    assert answer.status_code == 200, answer.content
    eur = lambda amount: {"amount": amount, "currency": "EUR"}  # noqa: E731
    assert answer.json() == {
        "currency": "EUR",
        # A1 B1 C1 sold; B3 held; A2 (declined) and B2 (refunded) back on sale; D1 blocked.
        "seats": {"available": 2, "held": 1, "sold": 3, "unavailable": 1},
        # alice 7500, bob 2500 then refunded, dave 1500; carol was never charged.
        "gross": eur(11500),
        "refunded": eur(2500),
        "net": eur(9000),
        "by_category": [
            {"code": "stalls", "name": "Stalls", "sold": 1, "gross": eur(5000)},
            {"code": "balcony", "name": "Balcony", "sold": 1, "gross": eur(2500)},
            {"code": "", "name": "", "sold": 1, "gross": eur(1500)},
        ],
    }
    assert reports.event_report(event=sales.event) == answer.json()
    assert reports.seat_status_counts(event=sales.event) == answer.json()["seats"]


@pytest.mark.django_db
def test_the_reports_money_is_the_ledgers_and_its_categories_add_up_to_net(sales):
    # (bob's refund gave back exactly the seat it put back on sale: with
    # refunds of other kinds the two differ, the test below)
    report = reports.event_report(event=sales.event)
    intents = PurchaseSaga.objects.filter(event=sales.event).values("intent_id")
    entries = LedgerEntry.objects.filter(intent_id__in=intents)

    charges = sum(e.amount for e in entries if e.kind == EntryKind.CHARGE)
    refunds = sum(e.amount for e in entries if e.kind == EntryKind.REFUND)
    assert (report["gross"]["amount"], report["refunded"]["amount"]) == (charges, -refunds)
    assert report["net"]["amount"] == sum(e.amount for e in entries)
    assert sum(c["gross"]["amount"] for c in report["by_category"]) == report["net"]["amount"]
    assert sum(c["sold"] for c in report["by_category"]) == report["seats"]["sold"]


@pytest.mark.django_db
def test_partial_refunds_show_in_the_rows_and_the_report_as_the_ledger_has_them(sales):
    # given: alice (A1 stalls 5000, B1 balcony 2500) gets 1000 back, then
    # B1's price with B1 back on sale; dave gets C1's price and keeps C1;
    # then a refund of alice's is asked that the processor has not answered
    finance = sales.members[Role.FINANCE]
    alice, dave = sales.sagas["alice"], sales.sagas["dave"]

    def refund(saga, **asked):
        organizer_refund(
            organizer=sales.event.organizer, saga_id=saga.pk, user=finance, reason="r", **asked
        )

    with freeze_time(T0) as clock:
        clock.tick(600)
        refund(alice, amount=1000)
        refund(alice, seats=["B1"], release_seats=True)
        refund(dave, seats=["C1"])
        drain_outbox()
        refund(alice, amount=500)  # pending: nothing given back yet

    # when
    rows = {row["id"]: row for row in sales.get("purchases/").json()["results"]}
    lines = {line[0]: line for line in _csv(sales.get("purchases.csv"))[1:]}
    report = sales.get("report/").json()

    # then: two refund entries of alice's intent, one per refund row
    refunds = LedgerEntry.objects.filter(intent_id=alice.intent_id, kind=EntryKind.REFUND)
    assert sorted(e.amount for e in refunds) == [-2500, -1000]
    assert len({e.refund_id for e in refunds} - {None}) == 2
    # the rows: the purchases stay CONFIRMED; the ledger's money says the rest
    facts = {
        name: (row["status"], row["payment_status"], row["refunded"]["amount"], row["seats"])
        for name, row in ((n, rows[str(sales.sagas[n].pk)]) for n in ("alice", "dave"))
    }
    assert facts == {
        "alice": ("CONFIRMED", "partially_refunded", 3500, ["A1", "B1"]),
        "dave": ("CONFIRMED", "refunded", 1500, ["C1"]),
    }
    # the CSV's lines say the same
    assert [lines[str(alice.pk)][i] for i in (1, 6, 9)] == [
        "CONFIRMED",
        "3500",
        "partially_refunded",
    ]
    assert [lines[str(dave.pk)][i] for i in (1, 6, 9)] == ["CONFIRMED", "1500", "refunded"]
    # the report: the ledger's money (bob's 2500, alice's 3500, dave's 1500)
    eur = lambda amount: {"amount": amount, "currency": "EUR"}  # noqa: E731
    assert (report["gross"], report["refunded"], report["net"]) == (
        eur(11500),
        eur(7500),
        eur(4000),
    )
    # B1 back on sale; C1 refunded and kept, still sold
    assert report["seats"] == {"available": 3, "held": 1, "sold": 2, "unavailable": 1}
    assert [(c["code"], c["sold"], c["gross"]["amount"]) for c in report["by_category"]] == [
        ("stalls", 1, 5000),
        ("balcony", 0, 0),
        ("", 1, 1500),
    ]
    # the seats sold add up to net and what was refunded beside the seats
    # put back on sale: alice's 1000, dave's C1 (1500)
    assert sum(c["gross"]["amount"] for c in report["by_category"]) == 4000 + 1000 + 1500
    assert report == reports.event_report(event=sales.event)


@pytest.mark.django_db
def test_a_new_events_report_lists_its_categories_with_nothing_sold():
    event = event_with_categories(OrganizerFactory(), {"A1": ("stalls", 5000)})

    report = reports.event_report(event=event)

    assert report["seats"] == {"available": 1, "held": 0, "sold": 0, "unavailable": 0}
    assert [(c["code"], c["sold"], c["gross"]["amount"]) for c in report["by_category"]] == [
        ("stalls", 0, 0),
        ("balcony", 0, 0),
    ]
    assert (
        report["gross"] == report["refunded"] == report["net"] == {"amount": 0, "currency": "EUR"}
    )


# --- scoping ----------------------------------------------------------------------------------

TAILS = ["purchases/", "purchases.csv", "report/"]


@pytest.mark.django_db
@pytest.mark.parametrize("tail", TAILS)
def test_another_organizers_event_is_the_same_404_as_a_missing_one(sales, tail):
    missing = max(Event.objects.values_list("pk", flat=True)) + 1
    owner = _client(sales.members[Role.OWNER])

    foreign = owner.get(sales.url(tail, sales.foreign_event))
    absent = owner.get(f"/api/organizers/riverside/events/{missing}/{tail}")
    malformed = owner.get(f"/api/organizers/riverside/events/abc/{tail}")
    huge = owner.get(f"/api/organizers/riverside/events/{2**64}/{tail}")

    assert foreign.status_code == 404
    assert foreign.json() == {"code": "not_found", "detail": "no such event"}
    for answer in (absent, malformed, huge):
        assert (answer.status_code, answer.json()) == (404, foreign.json())
    # The organizer's other event answers, with its own purchases only.
    other = owner.get(sales.url("purchases/", sales.other_event))
    assert other.json()["count"] == 1


@pytest.mark.django_db
@pytest.mark.parametrize("tail", TAILS)
def test_only_the_roles_that_read_sales_may(sales, tail):
    answers = {role: sales.get(tail, role=role).status_code for role in Role}
    door = sales.get(tail, role=Role.DOOR)

    assert answers == {Role.OWNER: 200, Role.MANAGER: 200, Role.FINANCE: 200, Role.DOOR: 403}
    assert door.json()["code"] == "permission_denied"
    stranger = _client(sales.buyers["alice"]).get(sales.url(tail))
    assert (stranger.status_code, stranger.json()["detail"]) == (404, "no such organizer")
