"""The door through the API (docs/door.md, "The door API"): a ticket is
let in once, then ``already_checked_in``, and ``revoked`` once a refund
releases its seat or a reissue replaces its code; the offline gates' list
and upload (conflicts, an upload replayed); the progress; who may scan.
Real PostgreSQL, the in-process fake processor."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from door import codes
from door.errors import TicketNotFound, TicketRefused
from door.models import CheckIn, RevocationReason, Scan, TicketRevocation
from door.revocations import revoke_purchase
from door.selectors import ticket_statuses
from door.services import ticket_reissue
from organizers.roles import Role
from purchases.services import organizer_refund

from .factories import EventFactory, MembershipFactory, OrganizerFactory, UserFactory
from .test_door_codes import code_of, confirmed, link_of

pytestmark = pytest.mark.django_db

T1 = datetime(2026, 12, 24, 19, 0, tzinfo=UTC)


def _client(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def venue(gateway):
    """An organizer with a member of each role, an event of theirs on sale,
    and a buyer's confirmed purchase of A1 and A2."""
    organizer = OrganizerFactory(slug="the-door")
    members = {role: UserFactory(username=f"door-{role}") for role in Role}
    for role, user in members.items():
        MembershipFactory(organizer=organizer, user=user, role=role)
    event = EventFactory(organizer=organizer, seats=["A1", "A2", "A3"])
    buyer = UserFactory(username="buyer")
    saga = confirmed(event, seats=["A1", "A2"], buyer=buyer)
    return {"organizer": organizer, "members": members, "event": event, "saga": saga}


def _url(venue, tail: str = "") -> str:
    return f"/api/organizers/{venue['organizer'].slug}/events/{venue['event'].pk}/checkin/{tail}"


def _scan(venue, code: str, gate: str = "north", role: Role = Role.DOOR) -> dict:
    answer = _client(venue["members"][role]).post(
        _url(venue), {"code": code, "gate": gate}, format="json"
    )
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_a_ticket_is_let_in_once_then_revoked_when_a_refund_releases_its_seat(gateway, venue):
    code = code_of(venue["saga"], "A1")

    first = _scan(venue, code, gate="north")
    again = _scan(venue, code, gate="south")

    assert first["result"] == "ok" and first["seat"] == "A1" and first["gate"] == "north"
    assert again == {
        "result": "already_checked_in",
        "seat": "A1",
        "checked_in_at": first["checked_in_at"],
        "gate": "north",
    }
    # when finance refunds the seat and puts it back on sale
    organizer_refund(
        organizer=venue["organizer"],
        saga_id=venue["saga"].pk,
        user=venue["members"][Role.FINANCE],
        reason="double booking",
        seats=["A1"],
        release_seats=True,
    )
    # then the ticket no longer lets anyone in, and the revocation is a row
    assert _scan(venue, code) == {"result": "revoked", "seat": "A1"}
    link = link_of(venue["saga"], "A1")
    revocation = TicketRevocation.objects.get(event_id=link.event_id, ticket_id=link.pk)
    assert (revocation.version, revocation.reason) == (0, "refund")
    assert ticket_statuses(link.event_id, [link.pk]) == {link.pk: "revoked"}
    scans = Scan.objects.filter(event_id=link.event_id).order_by("id")
    assert [s.result for s in scans] == ["ok", "already_checked_in", "revoked"]
    assert {s.ticket_id for s in scans} == {link.pk}
    assert CheckIn.objects.filter(event_id=link.event_id).count() == 1


