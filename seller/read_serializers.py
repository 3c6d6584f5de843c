"""The shapes of the seller's reads (docs/api.md, "Sales and reports"): a
purchase row (as JSON and as a CSV line), the event's report. Output only, read-only
fields, so that the schema says every field is answered."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from purchases.models import PurchaseSaga
from purchases.selectors import PAYMENT_STATUSES, payment_status, saga_seat_refs
from purchases.serializers import PURCHASE_STATUSES, MoneySerializer

# The CSV export's columns (docs/api.md, "Sales and reports"), in order.
CSV_HEADER = (
    "id",
    "status",
    "buyer_username",
    "buyer_email",
    "seats",
    "total_amount",
    "refunded_amount",
    "currency",
    "created_at",
    # Last, added with refunds (issue 34): the columns before it keep their places.
    "payment_status",
)
# A spreadsheet takes a cell starting with one of these for a formula
# (OWASP, "CSV injection"): such a cell is written after a quote, as text.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_TIME = serializers.DateTimeField()


class BuyerSerializer(serializers.Serializer):
    username = serializers.CharField(read_only=True)
    email = serializers.CharField(read_only=True)


class SellerPurchaseSerializer(serializers.ModelSerializer):
    """A purchase of the event, as its seller sees it."""

    # A row of seller.reports.event_purchases: its ledger money annotated,
    # the seats prefetched.

    status = serializers.ChoiceField(
        PURCHASE_STATUSES,
        source="state",
        read_only=True,
        help_text="The purchase's status; a refund does not change it (a purchase refunded "
        "in full stays CONFIRMED): `payment_status` and `refunded` say what was given back",
    )
    payment_status = serializers.SerializerMethodField(
        help_text="The payment's status, from the ledger: `partially_refunded` while its "
        "refunds are less than its charge, `refunded` when they reach it"
    )
    buyer = BuyerSerializer(read_only=True)
    seats = serializers.SerializerMethodField(help_text="The refs of the purchase's seats")
    total = serializers.SerializerMethodField()
    refunded = serializers.SerializerMethodField(
        help_text="What the ledger holds as refunded to the buyer, every refund of the "
        "purchase together (0 when nothing; a refund still pending counts once it succeeds)"
    )

    class Meta:
        model = PurchaseSaga
        fields = [
            "id",
            "status",
            "payment_status",
            "buyer",
            "seats",
            "total",
            "refunded",
            "created_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.ChoiceField(PAYMENT_STATUSES))
    def get_payment_status(self, saga: PurchaseSaga) -> str:
        return _payment_status(saga)

    def get_seats(self, saga: PurchaseSaga) -> list[str]:
        return saga_seat_refs(saga)

    @extend_schema_field(MoneySerializer)
    def get_total(self, saga: PurchaseSaga) -> dict[str, Any]:
        return {"amount": saga.amount, "currency": saga.currency}

    @extend_schema_field(MoneySerializer)
    def get_refunded(self, saga: PurchaseSaga) -> dict[str, Any]:
        return {"amount": _refunded(saga), "currency": saga.currency}


def _refunded(saga: PurchaseSaga) -> int:
    return saga.refunded_amount  # type: ignore[attr-defined]  # annotated by event_purchases


def _payment_status(saga: PurchaseSaga) -> str:
    """The ledger's word on the payment, from the row's annotations (no query)."""
    return payment_status(
        state=saga.state,
        charged=saga.ledger_charged,  # type: ignore[attr-defined]  # annotated by event_purchases
        refunded=saga.ledger_refunded,  # type: ignore[attr-defined]
    )


def csv_safe(cell: object) -> str:
    text = str(cell)
    return f"'{text}" if text.startswith(_FORMULA_STARTS) else text


def purchase_csv_row(saga: PurchaseSaga) -> list[str]:
    """The CSV line of a row of ``event_purchases``: the JSON row's facts,
    flat, in ``CSV_HEADER``'s order, each cell safe for a spreadsheet."""
    return [
        csv_safe(cell)
        for cell in (
            saga.pk,
            saga.state,
            saga.buyer.username,
            saga.buyer.email,
            " ".join(saga_seat_refs(saga)),
            saga.amount,
            _refunded(saga),
            saga.currency,
            _TIME.to_representation(saga.created_at),
            _payment_status(saga),
        )
    ]


class SeatCountsSerializer(serializers.Serializer):
    available = serializers.IntegerField(read_only=True)
    held = serializers.IntegerField(read_only=True)
    sold = serializers.IntegerField(read_only=True)
    unavailable = serializers.IntegerField(read_only=True, help_text="Blocked by the seller")


class CategorySalesSerializer(serializers.Serializer):
    code = serializers.CharField(
        read_only=True, help_text='The price category\'s code; "" for seats of no category'
    )
    name = serializers.CharField(read_only=True)
    sold = serializers.IntegerField(read_only=True, help_text="Its seats sold now")
    gross = MoneySerializer(
        read_only=True, help_text="The sum of the prices its sold seats were sold at"
    )


class EventReportSerializer(serializers.Serializer):
    currency = serializers.CharField(read_only=True, help_text="The event's (ISO 4217)")
    seats = SeatCountsSerializer(read_only=True, help_text="The event's seats by status")
    gross = MoneySerializer(
        read_only=True, help_text="The ledger's charges of the event's purchases"
    )
    refunded = MoneySerializer(
        read_only=True, help_text="The ledger's refunds of the event's purchases"
    )
    net = MoneySerializer(read_only=True, help_text="`gross` less `refunded`")
    by_category = CategorySalesSerializer(
        many=True,
        read_only=True,
        help_text="Seats sold per price category; their `gross` adds up to `net`",
    )
