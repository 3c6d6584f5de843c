"""The door's writes (docs/door.md): scanning a code in (online, or a
batch from an offline gate), reissuing a ticket, rotating and retiring an
event's key. Each public service owns its transaction
(``transaction.atomic(durable=True)``); :func:`revoke_links` runs inside
another's (``door.revocations``).

Admission is one conditional statement: the check-in row is inserted from
the ticket's link only while the link is live at the code's version, the
purchase confirmed and no revocation names it, and at most once per ticket
(``ON CONFLICT DO NOTHING`` on its unique key). Two gates scanning one code
at once: the second insert waits for the first's commit and writes nothing,
so exactly one is ``ok``. Every scan is kept, in the same commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from purchases.models import Event, PurchaseSaga, ReservationSeat
from purchases.saga.states import SagaState

from . import codes, keys, lock_objects
from .errors import (
    TICKET_CHECKED_IN,
    TICKET_REVOKED,
    KeyRefused,
    TicketNotFound,
    TicketRefused,
)
from .models import (
    SCANNED_CODE_CHARS,
    CheckIn,
    EventKey,
    RevocationReason,
    Scan,
    ScanResult,
    TicketRevocation,
)
from .revocations import revoke_links as revoke_links
from .selectors import TABLES, ticket_state
from .selectors import checkin_list as checkin_list
from .selectors import checkin_progress as checkin_progress

__all__ = [
    "TicketNotFound",
    "TicketRefused",
    "KeyRefused",
    "checkin",
    "checkin_list",
    "checkin_progress",
    "checkin_upload",
    "event_key_retire",
    "event_key_rotate",
    "event_keys_reencrypt",
    "revoke_links",
    "ticket_reissue",
]

# The admitting insert (see the module's docstring). FOR SHARE of the link:
# a reissue of the same ticket (FOR UPDATE, door/lock_objects.py) and this
# take turns, and the one that waited reads the other's commit. {key} is
# the fast path's condition on the code's key (below), or nothing.
_ADMIT = """
INSERT INTO {checkin} (event_id, ticket_id, version, gate, checked_in_at, by_id)
SELECT rs.event_id, rs.id, rs.ticket_version, %(gate)s, %(at)s, %(by)s
  FROM {link} rs
  JOIN {saga} sg ON sg.reservation_id = rs.reservation_id AND sg.event_id = rs.event_id
 WHERE rs.event_id = %(event)s AND rs.id = %(ticket)s AND rs.seat_id = %(seat)s
   AND rs.released_at IS NULL AND rs.ticket_version = %(version)s AND sg.state = %(confirmed)s
   AND NOT EXISTS (SELECT 1 FROM {revocation} r WHERE r.event_id = rs.event_id
                      AND r.ticket_id = rs.id AND r.version = rs.ticket_version){key}
   FOR SHARE OF rs
ON CONFLICT (event_id, ticket_id) DO NOTHING
RETURNING {returning}
"""
_ADMIT_SQL = _ADMIT.format(**TABLES, key="", returning="checked_in_at")

# A scan online, fast (:func:`checkin`): the admitting insert, only while
# the key the signature was checked with (its public bytes, read once per
# process: door/keys.py, public_key_of) is the event's and not retired; the
# scan's ``ok`` row written from what it inserted; the seat's ref read back.
# ONE statement in autocommit: both rows commit together or neither does.
# When it writes nothing (in already, revoked, replaced, the key retired),
# the scan takes the full path (_scan), which finds out why.
_KEY_ACCEPTED = """
   AND EXISTS (SELECT 1 FROM {key_table} k WHERE k.event_id = rs.event_id
                  AND k.version = %(key_version)s AND k.public_key = %(public_key)s
                  AND k.retired_at IS NULL)"""
_ADMIT_IF_KEY_ACCEPTED = _ADMIT.format(
    **TABLES,
    key=_KEY_ACCEPTED.format(key_table=EventKey._meta.db_table),
    returning="ticket_id, checked_in_at",
).strip()
_ADMIT_FAST_SQL = f"""
WITH admitted AS ({_ADMIT_IF_KEY_ACCEPTED}
), scanned AS (
INSERT INTO {Scan._meta.db_table}
       (event_id, ticket_id, gate, at, result, by_id, offline, conflict, code, recorded_at)
SELECT %(event)s, ticket_id, %(gate)s, %(at)s, %(ok)s, %(by)s, false, false, %(code)s, %(at)s
  FROM admitted
)
SELECT a.checked_in_at, s.ref FROM admitted a
  LEFT JOIN {TABLES["seat"]} s ON s.id = %(seat)s AND s.event_id = %(event)s
