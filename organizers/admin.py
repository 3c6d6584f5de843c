"""Organizers in the admin, for the platform's operators (docs/operations.md,
"Admin"): each organizer with its members on its page, and every
membership in one list, filterable by organizer and role (read-only there:
members change on their organizer's page). Each organizer's row links to
its events, purchases, seats and webhook endpoints: the other apps' lists,
filtered by it (by URL name: this app imports neither).

The rule the API keeps, an organizer keeps at least one owner, holds here
too: the members' formset refuses to leave none. An organizer with events
cannot be deleted: their foreign key protects it, and Django's delete page
lists them and refuses.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import Count
from django.urls import reverse
from django.utils.html import format_html_join

from config.admin import ReadOnlyAdminMixin

from .models import Membership, Organizer
from .roles import Role


class MembershipFormSet(forms.BaseInlineFormSet):
    def clean(self):
        super().clean()
        kept = [
            form.cleaned_data.get("role")
            for form in self.forms
            if form.cleaned_data and not form.cleaned_data.get("DELETE")
        ]
        if Role.OWNER not in kept:
            raise ValidationError("An organizer keeps at least one owner.")


class MembershipInline(admin.TabularInline):
    model = Membership
    formset = MembershipFormSet
    fields = ["user", "role", "created_at"]
    readonly_fields = ["created_at"]
    raw_id_fields = ["user"]
    extra = 1


# The lists an organizer's row links to: (label, admin URL name, the filter's
# query parameter). Each list filters by organizer (purchases/ops/admin.py,
# webhooks/admin.py).
ORGANIZER_LISTS = (
    ("events", "admin:purchases_event_changelist", "organizer__id__exact"),
    ("purchases", "admin:purchases_purchasesaga_changelist", "event__organizer__id__exact"),
    ("seats", "admin:purchases_seat_changelist", "event__organizer__id__exact"),
    ("webhook endpoints", "admin:webhooks_webhookendpoint_changelist", "organizer__id__exact"),
)


@admin.register(Organizer)
class OrganizerAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "members", "lists", "created_at"]
    search_fields = ["slug", "name"]
    readonly_fields = ["created_at", "lists"]
    inlines = [MembershipInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(member_count=Count("memberships"))

    @admin.display(description="members", ordering="member_count")
    def members(self, obj):
        return obj.member_count

    @admin.display(description="lists")
    def lists(self, obj):
        if obj.pk is None:
            return "-"  # the add page: nothing of its own yet
        return format_html_join(
            " · ",
            '<a href="{}?{}={}">{}</a>',
            ((reverse(name), param, obj.pk, label) for label, name, param in ORGANIZER_LISTS),
        )


@admin.register(Membership)
class MembershipAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["organizer", "user", "role", "created_at"]
    list_filter = ["organizer", "role"]
    search_fields = ["user__username", "organizer__slug"]
    list_select_related = ["organizer", "user"]
