"""The fake processor's own tables.

They stand for the card processor's database, not ours: nothing outside
``payments.fake_gateway`` reads or writes them (the saga sees them only through
the HTTP API or :class:`~payments.fake_gateway.inprocess.InProcessFakeGateway`).
Tests may read them to check what "the processor" ended up holding.
"""

import secrets

from django.db import models


def new_charge_id() -> str:
    return f"ch_{secrets.token_hex(12)}"


def new_refund_id() -> str:
    return f"re_{secrets.token_hex(12)}"


class FakeIntent(models.Model):
    class Status(models.TextChoices):
        REQUIRES_PAYMENT = "requires_payment"
        SUCCEEDED = "succeeded"
        DECLINED = "declined"
        CANCELED = "canceled"
        REFUNDED = "refunded"

    intent_id = models.CharField(max_length=255, primary_key=True)
    status = models.CharField(max_length=32, choices=Status.choices)
    # Null while no charge attempt has named an amount (an intent cancelled
    # before anyone tried to charge it).
    amount = models.PositiveBigIntegerField(null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True)
    payment_method = models.CharField(max_length=64, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.intent_id} ({self.status})"


class FakeCharge(models.Model):
    class Status(models.TextChoices):
        SUCCEEDED = "succeeded"
        REFUNDED = "refunded"

    id = models.CharField(max_length=64, primary_key=True, default=new_charge_id, editable=False)
    intent = models.ForeignKey(FakeIntent, on_delete=models.PROTECT, related_name="charges")
    amount = models.PositiveBigIntegerField()
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=16, choices=Status.choices)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.id} on {self.intent_id} ({self.status})"


class FakeIdempotentAnswer(models.Model):
    """The first answer given for an idempotency key, replayed verbatim
    (status code and body, errors included) to every later request with it."""

    class Endpoint(models.TextChoices):
        CHARGE = "charge"
        REFUND = "refund"  # the whole charge (what is left of it)
        CREATE_REFUND = "create_refund"  # a part of it, named by the client

    endpoint = models.CharField(max_length=16, choices=Endpoint.choices)
    idempotency_key = models.CharField(max_length=255)
    # Plain text, not a foreign key: a key may have been answered with an error
    # about an intent that was never created.
    intent_id = models.CharField(max_length=255)
    status_code = models.PositiveSmallIntegerField()
    body = models.JSONField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "idempotency_key"], name="fake_gateway_answer_unique_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.endpoint} {self.idempotency_key} -> {self.status_code}"


class FakeDroppedCharge(models.Model):
    """A charge request the fake dropped on the floor before processing it
    (``pm_card_timeout_not_charged``'s first call). One row per key at most: the
    unique key is what makes the retry the call that charges."""

    idempotency_key = models.CharField(max_length=255, unique=True)
    intent_id = models.CharField(max_length=255)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"dropped {self.idempotency_key}"


class FakeRequest(models.Model):
    """Every request the fake received, so tests can count what a client did
    (how many charge attempts, how many look-ups) even when nothing else was
    recorded."""

    class Endpoint(models.TextChoices):
        CHARGE = "charge"
        RETRIEVE = "retrieve"
        CANCEL = "cancel"
        REFUND = "refund"
        LIST_CHARGES = "list_charges"
        CREATE_REFUND = "create_refund"
        RETRIEVE_REFUND = "retrieve_refund"
        LIST_REFUNDS = "list_refunds"

    endpoint = models.CharField(max_length=16, choices=Endpoint.choices)
    # "" for a look-up of a refund nobody made.
    intent_id = models.CharField(max_length=255, db_index=True)
    idempotency_key = models.CharField(max_length=255, blank=True)
    # The client's refund id, for the refund endpoints.
    refund_id = models.CharField(max_length=255, blank=True)
    payment_method = models.CharField(max_length=64, blank=True)
    status_code = models.PositiveSmallIntegerField()
    # The answer stalled past any sane client timeout (the client saw none).
    timed_out = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.endpoint} {self.intent_id} -> {self.status_code}"


class FakeRefund(models.Model):
    """A refund of (a part of) an intent's charge, named by the client's own
    ``refund_id``. ``pending`` only with ``pm_card_refundPending``, until the
    first look-up of it (``GET refunds/<refund_id>``) settles it
    ``succeeded``; ``failed`` ones refunded nothing and do not count."""

    class Status(models.TextChoices):
        SUCCEEDED = "succeeded"
        PENDING = "pending"
        FAILED = "failed"

    id = models.CharField(max_length=64, primary_key=True, default=new_refund_id, editable=False)
    # The client's id of it: one refund per id, whatever the key.
    refund_id = models.CharField(max_length=255, unique=True)
    intent = models.ForeignKey(FakeIntent, on_delete=models.PROTECT, related_name="refunds")
    amount = models.PositiveBigIntegerField()
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=16, choices=Status.choices)
    # With FAILED: why, in Stripe's words ("expired_or_canceled_card").
    failure_reason = models.CharField(max_length=64, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    # When a look-up settled a pending refund (null: it never was pending).
    settled = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.id} ({self.refund_id}) on {self.intent_id} ({self.status})"