"""


@dataclass
class Verdict:
    """What a scan found: the API's answer, and the scan row's facts."""

    result: str
    ticket_id: int | None = None
    seat: str | None = None
    checked_in_at: datetime | None = None
    gate: str | None = None

    def answer(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"result": self.result}
        if self.seat is not None:
            shown["seat"] = self.seat
        if self.checked_in_at is not None:
            shown["checked_in_at"] = self.checked_in_at
            shown["gate"] = self.gate or ""
        return shown


def _read(event_id: int, code: str) -> tuple[codes.Payload | None, str | None]:
    """The code's payload when it may admit here, else the verdict: a
    payload naming another event is ``wrong_event`` (whatever its
    signature), anything else that fails this event's keys ``invalid``."""
    payload = codes.parse(code)
    if payload is None:
        return None, ScanResult.INVALID
    if payload.event_id != event_id:
        return None, ScanResult.WRONG_EVENT
    if codes.verify(code, keys.public_keys(event_id)) is None:
        return None, ScanResult.INVALID
    return payload, None


def _admit_params(
    payload: codes.Payload, *, gate: str, at: datetime, by_id: int | None
) -> dict[str, Any]:
    return {
        "gate": gate,
        "at": at,
        "by": by_id,
        "event": payload.event_id,
        "ticket": payload.ticket_id,
        "seat": payload.seat_id,
        "version": payload.ticket_version,
        "confirmed": SagaState.CONFIRMED,
    }


def _admit(payload: codes.Payload, *, gate: str, at: datetime, by_id: int | None) -> Verdict:
    """The conditional insert, then (when it wrote nothing) why not."""
    with connection.cursor() as cursor:
        cursor.execute(_ADMIT_SQL, _admit_params(payload, gate=gate, at=at, by_id=by_id))
        admitted = cursor.fetchone()
    state = ticket_state(payload)
    if state is None:
        return Verdict(ScanResult.REVOKED, ticket_id=payload.ticket_id)
    verdict = Verdict(ScanResult.REVOKED, ticket_id=payload.ticket_id, seat=state.seat)
    if admitted is not None:
        verdict.result, verdict.checked_in_at, verdict.gate = ScanResult.OK, admitted[0], gate
    elif state.live and state.version == payload.ticket_version and not state.voided:
        if state.checked_in_at is not None:
            verdict.result = ScanResult.ALREADY_CHECKED_IN
            verdict.checked_in_at, verdict.gate = state.checked_in_at, state.gate
    return verdict


def _scan(event_id: int, code: str, *, gate: str, at: datetime, by_id: int | None) -> Verdict:
    payload, refused = _read(event_id, code)
    if payload is None:
        assert refused is not None
        return Verdict(refused)
    return _admit(payload, gate=gate, at=at, by_id=by_id)


def _admitted_fast(
    event_id: int, code: str, *, gate: str, at: datetime, by_id: int | None
) -> dict[str, Any] | None:
    """A scan let in by the one fast statement (_ADMIT_FAST_SQL), its answer;
    None when it wrote nothing (or the code is not this event's, or fails
    its key as this process knows it): the full path decides."""
    payload = codes.parse(code)
    if payload is None or payload.event_id != event_id:
        return None
    known = keys.public_key_of(event_id, payload.key_version)
    if known is None or codes.verify(code, {payload.key_version: known[1]}) is None:
        return None
    params = _admit_params(payload, gate=gate, at=at, by_id=by_id)
    params.update(key_version=payload.key_version, public_key=known[0])
    params.update(ok=ScanResult.OK, code=code)
    with connection.cursor() as cursor:
        cursor.execute(_ADMIT_FAST_SQL, params)
        row = cursor.fetchone()
    if row is None:
        return None
    return Verdict(ScanResult.OK, seat=row[1], checked_in_at=row[0], gate=gate).answer()


