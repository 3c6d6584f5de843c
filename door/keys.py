"""Each event's Ed25519 signing keys (docs/door.md, "Keys and rotation").

An event gets its first key on first need, by a conflict-safe insert: two
processes asking at once end with one key, both signing with it. The
private key is kept encrypted with ``TICKET_KEY_SECRETS`` (a
``MultiFernet``: the first secret encrypts, any decrypts), decrypted once
per process and key. The current key is the highest version not retired;
every key not retired is accepted (``door.services.event_key_rotate`` and
``event_key_retire`` move them).
"""

from __future__ import annotations

import functools
import threading

from cryptography.fernet import Fernet, MultiFernet
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from django.conf import settings
from django.db import connection
from django.utils import timezone

from common import rows

from . import codes
from .models import EventKey

# Decrypted private keys by (event id, version, public key): a key never
# changes once written, so the cache needs no invalidation; the public half
# in the key keeps a row that is not the one cached (a database restored
# over another) from signing with the wrong key.
_private: dict[tuple[int, int, bytes], Ed25519PrivateKey] = {}
_private_lock = threading.Lock()

# Public keys by (event id, version), as a scan verifies with them: the row
# of a version never changes once written, so neither does this; whether
# the key is still accepted (not retired) is asked of the database by the
# admitting statement itself (door/services.py, _ADMIT_FAST), in the scan's
# one round trip. Bounded: past _PUBLIC_MAX entries it starts again empty.
_public: dict[tuple[int, int], tuple[bytes, Ed25519PublicKey]] = {}
_public_lock = threading.Lock()
_PUBLIC_MAX = 10_000


@functools.lru_cache(maxsize=4)
def _fernet(secrets: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(secret.strip().encode()) for secret in secrets])


def fernet() -> MultiFernet:
    """The cipher of the private keys, from ``TICKET_KEY_SECRETS``."""
    return _fernet(tuple(settings.TICKET_KEY_SECRETS))


def new_key_material() -> tuple[bytes, bytes]:
    """A fresh key pair: (32 raw public bytes, the encrypted raw private key)."""
    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    raw = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return public, fernet().encrypt(raw)


# The first key of an event, unless it has one (any version, retired or
# not): ON CONFLICT makes the second of two concurrent inserts wait for the
# first and then do nothing.
_FIRST_KEY_SQL = f"""
INSERT INTO {EventKey._meta.db_table}
       (event_id, version, public_key, private_key_encrypted, created_at, retired_at)
SELECT %s, 1, %s, %s, %s, NULL
 WHERE NOT EXISTS (SELECT 1 FROM {EventKey._meta.db_table} WHERE event_id = %s)
ON CONFLICT (event_id, version) DO NOTHING
"""


def _ensure_key(event_id: int) -> None:
    if EventKey.objects.filter(event_id=event_id).exists():
        return  # every key retired: none is made again (the insert would not)
    public, encrypted = new_key_material()
    with connection.cursor() as cursor:
        cursor.execute(_FIRST_KEY_SQL, [event_id, public, encrypted, timezone.now(), event_id])


def _not_retired(event_id: int) -> list[EventKey]:
    # Written once (docs/performance.md, "Statements written once"): every
    # confirmation's email signs its tickets with the event's current key.
    with connection.cursor() as cursor:
        cursor.execute(_not_retired_sql(), [event_id])
        return [rows.instance(EventKey, row, db=connection.alias) for row in cursor.fetchall()]


@functools.cache
def _not_retired_sql() -> str:
    return (
        f"SELECT {', '.join(rows.columns(EventKey, 'k'))} FROM {EventKey._meta.db_table} k"
        " WHERE k.event_id = %s AND k.retired_at IS NULL ORDER BY k.version DESC"
    )


def _accepted(event_id: int) -> list[EventKey]:
    """The event's keys not retired, newest first; made on first need."""
    keys = _not_retired(event_id)
    if keys:
        return keys
    # Read again after the insert whatever it did: a key another process
    # committed since the read above is the one to use.
    _ensure_key(event_id)
    return _not_retired(event_id)


def _decrypted(key: EventKey) -> Ed25519PrivateKey:
    named = (key.event_id, key.version, bytes(key.public_key))
    cached = _private.get(named)
    if cached is not None:
        return cached
    raw = fernet().decrypt(bytes(key.private_key_encrypted))
    private = Ed25519PrivateKey.from_private_bytes(raw)
    with _private_lock:
        _private[named] = private
    return private


def signing_key(event_id: int) -> tuple[int, Ed25519PrivateKey]:
    """The event's current key: (its version, the private key)."""
    keys = _accepted(event_id)
    if not keys:
        raise EventKey.DoesNotExist(f"event {event_id} has every key retired")
    return keys[0].version, _decrypted(keys[0])


def private_key(event_id: int, version: int) -> tuple[int, Ed25519PrivateKey]:
    """The event's key of ``version`` (retired or not) as ``codes.sign``
    takes it: the offline list re-signs its codes under every accepted key."""
    key = EventKey.objects.get(event_id=event_id, version=version)
    return version, _decrypted(key)


def public_keys(event_id: int) -> dict[int, Ed25519PublicKey]:
    """Every key the door accepts for the event, by version."""
    return {
        key.version: Ed25519PublicKey.from_public_bytes(bytes(key.public_key))
        for key in _accepted(event_id)
    }


def public_key_of(event_id: int, version: int) -> tuple[bytes, Ed25519PublicKey] | None:
    """The event's key of ``version``, retired or not, as (its 32 raw bytes,
    the key): read once per process; None when the event has no such key
    (not remembered: it may be made later)."""
    named = (event_id, version)
    cached = _public.get(named)
    if cached is not None:
        return cached
    raw = (
        EventKey.objects.filter(event_id=event_id, version=version)
        .values_list("public_key", flat=True)
        .first()
    )
    if raw is None:
        return None
    found = (bytes(raw), Ed25519PublicKey.from_public_bytes(bytes(raw)))
    with _public_lock:
        if len(_public) >= _PUBLIC_MAX:
            _public.clear()
        _public[named] = found
    return found


def public_key_bytes(event_id: int) -> dict[int, bytes]:
    """:func:`public_keys` as their 32 raw bytes, newest first (the offline list)."""
    return {key.version: bytes(key.public_key) for key in _accepted(event_id)}


def ticket_code(*, event_id: int, seat_id: int, ticket_id: int, ticket_version: int) -> str:
    """The code of a ticket (a seat link at a version), signed with the
    event's current key: the same string every time until the key rotates."""
    return codes.sign(
        signing_key(event_id),
        event_id=event_id,
        seat_id=seat_id,
        ticket_id=ticket_id,
        ticket_version=ticket_version,
    )
