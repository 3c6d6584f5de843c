"""Reads of organizers and memberships. Every organizer-scoped request finds
its organizer here (:func:`membership_for`, called by
``organizers.permissions.OrganizerPermission``): by slug *and* member, so
that a stranger and a missing organizer get the same answer."""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connection
from django.db.models import Model, QuerySet

from .errors import OrganizerNotFound
from .models import SLUG, Membership, Organizer


def _columns(model: type[Model], alias: str) -> tuple[list[str], str]:
    """A model's concrete fields: their attribute names, and their columns
    as a select list under ``alias``."""
    fields = model._meta.concrete_fields
    return [f.attname for f in fields], ", ".join(f'{alias}."{f.column}"' for f in fields)


_MEMBERSHIP_FIELDS, _MEMBERSHIP_COLUMNS = _columns(Membership, "m")
_ORGANIZER_FIELDS, _ORGANIZER_COLUMNS = _columns(Organizer, "o")
# membership_for's one query, written once: it runs on every request under
# /api/organizers/, where compiling the same ORM query again each time cost
# a fifth of a door scan's CPU (docs/performance.md, figure 16). The rows
# become models through Model.from_db, as the ORM's own would.
_MEMBERSHIP_SQL = f"""
SELECT {_MEMBERSHIP_COLUMNS}, {_ORGANIZER_COLUMNS}
  FROM {Membership._meta.db_table} m
  JOIN {Organizer._meta.db_table} o ON o.id = m.organizer_id
 WHERE m.user_id = %s AND o.slug = %s
"""


def membership_for(*, user, slug: str) -> Membership:
    """The user's membership of the organizer ``slug``, with its organizer,
    in one query; :class:`OrganizerNotFound` when there is no such
    organizer or the user is not one of its members. A slug of another form
    (a NUL byte, which PostgreSQL cannot even compare) names none."""
    if not SLUG.fullmatch(slug):
        raise OrganizerNotFound(f"no organizer {slug!r}")
    with connection.cursor() as cursor:
        cursor.execute(_MEMBERSHIP_SQL, [user.pk, slug])
        row = cursor.fetchone()  # (user, organizer) is unique: one row at most
    if row is None:
        raise OrganizerNotFound(f"no organizer {slug!r} of this user")
    cut = len(_MEMBERSHIP_FIELDS)
    found = Membership.from_db(DEFAULT_DB_ALIAS, _MEMBERSHIP_FIELDS, row[:cut])
    found.organizer = Organizer.from_db(DEFAULT_DB_ALIAS, _ORGANIZER_FIELDS, row[cut:])
    return found


def organizer_for(*, user, slug: str) -> Organizer:
    """The organizer ``slug`` if the user is a member (:func:`membership_for`)."""
    return membership_for(user=user, slug=slug).organizer


def memberships_of(*, user) -> QuerySet[Membership]:
    """The organizers the user belongs to, as memberships (with the role),
    by slug."""
    return (
        Membership.objects.select_related("organizer")
        .filter(user_id=user.pk)
        .order_by("organizer__slug")
    )


def members_of(*, organizer: Organizer) -> QuerySet[Membership]:
    """An organizer's members, with their users, by username."""
    return (
        Membership.objects.select_related("user")
        .filter(organizer=organizer)
        .order_by("user__username")
    )