def test_a_reissue_revokes_the_old_code_and_is_refused_once_checked_in(gateway, venue):
    saga, buyer = venue["saga"], venue["saga"].buyer
    old = code_of(saga, "A1")

    new = ticket_reissue(saga_id=saga.pk, seat_ref="A1", user=buyer)

    assert new != old and new == code_of(saga, "A1")
    assert codes.parse(new).ticket_version == 1  # type: ignore[union-attr]
    assert _scan(venue, old) == {"result": "revoked", "seat": "A1"}
    assert _scan(venue, new)["result"] == "ok"
    with pytest.raises(TicketRefused) as refused:
        ticket_reissue(saga_id=saga.pk, seat_ref="A1", user=buyer)
    assert refused.value.code == "ticket_checked_in"
    with pytest.raises(TicketNotFound):
        ticket_reissue(saga_id=saga.pk, seat_ref="A2", user=venue["members"][Role.OWNER])
    with pytest.raises(TicketNotFound):
        ticket_reissue(saga_id=saga.pk, seat_ref="A3", user=buyer)  # not this purchase's
    # a seat refunded and released: its ticket is revoked, not reissued
    organizer_refund(
        organizer=venue["organizer"],
        saga_id=saga.pk,
        user=venue["members"][Role.OWNER],
        reason="moved",
        seats=["A2"],
        release_seats=True,
    )
    with pytest.raises(TicketRefused) as refused:
        ticket_reissue(saga_id=saga.pk, seat_ref="A2", user=buyer)
    assert refused.value.code == "ticket_revoked"


def test_the_offline_list_carries_the_keys_and_the_revoked_and_checked_in_codes(gateway, venue):
    saga = venue["saga"]
    a1, old_a2 = code_of(saga, "A1"), code_of(saga, "A2")
    _scan(venue, a1)
    new_a2 = ticket_reissue(saga_id=saga.pk, seat_ref="A2", user=saga.buyer)

    answer = _client(venue["members"][Role.MANAGER]).get(_url(venue, "list/"))

    assert answer.status_code == 200, answer.content
    listed = answer.json()
    assert listed["checked_in"] == [a1]
    assert listed["revoked"] == [old_a2]
    assert listed["public_keys"] == [{"version": 1, "key": listed["public_key"]}]
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(listed["public_key"]))
    # a gate verifies every code with the listed key alone
    assert all(codes.verify(c, {1: public}) for c in (a1, old_a2, new_a2))
    assert datetime.fromisoformat(listed["as_of"]) <= datetime.now(UTC)


def test_a_lost_dispute_revokes_the_purchases_tickets_once(venue):
    saga = venue["saga"]
    a1, a2 = code_of(saga, "A1"), code_of(saga, "A2")

    def lost():
        return revoke_purchase(
            event_id=saga.event_id,
            reservation_id=saga.reservation_id,
            reason=RevocationReason.DISPUTE,
            at=T1,
        )

    assert (lost(), lost()) == (2, 0)  # the dispute's events replayed: nothing new
    assert _scan(venue, a1) == {"result": "revoked", "seat": "A1"}
    listed = _client(venue["members"][Role.OWNER]).get(_url(venue, "list/")).json()
    assert sorted(listed["revoked"]) == sorted([a1, a2])


def test_an_offline_upload_marks_a_second_admission_a_conflict_and_replays_once(gateway, venue):
    saga = venue["saga"]
    a1, a2 = code_of(saga, "A1"), code_of(saga, "A2")
    _scan(venue, a1, gate="north")  # online, first
    batch = {
        "scans": [
            {"code": a1, "gate": "south", "at": T1.isoformat()},
            {"code": a2, "gate": "south", "at": (T1 + timedelta(seconds=5)).isoformat()},
            {"code": "not a ticket", "gate": "south", "at": T1.isoformat()},
        ]
    }
    client = _client(venue["members"][Role.DOOR])

    first = client.post(_url(venue, "upload/"), batch, format="json")
    again = client.post(_url(venue, "upload/"), batch, format="json")

    assert first.status_code == again.status_code == 200, first.content
    results = [(r["result"], r["conflict"]) for r in first.json()["results"]]
    assert results == [("already_checked_in", True), ("ok", False), ("invalid", False)]
    assert again.json() == first.json()
    offline = Scan.objects.filter(event_id=saga.event_id, offline=True)
    assert offline.count() == 3  # the replay recorded nothing new
    link = link_of(saga, "A2")
    check_in = CheckIn.objects.get(event_id=saga.event_id, ticket_id=link.pk)
    assert (check_in.checked_in_at, check_in.gate) == (T1 + timedelta(seconds=5), "south")
    # then the progress counts both, by gate
    progress = client.get(_url(venue, "progress/")).json()
    assert progress == {
        "expected": 2,
        "admitted": 2,
        "by_gate": [{"gate": "north", "admitted": 1}, {"gate": "south", "admitted": 1}],
    }


