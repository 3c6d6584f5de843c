"""Which purchase a Stripe object is about."""

from __future__ import annotations

import uuid

from purchases.models import PurchaseSaga


def saga_id_for(*, purchase_id: str, payment_intent: str) -> uuid.UUID | None:
    """The saga a PaymentIntent belongs to: by the ``purchase_id`` our
    PaymentIntents carry in their metadata (a create whose answer was lost
    has not recorded its ``pi_…`` yet), else by the ``pi_…`` the saga
    recorded; None when it is none of ours."""
    try:
        by_id = uuid.UUID(purchase_id) if purchase_id else None
    except ValueError:
        by_id = None
    if by_id is not None:
        found = PurchaseSaga.objects.filter(pk=by_id).values_list("pk", flat=True).first()
        if found is not None:
            return found
    if not payment_intent:
        return None
    return (
        PurchaseSaga.objects.filter(processor_ref=payment_intent)
        .values_list("pk", flat=True)
        .first()
    )
