"""The shapes of the seller's money back: a refund's request and answer,
an event's cancellation request and its progress
(docs/api.md, "Money back: refunds and cancellations"). The answers are
output only, with read-only fields, so that the schema says every field is
answered."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from purchases.models import CancellationStatus, Event, EventCancellation, Refund
from purchases.serializers import (
    REFUND_STATUSES,
    SEAT_REF_MAX,
    JSONIntegerField,
    JSONStringField,
    MoneySerializer,
)

REASON_MAX = Refund._meta.get_field("reason").max_length or 500
CANCEL_REASON_MAX = EventCancellation._meta.get_field("reason").max_length or 500


class JSONBooleanField(serializers.BooleanField):
    """A JSON boolean only: not ``"true"``, ``1`` or ``"yes"``, which DRF's
    ``BooleanField`` would take for one."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class SellerRefundRequestSerializer(serializers.Serializer):
    """An amount, or seats (their prices paid when no amount is given), or
    neither: everything left to refund."""

    amount = JSONIntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        help_text="Minor units of the purchase's currency, at most what is left to refund "
        "(absent: the seats' prices, or everything left)",
    )
    seats = serializers.ListField(
        child=JSONStringField(min_length=1, max_length=SEAT_REF_MAX),
        required=False,
        allow_null=True,
        allow_empty=False,
        help_text="Seat refs of the purchase this refund is for, none refunded already",
    )
    reason = JSONStringField(
        max_length=REASON_MAX,
        help_text="Why, in the organizer's words: kept for the organizer and operators, never "
        "shown to the buyer (who reads a sentence written for buyers)",
    )
    release_seats = JSONBooleanField(
        required=False,
        default=False,
        help_text="Put the seats (those named, or all of the purchase's) back on sale, their "
        "tickets void",
    )


class SellerRefundSerializer(serializers.Serializer):
    """A refund as the organizer sees it: its reason too."""

    id = serializers.UUIDField(read_only=True)
    purchase = serializers.UUIDField(source="saga_id", read_only=True)
    amount = serializers.IntegerField(read_only=True, help_text="Minor units of `currency`")
    currency = serializers.CharField(read_only=True)
    status = serializers.ChoiceField(REFUND_STATUSES, read_only=True)
    seats = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="The seats it is for (empty: an amount, no seats named)",
    )
    release_seats = serializers.BooleanField(
        source="released", read_only=True, help_text="Whether its seats went back on sale"
    )
    reason = serializers.CharField(read_only=True, help_text="The organizer's reason")
    buyer_reason = serializers.CharField(
        source="public_reason", read_only=True, help_text="What the buyer reads about it"
    )
    created_at = serializers.DateTimeField(read_only=True)


class EventCancelRequestSerializer(serializers.Serializer):
    reason = JSONStringField(
        max_length=CANCEL_REASON_MAX,
        help_text="Why the event is cancelled (sent with the `event.cancelled` webhook)",
    )


class CancellationProgressSerializer(serializers.Serializer):
    """An event's cancellation run (``purchases.refunds.selectors.
    cancellation_progress``, with the event's currency for ``owed_amount``)."""

    status = serializers.ChoiceField(
        [
            (CancellationStatus.RUNNING.value, "refunds are still being opened or settled"),
            (CancellationStatus.DONE.value, "every confirmed purchase is refunded or failed"),
        ],
        read_only=True,
    )
    purchases = serializers.IntegerField(
        read_only=True, min_value=0, help_text="The event's confirmed purchases"
    )
    refunded = serializers.IntegerField(
        read_only=True, min_value=0, help_text="Those refunded in full"
    )
    failed = serializers.IntegerField(
        read_only=True,
        min_value=0,
        help_text="Those whose cancellation refund the processor refused (an operator is alerted)",
    )
    owed = serializers.IntegerField(
        read_only=True,
        min_value=0,
        help_text="Confirmed purchases not refunded in full yet (0 when nothing is owed)",
    )
    owed_amount = MoneySerializer(read_only=True, help_text="What is still to give back")
    in_flight = serializers.IntegerField(
        read_only=True,
        min_value=0,
        help_text="Purchases still being charged: each is settled before it is refunded",
    )
    reason = serializers.CharField(read_only=True)
    rate_per_second = serializers.FloatField(
        read_only=True, help_text="Refunds asked of the processor per second"
    )
    started_at = serializers.DateTimeField(read_only=True)
    finished_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="null while `running`"
    )


def progress_answer(progress: dict[str, Any], *, event: Event) -> dict[str, Any]:
    """The progress of ``cancellation_progress`` as the API answers it:
    ``owed_amount`` in the event's currency."""
    return CancellationProgressSerializer(
        {
            **progress,
            "owed_amount": {"amount": progress["owed_amount"], "currency": event.currency},
        }
    ).data
