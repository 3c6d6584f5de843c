"""Input validation and output shapes of the public API (docs/api.md).

The OpenAPI document at ``/api/schema/`` is generated from these classes, and
clients are generated from that document (tests/test_generated_client.py):
each field says exactly what is sent and answered, statuses are enums, and
output serializers are read-only so that a response field is required.
"""

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from common.api import ErrorSerializer
from door.tickets import tickets_of

from .buyer_history import buyer_history
from .disputes import dispute_answer
from .models import Event, PurchaseSaga, RefundStatus, Seat, SeatStatus
from .refunds.errors import InvalidRefund, RefundError, RefundExceedsPaid
from .refunds.selectors import cancellable_until
from .saga.states import TERMINAL, SagaState
from .selectors import (
    PAYMENT_STATUSES,
    saga_dispute,
    saga_payment_status,
    saga_refund_rows,
    saga_refunded,
    saga_seat_refs,
    saga_seats_left,
)

S = SagaState

# The longest seat ref and price-category code (purchases.models.Seat).
SEAT_REF_MAX = Seat._meta.get_field("ref").max_length or 32
CATEGORY_MAX = Seat._meta.get_field("category").max_length or 32

# What each state means to the buyer (docs/api.md, "Statuses"). The labels
# are the enum's description in the schema; the terminal ones say so.
_STATE_MEANINGS = {
    S.PENDING: "the seats are held; no charge attempted yet",
    S.CHARGING: "the charge is on its way",
    S.REQUIRES_ACTION: "your bank asks you to confirm the payment; nothing charged yet",
    S.CONFIRMED: "the seats are yours",
    S.PAYMENT_FAILED: "the payment was declined; the purchase is being undone",
    S.UNKNOWN: "we are finding out whether the charge landed",
    S.UNKNOWN_EXPIRED: "we could not find out in time; an operator is on it",
    S.EXPIRED: "the hold ran out before the payment went through; being undone",
    S.COMPENSATING: "the purchase is being undone (seats released, any charge refunded)",
    S.COMPENSATION_PENDING: "undoing is taking longer (a refund is retried); an operator is on it",
    S.COMPENSATED: "the purchase was undone: seats released, any charge refunded",
}
PURCHASE_STATUSES = [
    (
        state.value,
        f"terminal: {_STATE_MEANINGS[state]}" if state in TERMINAL else _STATE_MEANINGS[state],
    )
    for state in SagaState
]

# Every value purchases.selectors.saga_payment_status answers (docs/api.md,
# "Statuses"; a test holds the two together).


class MoneySerializer(serializers.Serializer):
    amount = serializers.IntegerField(help_text="Minor units of the currency (5000 EUR is 50.00)")
    currency = serializers.CharField(help_text="ISO 4217 code")


class EventOrganizerSerializer(serializers.Serializer):
    slug = serializers.CharField(read_only=True)
    name = serializers.CharField(read_only=True)


class EventSerializer(serializers.ModelSerializer):
    organizer = EventOrganizerSerializer(read_only=True, help_text="The seller")
    seats_available = serializers.IntegerField(read_only=True)
    sales_start = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="Purchases open then (null: open now)"
    )
    sales_end = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="Purchases close then (null: never closed by a date)",
    )

    class Meta:
        model = Event
        fields = [
            "id",
            "name",
            "starts_at",
            "organizer",
            "currency",
            "sales_start",
            "sales_end",
            "seats_available",
        ]
        read_only_fields = fields


class SeatSerializer(serializers.ModelSerializer):
    price = serializers.SerializerMethodField()

    status = serializers.ChoiceField(
        SeatStatus.choices,
        read_only=True,
        help_text="`unavailable`: blocked by the seller, not for sale",
    )
    category = serializers.CharField(
        read_only=True, help_text="The code of its price category (`best available` by category)"
    )
    x = serializers.FloatField(read_only=True, help_text="Where the seat map draws it")
    y = serializers.FloatField(read_only=True)

    class Meta:
        model = Seat
        fields = [
            "ref",
            "section",
            "row",
            "number",
            "category",
            "x",
            "y",
            "accessible",
            "status",
            "price",
        ]
        read_only_fields = fields

    @extend_schema_field(MoneySerializer)
    def get_price(self, seat) -> dict[str, Any]:
        return {"amount": seat.price_amount, "currency": seat.currency}


