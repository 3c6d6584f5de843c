"""Reads of organizers and memberships. Every organizer-scoped request finds
its organizer here (:func:`membership_for`, called by
``organizers.permissions.OrganizerPermission``): by slug *and* member, so
that a stranger and a missing organizer get the same answer."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import DEFAULT_DB_ALIAS, connection
from django.db.models import Model, QuerySet
from rest_framework.authtoken.models import Token

from common.users import model_order, user_from_values

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
    return _membership_of_row(row)


def _membership_of_row(row) -> Membership:
    cut = len(_MEMBERSHIP_FIELDS)
    found = Membership.from_db(DEFAULT_DB_ALIAS, _MEMBERSHIP_FIELDS, row[:cut])
    found.organizer = Organizer.from_db(DEFAULT_DB_ALIAS, _ORGANIZER_FIELDS, row[cut:])
    return found


# --- the token and the membership in one read ------------------------------------------------


@dataclass(frozen=True)
class TokenMembership:
    """A token's user and the user's membership of the organizer ``slug``
    (None: not a member, or no such organizer: the same 404)."""

    user: User
    slug: str
    membership: Membership | None


@functools.cache
def _token_membership_sql() -> str:
    """The statement, the user's columns in the model's order (as
    ``from_db`` takes them); built on first use, the user model being known
    only once the apps are."""
    model = get_user_model()
    names = model_order()
    column = {f.attname: f.column for f in model._meta.concrete_fields}
    columns = ", ".join(f'u."{column[name]}"' for name in names)
    sql = f"""
SELECT {columns}, {_MEMBERSHIP_COLUMNS}, {_ORGANIZER_COLUMNS}
  FROM {Token._meta.db_table} t
  JOIN {model._meta.db_table} u ON u.id = t.user_id
  LEFT JOIN ({Membership._meta.db_table} m
             JOIN {Organizer._meta.db_table} o ON o.id = m.organizer_id AND o.slug = %s)
         ON m.user_id = t.user_id
 WHERE t.key = %s
"""
    return sql


def token_membership(*, key: str, slug: str) -> TokenMembership | None:
    """The token ``key``'s user and their membership of ``slug`` in one
    query (an organizer-scoped request's authentication and authorization
    read together: purchases/authentication.py); None when there is no such
    token or ``slug`` is of no organizer's form (the caller then asks as any
    other route does)."""
    if not SLUG.fullmatch(slug):
        return None
    sql = _token_membership_sql()
    with connection.cursor() as cursor:
        cursor.execute(sql, [slug, key])
        row = cursor.fetchone()  # the token's key is its primary key: one row at most
    if row is None:
        return None
    cut = len(model_order())
    user = user_from_values(row[:cut])
    rest = row[cut:]
    member = None if rest[0] is None else _membership_of_row(rest)  # m.id NULL: no membership
    return TokenMembership(user=user, slug=slug, membership=member)


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