def checkin(
    event_id: int, code: str, gate: str = "", user=None, now: datetime | None = None
) -> dict[str, Any]:
    """Scan ``code`` in at ``gate`` of the event ``event_id`` (door staff
    ``user``): ``{"result", "seat"?, "checked_in_at"?, "gate"?}``
    (docs/door.md, "The door API"). The scan is kept whatever its result:
    one statement when it lets the ticket in, else one commit that reads
    why not and records the refusal."""
    at = now or timezone.now()
    by_id = getattr(user, "pk", None)
    admitted = _admitted_fast(event_id, code, gate=gate, at=at, by_id=by_id)
    if admitted is not None:
        return admitted
    with transaction.atomic(durable=True):
        verdict = _scan(event_id, code, gate=gate, at=at, by_id=by_id)
        Scan.objects.create(
            event_id=event_id,
            ticket_id=verdict.ticket_id,
            gate=gate,
            at=at,
            result=verdict.result,
            by_id=by_id,
            code=code[:SCANNED_CODE_CHARS],
            recorded_at=at,
        )
    return verdict.answer()


# --- offline gates ------------------------------------------------------------------------

# The scan's row claims its (gate, at, code) first: the same scan uploaded
# again, or by two uploads at once, finds it taken (the second waits for
# the first's commit) and answers what the first recorded.
_CLAIM_SQL = f"""
INSERT INTO {Scan._meta.db_table}
       (event_id, ticket_id, gate, at, result, by_id, offline, conflict, code, recorded_at)
VALUES (%s, NULL, %s, %s, %s, %s, true, false, %s, %s)
ON CONFLICT (event_id, gate, at, code) WHERE offline DO NOTHING
RETURNING id
"""


def _uploaded(event_id: int, scan: dict, *, by_id: int | None, now: datetime) -> dict:
    """One offline scan, in its own commit: its row, and its check-in
    through the same conditional insert as a scan online, at its own time."""
    code, gate, at = scan["code"][:SCANNED_CODE_CHARS], scan.get("gate", ""), scan["at"]
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute(_CLAIM_SQL, [event_id, gate, at, ScanResult.INVALID, by_id, code, now])
            claimed = cursor.fetchone()
        if claimed is None:
            row = Scan.objects.get(event_id=event_id, gate=gate, at=at, code=code, offline=True)
            return {"code": scan["code"], "result": row.result, "conflict": row.conflict, "at": at}
        verdict = _scan(event_id, scan["code"], gate=gate, at=at, by_id=by_id)
        # Let in by the gate, yet in already (by a scan online or another
        # offline one): the person came in twice.
        conflict = verdict.result == ScanResult.ALREADY_CHECKED_IN
        Scan.objects.filter(pk=claimed[0], event_id=event_id).update(
            result=verdict.result, ticket_id=verdict.ticket_id, conflict=conflict
        )
    return {"code": scan["code"], "result": verdict.result, "conflict": conflict, "at": at}


def checkin_upload(
    event: Event, scans: list[dict], user=None, now: datetime | None = None
) -> list[dict]:
    """The scans of an offline gate (``{"code", "gate", "at"}`` each), in
    the order given: a result each, ``conflict`` on one that let in a
    ticket already in. Idempotent per (code, gate, at)."""
    at = now or timezone.now()
    by_id = getattr(user, "pk", None)
    return [_uploaded(event.pk, scan, by_id=by_id, now=at) for scan in scans]


# --- the buyer's reissue ------------------------------------------------------------------


def ticket_reissue(*, saga_id, seat_ref: str, user, now: datetime | None = None) -> str:
    """Replace the ticket of ``seat_ref`` in the buyer's purchase with a new
    code, in one commit: the link's version goes up, the old version is
    revoked. Returns the new code. Refused (``TicketRefused``) once checked
    in, or when the ticket is revoked; ``TicketNotFound`` for no such
    purchase of ``user``'s, or no such seat in it."""
    at = now or timezone.now()
    saga = PurchaseSaga.objects.filter(pk=saga_id).only("event_id").first()
    if saga is None:
        raise TicketNotFound(f"no purchase {saga_id}")
    with transaction.atomic(durable=True):
        saga = (
            PurchaseSaga.objects.filter(pk=saga_id, event_id=saga.event_id)
            .only("event_id", "reservation_id", "buyer_id", "state")
            .get()
        )
        if saga.buyer_id != getattr(user, "pk", None):
            raise TicketNotFound(f"no purchase {saga_id}")
        link = lock_objects.ticket_for_update(
            event_id=saga.event_id, reservation_id=saga.reservation_id, seat_ref=seat_ref
        )
        if link is None:
            raise TicketNotFound(f"no seat {seat_ref} in purchase {saga_id}")
        _may_reissue(saga, link)
        TicketRevocation.objects.create(
            event_id=link.event_id,
            ticket_id=link.pk,
            version=link.ticket_version,
            reason=RevocationReason.REISSUE,
            at=at,
        )
        link.ticket_version += 1
        ReservationSeat.objects.filter(pk=link.pk, event_id=link.event_id).update(
            ticket_version=link.ticket_version
        )
        return keys.ticket_code(
            event_id=link.event_id,
            seat_id=link.seat_id,
            ticket_id=link.pk,
            ticket_version=link.ticket_version,
        )