class SeatRefsField(serializers.ListField):
    """The seats of a purchase: 1 to ``MAX_SEATS_PER_PURCHASE`` distinct refs.
    The limit is read each time a serializer is built (DRF builds its fields
    anew per instance), so the schema and the check follow the setting."""

    def __init__(self, **kwargs):
        limit = settings.MAX_SEATS_PER_PURCHASE
        super().__init__(
            child=serializers.CharField(min_length=1, max_length=SEAT_REF_MAX),
            allow_empty=False,
            min_length=1,
            max_length=limit,
            error_messages={"max_length": f"at most {limit} seats per purchase"},
            **kwargs,
        )

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        duplicates = sorted({ref for ref in value if value.count(ref) > 1})
        if duplicates:
            raise serializers.ValidationError(f"duplicate seats: {', '.join(duplicates)}")
        return value


class _SeatRefsFieldSchema(OpenApiSerializerFieldExtension):
    """``uniqueItems`` for the seats (drf-spectacular maps the rest)."""

    target_class = SeatRefsField

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        return {**schema, "uniqueItems": True}


class JSONIntegerField(serializers.IntegerField):
    """A JSON integer only: not a string, a bool or a fraction (``"1"``,
    ``true``, ``1.0``), which DRF's ``IntegerField`` would turn into one.
    What the plain path (``plain_purchase_request``) takes, too."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class QuantityField(JSONIntegerField):
    """Best available: how many seats, 1 to ``MAX_SEATS_PER_PURCHASE`` (read
    each time, as for the seats)."""

    def __init__(self, **kwargs):
        limit = settings.MAX_SEATS_PER_PURCHASE
        super().__init__(
            min_value=1,
            max_value=limit,
            error_messages={"max_value": f"at most {limit} seats per purchase"},
            **kwargs,
        )


@extend_schema_serializer(component_name="Purchase")  # "PurchaseRequest" as a request body
class PurchaseRequestSerializer(serializers.Serializer):
    """Exactly one of `seats` (the seats named) and `quantity` (best available:
    the server holds that many seats next to each other in one row, rows in
    order, in a row the block nearest its middle). Both: 400 `invalid` with
    `field` `quantity`; neither: 400 `invalid` with `field` `seats`."""

    event = JSONIntegerField(min_value=1, help_text="The event's id")
    seats = SeatRefsField(
        required=False, help_text="Seat refs of that event, e.g. A1. Not with `quantity`"
    )
    quantity = QuantityField(
        required=False,
        help_text="Best available, instead of `seats`: how many seats next to each other "
        "in one row (1 to `MAX_SEATS_PER_PURCHASE`); the answer's `seats` names them",
    )
    category = serializers.CharField(
        required=False,
        min_length=1,
        max_length=CATEGORY_MAX,
        help_text="With `quantity` only: the seats are chosen among those of this price "
        "category (its code, e.g. `stalls`)",
    )
    payment_method = serializers.CharField(
        max_length=100, help_text="A payment method token (docs/api.md, test payment methods)"
    )

    def to_internal_value(self, data):
        # Before the fields: whether the body names seats or asks for a
        # quantity decides which field a refusal names.
        if isinstance(data, Mapping):
            if "seats" in data and "quantity" in data:
                raise serializers.ValidationError(
                    {"quantity": ["give either seats or quantity, not both"]}
                )
            if "seats" not in data and "quantity" not in data:
                raise serializers.ValidationError(
                    {"seats": ["This field is required (or quantity, for best available)."]}
                )
            if "category" in data and "quantity" not in data:
                raise serializers.ValidationError(
                    {"category": ["a category chooses seats for a quantity: not with seats"]}
                )
        return super().to_internal_value(data)


def plain_purchase_request(data) -> dict[str, Any] | None:
    """The ``validated_data`` of :class:`PurchaseRequestSerializer` for the
    plainest bodies, without building the serializer; None for any other
    body, which the serializer then judges (and words the refusal of).

    Plain: a JSON object with ``event`` a positive integer, exactly one of
    ``seats`` (1 to ``MAX_SEATS_PER_PURCHASE`` distinct ASCII refs of 1 to 32
    characters, without surrounding spaces) and ``quantity`` (an integer
    from 1 to ``MAX_SEATS_PER_PURCHASE``, with an optional ``category`` of 1
    to 32 such characters), and ``payment_method`` an ASCII
    string of 1 to 100 characters without surrounding spaces; other keys
    are ignored, as the serializer ignores them. Building the serializer
    and its fields was a tenth of the web's CPU per purchase
    (docs/performance.md, "The purchase request's body");
    tests/test_purchase_request.py holds the two to the same answers."""
    if type(data) is not dict or ("seats" in data) == ("quantity" in data):
        return None
    event, method = data.get("event"), data.get("payment_method")
    if type(event) is not int or event < 1 or not _plain_text(method, 100):
        return None
    limit = settings.MAX_SEATS_PER_PURCHASE
    if "quantity" in data:
        quantity = data["quantity"]
        if type(quantity) is not int or not 1 <= quantity <= limit:
            return None
        chosen: dict[str, Any] = {"quantity": quantity}
        if "category" in data:
            if not _plain_text(data["category"], CATEGORY_MAX):
                return None
            chosen["category"] = data["category"]
        return {"event": event, **chosen, "payment_method": method}
    if "category" in data:
        return None  # not with seats: the serializer words the refusal
    seats = data["seats"]
    if (
        type(seats) is not list
        or not 1 <= len(seats) <= limit
        or not all(_plain_text(ref, SEAT_REF_MAX) for ref in seats)
        or len(set(seats)) != len(seats)
    ):
        return None
    return {"event": event, "seats": list(seats), "payment_method": method}


def _plain_text(value, max_length: int) -> bool:
    # ASCII: no surrogate or other character a CharField validator refuses
    # but NUL; stripped already: a CharField would strip it.
    return (
        type(value) is str
        and 1 <= len(value) <= max_length
        and value.isascii()
        and "\x00" not in value
        and value == value.strip()
    )


class PurchaseConflictSerializer(ErrorSerializer):
    """A 409 of `POST /api/purchases/`: the error shape, with `available` when
    the code is `not_enough_seats`, `sales_start` for `sales_not_open`, and
    `limit` and `held_or_bought` for `buyer_limit_reached`."""

    available = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="409 not_enough_seats: the event's seats available and not being taken "
        "right now (none of them N next to each other in a row)",
    )
    sales_start = serializers.DateTimeField(
        required=False, help_text="409 sales_not_open: when the event's sales open (UTC)"
    )
    limit = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="409 buyer_limit_reached: the event's seats per buyer",
    )
    held_or_bought = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="409 buyer_limit_reached: the seats this buyer already holds or bought for "
        "the event, every purchase held or confirmed counted",
    )


class PurchasePausedSerializer(ErrorSerializer):
    """The 503 of `POST /api/purchases/` while the processor's breaker is
    open, or while the event's waiting room lets buyers in in turn."""

    retry_after = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="503 payments_paused and waiting_room: seconds until new purchases may be "
        "tried again (also the Retry-After header)",
    )
    position = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        help_text="503 waiting_room: the buyer's place in the event's waiting room (1 is "
        "next; 0: let in just now, ask again at once); null before the sale opens, when "
        "the places of those who came early are drawn",
    )
    sales_start = serializers.DateTimeField(
        required=False,
        help_text="503 waiting_room before the sale opens: when it opens",
    )


