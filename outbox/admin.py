"""The outbox in the admin: every row read-only, dead letters found, replayed.

Nobody edits an outbox row here. The one action, "Replay", is for staff
holding ``outbox.replay_outboxmessage``; like the saga runbook
(``purchases/admin.py``) it shows a dry run first and asks for a reason, then
calls the same service as ``manage.py outbox_replay``
(:func:`outbox.services.outbox_replay`) and writes the admin log.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from config.admin import ReasonForm, exact_search

from .models import InboxEntry, OutboxMessage
from .services import outbox_replay

# More than this is a job for the command (and its --dry-run).
REPLAY_MAX_MESSAGES = 200
STATES = {
    "armed": "armed (a timer, not due yet)",
    "due": "due, waiting for the relay",
    "fired": "handed over, not completed (redeliveries go on)",
    "completed": "completed",
    "cancelled": "cancelled",
    "dead": "dead letters",
}


def message_state(message: OutboxMessage, now=None) -> str:
    if message.cancelled_at:
        return "cancelled"
    if message.completed_at:
        return "completed"
    if message.dead_at:
        return "dead"
    if message.fired_at:
        return "fired"
    return "armed" if message.available_at > (now or timezone.now()) else "due"


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return list(STATES.items())

    def queryset(self, request, queryset):
        now = timezone.now()
        pending = {"completed_at__isnull": True, "cancelled_at__isnull": True}
        match self.value():
            case "armed":
                return queryset.filter(**pending, fired_at__isnull=True, available_at__gt=now)
            case "due":
                return queryset.filter(**pending, fired_at__isnull=True, available_at__lte=now)
            case "fired":
                return queryset.filter(**pending, fired_at__isnull=False, dead_at__isnull=True)
            case "completed":
                return queryset.filter(completed_at__isnull=False, cancelled_at__isnull=True)
            case "cancelled":
                return queryset.filter(cancelled_at__isnull=False)
            case "dead":
                return queryset.filter(**pending, dead_at__isnull=False)
        return queryset


class TopicFilter(admin.SimpleListFilter):
    """The routed topics (from ``OUTBOX_CONSUMERS``, not a DISTINCT over the
    whole table on every page)."""

    title = "topic"
    parameter_name = "topic"

    def lookups(self, request, model_admin):
        return [(topic, topic) for topic in sorted(settings.OUTBOX_CONSUMERS)]

    def queryset(self, request, queryset):
        return queryset.filter(topic=self.value()) if self.value() else queryset


class ReplayReasonForm(ReasonForm):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["reason"].help_text = "Required. Lands in the admin log and the log line."


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "topic",
        "key",
        "saga_id",
        "due",
        "deliveries",
        "state",
        "last_error_short",
    ]
    list_filter = [StateFilter, TopicFilter]
    search_fields = ["key"]  # see get_search_results
    search_help_text = "Saga id, message id or key (exact)."
    show_full_result_count = False  # no count(*) over the whole history
    ordering = ["-id"]
    actions = ["replay"]
    fields = (
        "id",
        "topic",
        "key",
        "saga_id",
        "event_id",
        "state",
        "created_at",
        "available_at",
        "fired_at",
        "handed_over_at",
        "deliveries",
        "attempts",
        "due_at",
        "last_error",
        "last_error_at",
        "dead_at",
        "replayed_at",
        "only_consumers",
        "completed_at",
        "cancelled_at",
        "claimed_until",
        "processing_until",
        "consumers",
        "payload_json",
    )
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_replay_permission(self, request):
        return request.user.has_perm("outbox.replay_outboxmessage")

    # --- columns ------------------------------------------------------------------

    @admin.display(description="due", ordering="due_at")
    def due(self, obj):
        """When the relay looks at it next: its due time, then its next
        redelivery (or dead-letter verdict); nothing once it is settled."""
        return obj.due_at or "-"

    @admin.display(description="state")
    def state(self, obj):
        return message_state(obj)

    @admin.display(description="last error")
    def last_error_short(self, obj):
        return obj.last_error[:120] + ("…" if len(obj.last_error) > 120 else "")

    @admin.display(description="consumers (from the inbox)")
    def consumers(self, obj):
        ran = dict(InboxEntry.objects.filter(message=obj).values_list("consumer", "processed_at"))
        routed = settings.OUTBOX_CONSUMERS.get(obj.topic, [])
        rows = [
            (name, f"ran {ran[name]:%Y-%m-%d %H:%M:%S}" if name in ran else "not yet")
            for name in routed
        ]
        rows += [
            (name, f"ran {at:%Y-%m-%d %H:%M:%S} (no longer routed)")
            for name, at in ran.items()
            if name not in routed
        ]
        if not rows:
            return "no consumer is routed for this topic"
        return format_html("<ul>{}</ul>", format_html_join("", "<li>{}: {}</li>", rows))

    @admin.display(description="payload")
    def payload_json(self, obj):
        return format_html(
            "<pre>{}</pre>", json.dumps(obj.payload, indent=2, sort_keys=True, default=str)
        )

    def get_search_results(self, request, queryset, search_term):
        return exact_search(queryset, search_term, field="key")

    # --- the replay action ------------------------------------------------------

    @admin.action(permissions=["replay"], description="Replay (dry run first)")
    def replay(self, request, queryset):
        """First POST: the dry run and a reason form. Confirmed POST with a
        reason: replay, write the admin log, back to the list."""
        ids = list(queryset.order_by("pk").values_list("pk", flat=True)[: REPLAY_MAX_MESSAGES + 1])
        if len(ids) > REPLAY_MAX_MESSAGES:
            self.message_user(
                request,
                f"More than {REPLAY_MAX_MESSAGES} messages selected: use "
                "`manage.py outbox_replay` (with --dry-run first). Nothing was replayed.",
                messages.ERROR,
            )
            return None
        form = ReplayReasonForm(request.POST if request.POST.get("confirm") else None)
        if form.is_bound and form.is_valid():
            return self._replay(request, ids, form.cleaned_data["reason"])
        plan = outbox_replay(ids=ids, dry_run=True)
        context = {
            **self.admin_site.each_context(request),
            "title": "Replay: dry run",
            "opts": self.model._meta,
            "plan": plan,
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/outbox/outboxmessage/replay_confirm.html", context)

    def _replay(self, request, ids, reason):
        operator = request.user.username
        result = outbox_replay(ids=ids, operator=operator, reason=reason)
        replayed = {
            m.pk: m
            for m in OutboxMessage.objects.filter(
                pk__in=[line.message_id for line in result.replayed]
            )
        }
        for line in result.replayed:
            self.log_change(
                request,
                replayed[line.message_id],
                f'Replay ({line.kind}); reason: "{reason}"; runs: '
                f"{', '.join(line.runs) or 'nothing'}; skips (already ran): "
                f"{', '.join(line.skips) or 'nothing'}",
            )
        self.message_user(
            request,
            f"Replayed {len(result.replayed)} message(s): the relay hands them over now.",
            messages.SUCCESS if result.replayed else messages.WARNING,
        )
        for line in result.refused:
            self.message_user(
                request, f"#{line.message_id} not replayed: {line.refused}", messages.WARNING
            )
        return None
