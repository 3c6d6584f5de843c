"""Shapes of the seller's event API (docs/api.md, "Events, seat maps and
prices").

The request serializers describe the bodies in the schema only: a body is
read by ``seller.seat_maps`` (every problem at once, named by its path, and
100,000 seats in a fraction of a second, which a serializer per seat is
not). The answers are serializers over the rows, but for the seat map's,
built as plain data (:func:`seat_map_answer`), a seat at a time.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from purchases.models import Event, EventStatus, PriceCategory, SeatStatus

from .seat_maps import (
    BLOCK_REASON_MAX,
    CATEGORY_NAME_MAX,
    CODE,
    CODE_MAX,
    EVENT_NAME_MAX,
    HOLD_SECONDS_MAX,
    HOLD_SECONDS_MIN,
    MAX_INT,
    MAX_SEATS,
    PRICE_MAX,
    REF_MAX,
    ROW_MAX,
    SECTION_MAX,
)

_CODE_HELP = f"1 to {CODE_MAX} letters, digits, '-' or '_', unique in the event"
_TIME_HELP = "ISO 8601; without an offset: UTC"

# --- answers ---------------------------------------------------------------------------------


class SellerPriceSerializer(serializers.Serializer):
    amount = serializers.IntegerField(
        source="price_amount", read_only=True, help_text="Minor units (cents)"
    )
    currency = serializers.CharField(read_only=True, help_text="ISO 4217 code, the event's")


class SellerPriceCategorySerializer(serializers.Serializer):
    code = serializers.CharField(read_only=True, help_text="What a seat's `category` names")
    name = serializers.CharField(read_only=True)
    price = SellerPriceSerializer(source="*", read_only=True)


class SellerRefundPolicySerializer(serializers.Serializer):
    buyer_can_cancel_until = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="Buyers may cancel until then (null: never)"
    )
    fee_percent = serializers.IntegerField(
        source="cancel_fee_percent",
        read_only=True,
        help_text="Kept of the price of the seats a buyer cancels (0 to 100)",
    )


class SellerEventSerializer(serializers.Serializer):
    """An event as its seller sees it (from ``seller.selectors``, with
    ``seat_count`` and its categories)."""

    id = serializers.IntegerField(read_only=True)
    status = serializers.ChoiceField(
        EventStatus.choices,
        read_only=True,
        help_text="`draft` (its seller's alone: seat map and categories may change), "
        "`on_sale` (in the catalog; seat map frozen), `cancelled`",
    )
    name = serializers.CharField(read_only=True)
    starts_at = serializers.DateTimeField(read_only=True)
    currency = serializers.CharField(read_only=True, help_text="ISO 4217: every price's")
    sales_start = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="Purchases open then (null: once on sale)"
    )
    sales_end = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="Purchases close then (null: no end)"
    )
    hold_seconds = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="How long a purchase holds its seats (null: the service's PURCHASE_HOLD_SECONDS)",
    )
    max_seats_per_buyer = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="Seats one buyer may hold or have bought, all purchases counted (null: no limit)",
    )
    refund_policy = SellerRefundPolicySerializer(source="*", read_only=True)
    price_categories = SellerPriceCategorySerializer(many=True, read_only=True)
    seats = serializers.IntegerField(
        source="seat_count", read_only=True, help_text="How many seats its map has"
    )
    published_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="When it went on sale (null: a draft)"
    )


class SellerMapSeatSerializer(serializers.Serializer):
    ref = serializers.CharField(read_only=True)
    number = serializers.IntegerField(read_only=True)
    category = serializers.CharField(read_only=True, help_text="A price category's code")
    x = serializers.FloatField(read_only=True)
    y = serializers.FloatField(read_only=True)
    accessible = serializers.BooleanField(read_only=True)
    status = serializers.ChoiceField(
        SeatStatus.choices,
        read_only=True,
        help_text="`unavailable`: blocked by the seller",
    )
    block_reason = serializers.CharField(
        read_only=True, help_text="Why it is blocked (empty unless `unavailable`)"
    )


class SellerMapRowSerializer(serializers.Serializer):
    label = serializers.CharField(read_only=True)  # type: ignore[assignment]  # DRF's metaclass moves it off
    seats = SellerMapSeatSerializer(many=True, read_only=True)


class SellerMapSectionSerializer(serializers.Serializer):
    name = serializers.CharField(read_only=True)
    rows = SellerMapRowSerializer(many=True, read_only=True)


class SellerSeatMapSerializer(serializers.Serializer):
    sections = SellerMapSectionSerializer(many=True, read_only=True)


class SellerSeatMapAnswerSerializer(serializers.Serializer):
    """The seat map as ``PUT`` takes it back (the statuses are ignored
    there), with the event's price categories."""

    seat_map = SellerSeatMapSerializer(read_only=True)
    price_categories = SellerPriceCategorySerializer(many=True, read_only=True)


