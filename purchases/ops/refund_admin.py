"""The operators' admin of money back (docs/refunds.md): refund rows and
events' cancellation runs, read-only like every row that moves money
(``config.admin.ReadOnlyAdminMixin``): a refund moves through its own steps
only, and a run through its ticks.

A refund's page opens with what it is (amount, seats, who asked, why: the
seller's reason beside the buyer's sentence) and shows its evidence: every
answer of the processor about it (``GatewayAnswer.refund_id``) and its
ledger entry once it succeeded. A cancellation's page shows its progress
as the seller's dashboard does (``cancellation_progress``)."""

from __future__ import annotations

import re
import uuid

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from common.money import format_money
from common.time import format_utc_seconds
from config.admin import ReadOnlyAdminMixin
from ledger.models import LedgerEntry

from ..models import EventCancellation, GatewayAnswer, Refund
from ..refunds.selectors import cancellation_progress
from ..templatetags.saga_admin import saga_id
from .admin import ORGANIZER, OrganizerColumn

# A saga id as the saga list shows it (its first 8 characters).
_SHORT_ID = re.compile(r"[0-9a-fA-F]{8}")


def _saga_link(saga_pk) -> str:
    url = reverse("admin:purchases_purchasesaga_change", args=[saga_pk])
    return format_html('<a href="{}">{}</a>', url, saga_id(saga_pk))


@admin.register(Refund)
class RefundAdmin(ReadOnlyAdminMixin, OrganizerColumn, admin.ModelAdmin):
    list_display = [
        "short_id",
        "saga_link",
        "organizer",
        "event",
        "money",
        "source",
        "status",
        "created",
        "settled",
    ]
    list_filter = ["status", "source", ORGANIZER, "event"]
    list_select_related = ["event__organizer"]
    ordering = ["-created_at", "-id"]
    show_full_result_count = False
    search_fields = ["processor_ref"]  # see get_search_results
    search_help_text = (
        "Saga id (whole, or its first 8 characters), refund id, or the processor's refund id."
    )
    fields = (
        "id",
        "saga_link",
        "event",
        "money",
        "seats_text",
        "released",
        "source",
        "status",
        "reason",
        "public_reason",
        "requested_by",
        "request_key",
        "processor_ref",
        "detail",
        "asked",
        "lookups",
        "created",
        "updated",
        "settled",
        "ledger",
        "gateway_evidence",
    )
    readonly_fields = fields

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            found = uuid.UUID(term)
        except ValueError:
            pass
        else:  # a saga's refunds, or one refund
            return queryset.filter(saga_id=found) | queryset.filter(pk=found), False
        if _SHORT_ID.fullmatch(term):
            low = uuid.UUID(term.lower() + "0" * 24)
            high = uuid.UUID(term.lower() + "f" * 24)
            return queryset.filter(saga_id__gte=low, saga_id__lte=high), False
        return queryset.filter(processor_ref=term), False

    @admin.display(description="id")
    def short_id(self, obj):
        return str(obj.pk)[:8]

    @admin.display(description="saga")
    def saga_link(self, obj):
        return _saga_link(obj.saga_id)

    @admin.display(description="amount", ordering="amount")
    def money(self, obj):
        return format_money(obj.amount, obj.currency)

    @admin.display(description="seats")
    def seats_text(self, obj):
        return ", ".join(obj.seats) or "none named (an amount)"

    @admin.display(description="created", ordering="created_at")
    def created(self, obj):
        return format_utc_seconds(obj.created_at)

    @admin.display(description="updated")
    def updated(self, obj):
        return format_utc_seconds(obj.updated_at)

    @admin.display(description="settled", ordering="settled_at")
    def settled(self, obj):
        return format_utc_seconds(obj.settled_at)

    @admin.display(description="ledger entry")
    def ledger(self, obj):
        entry = LedgerEntry.objects.filter(refund_id=obj.pk, event_id=obj.event_id).first()
        if entry is None:
            return "none (written when the refund succeeds)"
        money = format_money(entry.amount, entry.currency)
        return f"{entry.kind} {money} ({entry.gateway_reference or '-'})"

    @admin.display(description="the processor's answers (evidence)")
    def gateway_evidence(self, obj):
        answers = GatewayAnswer.objects.filter(refund_id=obj.pk, event_id=obj.event_id).order_by(
            "at", "id"
        )
        if not answers:
            return "none yet (the processor has not been asked)"
        rows = format_html_join(
            "",
            '<tr class="refund-answer"><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
            "<td>{}</td><td>{} ms</td></tr>",
            (
                (
                    format_utc_seconds(a.at),
                    a.asked,
                    a.answer,
                    a.detail or "-",
                    a.attempt or "-",
                    round(a.latency_ms, 1),
                )
                for a in answers
            ),
        )
        return format_html(
            '<table class="refund-evidence"><thead><tr><th>at</th><th>asked</th>'
            "<th>answer</th><th>detail</th><th>attempt</th><th>latency</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            rows,
        )


@admin.register(EventCancellation)
class EventCancellationAdmin(ReadOnlyAdminMixin, OrganizerColumn, admin.ModelAdmin):
    list_display = ["event", "organizer", "status", "started", "finished", "rate", "requested_by"]
    list_filter = ["status", ORGANIZER]
    list_select_related = ["event__organizer", "requested_by"]
    ordering = ["-created_at"]
    search_fields = ["event__name"]
    fields = (
        "event",
        "status",
        "reason",
        "requested_by",
        "rate",
        "started",
        "updated",
        "finished",
        "progress",
    )
    readonly_fields = fields

    @admin.display(description="started", ordering="created_at")
    def started(self, obj):
        return format_utc_seconds(obj.created_at)

    @admin.display(description="updated")
    def updated(self, obj):
        return format_utc_seconds(obj.updated_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, obj):
        return format_utc_seconds(obj.finished_at)

    @admin.display(description="progress")
    def progress(self, obj):
        p = cancellation_progress(obj)
        owed = format_money(p["owed_amount"], obj.event.currency)
        return format_html(
            '<span class="cancellation-progress">{} purchases: {} refunded in full, '
            "{} failed, {} still owed, {} in flight ({})</span>",
            p["purchases"],
            p["refunded"],
            p["failed"],
            owed,
            p["in_flight"],
            p["status"],
        )
