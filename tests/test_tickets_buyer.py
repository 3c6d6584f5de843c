"""The buyer's tickets (docs/api.md, "Your tickets", "Replace a ticket"):
a confirmed purchase's answer, page and confirmation email carry each
seat's signed code; the codes verify with the event's public key; a
ticket replaced through the API or the page answers ``revoked`` at the
door and its new code ``ok``; another user's purchase is a 404. Real
PostgreSQL, the in-process fake processor, the door's own check-in."""

from __future__ import annotations

import html
import re
import uuid

import pytest
import segno
from django.core import mail
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from door import codes, keys
from door.models import CheckIn, RevocationReason, TicketRevocation
from door.services import checkin, event_key_rotate
from door.tickets import purchase_tickets, purchases_tickets, tickets_of
from outbox.delivery import messages_deliver_claimed
from outbox.models import OutboxMessage
from purchases.models import PurchaseSaga, ReservationSeat, Seat
from purchases.services import organizer_refund, saga_charge

from .conftest import drain_outbox, start_purchase
from .factories import EventFactory, UserFactory

pytestmark = pytest.mark.django_db

PURCHASES = "/api/purchases/"
CODE = re.compile(r"^[A-Za-z0-9_-]{119}$")


# --- helpers -----------------------------------------------------------------------------


@pytest.fixture
def show(db):
    return EventFactory(name="Harbour lights", seats=["A1", "A2", "A3", "A4"])


@pytest.fixture
def bought(alice, show, gateway) -> PurchaseSaga:
    """Alice's confirmed purchase of A1 and A2."""
    saga = saga_charge(saga_id=start_purchase(alice, show, seats=["A1", "A2"]).pk)
    assert saga.state == "CONFIRMED"
    return saga