class SellerSeatsChangedSerializer(serializers.Serializer):
    status = serializers.CharField(
        read_only=True, help_text="What the seats named are now: `unavailable` or `available`"
    )
    seats = serializers.ListField(
        child=serializers.CharField(), read_only=True, help_text="The seats named"
    )
    changed = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="Those whose status this changed (the others were so already)",
    )


def seat_map_answer(*, rows: Any, categories: list[PriceCategory]) -> dict[str, Any]:
    """The seat map answer from the seats' rows (``ref, section, row,
    number, category, x, y, accessible, status, block_reason`` tuples, in
    the map's order): sections and rows in the order they first appear."""
    sections: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for ref, section, row, number, category, x, y, accessible, status, reason in rows:
        sections.setdefault(section, {}).setdefault(row, []).append(
            {
                "ref": ref,
                "number": number,
                "category": category,
                "x": x,
                "y": y,
                "accessible": accessible,
                "status": status,
                "block_reason": reason,
            }
        )
    return {
        "seat_map": {
            "sections": [
                {
                    "name": name,
                    "rows": [{"label": label, "seats": seats} for label, seats in by_row.items()],
                }
                for name, by_row in sections.items()
            ]
        },
        "price_categories": SellerPriceCategorySerializer(categories, many=True).data,
    }


def event_answer(event: Event) -> dict[str, Any]:
    return SellerEventSerializer(event).data


# --- requests (the schema's: seller.seat_maps reads them) ------------------------------------


class SellerPriceInputSerializer(serializers.Serializer):
    amount = serializers.IntegerField(min_value=0, max_value=PRICE_MAX, help_text="Minor units")
    currency = serializers.CharField(min_length=3, max_length=3, help_text="ISO 4217, the event's")


class SellerPriceCategoryInputSerializer(serializers.Serializer):
    code = serializers.RegexField(
        CODE.pattern, min_length=1, max_length=CODE_MAX, help_text=_CODE_HELP
    )
    name = serializers.CharField(max_length=CATEGORY_NAME_MAX)
    price = SellerPriceInputSerializer()


class SellerSeatInputSerializer(serializers.Serializer):
    ref = serializers.CharField(
        max_length=REF_MAX,
        help_text=f"1 to {REF_MAX} printable characters, no surrounding spaces; unique in "
        "the event",
    )
    number = serializers.IntegerField(min_value=1, max_value=MAX_INT)
    category = serializers.CharField(
        max_length=CODE_MAX, help_text="The code of one of the price categories"
    )
    x = serializers.FloatField(required=False, help_text="Where the seat map draws it (0)")
    y = serializers.FloatField(required=False, help_text="(0)")
    accessible = serializers.BooleanField(required=False, help_text="(false)")


