"""Read-only admin for sagas: the timeline an operator reads at 3 a.m.

Nobody edits a saga's state here; state moves only through the services.
"""

from django.contrib import admin

from outbox.models import OutboxMessage

from .models import Event, PurchaseSaga, ReconciliationProbe, Reservation, SagaHistory, Seat


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class HistoryInline(ReadOnlyInline):
    model = SagaHistory
    fields = ["at", "from_state", "to_state", "actor", "actor_name", "reason", "version"]
    readonly_fields = fields
    ordering = ["at", "id"]


class ProbeInline(ReadOnlyInline):
    model = ReconciliationProbe
    fields = ["at", "asked", "answer", "detail", "latency_ms", "attempt"]
    readonly_fields = fields


@admin.register(PurchaseSaga)
class PurchaseSagaAdmin(admin.ModelAdmin):
    list_display = ["id", "state", "event", "buyer", "amount", "currency", "attempts",
                    "created_at", "updated_at"]
    list_filter = ["state", "event"]
    search_fields = ["id", "intent_id", "reservation__ref", "buyer__username"]
    inlines = [HistoryInline, ProbeInline]
    readonly_fields = ["id", "reservation", "event", "buyer", "intent_id", "payment_method",
                       "amount", "currency", "state", "version", "attempts", "created_at",
                       "updated_at", "timers"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="timers and outbox messages")
    def timers(self, obj):
        rows = OutboxMessage.objects.filter(saga_id=obj.pk).order_by("available_at", "id")
        return "\n".join(
            f"{m.topic} key={m.key} due={m.available_at:%Y-%m-%d %H:%M:%S} "
            f"fired={m.fired_at or '-'} cancelled={m.cancelled_at or '-'} "
            f"completed={m.completed_at or '-'}"
            for m in rows
        ) or "-"


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "starts_at"]


@admin.register(Seat)
class SeatAdmin(admin.ModelAdmin):
    list_display = ["ref", "event", "status", "price_amount", "currency"]
    list_filter = ["event", "status"]
    readonly_fields = ["status"]


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    list_display = ["ref", "event", "buyer", "status", "hold_expires_at", "total_amount"]
    list_filter = ["status", "event"]
    search_fields = ["ref", "buyer__username"]
    readonly_fields = ["ref", "event", "buyer", "status", "hold_expires_at", "total_amount",
                       "currency", "created_at"]
