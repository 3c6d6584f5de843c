"""Read-only admin views of the fake processor's tables, for looking at what
"the processor" holds during a demo. Nobody edits them by hand: a real
processor's records are not ours to change, and the saga reads them only
through the gateway's API."""

from django.contrib import admin

from common.money import format_money
from config.admin import ReadOnlyAdminMixin

from .models import (
    FakeCharge,
    FakeDroppedCharge,
    FakeIdempotentAnswer,
    FakeIntent,
    FakeRefund,
    FakeRequest,
)


class AmountColumn:
    """The amount as money, for ``list_display`` and ``fields`` (by name)."""

    @admin.display(description="amount", ordering="amount")
    def amount_display(self, obj: FakeIntent | FakeCharge | FakeRefund) -> str | None:
        # Null on an intent cancelled before any charge named an amount (shown "-").
        return None if obj.amount is None else format_money(obj.amount, obj.currency)


class FakeChargeInline(ReadOnlyAdminMixin, AmountColumn, admin.TabularInline):
    model = FakeCharge
    extra = 0
    fields = readonly_fields = ("id", "amount_display", "status", "created")


@admin.register(FakeIntent)
class FakeIntentAdmin(ReadOnlyAdminMixin, AmountColumn, admin.ModelAdmin):
    list_display = ("intent_id", "status", "amount_display", "payment_method", "updated")
    list_filter = ("status", "payment_method")
    search_fields = ("intent_id",)
    fields = readonly_fields = (
        "intent_id",
        "status",
        "amount_display",
        "payment_method",
        "created",
        "updated",
    )
    inlines = [FakeChargeInline]


@admin.register(FakeCharge)
class FakeChargeAdmin(ReadOnlyAdminMixin, AmountColumn, admin.ModelAdmin):
    list_display = ("id", "intent", "amount_display", "status", "created")
    list_filter = ("status",)
    search_fields = ("id", "intent__intent_id")
    fields = readonly_fields = ("id", "intent", "amount_display", "status", "created")


@admin.register(FakeRefund)
class FakeRefundAdmin(ReadOnlyAdminMixin, AmountColumn, admin.ModelAdmin):
    list_display = ("id", "refund_id", "intent", "amount_display", "status", "created")
    list_filter = ("status",)
    search_fields = ("id", "refund_id", "intent__intent_id")
    fields = readonly_fields = (
        "id",
        "refund_id",
        "intent",
        "amount_display",
        "status",
        "failure_reason",
        "created",
        "settled",
    )


@admin.register(FakeIdempotentAnswer)
class FakeIdempotentAnswerAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("endpoint", "idempotency_key", "intent_id", "status_code", "created")
    list_filter = ("endpoint", "status_code")
    search_fields = ("idempotency_key", "intent_id")


@admin.register(FakeDroppedCharge)
class FakeDroppedChargeAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("idempotency_key", "intent_id", "created")
    search_fields = ("idempotency_key", "intent_id")


@admin.register(FakeRequest)
class FakeRequestAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = (
        "created",
        "endpoint",
        "intent_id",
        "idempotency_key",
        "payment_method",
        "status_code",
        "timed_out",
    )
    list_filter = ("endpoint", "status_code", "timed_out")
    search_fields = ("intent_id", "idempotency_key", "refund_id")
