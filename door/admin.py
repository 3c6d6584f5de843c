"""The door's rows in the admin, to look at only (``ReadOnlyAdminMixin``):
a scan, a check-in or a revocation is written by the door's services in the
commit of what it records, and a key never leaves them (its private half is
not shown). The runbook reads the scans (docs/door.md, "A forged or leaked
ticket")."""

from django.contrib import admin

from config.admin import ReadOnlyAdminMixin

from .models import CheckIn, EventKey, Scan, TicketRevocation


@admin.register(Scan)
class ScanAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["at", "event_id", "gate", "result", "ticket_id", "offline", "conflict", "by"]
    list_filter = ["result", "offline", "conflict"]
    # The code as scanned (a leaked one is searched for by its text).
    search_fields = ["code", "gate"]
    list_select_related = ["by"]
    ordering = ["-at", "-id"]
    show_full_result_count = False


@admin.register(CheckIn)
class CheckInAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["checked_in_at", "event_id", "ticket_id", "version", "gate", "by"]
    search_fields = ["gate"]
    list_select_related = ["by"]
    ordering = ["-checked_in_at", "-id"]
    show_full_result_count = False


@admin.register(TicketRevocation)
class TicketRevocationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["at", "event_id", "ticket_id", "version", "reason"]
    list_filter = ["reason"]
    ordering = ["-at", "-id"]
    show_full_result_count = False


@admin.register(EventKey)
class EventKeyAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["event_id", "version", "created_at", "retired_at"]
    fields = ["event", "version", "created_at", "retired_at"]
    ordering = ["event_id", "-version"]
