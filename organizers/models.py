"""Organizers (the sellers: a venue, a promoter) and their members, each
with one role (docs/api.md, "Organizers and roles").

An organizer owns events (``purchases.Event.organizer``) and webhook
endpoints (``webhooks.WebhookEndpoint.organizer``); neither app is known
here. Both tables are small and read by every shard (config/distribution.py).
"""

import re

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from .roles import Role

SLUG_MAX_CHARS = 50
# Lower-case letters, digits and inner hyphens: safe in a URL as it is.
SLUG = re.compile(rf"[a-z0-9](?:[a-z0-9-]{{0,{SLUG_MAX_CHARS - 2}}}[a-z0-9])?")
SLUG_RULE = (
    f"1 to {SLUG_MAX_CHARS} lower-case letters, digits and hyphens, starting and ending "
    "with a letter or a digit"
)


class Organizer(models.Model):
    # The organizer's name in every URL under /api/organizers/. The services
    # check it; the validator is the admin's form's.
    slug = models.CharField(
        max_length=SLUG_MAX_CHARS,
        unique=True,
        validators=[RegexValidator(rf"\A{SLUG.pattern}\Z", SLUG_RULE)],
    )
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return f"{self.name} ({self.slug})"


class Membership(models.Model):
    # No index of its own: the unique constraint leads with it.
    organizer = models.ForeignKey(
        Organizer, on_delete=models.CASCADE, related_name="memberships", db_index=False
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=10, choices=Role.choices)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["organizer", "user"]
        constraints = [
            models.UniqueConstraint(fields=["organizer", "user"], name="one_membership_per_user"),
        ]

    def __str__(self) -> str:
        return f"{self.user} is {self.role} of {self.organizer.slug}"
