"""Request and answer shapes of the organizers' API (docs/api.md,
"Organizers and roles"). The slug's and the name's rules are the services'
(:class:`organizers.errors.OrganizerInvalid`); the roles are an enum here
too, so that the schema lists them."""

from __future__ import annotations

from rest_framework import serializers

from .models import SLUG_MAX_CHARS, SLUG_RULE
from .roles import Role
from .services import NAME_MAX_CHARS


class OrganizerCreateSerializer(serializers.Serializer):
    slug = serializers.CharField(max_length=SLUG_MAX_CHARS, help_text=SLUG_RULE)
    name = serializers.CharField(max_length=NAME_MAX_CHARS)


class OrganizerSerializer(serializers.Serializer):
    """An organizer as one of its members sees it: with the member's role
    (read from the membership)."""

    slug = serializers.CharField(source="organizer.slug", read_only=True)
    name = serializers.CharField(source="organizer.name", read_only=True)
    role = serializers.ChoiceField(choices=Role.choices, read_only=True)


class MemberAddSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)


class MemberSerializer(serializers.Serializer):
    username = serializers.CharField(source="user.username", read_only=True)
    role = serializers.ChoiceField(choices=Role.choices, read_only=True)
