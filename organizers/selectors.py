"""Reads of organizers and memberships. Every organizer-scoped request finds
its organizer here (:func:`membership_for`, called by
``organizers.permissions.OrganizerPermission``): by slug *and* member, so
that a stranger and a missing organizer get the same answer."""

from __future__ import annotations

from django.db.models import QuerySet

from .errors import OrganizerNotFound
from .models import SLUG, Membership, Organizer


def membership_for(*, user, slug: str) -> Membership:
    """The user's membership of the organizer ``slug``, with its organizer,
    in one query; :class:`OrganizerNotFound` when there is no such
    organizer or the user is not one of its members. A slug of another form
    (a NUL byte, which PostgreSQL cannot even compare) names none."""
    if not SLUG.fullmatch(slug):
        raise OrganizerNotFound(f"no organizer {slug!r}")
    found = (
        Membership.objects.select_related("organizer")
        .filter(user_id=user.pk, organizer__slug=slug)
        .first()
    )
    if found is None:
        raise OrganizerNotFound(f"no organizer {slug!r} of this user")
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