class PurchaseLinksSerializer(serializers.Serializer):
    self = serializers.CharField(help_text="The purchase's path, e.g. /api/purchases/{id}/")


class HistoryEntrySerializer(serializers.Serializer):
    """One step as the buyer reads it (``buyer_history.BuyerMove``): a step
    repeated (a retry) is one entry with its count and latest time. The
    actor, operators' notes, diagnostics and every row stay in the admin
    (docs/api.md)."""

    def get_fields(self):
        # "from" is a Python keyword, so the fields are declared here.
        return {
            "from": serializers.ChoiceField(
                PURCHASE_STATUSES,
                source="from_state",
                allow_null=True,
                read_only=True,
                help_text="null for the creation",
            ),
            "to": serializers.ChoiceField(PURCHASE_STATUSES, source="to_state", read_only=True),
            "at": serializers.DateTimeField(
                read_only=True, help_text="When it happened; the latest time when times > 1"
            ),
            "reason": serializers.CharField(
                help_text="A sentence written for the buyer", read_only=True
            ),
            "times": serializers.IntegerField(
                min_value=1,
                read_only=True,
                help_text="How many times this step happened (1 unless it was retried)",
            ),
        }


class PaymentSerializer(serializers.Serializer):
    intent_id = serializers.CharField(read_only=True)
    status = serializers.ChoiceField(PAYMENT_STATUSES, read_only=True)
    processor = serializers.ChoiceField(
        [("fake", "the fake gateway"), ("stripe", "Stripe")],
        read_only=True,
        help_text='Who charges the card (docs/api.md, "Paying with Stripe")',
    )
    processor_ref = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text="The processor's id of the payment (Stripe's pi_...); null until it has one",
    )


