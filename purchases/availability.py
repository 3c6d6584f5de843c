"""The catalog's availability cache (docs/design.md, "The edges").

The two catalog reads, an event's seat map and the events list with each
event's ``seats_available``, are served from Django's cache (Redis through
``CACHE_URL``). An entry is keyed by its event and the **availability
version** it was built at; it answers only while that is still the event's
version. Every committed change of a seat's status (held by the start, sold
by the confirmation, released by the compensation) moves the version after
the commit (``availability_changed``; a rollback moves nothing), which
orphans the entry: a writer never rewrites one. The entry's TTL,
``AVAILABILITY_MAX_STALE_SECONDS``, bounds how long it is served when a move
is lost (a cache or broker restart between the commit and the move).

A move deletes the version; the next read draws a fresh random one. A version
is thus never reused, not even after the cache restarts, and an ETag a client
keeps cannot match a later state by chance. The ETag is the version and a
digest of the answer: within one version the answer changes only when a move
was lost and the entry was rebuilt after its TTL, and the digest then tells
the client so.

Keys (``scope``: an event's id, or ``events`` for the list):
``availability:version:<scope>`` the version (no TTL: it is moved, never
expired); ``availability:tag:<scope>`` the version and ETag of the entry;
``availability:body:<scope>:<version>`` the ETag and the answer's body, as
sent. A read fetches the version and the tag in one round trip: that decides
a ``304``; a ``200`` fetches the body too. Both expire after the TTL.

The events list shows every event's ``seats_available``, so a change in any
event changes it: it has one version of its own, moved with every event's
(keyed by the versions of the events it covers instead, it would be
invalidated exactly as often, and each read would fetch every event's
version).

The cache down (docs/operations.md, "Cache down"): a read is built from the
database, without an ETag, and a version move is lost (the TTL bounds it);
each is counted, the outage logged once, and the cache not asked again for
``CACHE_RETRY_SECONDS`` (``purchases/cache_outage.py``). Only a cache that
cannot be reached is caught: anything else a cache call raises (an entry
that does not unpickle, a bug) is not hidden behind the database's answer.

A cached value informs a buyer and is never an input to a write: the
purchase decides under row locks (``purchases/lock_objects.py``) and reads
nothing here. This module imports only Django, the settings and
``cache_outage`` (which imports nothing of ours), so that the saga can
announce its changes.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import overload

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from .cache_outage import cache_answered, cache_call, cache_down, cache_skipped, cache_unavailable

_EVENTS = "events"  # the events list's scope, beside each event's id


def _version_key(scope: int | str) -> str:
    return f"availability:version:{scope}"


def _tag_key(scope: int | str) -> str:
    return f"availability:tag:{scope}"


def _body_key(scope: int | str, version: str) -> str:
    return f"availability:body:{scope}:{version}"


@dataclass(frozen=True)
class Catalog:
    """A catalog answer: its ETag (None when the cache is off or cannot be
    reached, and the database answered) and its body as sent (None when the
    client already holds it: the ETag was among those it named)."""

    etag: str | None
    body: bytes | None


def availability_version(event_id: int) -> str:
    """The current availability version of ``event_id`` (drawn if it has none)."""
    return cache.get(_version_key(event_id)) or _draw_version(_version_key(event_id))


# Inside availability_changes_gathered(): the events whose seats changed.
_GATHERED: ContextVar[set[int] | None] = ContextVar("availability_gathered", default=None)


def availability_changed(event_id: int) -> None:
    """The seats of ``event_id`` change in the caller's transaction: move its
    version when that commits, and not at all if it rolls back."""
    if not settings.AVAILABILITY_CACHE:
        return
    gathered = _GATHERED.get()
    if gathered is not None:
        gathered.add(event_id)
        return
    transaction.on_commit(partial(availability_bump, event_id), robust=True)


@contextmanager
def availability_changes_gathered() -> Iterator[None]:
    """Inside a transaction: the changes announced in the block move each
    event's version once, when the transaction commits (a charge burst's
    confirmations sell seats of one event many times in one commit). A block
    left by an exception registers nothing: its transaction rolls back."""
    gathered: set[int] = set()
    token = _GATHERED.set(gathered)
    try:
        yield
    finally:
        _GATHERED.reset(token)
    for event_id in sorted(gathered):
        transaction.on_commit(partial(availability_bump, event_id), robust=True)


def availability_bump(event_id: int) -> None:
    """Move the versions of ``event_id`` and of the events list, now (what a
    change's commit runs). One round trip; a move that cannot reach the cache
    is lost, and the TTL bounds how long the orphaned entries are served."""
    # A move lost (the cache down): the commit stands, the TTL is the net.
    cache_call(
        "catalog", partial(cache.delete_many, [_version_key(event_id), _version_key(_EVENTS)])
    )


def cached_event_seats(
    *, event_id: int, build: Callable[[], bytes | None], held: Collection[str] = ()
) -> Catalog | None:
    """The seats of ``event_id``: the body ``build`` makes from the database
    (None: no such event, which is not cached), from the cache while the
    event's version holds. ``held``: the ETags the client holds
    (If-None-Match, ``*`` for any)."""
    return _cached(event_id, build, held)


def cached_event_list(*, build: Callable[[], bytes], held: Collection[str] = ()) -> Catalog:
    """Every event, as ``cached_event_seats`` has an event's seats."""
    return _cached(_EVENTS, build, held)


@overload
def _cached(scope: int | str, build: Callable[[], bytes], held: Collection[str]) -> Catalog: ...
@overload
def _cached(
    scope: int | str, build: Callable[[], bytes | None], held: Collection[str]
) -> Catalog | None: ...
def _cached(
    scope: int | str, build: Callable[[], bytes | None], held: Collection[str]
) -> Catalog | None:
    if not settings.AVAILABILITY_CACHE or cache_skipped("catalog"):
        return _from_database(build)
    try:
        found = cache.get_many([_version_key(scope), _tag_key(scope)])
        cache_answered()
        drawn = found.get(_version_key(scope)) is None
        version = found.get(_version_key(scope)) or _draw_version(_version_key(scope))
        tag = found.get(_tag_key(scope))
        if tag is not None and tag["version"] == version:
            if _names(held, tag["etag"]):
                return Catalog(etag=tag["etag"], body=None)
            entry = cache.get(_body_key(scope, version))
            if entry is not None:
                return Catalog(etag=entry["etag"], body=entry["body"])
    except cache_down() as exc:  # the catalog still answers
        cache_unavailable("catalog", exc)
        return _from_database(build)
    # The database is read after the version: a change committed after this
    # read moves the version, so this entry cannot hide it past the move.
    body = build()
    if body is None:
        if drawn:
            # No such event: keep no version for it (versions never expire,
            # and anyone may ask about any id).
            _forget_version(_version_key(scope))
        return None
    etag = f'W/"{version}.{hashlib.blake2b(body, digest_size=8).hexdigest()}"'
    try:
        cache.set_many(
            {
                _tag_key(scope): {"version": version, "etag": etag},
                _body_key(scope, version): {"etag": etag, "body": body},
            },
            settings.AVAILABILITY_MAX_STALE_SECONDS,
        )
    except cache_down() as exc:  # the next read builds it again
        cache_unavailable("catalog", exc)
    return Catalog(etag=etag, body=None if _names(held, etag) else body)


def _names(held: Collection[str], etag: str) -> bool:
    """Whether the client's ETags name ``etag`` (the weak comparison
    If-None-Match uses: a W/ prefix does not matter)."""
    return "*" in held or etag.removeprefix("W/") in {e.removeprefix("W/") for e in held}


def _from_database(build: Callable[[], bytes | None]) -> Catalog | None:
    body = build()
    return None if body is None else Catalog(etag=None, body=body)


def _forget_version(version_key: str) -> None:
    try:
        cache.delete(version_key)
    except cache_down() as exc:  # a stray key, nothing worse
        cache_unavailable("catalog", exc)


def _draw_version(version_key: str) -> str:
    """A fresh version, unless another reader drew one first (then that one)."""
    drawn = secrets.token_hex(8)
    if cache.add(version_key, drawn, timeout=None):
        return drawn
    # Moved again since: our draw files an entry nobody will find, which is harmless.
    return cache.get(version_key) or drawn