def page_client(user, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def detail(api, saga) -> dict:
    answer = api.get(f"{PURCHASES}{saga.pk}/")
    assert answer.status_code == 200, answer.content
    return answer.json()


def codes_of(api, saga) -> dict[str, str]:
    return {t["seat"]: t["code"] for t in detail(api, saga)["tickets"]}


def reissue_url(saga, seat: str, *, page: bool = False) -> str:
    return f"{'' if page else '/api'}/purchases/{saga.pk}/tickets/{seat}/reissue/"


def payload_of(event, code: str) -> codes.Payload:
    """What ``code`` says, verified with the event's public keys."""
    payload = codes.verify(code, keys.public_keys(event.pk))
    assert payload is not None, "the code does not verify with the event's public key"
    return payload


def give_back(show, bought, seats: list[str], *, reason: str) -> None:
    """The organizer refunds ``seats`` of the purchase and puts them back on sale."""
    organizer_refund(
        organizer=show.organizer,
        saga_id=bought.pk,
        user=UserFactory(),
        reason=reason,
        seats=seats,
        release_seats=True,
    )


def at_the_door(event, code: str) -> str:
    return checkin(event.pk, code, gate="north")["result"]


def tickets_on(page: str) -> dict[str, str]:
    """Each ticket of the page: its seat and its body."""
    return dict(re.findall(r'<li class="ticket" data-ticket="([^"]+)">(.*?)</li>', page, re.S))


def qr_of(code: str) -> str:
    """The QR code the page draws for ``code``: segno's full QR code, level M."""
    return segno.make_qr(code, error="m").svg_inline(
        scale=5, border=2, title=code, svgclass="qr", lineclass=None
    )


def text_of(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def csrf_token_of(page: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert found is not None, "no CSRF token on the page"
    return found.group(1)


# --- the API's answer --------------------------------------------------------------------


def test_a_confirmed_purchase_answers_a_signed_ticket_per_seat(alice, alice_api, show, bought):
    # when
    tickets = detail(alice_api, bought)["tickets"]

    # then: one per seat, valid, each code a signature of the event's key
    assert [(t["seat"], t["status"]) for t in tickets] == [("A1", "valid"), ("A2", "valid")]
    links = {
        link.seat.ref: link
        for link in ReservationSeat.objects.filter(reservation_id=bought.reservation_id)
    }
    for ticket in tickets:
        assert CODE.fullmatch(ticket["code"]), ticket["code"]
        payload = payload_of(show, ticket["code"])
        link = links[ticket["seat"]]
        assert (payload.event_id, payload.seat_id, payload.ticket_id) == (
            show.pk,
            link.seat_id,
            link.pk,
        )
        assert payload.ticket_version == 0
    # the same code on every read (signed at read time, never stored)
    assert codes_of(alice_api, bought) == {t["seat"]: t["code"] for t in tickets}


def test_no_ticket_before_the_purchase_is_confirmed_nor_once_it_is_undone(
    alice, alice_api, show, gateway
):
    pending = start_purchase(alice, show, seats=["A3"])
    declined = saga_charge(
        saga_id=start_purchase(
            alice, show, seats=["A4"], payment_method="pm_card_chargeDeclined"
        ).pk
    )

    assert detail(alice_api, pending)["tickets"] == []
    assert declined.state == "COMPENSATED"
    assert detail(alice_api, declined)["tickets"] == []


def test_a_code_does_not_verify_with_another_events_key(alice, alice_api, bought, gateway):
    other = EventFactory(seats=["B1"])
    keys.signing_key(other.pk)  # its key made

    [code, *_] = codes_of(alice_api, bought).values()

    assert codes.verify(code, keys.public_keys(other.pk)) is None
    assert at_the_door(other, code) == "wrong_event"


def test_a_seat_given_back_has_no_ticket_and_its_code_is_revoked(alice, alice_api, show, bought):
    before = codes_of(alice_api, bought)

    give_back(show, bought, ["A2"], reason="broken seat")
    drain_outbox()

    assert codes_of(alice_api, bought) == {"A1": before["A1"]}
    assert at_the_door(show, before["A2"]) == "revoked"
    answer = alice_api.post(reissue_url(bought, "A2"))
    assert answer.status_code == 409 and answer.json()["code"] == "ticket_revoked"


def test_a_rotated_key_signs_new_codes_and_the_old_ones_still_scan(alice, alice_api, show, bought):
    old = codes_of(alice_api, bought)

    version = event_key_rotate(show)

    new = codes_of(alice_api, bought)
    assert set(new) == set(old) and all(new[s] != old[s] for s in new)
    assert {payload_of(show, c).key_version for c in new.values()} == {version}
    assert at_the_door(show, old["A1"]) == "ok"  # the old key is still accepted
    assert at_the_door(show, new["A1"]) == "already_checked_in"


def test_the_tickets_cost_the_same_queries_whatever_their_number(alice, alice_api, show, gateway):
    one = saga_charge(saga_id=start_purchase(alice, show, seats=["A1"]).pk)
    three = saga_charge(saga_id=start_purchase(alice, show, seats=["A2", "A3", "A4"]).pk)
    detail(alice_api, one)  # the token, and the event's key, read once

    with CaptureQueriesContext(connection) as few:
        assert len(detail(alice_api, one)["tickets"]) == 1
    with CaptureQueriesContext(connection) as more:
        assert len(detail(alice_api, three)["tickets"]) == 3

    assert len(few) == len(more)


def test_the_schema_describes_the_tickets_and_the_reissue(anon_api):
    schema = anon_api.get("/api/schema/", {"format": "json"}).json()
    components = schema["components"]["schemas"]

    tickets = components["PurchaseDetail"]["properties"]["tickets"]
    ticket = components[tickets["items"]["$ref"].rsplit("/", 1)[-1]]
    assert set(ticket["required"]) == {"seat", "code", "status"}
    [status_ref] = ticket["properties"]["status"]["allOf"]
    status = components[status_ref["$ref"].rsplit("/", 1)[-1]]
    assert set(status["enum"]) == {"valid", "checked_in", "revoked"}

    reissue = schema["paths"]["/api/purchases/{saga_id}/tickets/{seat}/reissue/"]["post"]
    assert set(reissue["responses"]) == {"200", "401", "403", "404", "409"}
    for code in ("ticket_checked_in", "ticket_revoked"):
        assert f"`{code}`" in reissue["responses"]["409"]["description"]
    assert reissue["operationId"] == "purchases_tickets_reissue"


# --- reissue through the API -------------------------------------------------------------


def test_a_reissue_answers_a_new_code_and_the_old_one_is_revoked_at_the_door(
    alice, alice_api, show, bought
):
    old = codes_of(alice_api, bought)

    # when
    answer = alice_api.post(reissue_url(bought, "A1"))

    # then
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert set(body) == {"seat", "code", "status"}
    assert (body["seat"], body["status"]) == ("A1", "valid")
    assert body["code"] != old["A1"] and CODE.fullmatch(body["code"])
    assert payload_of(show, body["code"]).ticket_version == 1
    # the purchase answers the new code; the other ticket is untouched
    assert codes_of(alice_api, bought) == {"A1": body["code"], "A2": old["A2"]}
    # the revocation row the offline list carries
    link = ReservationSeat.objects.get(reservation_id=bought.reservation_id, seat__ref="A1")
    assert TicketRevocation.objects.filter(
        event_id=show.pk, ticket_id=link.pk, version=0, reason=RevocationReason.REISSUE
    ).exists()
    # at the door
    assert at_the_door(show, old["A1"]) == "revoked"
    assert at_the_door(show, body["code"]) == "ok"
    assert at_the_door(show, old["A2"]) == "ok"


def test_a_ticket_used_at_the_door_cannot_be_reissued(alice, alice_api, show, bought):
    code = codes_of(alice_api, bought)["A1"]
    assert at_the_door(show, code) == "ok"

    answer = alice_api.post(reissue_url(bought, "A1"))

    assert answer.status_code == 409
    body = answer.json()
    assert body["code"] == "ticket_checked_in" and body["detail"]
    assert detail(alice_api, bought)["tickets"][0] == {
        "seat": "A1",
        "code": code,
        "status": "checked_in",
    }


def test_another_users_reissue_is_a_404_like_a_missing_purchase(
    alice, bob_api, alice_api, show, bought
):
    before = codes_of(alice_api, bought)

    theirs = bob_api.post(reissue_url(bought, "A1"))
    missing = bob_api.post(f"/api/purchases/{uuid.uuid4()}/tickets/A1/reissue/")

    assert theirs.status_code == missing.status_code == 404
    assert theirs.json() == missing.json()
    assert theirs.json()["code"] == "not_found"
    assert codes_of(alice_api, bought) == before  # nothing changed
    assert not TicketRevocation.objects.exists()


@pytest.mark.parametrize(
    "path",
    [
        "/api/purchases/not-a-uuid/tickets/A1/reissue/",
        "/api/purchases/{saga}/tickets/Z9/reissue/",
    ],
)
def test_an_unknown_seat_or_a_malformed_id_is_a_json_404(alice, alice_api, bought, path):
    answer = alice_api.post(path.format(saga=bought.pk))

    assert answer.status_code == 404
    assert answer["Content-Type"] == "application/json"
    assert answer.json()["code"] == "not_found"


def test_a_reissue_needs_credentials(anon_api, bought):
    answer = anon_api.post(reissue_url(bought, "A1"))

    assert answer.status_code == 401
    assert answer.json()["code"] == "not_authenticated"


def test_a_ticket_taken_back_by_a_dispute_is_revoked_and_cannot_be_reissued(
    alice, alice_api, show, bought
):
    link = ReservationSeat.objects.get(reservation_id=bought.reservation_id, seat__ref="A2")
    TicketRevocation.objects.create(
        event_id=show.pk,
        ticket_id=link.pk,
        version=0,
        reason=RevocationReason.DISPUTE,
        at=timezone.now(),
    )

    statuses = {t["seat"]: t["status"] for t in detail(alice_api, bought)["tickets"]}
    answer = alice_api.post(reissue_url(bought, "A2"))

    assert statuses == {"A1": "valid", "A2": "revoked"}
    assert answer.status_code == 409 and answer.json()["code"] == "ticket_revoked"


# --- the purchase page -------------------------------------------------------------------


def test_the_page_draws_each_tickets_signed_code_as_a_qr_code(alice, alice_api, bought):
    expected = codes_of(alice_api, bought)

    page = page_client(alice).get(f"/purchases/{bought.pk}/").content.decode()

    tickets = tickets_on(page)
    assert list(tickets) == ["A1", "A2"]
    for seat, body in tickets.items():
        assert qr_of(expected[seat]) in body  # a full QR code of the signed code
        assert f"<code data-ticket-code>{expected[seat]}</code>" in body
        assert 'data-ticket-status="valid"' in body
        assert "Valid" in text_of(body) and bought.reservation.ref in body
        assert 'data-action="reissue"' in body
        assert 'name="csrfmiddlewaretoken"' in body
        assert f'hx-post="{reissue_url(bought, seat, page=True)}"' in body


def test_a_used_or_revoked_ticket_says_so_in_words_and_a_revoked_one_shows_no_code(
    alice, alice_api, show, bought
):
    codes_now = codes_of(alice_api, bought)
    assert at_the_door(show, codes_now["A1"]) == "ok"
    link = ReservationSeat.objects.get(reservation_id=bought.reservation_id, seat__ref="A2")
    TicketRevocation.objects.create(
        event_id=show.pk,
        ticket_id=link.pk,
        version=0,
        reason=RevocationReason.DISPUTE,
        at=timezone.now(),
    )

    tickets = tickets_on(page_client(alice).get(f"/purchases/{bought.pk}/").content.decode())

    used, revoked = tickets["A1"], tickets["A2"]
    assert 'data-ticket-status="checked_in"' in used and "Checked in" in text_of(used)
    assert "<svg" in used and 'data-action="reissue"' not in used
    assert 'data-ticket-status="revoked"' in revoked and "No longer valid" in text_of(revoked)
    assert "<svg" not in revoked and codes_now["A2"] not in revoked
    assert 'data-action="reissue"' not in revoked


def test_replace_this_ticket_on_the_page_revokes_the_old_code(alice, alice_api, show, bought):
    old = codes_of(alice_api, bought)
    client = page_client(alice, csrf=True)
    page = client.get(f"/purchases/{bought.pk}/").content.decode()

    # when: the form's POST, with its CSRF token, without JavaScript
    answer = client.post(
        reissue_url(bought, "A1", page=True), {"csrfmiddlewaretoken": csrf_token_of(page)}
    )

    # then: back to the purchase, which draws the new code
    assert answer.status_code == 303
    assert answer["Location"] == f"/purchases/{bought.pk}/?replaced=A1"
    new = codes_of(alice_api, bought)
    assert new["A1"] != old["A1"] and new["A2"] == old["A2"]
    shown = tickets_on(client.get(answer["Location"]).content.decode())
    assert qr_of(new["A1"]) in shown["A1"] and old["A1"] not in shown["A1"]
    assert "data-ticket-new" in shown["A1"] and "data-ticket-new" not in shown["A2"]
    assert at_the_door(show, old["A1"]) == "revoked"
    assert at_the_door(show, new["A1"]) == "ok"


def test_replace_this_ticket_needs_the_forms_csrf_token(alice, alice_api, bought):
    before = codes_of(alice_api, bought)

    answer = page_client(alice, csrf=True).post(reissue_url(bought, "A1", page=True))

    assert answer.status_code == 403
    assert codes_of(alice_api, bought) == before


def test_replace_this_ticket_with_htmx_answers_the_live_part_with_the_new_code(
    alice, alice_api, show, bought
):
    client = page_client(alice)
    live = f"/purchases/{bought.pk}/live/"
    first = client.get(live, headers={"HX-Request": "true"})
    old = codes_of(alice_api, bought)

    answer = client.post(reissue_url(bought, "A2", page=True), headers={"HX-Request": "true"})

    assert answer.status_code == 200
    part = answer.content.decode()
    assert part.startswith('<div id="purchase-live"')
    new = codes_of(alice_api, bought)
    assert new["A2"] != old["A2"]
    shown = tickets_on(part)
    assert qr_of(new["A2"]) in shown["A2"] and "data-ticket-new" in shown["A2"]
    assert at_the_door(show, old["A2"]) == "revoked"
    # the live part's ETag moved with the ticket (the saga did not move)
    again = client.get(live, headers={"HX-Request": "true", "If-None-Match": first["ETag"]})
    assert again.status_code == 200 and again["ETag"] != first["ETag"]


def test_replacing_a_used_ticket_on_the_page_is_refused_in_words(alice, alice_api, show, bought):
    assert at_the_door(show, codes_of(alice_api, bought)["A1"]) == "ok"
    client = page_client(alice)

    plain = client.post(reissue_url(bought, "A1", page=True))
    with_htmx = client.post(reissue_url(bought, "A1", page=True), headers={"HX-Request": "true"})

    assert plain.status_code == 409
    for answer in (plain, with_htmx):
        problem = tickets_on(answer.content.decode())["A1"]
        assert "data-ticket-problem" in problem
        assert "already used at the door" in text_of(problem)
    assert CheckIn.objects.count() == 1


def test_another_users_page_reissue_is_a_404(alice, bob, alice_api, bought):
    before = codes_of(alice_api, bought)

    theirs = page_client(bob).post(reissue_url(bought, "A1", page=True))
    missing = page_client(bob).post(f"/purchases/{uuid.uuid4()}/tickets/A1/reissue/")
    unknown_seat = page_client(alice).post(reissue_url(bought, "Z9", page=True))

    assert theirs.status_code == missing.status_code == unknown_seat.status_code == 404
    assert codes_of(alice_api, bought) == before


# --- the confirmation email --------------------------------------------------------------


def test_the_confirmation_email_carries_each_seats_code(alice, alice_api, show, bought):
    drain_outbox()

    [email] = mail.outbox
    expected = codes_of(alice_api, bought)
    for seat, code in expected.items():
        assert f"Seat {seat}:\n{code}\n" in email.body
    assert bought.reservation.ref in email.subject


def test_a_purchase_taken_back_before_its_email_is_sent_sends_no_code(
    alice, alice_api, show, bought
):
    codes_before = codes_of(alice_api, bought)
    give_back(show, bought, ["A1", "A2"], reason="double booking")

    drain_outbox()

    [confirmation] = [m for m in mail.outbox if "Your tickets" in m.subject]
    assert not any(code in confirmation.body for code in codes_before.values())


def test_seat_refs_in_the_tickets_are_the_seats_own(alice_api, show, bought):
    refs = set(Seat.objects.filter(event=show).values_list("ref", flat=True))

    assert {t["seat"] for t in detail(alice_api, bought)["tickets"]} <= refs


def test_the_emails_read_of_the_tickets_is_the_pages_in_two_statements(
    alice, alice_api, show, gateway
):
    # given a purchase of four seats: one given back, one replaced, one used
    bought = saga_charge(saga_id=start_purchase(alice, show, seats=["A1", "A2", "A3", "A4"]).pk)
    give_back(show, bought, ["A1"], reason="double booking")
    assert alice_api.post(reissue_url(bought, "A2")).status_code == 200
    assert at_the_door(show, codes_of(alice_api, bought)["A3"]) == "ok"
    saga = PurchaseSaga.objects.get(pk=bought.pk)
    pending = start_purchase(UserFactory(), EventFactory(seats=["B1"]), seats=["B1"])

    # then the email's read answers what the page and the API show
    with CaptureQueriesContext(connection) as read:
        found = purchase_tickets(saga_id=str(saga.pk), event_id=show.pk)
    assert found == tickets_of(saga)
    assert [(t.seat, t.status) for t in found] == [
        ("A2", "valid"),
        ("A3", "checked_in"),
        ("A4", "valid"),
    ]
    assert purchase_tickets(saga_id=str(saga.pk), event_id=None) == found
    # in two statements: the tickets, and the event's key
    assert len(read) == 2, read.captured_queries
    # and nothing for a purchase not confirmed, of another event, or missing
    assert purchase_tickets(saga_id=str(pending.pk), event_id=pending.event_id) == []
    assert tickets_of(pending) == []
    assert purchase_tickets(saga_id=str(saga.pk), event_id=pending.event_id) == []
    assert purchase_tickets(saga_id=str(uuid.uuid4()), event_id=None) == []


def test_several_purchases_tickets_are_each_ones_in_one_statement_and_a_key_per_event(
    alice, bob, show, gateway
):
    # given confirmed purchases of two events (one with a seat given back),
    # one still on its way, and one that does not exist
    other = EventFactory(seats=["B1", "B2"])
    first = saga_charge(saga_id=start_purchase(alice, show, seats=["A1", "A2"]).pk)
    second = saga_charge(saga_id=start_purchase(bob, show, seats=["A3"]).pk)
    third = saga_charge(saga_id=start_purchase(alice, other, seats=["B1"]).pk)
    give_back(show, first, ["A1"], reason="double booking")
    pending = start_purchase(bob, other, seats=["B2"])
    named = [first, second, third, pending]
    asked = [(str(s.pk), s.event_id) for s in named] + [(str(uuid.uuid4()), show.pk)]

    alone = {
        str(s.pk): purchase_tickets(saga_id=str(s.pk), event_id=s.event_id)
        for s in (first, second, third)
    }  # (and each event's key made, on its first read)

    # when they are read together
    with CaptureQueriesContext(connection) as read:
        found = purchases_tickets(asked)

    # then each confirmed one's are what it reads alone, none for the others
    assert found == alone
    assert [t.seat for t in found[str(first.pk)]] == ["A2"]
    # in one statement for the tickets, and one per event for its key
    assert len(read) == 1 + 2, read.captured_queries
    assert purchases_tickets([]) == {}


def test_confirmations_delivered_together_read_their_tickets_once_and_each_carries_its_own(
    alice, bob, alice_api, bob_api, show, gateway, settings
):
    settings.OUTBOX_CONSUMERS = {"purchase.confirmed": ["purchases.consumers.confirmation_email"]}
    bought = [
        saga_charge(saga_id=start_purchase(alice, show, seats=["A1", "A2"]).pk),
        saga_charge(saga_id=start_purchase(bob, show, seats=["A3"]).pk),
    ]
    messages = list(OutboxMessage.objects.filter(topic="purchase.confirmed").order_by("pk"))
    for message in messages:
        message.already_ran = []

    with CaptureQueriesContext(connection) as seen:
        assert messages_deliver_claimed(messages)[:2] == (2, 0)

    reads = [q["sql"] for q in seen.captured_queries if "ticket_version" in q["sql"]]
    assert len(reads) == 1, reads
    by_reservation = {email.subject.rsplit(" ", 1)[1]: email.body for email in mail.outbox}
    for saga, api in zip(bought, [alice_api, bob_api], strict=True):
        body = by_reservation[saga.reservation.ref]
        for seat, code in codes_of(api, saga).items():
            assert f"Seat {seat}:\n{code}\n" in body
