"""A ticket's code: a small payload signed with the event's Ed25519 key
(docs/door.md, "The code").

::

    payload = struct.pack(">BHIQQH", 1, key_version, event_id, seat_id,
                          ticket_id, ticket_version)            # 25 bytes
    code    = base64url(payload + signature(payload)), no padding  # 119 chars

Ed25519 signatures are deterministic: the code is derived from the rows and
the key whenever it is shown, never stored. A scanner holding the event's
public keys verifies it offline (pretix's ``pretix_sig1`` is the model).
Pure functions: no database, no settings (the keys are ``door.keys``'s).
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

FORMAT = 1  # the payload's first byte: its layout
_LAYOUT = struct.Struct(">BHIQQH")
PAYLOAD_BYTES = _LAYOUT.size  # 25
SIGNATURE_BYTES = 64
CODE_LENGTH = 119  # 89 bytes in base64url without padding
_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Payload:
    """What a code says: which ticket, at which version, signed with which
    of the event's keys."""

    key_version: int
    event_id: int
    seat_id: int
    ticket_id: int  # the seat link's id (purchases.ReservationSeat)
    ticket_version: int

    def packed(self) -> bytes:
        return _LAYOUT.pack(
            FORMAT,
            self.key_version,
            self.event_id,
            self.seat_id,
            self.ticket_id,
            self.ticket_version,
        )


def sign(
    key: tuple[int, Ed25519PrivateKey],
    *,
    event_id: int,
    seat_id: int,
    ticket_id: int,
    ticket_version: int,
) -> str:
    """The code of a ticket (a seat link at ``ticket_version``), signed with
    ``key``: (its version, the private key), as ``door.keys.signing_key``
    gives it. Raises ``struct.error`` when a number does not fit its field."""
    key_version, private_key = key
    payload = Payload(key_version, event_id, seat_id, ticket_id, ticket_version)
    return sign_payload(payload, private_key)


def sign_payload(payload: Payload, private_key: Ed25519PrivateKey) -> str:
    """The code of ``payload``, signed with ``private_key`` (the event's key
    of version ``payload.key_version``)."""
    packed = payload.packed()
    raw = packed + private_key.sign(packed)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _raw(code: str) -> bytes | None:
    """The 89 bytes of a well-formed code, or None. Only the canonical
    spelling is accepted: base64 leaves two spare bits in the last
    character, and a second spelling of one ticket must not scan."""
    if len(code) != CODE_LENGTH or not _ALPHABET.fullmatch(code):
        return None
    try:
        raw = base64.urlsafe_b64decode(code + "=")
    except (binascii.Error, ValueError):
        return None
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != code:
        return None
    return raw


def parse(code: str) -> Payload | None:
    """The payload a code carries, unverified; None when it is malformed
    (length, alphabet, spelling, layout version)."""
    if not isinstance(code, str):
        return None
    raw = _raw(code)
    if raw is None:
        return None
    fmt, key_version, event_id, seat_id, ticket_id, version = _LAYOUT.unpack(raw[:PAYLOAD_BYTES])
    if fmt != FORMAT:
        return None
    return Payload(key_version, event_id, seat_id, ticket_id, version)


def verify(code: str, public_key_by_version: Mapping[int, Ed25519PublicKey]) -> Payload | None:
    """The payload of ``code`` when its signature is good under the key of
    the version it names; None when it is malformed, names a key version
    not in ``public_key_by_version`` (unknown or retired), or its signature
    fails."""
    payload = parse(code)
    if payload is None:
        return None
    key = public_key_by_version.get(payload.key_version)
    if key is None:
        return None
    raw = _raw(code)
    assert raw is not None  # parse() accepted it
    try:
        key.verify(raw[PAYLOAD_BYTES:], raw[:PAYLOAD_BYTES])
    except InvalidSignature:
        return None
    return payload
