"""Organizers and their members, written (docs/api.md, "Organizers and
roles"). Each operation owns its transaction (``atomic(durable=True)``);
values are checked first and a bad one raises :class:`OrganizerInvalid`
naming its field. Two rules hold here and nowhere else: an organizer keeps
at least one owner, and an organizer with events is not deleted
(:class:`OrganizerConflict`)."""

from __future__ import annotations

import logging
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django.utils import timezone

from . import lock_objects
from .errors import MemberNotFound, OrganizerConflict, OrganizerInvalid, OrganizerNotFound
from .models import SLUG, SLUG_RULE, Membership, Organizer
from .roles import Role

logger = logging.getLogger(__name__)

NAME_MAX_CHARS = 200


def _clean_slug(slug) -> str:
    if not isinstance(slug, str) or not SLUG.fullmatch(slug):
        raise OrganizerInvalid("slug", SLUG_RULE)
    return slug


def _clean_name(name) -> str:
    if not isinstance(name, str) or not name.strip():
        raise OrganizerInvalid("name", "a name is required")
    name = name.strip()
    if len(name) > NAME_MAX_CHARS or "\x00" in name:
        raise OrganizerInvalid("name", f"a text of at most {NAME_MAX_CHARS} characters")
    return name


def _clean_role(role) -> Role:
    if role not in Role.values:
        raise OrganizerInvalid("role", f"one of {', '.join(Role.values)}")
    return Role(role)


def organizer_create(*, slug: str, name: str, owner, now: datetime | None = None) -> Membership:
    """A new organizer with ``owner`` as its owner, in one commit; the
    owner's membership, with the organizer."""
    slug, name = _clean_slug(slug), _clean_name(name)
    now = now or timezone.now()
    try:
        with transaction.atomic(durable=True):
            organizer = Organizer.objects.create(slug=slug, name=name, created_at=now)
            membership = Membership.objects.create(
                organizer=organizer, user=owner, role=Role.OWNER, created_at=now
            )
    except IntegrityError:
        # The slug is unique in the database: taken, perhaps by a create
        # that committed a moment ago.
        if Organizer.objects.filter(slug=slug).exists():
            raise OrganizerInvalid("slug", f"{slug!r} is taken") from None
        raise
    logger.info("organizer created", extra={"organizer": slug, "owner": owner.get_username()})
    return membership


def organizer_delete(*, organizer: Organizer) -> None:
    """Delete an organizer with its members and its webhook endpoints;
    refused while it has events (``organizer_has_events``)."""
    with transaction.atomic(durable=True):
        locked = lock_objects.organizer_for_update(organizer_id=organizer.pk, delete=True)
        if locked is None:
            raise OrganizerNotFound(f"no organizer {organizer.slug!r}")
        try:
            locked.delete()
        except ProtectedError as exc:  # its events' foreign key (purchases.Event)
            raise OrganizerConflict(
                "organizer_has_events", "an organizer with events cannot be deleted"
            ) from exc
    logger.info("organizer deleted", extra={"organizer": organizer.slug})


def member_add(
    *, organizer: Organizer, username, role, now: datetime | None = None
) -> tuple[Membership, bool]:
    """Make the user ``username`` a member with ``role``, or give a member
    that role; the membership, and whether it is new. The last owner keeps
    the role (``last_owner``)."""
    role = _clean_role(role)
    user = _user(username)
    with transaction.atomic(durable=True):
        locked = _locked(organizer)
        membership = Membership.objects.filter(organizer=locked, user=user).first()
        created = membership is None
        if membership is None:
            membership = Membership.objects.create(
                organizer=locked, user=user, role=role, created_at=now or timezone.now()
            )
        elif membership.role != role:
            if membership.role == Role.OWNER:
                _keep_an_owner(locked, leaving=membership)
            membership.role = role
            membership.save(update_fields=["role"])
    logger.info(
        "organizer member %s",
        "added" if created else "set",
        extra={"organizer": organizer.slug, "member": user.get_username(), "role": role.value},
    )
    return membership, created


def member_remove(*, organizer: Organizer, username: str) -> None:
    """The user ``username`` is a member no more; the last owner stays
    (``last_owner``)."""
    if "\x00" in username:  # no user has it, and PostgreSQL cannot compare it
        raise MemberNotFound(f"{username!r} is not a member of {organizer.slug!r}")
    with transaction.atomic(durable=True):
        locked = _locked(organizer)
        membership = Membership.objects.filter(organizer=locked, user__username=username).first()
        if membership is None:
            raise MemberNotFound(f"{username!r} is not a member of {organizer.slug!r}")
        if membership.role == Role.OWNER:
            _keep_an_owner(locked, leaving=membership)
        membership.delete()
    logger.info("organizer member removed", extra={"organizer": organizer.slug, "member": username})


def _user(username):
    if not isinstance(username, str) or not username or "\x00" in username:
        raise OrganizerInvalid("username", "a username is required")
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise OrganizerInvalid("username", f"no user {username!r}")
    return user


def _locked(organizer: Organizer) -> Organizer:
    """The organizer, locked for a change of its members (lock_objects)."""
    locked = lock_objects.organizer_for_update(organizer_id=organizer.pk)
    if locked is None:
        raise OrganizerNotFound(f"no organizer {organizer.slug!r}")
    return locked


def _keep_an_owner(organizer: Organizer, *, leaving: Membership) -> None:
    # Read under the organizer's lock: no other change of its members runs.
    others = Membership.objects.filter(organizer=organizer, role=Role.OWNER).exclude(pk=leaving.pk)
    if not others.exists():
        raise OrganizerConflict(
            "last_owner",
            "an organizer keeps at least one owner: make another member owner first",
        )
