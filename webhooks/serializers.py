"""Request and answer shapes of the webhooks' staff API (docs/api.md,
"Webhooks").

Requests are strict, because they configure where the seller's data goes: a
field that is not one of the operation's is refused by name (never ignored),
and a value of the wrong JSON type is refused rather than coerced (``"false"``
is not ``false``, ``12`` is not a URL). Whether a URL may be sent to and
which event types exist is the services' to decide
(:class:`webhooks.errors.WebhookInvalid`), except that the event types are
also an enum here, so that the schema lists them.

Answers never carry an endpoint's secret, except the two that exist to show
it once (creation, rotation).
"""

from __future__ import annotations

from collections.abc import Mapping

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from rest_framework import serializers

from .endpoints import DESCRIPTION_MAX_CHARS, URL_MAX_CHARS
from .models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent

RESEND_REASON_MAX_CHARS = 500
_URL_HELP = (
    "`https://` to public addresses only (`http://` and private addresses too with "
    "`WEBHOOK_ALLOW_LOCAL_URLS`); checked now and before each delivery"
)
_EVENTS_HELP = "The event types to send; at least one"


class StrictCharField(serializers.CharField):
    """A JSON string, nothing else (DRF's CharField turns numbers into text)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """JSON ``true`` or ``false``, nothing else (DRF's BooleanField takes
    ``"false"``, ``0``, ``"off"``...)."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class WebhookEventField(serializers.ChoiceField):
    """An event type (``WebhookEvent``)."""

    def __init__(self, **kwargs):
        super().__init__(choices=WebhookEvent.choices, **kwargs)


class _WebhookEventFieldSchema(OpenApiSerializerFieldExtension):
    """One enum component, ``WebhookEventType``, for an endpoint's ``events``
    and a delivery's ``type`` alike (drf-spectacular would otherwise name the
    same choices twice, after each field)."""

    target_class = WebhookEventField

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        component = ResolvedComponent(
            name="WebhookEventType",
            type=ResolvedComponent.SCHEMA,
            object="WebhookEventType",
            schema={k: schema[k] for k in ("type", "enum", "description") if k in schema},
        )
        auto_schema.registry.register_on_missing(component)
        return component.ref


def _event_types(**kwargs) -> serializers.ListField:
    return serializers.ListField(child=WebhookEventField(), **kwargs)


def _event_types_request(**kwargs) -> serializers.ListField:
    # allow_empty and min_length say the same: the first gives the error
    # message, the second the schema's minItems.
    return _event_types(allow_empty=False, min_length=1, help_text=_EVENTS_HELP, **kwargs)


class StrictRequestSerializer(serializers.Serializer):
    """Refuses, by name, any field it does not declare."""

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            known = ", ".join(self.fields)
            unknown = [name for name in data if name not in self.fields]
            if unknown:
                raise serializers.ValidationError(
                    {name: [f"unknown field; the fields are: {known}"] for name in unknown}
                )
        return super().to_internal_value(data)


class WebhookEndpointCreateSerializer(StrictRequestSerializer):
    """A new endpoint; any other field is refused by name."""

    url = StrictCharField(max_length=URL_MAX_CHARS, help_text=_URL_HELP)
    events = _event_types_request()
    description = StrictCharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=DESCRIPTION_MAX_CHARS,
        help_text="For people: whose system it is",
    )


class WebhookEndpointUpdateSerializer(StrictRequestSerializer):
    """Every field optional: what is given changes, the rest stays; any other
    field is refused by name."""

    url = StrictCharField(required=False, max_length=URL_MAX_CHARS, help_text=_URL_HELP)
    events = _event_types_request(required=False)
    description = StrictCharField(
        required=False, allow_blank=True, trim_whitespace=False, max_length=DESCRIPTION_MAX_CHARS
    )
    enabled = StrictBooleanField(
        required=False,
        help_text="`false`: no delivery is written for it from now on, and an "
        "attempt that comes due fails without being sent",
    )


class DeliveryCountsSerializer(serializers.Serializer):
    pending = serializers.IntegerField(read_only=True, source="pending_count")
    delivered = serializers.IntegerField(read_only=True, source="delivered_count")
    failed = serializers.IntegerField(read_only=True, source="failed_count")


class WebhookEndpointCreatedSerializer(serializers.ModelSerializer):
    """The answer to a creation: the only one, with a rotation's, that shows
    the secret."""

    events = _event_types(read_only=True)
    secret = serializers.CharField(
        read_only=True,
        help_text="`whsec_<base64>`: verify deliveries with it (any Standard "
        "Webhooks library). Shown now and at each rotation only",
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "events", "description", "enabled", "secret", "created_at"]
        read_only_fields = fields


class WebhookEndpointSerializer(serializers.ModelSerializer):
    """An endpoint as read and as changed: never its secret."""

    events = _event_types(read_only=True)
    delivery_counts = DeliveryCountsSerializer(
        read_only=True, source="*", help_text="Its deliveries, counted by status"
    )

    class Meta:
        model = WebhookEndpoint
        fields = [
            "id",
            "url",
            "events",
            "description",
            "enabled",
            "created_at",
            "updated_at",
            "delivery_counts",
        ]
        read_only_fields = fields


class WebhookSecretSerializer(serializers.Serializer):
    secret = serializers.CharField(
        read_only=True,
        help_text="The new `whsec_<base64>`; every attempt from now on is signed with it alone",
    )


class WebhookAttemptSerializer(serializers.ModelSerializer):
    at = serializers.DateTimeField(
        read_only=True, help_text="When it started: its `webhook-timestamp`"
    )
    status_code = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="The receiver's; null: no answer"
    )
    latency_ms = serializers.FloatField(
        read_only=True, allow_null=True, help_text="null: nothing was sent"
    )
    error = serializers.CharField(read_only=True, help_text="Empty on a 2xx")
    response_excerpt = serializers.CharField(
        read_only=True, help_text="The start of the receiver's answer"
    )
    resend = serializers.BooleanField(read_only=True, help_text="Asked for by staff")

    class Meta:
        model = WebhookAttempt
        fields = [
            "number",
            "at",
            "status_code",
            "latency_ms",
            "error",
            "response_excerpt",
            "resend",
        ]
        read_only_fields = fields


class WebhookDeliverySerializer(serializers.ModelSerializer):
    message_id = serializers.CharField(
        read_only=True, help_text="The `webhook-id` header: the same on every attempt"
    )
    type = WebhookEventField(source="event_type", read_only=True)
    status = serializers.ChoiceField(choices=DeliveryStatus.choices, read_only=True)
    purchase = serializers.UUIDField(
        source="saga_id", read_only=True, help_text="The purchase it is about"
    )
    next_attempt_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="When the attempt owed is due (pending)"
    )
    attempts = WebhookAttemptSerializer(many=True, read_only=True, help_text="Oldest first")

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "message_id",
            "type",
            "status",
            "purchase",
            "created_at",
            "next_attempt_at",
            "delivered_at",
            "failed_at",
            "attempts",
        ]
        read_only_fields = fields


class WebhookResendSerializer(StrictRequestSerializer):
    """Optional: the body may be empty."""

    reason = StrictCharField(
        required=False,
        allow_blank=True,
        max_length=RESEND_REASON_MAX_CHARS,
        help_text="Why: written to the log with who asked",
    )


class WebhookResendAcceptedSerializer(serializers.Serializer):
    delivery = serializers.IntegerField(read_only=True)
    attempt = serializers.IntegerField(read_only=True, help_text="The number of the attempt armed")
