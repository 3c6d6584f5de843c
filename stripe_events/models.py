"""The inbox of Stripe's events (docs/stripe.md, "Stripe's events").

One row per event id Stripe signed and sent, written by the endpoint in the
commit that also writes the obligation to act on it (an outbox row), so a
replay of the same id is a no-op and each event is acted on once. The body
is not kept: it is only a trigger (the consumer re-reads the object from
Stripe), and what it carries (a buyer's name, a card's last digits) is not
ours to store.
"""

from django.db import models


class StripeEvent(models.Model):
    stripe_id = models.CharField(max_length=255, unique=True)  # evt_…
    type = models.CharField(max_length=100)  # payment_intent.succeeded, …
    # data.object.id: the PaymentIntent, Charge or Dispute it is about.
    object_id = models.CharField(max_length=255, blank=True, default="")
    livemode = models.BooleanField()
    created = models.DateTimeField()  # Stripe's, when the event happened there
    received_at = models.DateTimeField()
    # A type we do not act on: recorded, answered 200, nothing owed.
    ignored = models.BooleanField(default=False)
    # When its consumer finished, and what it did ("" until then).
    acted_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ["-received_at", "-id"]

    def __str__(self) -> str:
        return f"{self.type} {self.stripe_id}"