def _may_reissue(saga: PurchaseSaga, link: ReservationSeat) -> None:
    revoked = (
        saga.state != SagaState.CONFIRMED
        or link.released_at is not None
        or TicketRevocation.objects.filter(
            event_id=link.event_id, ticket_id=link.pk, version=link.ticket_version
        ).exists()
    )
    if revoked:
        raise TicketRefused(TICKET_REVOKED, "this ticket no longer lets anyone in")
    if CheckIn.objects.filter(event_id=link.event_id, ticket_id=link.pk).exists():
        raise TicketRefused(TICKET_CHECKED_IN, "this ticket was used at the door already")
    if link.ticket_version >= _MAX_TICKET_VERSION:
        raise TicketRefused(TICKET_REVOKED, "this ticket was replaced too many times")


# A PositiveSmallIntegerField, packed in 16 bits in the code.
_MAX_TICKET_VERSION = 32767


# --- the event's keys ---------------------------------------------------------------------

_ROTATE_SQL = f"""
INSERT INTO {EventKey._meta.db_table}
       (event_id, version, public_key, private_key_encrypted, created_at, retired_at)
SELECT %s, COALESCE(MAX(version), 0) + 1, %s, %s, %s, NULL
  FROM {EventKey._meta.db_table} WHERE event_id = %s
ON CONFLICT (event_id, version) DO NOTHING
RETURNING version
"""


def event_key_rotate(event: Event, now: datetime | None = None) -> int:
    """A new key for ``event``, current from this commit on: pages show
    codes signed with it at once; the older keys stay accepted until
    retired (:func:`event_key_retire`). Returns its version. Two rotations
    at once make one new key."""
    at = now or timezone.now()
    keys.signing_key(event.pk)  # the first key, if the event had none: it is rotated out
    public, encrypted = keys.new_key_material()
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute(_ROTATE_SQL, [event.pk, public, encrypted, at, event.pk])
            made = cursor.fetchone()
        if made is None:  # another rotation took the version: that one is the new key
            return keys.signing_key(event.pk)[0]
        return made[0]


def event_key_retire(event: Event, version: int, now: datetime | None = None) -> None:
    """Stop accepting ``event``'s key of ``version``: its codes scan
    ``invalid`` from this commit on. The current key cannot be retired
    (rotate first); retiring a retired key changes nothing."""
    at = now or timezone.now()
    with transaction.atomic(durable=True):
        found = lock_objects.event_keys_for_update(event_id=event.pk)
        accepted = [v for v, retired_at in found if retired_at is None]
        if version not in {v for v, _ in found}:
            raise KeyRefused(f"event {event.pk} has no key {version}")
        if accepted and version == accepted[0]:
            raise KeyRefused(f"key {version} is the current key of event {event.pk}: rotate first")
        EventKey.objects.filter(event_id=event.pk, version=version, retired_at__isnull=True).update(
            retired_at=at
        )


def event_keys_reencrypt() -> int:
    """Every event's private keys encrypted again with the first of
    ``TICKET_KEY_SECRETS`` (a new secret put first): once done, the old
    secret can be dropped. One commit per key; returns how many."""
    done = 0
    for pk, event_id, token in EventKey.objects.values_list(
        "pk", "event_id", "private_key_encrypted"
    ).iterator():
        rotated = keys.fernet().rotate(bytes(token))
        with transaction.atomic(durable=True):
            EventKey.objects.filter(pk=pk, event_id=event_id).update(private_key_encrypted=rotated)
        done += 1
    return done
