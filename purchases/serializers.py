"""Input validation and output shapes of the public API (docs/api.md)."""

from django.conf import settings
from rest_framework import serializers

from .buyer_history import buyer_history
from .models import Event, PurchaseSaga, Seat
from .selectors import saga_payment_status, saga_seat_refs


class MoneySerializer(serializers.Serializer):
    amount = serializers.IntegerField()
    currency = serializers.CharField()


class EventSerializer(serializers.ModelSerializer):
    seats_available = serializers.IntegerField(read_only=True)

    class Meta:
        model = Event
        fields = ["id", "name", "starts_at", "seats_available"]


class SeatSerializer(serializers.ModelSerializer):
    price = serializers.SerializerMethodField()

    class Meta:
        model = Seat
        fields = ["ref", "status", "price"]

    def get_price(self, seat) -> MoneySerializer:
        return {"amount": seat.price_amount, "currency": seat.currency}


class PurchaseRequestSerializer(serializers.Serializer):
    event = serializers.IntegerField(min_value=1)
    seats = serializers.ListField(
        child=serializers.CharField(max_length=10, allow_blank=False), allow_empty=False
    )
    payment_method = serializers.CharField(max_length=100)

    def validate_seats(self, value):
        if len(value) > settings.MAX_SEATS_PER_PURCHASE:
            raise serializers.ValidationError(
                f"at most {settings.MAX_SEATS_PER_PURCHASE} seats per purchase"
            )
        duplicates = sorted({ref for ref in value if value.count(ref) > 1})
        if duplicates:
            raise serializers.ValidationError(f"duplicate seats: {', '.join(duplicates)}")
        return value


class HistoryEntrySerializer(serializers.Serializer):
    """One move as the buyer reads it (``buyer_history.BuyerMove``). The
    actor, operators' notes and diagnostics stay in the admin (docs/api.md)."""

    def get_fields(self):
        # "from" is a Python keyword, so the fields are declared here.
        return {
            "from": serializers.CharField(source="from_state", allow_null=True),
            "to": serializers.CharField(source="to_state"),
            "at": serializers.DateTimeField(),
            "reason": serializers.CharField(help_text="A sentence written for the buyer"),
        }


class PaymentSerializer(serializers.Serializer):
    intent_id = serializers.CharField()
    status = serializers.CharField()


class PurchaseSummarySerializer(serializers.ModelSerializer):
    status = serializers.CharField(source="state")
    event = serializers.IntegerField(source="event_id")
    seats = serializers.SerializerMethodField()
    total = serializers.SerializerMethodField()
    hold_expires_at = serializers.DateTimeField(source="reservation.hold_expires_at")
    links = serializers.SerializerMethodField()

    class Meta:
        model = PurchaseSaga
        fields = ["id", "status", "event", "seats", "total", "hold_expires_at", "links"]

    def get_seats(self, saga) -> list[str]:
        return saga_seat_refs(saga)

    def get_total(self, saga) -> MoneySerializer:
        return {"amount": saga.amount, "currency": saga.currency}

    def get_links(self, saga) -> dict[str, str]:
        return {"self": f"/api/purchases/{saga.pk}/"}


class PurchaseDetailSerializer(PurchaseSummarySerializer):
    payment = serializers.SerializerMethodField()
    history = serializers.SerializerMethodField()

    class Meta(PurchaseSummarySerializer.Meta):
        fields = [*PurchaseSummarySerializer.Meta.fields, "payment", "history"]

    def get_payment(self, saga) -> PaymentSerializer:
        return {"intent_id": saga.intent_id, "status": saga_payment_status(saga)}

    def get_history(self, saga) -> HistoryEntrySerializer(many=True):
        return HistoryEntrySerializer(buyer_history(saga), many=True).data


class PurchaseAcceptedSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    status = serializers.CharField()
    event = serializers.IntegerField()
    seats = serializers.ListField(child=serializers.CharField())
    total = MoneySerializer()
    hold_expires_at = serializers.DateTimeField()
    links = serializers.DictField(child=serializers.CharField())


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    detail = serializers.CharField()
