"""The door's rows (docs/door.md): each event's signing keys, the check-ins,
every scan, and the revocations the offline list carries.

Every table is distributed by event like the purchases they belong to
(config/distribution.py): the primary keys are (id, event_id) in the
database (door/migrations/0001_initial.py), and a ticket is named by its
seat link's id, ``ticket_id``, with the event beside it.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class EventKey(models.Model):
    """One of an event's Ed25519 key pairs. The current key is the highest
    version not retired: codes are signed with it; every key not retired is
    accepted at the door (docs/door.md, "Keys and rotation")."""

    event = models.ForeignKey("purchases.Event", on_delete=models.PROTECT, related_name="+")
    version = models.PositiveSmallIntegerField()
    public_key = models.BinaryField()  # 32 raw bytes
    # The raw 32-byte private key, encrypted with TICKET_KEY_SECRETS (door/keys.py).
    private_key_encrypted = models.BinaryField()
    created_at = models.DateTimeField()
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["event", "version"]
        constraints = [
            models.UniqueConstraint(fields=["event", "version"], name="event_key_version_once"),
        ]

    def __str__(self) -> str:
        return f"key {self.version} of event {self.event_id}"


class CheckIn(models.Model):
    """A ticket let in: at most one per ticket, whatever its version
    (the unique constraint is the door's "exactly one ok")."""

    event = models.ForeignKey("purchases.Event", on_delete=models.PROTECT, related_name="+")
    # The seat link's id; the database's key is (event_id, ticket_id) ->
    # purchases_reservationseat (event_id, id), written in the migration.
    ticket_id = models.BigIntegerField()
    version = models.PositiveSmallIntegerField()
    gate = models.CharField(max_length=64, blank=True, default="")
    checked_in_at = models.DateTimeField()
    # Who scanned it (the door staff's user; for an offline scan, who uploaded it).
    by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="+",
        null=True,
        blank=True,
    )

    class Meta:
        ordering = ["event", "checked_in_at"]
        constraints = [
            models.UniqueConstraint(fields=["event", "ticket_id"], name="checkin_once_per_ticket"),
        ]

    def __str__(self) -> str:
        return f"ticket {self.ticket_id} in at {self.checked_in_at:%H:%M:%S}"


class ScanResult(models.TextChoices):
    OK = "ok"
    ALREADY_CHECKED_IN = "already_checked_in"
    REVOKED = "revoked"
    INVALID = "invalid"
    WRONG_EVENT = "wrong_event"


# What an operator sees of a scanned code: a valid one is 119 characters.
SCANNED_CODE_CHARS = 200


class Scan(models.Model):
    """Every scan, whatever its result, written in the commit of its
    check-in (if any): the door's log, and the record of conflicts."""

    event = models.ForeignKey("purchases.Event", on_delete=models.PROTECT, related_name="+")
    ticket_id = models.BigIntegerField(null=True, blank=True)  # null: the code was invalid
    gate = models.CharField(max_length=64, blank=True, default="")
    at = models.DateTimeField()
    result = models.CharField(max_length=20, choices=ScanResult.choices)
    by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="+",
        null=True,
        blank=True,
    )
    # Scanned by a gate without a connection, and uploaded later.
    offline = models.BooleanField(default=False)
    # An offline gate let in a ticket that was already in.
    conflict = models.BooleanField(default=False)
    code = models.CharField(max_length=SCANNED_CODE_CHARS)  # as scanned, truncated
    recorded_at = models.DateTimeField()

    class Meta:
        ordering = ["event", "at", "id"]
        indexes = [
            models.Index(fields=["event", "ticket_id"], name="scan_ticket_idx"),
        ]
        constraints = [
            # An offline batch uploaded twice records nothing new.
            models.UniqueConstraint(
                fields=["event", "gate", "at", "code"],
                condition=Q(offline=True),
                name="scan_offline_once",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.result} at {self.gate or '-'} {self.at:%H:%M:%S}"


class RevocationReason(models.TextChoices):
    REFUND = "refund"
    REISSUE = "reissue"
    DISPUTE = "dispute"
    COMPENSATION = "compensation"


class TicketRevocation(models.Model):
    """A ticket version that no longer admits, and why: written in the
    commit that voids it, carried by the offline list."""

    event = models.ForeignKey("purchases.Event", on_delete=models.PROTECT, related_name="+")
    ticket_id = models.BigIntegerField()
    version = models.PositiveSmallIntegerField()
    reason = models.CharField(max_length=20, choices=RevocationReason.choices)
    at = models.DateTimeField()

    class Meta:
        ordering = ["event", "at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["event", "ticket_id", "version"], name="revocation_once_per_version"
            ),
        ]

    def __str__(self) -> str:
        return f"ticket {self.ticket_id} v{self.version} revoked ({self.reason})"
