"""Every row lock of the webhooks app (docs/design.md, "House rules").

A delivery is locked alone (its attempt's record, a resend), and an endpoint
alone (a change, a rotation): never both, and never with a saga's lock. The
saga's commit that writes deliveries takes no lock here (the foreign key's
share lock on the endpoint only).
"""

from __future__ import annotations

from .models import WebhookDelivery, WebhookEndpoint


def delivery_for_update(*, delivery_id: int) -> WebhookDelivery | None:
    return (WebhookDelivery.objects.select_related("endpoint")
            .select_for_update(of=("self",)).filter(pk=delivery_id).first())


def endpoint_for_update(*, endpoint_id: int) -> WebhookEndpoint | None:
    return WebhookEndpoint.objects.select_for_update(of=("self",)).filter(pk=endpoint_id).first()