class NextActionSerializer(serializers.Serializer):
    type = serializers.ChoiceField([("authenticate", "3-D Secure")], read_only=True)
    processor = serializers.ChoiceField([("stripe", "Stripe")], read_only=True)
    client_secret = serializers.CharField(
        read_only=True, help_text="For Stripe.js's confirmCardPayment, in the buyer's browser"
    )


class DisputeSerializer(serializers.Serializer):
    """A dispute of the purchase's charge (a chargeback), as the processor last said it."""

    status = serializers.CharField(
        read_only=True,
        help_text="Stripe's dispute status: warning_needs_response, warning_under_review, "
        "warning_closed, needs_response, under_review, won, lost, prevented",
    )
    amount = MoneySerializer(
        read_only=True, help_text="The disputed amount (all or part of the total)"
    )
    reason = serializers.CharField(
        read_only=True, help_text="The bank's reason as Stripe names it (fraudulent, general, ...)"
    )


class PurchaseSummarySerializer(serializers.ModelSerializer):
    status = serializers.ChoiceField(PURCHASE_STATUSES, source="state", read_only=True)
    event = serializers.IntegerField(source="event_id", read_only=True)
    seats = serializers.SerializerMethodField()
    total = serializers.SerializerMethodField()
    hold_expires_at = serializers.DateTimeField(
        source="reservation.hold_expires_at", read_only=True
    )
    links = serializers.SerializerMethodField()

    class Meta:
        model = PurchaseSaga
        fields = ["id", "status", "event", "seats", "total", "hold_expires_at", "links"]
        read_only_fields = fields

    def get_seats(self, saga) -> list[str]:
        return saga_seat_refs(saga)

    @extend_schema_field(MoneySerializer)
    def get_total(self, saga) -> dict[str, Any]:
        return {"amount": saga.amount, "currency": saga.currency}

    @extend_schema_field(PurchaseLinksSerializer)
    def get_links(self, saga) -> dict[str, str]:
        return {"self": f"/api/purchases/{saga.pk}/"}


# What each refund status means to the buyer:
# docs/api.md, "Money back: refunds and cancellations".
REFUND_STATUSES = [
    (RefundStatus.PENDING.value, "asked of the processor; not given back yet"),
    (RefundStatus.SUCCEEDED.value, "given back: the processor refunded it"),
    (
        RefundStatus.FAILED.value,
        "the processor refused it: nothing given back (an operator is on it)",
    ),
]


class RefundSerializer(serializers.Serializer):
    """A refund of the purchase, as its buyer reads it: never the seller's
    or an operator's reason, only the sentence written for the buyer."""

    id = serializers.UUIDField(read_only=True)
    amount = serializers.IntegerField(
        read_only=True, help_text="Minor units of `currency`: what this refund gives back"
    )
    currency = serializers.CharField(read_only=True, help_text="ISO 4217 code (the purchase's)")
    status = serializers.ChoiceField(REFUND_STATUSES, read_only=True)
    created_at = serializers.DateTimeField(read_only=True)
    seats = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="The seats it is for (empty: an amount, no seats named)",
    )
    reason = serializers.CharField(
        source="public_reason", read_only=True, help_text="A sentence written for the buyer"
    )


# What each ticket status means to the buyer
# (docs/api.md, "Your tickets").
TICKET_STATUSES = [
    ("valid", "lets one person in"),
    ("checked_in", "used: scanned in at the door"),
    (
        "revoked",
        "no longer lets anyone in: replaced by a new code, or taken back (a refund, a dispute)",
    ),
]


