"""Read-mostly admin views of the fake processor's tables, for poking at what
"the processor" holds during a demo."""

from django.contrib import admin

from .models import FakeCharge, FakeDroppedCharge, FakeIdempotentAnswer, FakeIntent, FakeRequest


class FakeChargeInline(admin.TabularInline):
    model = FakeCharge
    extra = 0
    can_delete = False
    readonly_fields = ("id", "amount", "currency", "status", "created")


@admin.register(FakeIntent)
class FakeIntentAdmin(admin.ModelAdmin):
    list_display = ("intent_id", "status", "amount", "currency", "payment_method", "updated")
    list_filter = ("status", "payment_method")
    search_fields = ("intent_id",)
    readonly_fields = ("created", "updated")
    inlines = [FakeChargeInline]


@admin.register(FakeCharge)
class FakeChargeAdmin(admin.ModelAdmin):
    list_display = ("id", "intent", "amount", "currency", "status", "created")
    list_filter = ("status",)
    search_fields = ("id", "intent__intent_id")
    readonly_fields = ("id", "created")


@admin.register(FakeIdempotentAnswer)
class FakeIdempotentAnswerAdmin(admin.ModelAdmin):
    list_display = ("endpoint", "idempotency_key", "intent_id", "status_code", "created")
    list_filter = ("endpoint", "status_code")
    search_fields = ("idempotency_key", "intent_id")


@admin.register(FakeDroppedCharge)
class FakeDroppedChargeAdmin(admin.ModelAdmin):
    list_display = ("idempotency_key", "intent_id", "created")
    search_fields = ("idempotency_key", "intent_id")


@admin.register(FakeRequest)
class FakeRequestAdmin(admin.ModelAdmin):
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
    search_fields = ("intent_id", "idempotency_key")