def test_only_door_staff_managers_and_owners_scan_and_only_their_organizers_events(gateway, venue):
    code = code_of(venue["saga"], "A1")
    finance = _client(venue["members"][Role.FINANCE])
    other = OrganizerFactory(slug="elsewhere")
    outsider = UserFactory(username="outsider")
    MembershipFactory(organizer=other, user=outsider, role=Role.OWNER)
    theirs = EventFactory(organizer=other, seats=["A1"])

    refused = finance.post(_url(venue), {"code": code}, format="json")
    elsewhere = _client(outsider).post(_url(venue), {"code": code}, format="json")
    not_ours = _client(venue["members"][Role.DOOR]).post(
        f"/api/organizers/the-door/events/{theirs.pk}/checkin/", {"code": code}, format="json"
    )
    empty = _client(venue["members"][Role.DOOR]).post(_url(venue), {}, format="json")

    assert (refused.status_code, refused.json()["code"]) == (403, "permission_denied")
    assert (elsewhere.status_code, elsewhere.json()["code"]) == (404, "not_found")
    assert (not_ours.status_code, not_ours.json()["code"]) == (404, "not_found")
    assert (empty.status_code, empty.json()["field"]) == (400, "code")
    assert not Scan.objects.exists()
    assert _scan(venue, code, role=Role.OWNER)["result"] == "ok"


def test_an_event_the_process_remembers_is_still_refused_to_another_organizer(gateway, venue):
    # given the venue's event scanned once (the process remembers whose it is)
    code = code_of(venue["saga"], "A1")
    assert _scan(venue, code)["result"] == "ok"
    other = OrganizerFactory(slug="elsewhere")
    outsider = UserFactory(username="outsider")
    MembershipFactory(organizer=other, user=outsider, role=Role.DOOR)

    # when door staff of another organizer scan it under their own organizer
    answer = _client(outsider).post(
        f"/api/organizers/elsewhere/events/{venue['event'].pk}/checkin/",
        {"code": code_of(venue["saga"], "A2")},
        format="json",
    )

    # then it is no event of theirs, and nothing is kept
    assert (answer.status_code, answer.json()["code"]) == (404, "not_found")
    assert Scan.objects.filter(event_id=venue["event"].pk).count() == 1
    assert _scan(venue, code_of(venue["saga"], "A2"))["result"] == "ok"


# --- the scan's body: the fast path and the serializer agree ---------------------------------

_CODE = "A" * 119
_BODIES = [
    {"code": _CODE},
    {"code": _CODE, "gate": "north"},
    {"code": f"  {_CODE}\n", "gate": " north\t"},
    {"code": "", "gate": ""},
    {"code": "   "},
    {"code": "x" * 2000, "gate": "g" * 64},
    {"code": "x" * 2001},
    {"code": " " + "x" * 2000 + " "},
    {"code": _CODE, "gate": "g" * 65},
    {"code": _CODE + "\x00"},
    {"code": _CODE, "gate": "n\x00rth"},
    {"code": "Ünïcode"},
    {"code": _CODE, "gate": "Nord-Süd"},
    {"code": "\ud800"},
    {"code": _CODE, "gate": "\udfff"},
    {"code": 119},
    {"code": 1.5},
    {"code": True},
    {"code": None},
    {"code": [_CODE]},
    {"code": {"x": 1}},
    {"code": _CODE, "gate": None},
    {"code": _CODE, "gate": 7},
    {"code": _CODE, "gate": False},
    {"gate": "north"},
    {},
    {"code": _CODE, "extra": "ignored"},
    [{"code": _CODE}],
    "code",
    None,
]


@pytest.mark.parametrize("body", _BODIES, ids=range(len(_BODIES)))
def test_the_scans_fast_path_answers_every_body_as_the_serializer(body):
    from rest_framework.exceptions import ValidationError

    from door.serializers import CheckinRequestSerializer, checkin_request

    def answer(parse):
        try:
            return "valid", parse()
        except ValidationError as refused:
            return "refused", refused.detail

    def by_serializer():
        payload = CheckinRequestSerializer(data=body)
        payload.is_valid(raise_exception=True)
        return payload.validated_data["code"], payload.validated_data["gate"]

    assert answer(lambda: checkin_request(body)) == answer(by_serializer)
