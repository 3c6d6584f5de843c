"""A ticket's code (docs/door.md, "The code"; "Keys and rotation"): any
change to it fails, another event's is ``wrong_event``, one signed with a
key not the event's is ``invalid``; a rotated key keeps admitting the codes
it signed until it is retired; the private keys are kept encrypted."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from door import codes, keys
from door.errors import KeyRefused
from door.models import EventKey, Scan
from door.services import checkin, event_key_retire, event_key_rotate
from purchases.models import PurchaseSaga, ReservationSeat, Seat
from purchases.services import saga_charge

from .conftest import start_purchase
from .factories import EventFactory, UserFactory

pytestmark = pytest.mark.django_db


def link_of(saga: PurchaseSaga, ref: str = "A1") -> ReservationSeat:
    seat = Seat.objects.get(event_id=saga.event_id, ref=ref)
    return ReservationSeat.objects.get(
        event_id=saga.event_id, reservation_id=saga.reservation_id, seat_id=seat.pk
    )


def code_of(saga: PurchaseSaga, ref: str = "A1") -> str:
    """The code of the purchase's ticket for ``ref``, as the pages show it."""
    link = link_of(saga, ref)
    return keys.ticket_code(
        event_id=link.event_id,
        seat_id=link.seat_id,
        ticket_id=link.pk,
        ticket_version=link.ticket_version,
    )


def confirmed(event, seats=("A1",), buyer=None) -> PurchaseSaga:
    buyer = buyer or UserFactory()
    saga = saga_charge(saga_id=start_purchase(buyer, event, seats=seats).pk)
    assert saga.state == "CONFIRMED"
    return saga


@pytest.fixture
def door_staff():
    return UserFactory(username="door")


def test_a_code_is_119_url_safe_characters_and_the_same_every_time(gateway):
    saga = confirmed(EventFactory(seats=["A1"]))

    code = code_of(saga)

    assert len(code) == codes.CODE_LENGTH == 119
    assert code == code_of(saga)  # deterministic: derived, never stored
    link = link_of(saga)
    assert codes.parse(code) == codes.Payload(1, saga.event_id, link.seat_id, link.pk, 0)


def test_every_changed_character_or_byte_of_a_code_is_invalid(gateway, door_staff):
    # given a valid code and the event's keys
    event = EventFactory(seats=["A1"])
    code = code_of(confirmed(event))
    accepted = keys.public_keys(event.pk)
    assert codes.verify(code, accepted) is not None
    raw = base64.urlsafe_b64decode(code + "=")

    # when each character is changed, and each byte flipped
    changed = [
        code[:i] + ("B" if code[i] == "A" else "A") + code[i + 1 :] for i in range(len(code))
    ]
    flipped = [
        base64.urlsafe_b64encode(raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1 :])
        .rstrip(b"=")
        .decode()
        for i in range(len(raw))
    ]

    # then none verifies; those naming this event scan invalid, and none is let in
    assert [c for c in changed + flipped if codes.verify(c, accepted) is not None] == []
    assert codes.parse(code + "A") is None and codes.parse(code[:-1]) is None
    assert codes.parse(code[:-1] + "!") is None
    results = {checkin(event.pk, c, "north", door_staff)["result"] for c in changed + flipped}
    assert "ok" not in results and "already_checked_in" not in results
    assert results <= {"invalid", "wrong_event"}
    assert checkin(event.pk, code, "north", door_staff)["result"] == "ok"


def test_another_events_code_is_wrong_event(gateway, door_staff):
    ours, theirs = EventFactory(seats=["A1"]), EventFactory(seats=["A1"])
    code = code_of(confirmed(theirs))

    answer = checkin(ours.pk, code, "north", door_staff)

    assert answer == {"result": "wrong_event"}
    scan = Scan.objects.get(event_id=ours.pk)
    assert (scan.result, scan.ticket_id, scan.code) == ("wrong_event", None, code)


def test_a_code_signed_with_another_key_is_invalid(gateway, door_staff):
    event = EventFactory(seats=["A1"])
    saga = confirmed(event)
    link = link_of(saga)
    keys.signing_key(event.pk)  # the event has its own key (version 1)
    forged = codes.sign(
        (1, Ed25519PrivateKey.generate()),
        event_id=event.pk,
        seat_id=link.seat_id,
        ticket_id=link.pk,
        ticket_version=0,
    )

    assert checkin(event.pk, forged, "north", door_staff) == {"result": "invalid"}
    assert checkin(event.pk, code_of(saga), "north", door_staff)["result"] == "ok"


def test_a_rotated_key_admits_its_codes_until_it_is_retired(gateway, door_staff):
    # given a ticket's code signed with the event's first key
    event = EventFactory(seats=["A1", "A2"])
    saga = confirmed(event, seats=["A1", "A2"])
    old_a1, old_a2 = code_of(saga, "A1"), code_of(saga, "A2")

    # when the key is rotated
    assert event_key_rotate(event) == 2

    # then new codes are signed with the new key; the old ones still admit
    new_a1, new_a2 = code_of(saga, "A1"), code_of(saga, "A2")
    assert new_a1 != old_a1 and codes.parse(new_a1).key_version == 2  # type: ignore[union-attr]
    assert checkin(event.pk, old_a1, "north", door_staff)["result"] == "ok"
    assert checkin(event.pk, new_a1, "north", door_staff)["result"] == "already_checked_in"
    with pytest.raises(KeyRefused):
        event_key_retire(event, 2)  # the current key: rotate first

    # when the first key is retired, its codes no longer scan
    event_key_retire(event, 1)
    assert checkin(event.pk, old_a2, "north", door_staff) == {"result": "invalid"}
    assert checkin(event.pk, new_a2, "north", door_staff)["result"] == "ok"
    assert sorted(keys.public_keys(event.pk)) == [2]


def test_the_private_keys_are_encrypted_with_the_first_secret_and_read_with_any(gateway, settings):
    event = EventFactory(seats=["A1"])
    saga = confirmed(event)
    code = code_of(saga)
    row = EventKey.objects.get(event_id=event.pk)
    assert len(bytes(row.public_key)) == 32
    assert len(bytes(row.private_key_encrypted)) > 32  # a Fernet token, not the raw key

    # a new secret first, the old one kept: the keys still decrypt
    keys._private.clear()
    settings.TICKET_KEY_SECRETS = [Fernet.generate_key().decode(), *settings.TICKET_KEY_SECRETS]
    try:
        assert code_of(saga) == code
    finally:
        keys._private.clear()


def _settings_load(**env: str) -> subprocess.CompletedProcess[str]:
    """config.settings (production's) loaded in a process of its own."""
    environment = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "TICKET_KEY_SECRETS")}
    return subprocess.run(
        [sys.executable, "-c", "import config.settings"],
        cwd=Path(__file__).resolve().parent.parent,
        env={**environment, "SECRET_KEY": "x" * 60, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_with_debug_off_the_ticket_key_secrets_are_required_and_checked():
    missing = _settings_load()
    malformed = _settings_load(TICKET_KEY_SECRETS="not-a-fernet-key")
    development = _settings_load(DEBUG="true")

    assert "TICKET_KEY_SECRETS must be set when DEBUG is off" in missing.stderr
    assert "TICKET_KEY_SECRETS takes Fernet keys" in malformed.stderr
    assert development.returncode == 0, development.stderr