class TicketSerializer(serializers.Serializer):
    """A ticket of a confirmed purchase: one per seat still the buyer's."""

    seat = serializers.CharField(read_only=True, help_text="The seat's ref, e.g. A1")
    code = serializers.CharField(
        read_only=True,
        help_text="What the ticket's QR code encodes: the ticket signed with the event's "
        "Ed25519 key (base64url, 119 characters), checked at the door, offline too. The "
        "same until the ticket is replaced or the event's key is rotated",
    )
    status = serializers.ChoiceField(TICKET_STATUSES, read_only=True)


class PurchaseDetailSerializer(PurchaseSummarySerializer):
    """One purchase (``selectors.purchase_get``: what it reads is prefetched).
    ``context["now"]``, when given, is the clock ``cancellable_until`` reads."""

    payment = serializers.SerializerMethodField()
    next_action = serializers.SerializerMethodField()
    dispute = serializers.SerializerMethodField()
    history = serializers.SerializerMethodField()
    refunds = serializers.SerializerMethodField()
    refunded = serializers.SerializerMethodField()
    cancellable_until = serializers.SerializerMethodField()
    tickets = serializers.SerializerMethodField()

    class Meta(PurchaseSummarySerializer.Meta):
        fields = [
            *PurchaseSummarySerializer.Meta.fields,
            "payment",
            "next_action",
            "dispute",
            "history",
            "refunds",
            "refunded",
            "cancellable_until",
            "tickets",
        ]
        read_only_fields = fields

    @extend_schema_field(TicketSerializer(many=True))
    def get_tickets(self, saga) -> Any:  # a list (the stubs type .data as a dict)
        """Its tickets, one per seat still yours, once CONFIRMED (empty
        before, and once undone); each `code` is what its QR code encodes."""
        return TicketSerializer(tickets_of(saga), many=True).data

    @extend_schema_field(RefundSerializer(many=True))
    def get_refunds(self, saga) -> Any:  # a list (the stubs type .data as a dict)
        """Its refunds, oldest first: a buyer's cancellation, the organizer's
        refunds, the event's cancellation, customer service's."""
        return RefundSerializer(saga_refund_rows(saga), many=True).data

    @extend_schema_field(MoneySerializer)
    def get_refunded(self, saga) -> dict[str, Any]:
        """What has been given back so far (the ledger's refunds: refunds
        that succeeded, and the refund of a purchase undone)."""
        return {"amount": saga_refunded(saga), "currency": saga.currency}

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_cancellable_until(self, saga) -> str | None:
        """Until when you may cancel seats of this purchase (`POST
        /api/purchases/{id}/cancel/`); null when you may not (not confirmed,
        the event's policy allows none or its time has passed, the event
        is cancelled, nothing is left to cancel)."""
        now = self.context.get("now") or timezone.now()
        until = cancellable_until(saga, saga.event, now=now)
        if until is None or not saga_seats_left(saga):
            return None  # (or nothing is left to cancel)
        return serializers.DateTimeField().to_representation(until)

    @extend_schema_field(PaymentSerializer)
    def get_payment(self, saga) -> dict[str, Any]:
        return {
            "intent_id": saga.intent_id,
            "status": saga_payment_status(saga),
            "processor": saga.processor,
            "processor_ref": saga.processor_ref or None,
        }

    @extend_schema_field(NextActionSerializer(allow_null=True))
    def get_next_action(self, saga) -> dict[str, Any] | None:
        """What the buyer must do for the purchase to go on (REQUIRES_ACTION:
        authenticate with the processor); null otherwise."""
        if saga.state != S.REQUIRES_ACTION or not saga.action_secret:
            return None
        return {
            "type": "authenticate",
            "processor": saga.processor,
            "client_secret": saga.action_secret,
        }

    @extend_schema_field(DisputeSerializer(allow_null=True))
    def get_dispute(self, saga) -> dict[str, Any] | None:
        """The purchase's latest dispute (a chargeback); null if none."""
        dispute = saga_dispute(saga)
        return None if dispute is None else dispute_answer(dispute)

    @extend_schema_field(HistoryEntrySerializer(many=True))
    def get_history(self, saga) -> Any:  # a list (the stubs type .data as a dict)
        return HistoryEntrySerializer(buyer_history(saga), many=True).data