class SellerRowInputSerializer(serializers.Serializer):
    label = serializers.CharField(  # type: ignore[assignment]  # DRF's metaclass moves it off
        max_length=ROW_MAX, help_text=f"1 to {ROW_MAX} characters"
    )
    seats = serializers.ListField(child=SellerSeatInputSerializer())


class SellerSectionInputSerializer(serializers.Serializer):
    name = serializers.CharField(
        required=False, allow_blank=True, max_length=SECTION_MAX, help_text="(empty)"
    )
    rows = serializers.ListField(child=SellerRowInputSerializer())


class SellerSeatMapInputSerializer(serializers.Serializer):
    sections = serializers.ListField(
        child=SellerSectionInputSerializer(),
        help_text=f"At most {MAX_SEATS} seats in all",
    )


class SellerRefundPolicyInputSerializer(serializers.Serializer):
    buyer_can_cancel_until = serializers.DateTimeField(
        required=False, allow_null=True, help_text=f"{_TIME_HELP}; null: never"
    )
    fee_percent = serializers.IntegerField(
        required=False, min_value=0, max_value=100, help_text="0 to 100 (0)"
    )


class SellerEventCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=EVENT_NAME_MAX)
    starts_at = serializers.DateTimeField(help_text=_TIME_HELP)
    currency = serializers.CharField(min_length=3, max_length=3, help_text="ISO 4217")
    sales_start = serializers.DateTimeField(
        required=False, allow_null=True, help_text=f"{_TIME_HELP}; before sales_end"
    )
    sales_end = serializers.DateTimeField(required=False, allow_null=True, help_text=_TIME_HELP)
    hold_seconds = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=HOLD_SECONDS_MIN,
        max_value=HOLD_SECONDS_MAX,
        help_text=f"{HOLD_SECONDS_MIN} to {HOLD_SECONDS_MAX}; null: PURCHASE_HOLD_SECONDS",
    )
    max_seats_per_buyer = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_INT, help_text="null: none"
    )
    refund_policy = SellerRefundPolicyInputSerializer(required=False, allow_null=True)
    price_categories = serializers.ListField(
        child=SellerPriceCategoryInputSerializer(), required=False
    )
    seat_map = SellerSeatMapInputSerializer(required=False, allow_null=True)


class SellerEventChangeSerializer(serializers.Serializer):
    name = serializers.CharField(required=False, max_length=EVENT_NAME_MAX)
    starts_at = serializers.DateTimeField(required=False, help_text=_TIME_HELP)
    currency = serializers.CharField(
        required=False, min_length=3, max_length=3, help_text="A draft's only"
    )
    sales_start = serializers.DateTimeField(required=False, allow_null=True)
    sales_end = serializers.DateTimeField(required=False, allow_null=True)
    hold_seconds = serializers.IntegerField(
        required=False, allow_null=True, min_value=HOLD_SECONDS_MIN, max_value=HOLD_SECONDS_MAX
    )
    max_seats_per_buyer = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_INT
    )
    refund_policy = SellerRefundPolicyInputSerializer(
        required=False, allow_null=True, help_text="Only the keys sent change"
    )
    price_categories = serializers.ListField(
        child=SellerPriceCategoryInputSerializer(),
        required=False,
        help_text="The whole list: on sale, the same codes (new prices and names); adding "
        "or removing one: a draft's only",
    )


class SellerSeatMapPutSerializer(serializers.Serializer):
    seat_map = SellerSeatMapInputSerializer()
    price_categories = serializers.ListField(
        child=SellerPriceCategoryInputSerializer(),
        required=False,
        help_text="New price categories for the map (absent: the event's stay)",
    )


class SellerSeatsSerializer(serializers.Serializer):
    seats = serializers.ListField(
        child=serializers.CharField(max_length=REF_MAX),
        min_length=1,
        max_length=MAX_SEATS,
        help_text="Seat refs",
    )
    reason = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=BLOCK_REASON_MAX,
        help_text="Why (block only; shown to the seller)",
    )
