"""Stripe's events as received: looked at, never edited (the endpoint writes
them, the consumer stamps them)."""

from django.contrib import admin

from config.admin import ReadOnlyAdminMixin

from .models import StripeEvent


@admin.register(StripeEvent)
class StripeEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = COLUMNS = (
        "stripe_id",
        "type",
        "object_id",
        "livemode",
        "created",
        "received_at",
        "ignored",
        "acted_at",
        "outcome",
    )
    list_filter = ["type", "ignored", "livemode"]
    search_fields = ["=stripe_id", "=object_id"]
    search_help_text = "The event's id (evt_…) or its object's (pi_…, ch_…, dp_…), exact."
    show_full_result_count = False
    readonly_fields = COLUMNS
    fields = COLUMNS