class PurchaseAcceptedSerializer(serializers.Serializer):
    """The 202 answer (and every replay of its key), as stored by the start."""

    id = serializers.UUIDField(read_only=True)
    status = serializers.ChoiceField(PURCHASE_STATUSES, read_only=True)
    event = serializers.IntegerField(read_only=True)
    seats = serializers.ListField(child=serializers.CharField(), read_only=True)
    total = MoneySerializer(read_only=True)
    hold_expires_at = serializers.DateTimeField(read_only=True)
    links = PurchaseLinksSerializer(read_only=True)


class TokenSerializer(serializers.Serializer):
    token = serializers.CharField(
        read_only=True, help_text="Send it as `Authorization: Token <token>`"
    )


class JSONStringField(serializers.CharField):
    """A JSON string only: not a number, which DRF's ``CharField`` would
    turn into one."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class PurchaseCancelRequestSerializer(serializers.Serializer):
    """What the buyer cancels: the seats named, or every seat left when
    `seats` is absent."""

    seats = serializers.ListField(
        child=JSONStringField(min_length=1, max_length=SEAT_REF_MAX),
        required=False,
        allow_empty=False,
        help_text="Seat refs of this purchase, e.g. A1 (absent: every seat not cancelled yet)",
    )


class PurchaseCancelledSerializer(serializers.Serializer):
    """The 202 of a cancellation (and of every replay of its key): the
    refund it opened, as the purchase's `refunds` lists it."""

    refund = RefundSerializer(read_only=True)


class RefundConflictSerializer(ErrorSerializer):
    """A 409 of a refund or a cancellation: the error shape, with
    `refundable` and `currency` when the code is `refund_exceeds_paid`."""

    refundable = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="409 refund_exceeds_paid: what is left to refund of the purchase (minor units)",
    )
    currency = serializers.CharField(
        required=False, help_text="409 refund_exceeds_paid: the currency of `refundable`"
    )


def idempotency_key_problem(key: str | None) -> tuple[str, str] | None:
    """The ``Idempotency-Key`` header checked as every API that takes one
    checks it: None when it is fine, else the 400's (code, detail)."""
    if key is None or key == "":
        return "idempotency_key_missing", "the Idempotency-Key header is required"
    if len(key) > 255 or not key.isprintable() or not key.isascii():
        return (
            "idempotency_key_invalid",
            "the Idempotency-Key header must be 1 to 255 printable ASCII characters",
        )
    return None


def refund_refusal(exc: RefundError) -> tuple[int, dict[str, Any]]:
    """The status and error body of a refund refused: a bad field names it
    (400), too much says what is left (409), a reused key is 422, the rest
    409 by code (docs/api.md, "Money back: refunds and cancellations")."""
    body: dict[str, Any] = {"code": exc.code, "detail": str(exc)}
    if isinstance(exc, InvalidRefund):
        body.update(field=exc.field, errors={exc.field: [str(exc)]})
    elif isinstance(exc, RefundExceedsPaid):
        body.update(refundable=exc.refundable, currency=exc.currency)
    return exc.status, body


class QueuePlaceSerializer(serializers.Serializer):
    """Where the buyer stands in an event's waiting room
    (`/api/events/{id}/queue/`)."""

    status = serializers.ChoiceField(
        choices=["waiting", "admitted", "not_in_room", "open"],
        help_text="`waiting`: in the room (`position`, `retry_after`); `admitted`: the "
        "buyer's turn (`pass`, `pass_expires_at`): start a purchase before then; "
        "`not_in_room`: the room lets buyers in in turn and this buyer has not joined (POST "
        "joins, as a purchase refused with 503 waiting_room does); `open`: nothing to wait "
        "for, buy",
    )
    position = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="`waiting`: 1 is next; null before the sale opens (places are drawn then)",
    )
    retry_after = serializers.IntegerField(
        required=False, help_text="`waiting`: seconds until asking again is worth it"
    )
    sales_start = serializers.DateTimeField(
        required=False, help_text="`waiting` before the sale opens: when it opens"
    )
    pass_ = serializers.CharField(
        required=False,
        help_text="`admitted`: the buyer's pass, sent in `Waiting-Room-Pass` with "
        "`POST /api/purchases/`; it names this buyer and this event only",
    )
    pass_expires_at = serializers.DateTimeField(
        required=False, help_text="`admitted`: when the turn ends"
    )

    def get_fields(self):
        # "pass" is a Python keyword: declared as pass_, named pass.
        fields = super().get_fields()
        fields["pass"] = fields.pop("pass_")
        return fields
