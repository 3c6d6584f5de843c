"""Append-only money entries.

Balances are derived by summing rows; nothing is ever updated or deleted. A
refund is a new inverse entry. One entry per (intent, kind): recording the
same charge twice is a constraint violation, not a bug someone must notice.
"""

from typing import Any, NoReturn

from django.db import models


class EntryKind(models.TextChoices):
    CHARGE = "charge", "charge"
    REFUND = "refund", "refund"
    # A chargeback: the bank took the charge back (negative, like a refund),
    # and, if the dispute was won, gave it back (positive). purchases/disputes.py.
    DISPUTE = "dispute", "dispute"
    DISPUTE_REVERSAL = "dispute_reversal", "dispute reversal"


class LedgerEntry(models.Model):
    intent_id = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, choices=EntryKind.choices)
    # Signed, minor units: a charge is positive, a refund negative (and a
    # dispute negative, its reversal positive).
    amount = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    saga_id = models.UUIDField(db_index=True)
    event_id = models.BigIntegerField()
    gateway_reference = models.CharField(max_length=100, blank=True, default="")
    note = models.TextField(blank=True, default="")
    # Written on an operator's word while the gateway could not be asked:
    # the auditor names it until the gateway's records agree.
    override = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    # The refund row (purchases.models.Refund) a refund entry records; null
    # for the saga's own entries (its charge, its compensation's refund).
    refund_id = models.UUIDField(null=True, blank=True)

    class Meta:
        constraints = [
            # With the event, the distribution column; the intent id names its
            # event, so this is still one entry per (intent, kind) for the
            # saga's own entries...
            models.UniqueConstraint(
                fields=["intent_id", "kind", "event_id"],
                condition=models.Q(refund_id__isnull=True),
                name="ledger_one_entry_per_kind",
            ),
            # ...and one per refund row, however many refunds a purchase has.
            models.UniqueConstraint(
                fields=["refund_id", "event_id"],
                condition=models.Q(refund_id__isnull=False),
                name="ledger_one_entry_per_refund",
            ),
        ]
        ordering = ["created_at", "id"]
        # An intent's entries (its charge, its refunds), read by the saga's
        # steps and the pages: the unique constraints above are partial, so
        # they cannot serve a read by intent alone.
        indexes = [models.Index(fields=["intent_id", "kind"], name="ledger_intent_kind_idx")]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise ValueError("ledger entries are insert-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ValueError("ledger entries are insert-only")

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} {self.currency} ({self.intent_id})"
