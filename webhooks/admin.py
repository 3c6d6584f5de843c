"""Webhooks in the admin: endpoints and deliveries, read-only; one action,
Resend (docs/operations.md, "Admin").

Endpoints are managed through the staff API (``/api/webhook-endpoints/``),
which checks the URL and shows the secret once, at creation and at each
rotation: the admin never shows a secret. An operator who needs it rotates
it through the API (``POST /api/webhook-endpoints/{id}/rotate-secret/``) and
hands the new one to the receiver's owner.

A delivery's page shows its attempts (the delivery log). "Resend", for staff
holding ``webhooks.resend_webhookdelivery`` only (other staff see no action,
and a forged POST does nothing), shows what it will do first, asks for a
reason, then calls :func:`webhooks.services.webhook_resend` per delivery and
writes the admin log.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Count
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from common.time import format_utc_seconds
from config.admin import ReadOnlyAdminMixin, ReasonForm

from .errors import WebhookNotFound, WebhookResendRefused
from .models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from .selectors import endpoint_list
from .services import webhook_resend

# A resend is one POST each: more than this at once is a job for a script.
RESEND_MAX_DELIVERIES = 100


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "url", "event_types", "enabled", "deliveries", "description",
                    "updated"]
    list_filter = ["enabled"]
    search_fields = ["url", "description"]
    # The secret is never among them.
    fields = ["id", "url", "event_types", "enabled", "description", "deliveries",
              "secret_note", "created", "updated"]
    readonly_fields = fields

    def get_queryset(self, request):
        return endpoint_list()

    @admin.display(description="events")
    def event_types(self, obj):
        return ", ".join(obj.events)

    @admin.display(description="deliveries")
    def deliveries(self, obj):
        return (f"{obj.delivered_count} delivered · {obj.pending_count} pending · "
                f"{obj.failed_count} failed")

    @admin.display(description="secret")
    def secret_note(self, obj):
        return ("Shown once, when the endpoint was created or its secret rotated. To hand it "
                "over again, rotate it: POST /api/webhook-endpoints/{id}/rotate-secret/ "
                "(the old one stops working at once).")

    @admin.display(description="created", ordering="created_at")
    def created(self, obj):
        return format_utc_seconds(obj.created_at)

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj):
        return format_utc_seconds(obj.updated_at)


class WebhookAttemptInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = WebhookAttempt
    fields = ["number", "when", "resend", "status_code", "latency_ms", "error",
              "response_excerpt"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ["number"]

    def has_view_permission(self, request, obj=None):
        # The attempts are the delivery's log: whoever may read the delivery
        # reads them (they have no page of their own).
        return request.user.has_perm("webhooks.view_webhookdelivery")

    @admin.display(description="at")
    def when(self, obj):
        return format_utc_seconds(obj.at)


class ResendReasonForm(ReasonForm):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["reason"].help_text = "Required. Lands in the admin log and the log line."


@dataclass(frozen=True)
class ResendLine:
    delivery: WebhookDelivery
    refused: str = ""  # why it cannot be resent now
    attempt: int = 0  # the attempt it will be (the dry run) or was armed as


def _resend_plan(deliveries: list[WebhookDelivery]) -> list[ResendLine]:
    lines = []
    for d in deliveries:
        if d.status == DeliveryStatus.PENDING:
            due = format_utc_seconds(d.next_attempt_at)
            lines.append(ResendLine(d, refused=f"attempt {d.armed_attempt} is already owed "
                                               f"(due {due})"))
        elif not d.endpoint.enabled:
            lines.append(ResendLine(d, refused="the endpoint is disabled"))
        else:
            lines.append(ResendLine(d, attempt=d.armed_attempt + 1))
    return lines


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "event_type", "status", "endpoint", "saga_id", "message_id",
                    "attempt_count", "created", "settled"]
    list_filter = ["status", "event_type"]
    list_select_related = ["endpoint"]
    search_fields = ["message_id"]  # see get_search_results
    search_help_text = "Saga id, webhook-id (msg_…) or delivery id (exact)."
    show_full_result_count = False
    actions = ["resend"]
    fields = ["id", "message_id", "event_type", "status", "endpoint", "saga_link",
              "event_id", "created", "settled", "next_attempt", "armed_attempt", "body_json"]
    readonly_fields = fields
    inlines = [WebhookAttemptInline]

    def has_resend_permission(self, request):
        return request.user.has_perm("webhooks.resend_webhookdelivery")

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(attempts_made=Count("attempts"))

    # --- columns ------------------------------------------------------------------

    @admin.display(description="attempts", ordering="attempts_made")
    def attempt_count(self, obj):
        return obj.attempts_made

    @admin.display(description="created", ordering="created_at")
    def created(self, obj):
        return format_utc_seconds(obj.created_at)

    @admin.display(description="delivered / failed")
    def settled(self, obj):
        if obj.status == DeliveryStatus.DELIVERED:
            return f"delivered {format_utc_seconds(obj.delivered_at)}"
        if obj.status == DeliveryStatus.FAILED:
            return f"failed {format_utc_seconds(obj.failed_at)}"
        return "-"

    @admin.display(description="next attempt")
    def next_attempt(self, obj):
        if obj.status != DeliveryStatus.PENDING:
            return "none owed"
        return f"attempt {obj.armed_attempt}, due {format_utc_seconds(obj.next_attempt_at)}"

    @admin.display(description="saga")
    def saga_link(self, obj):
        # By the URL's name: the webhooks app imports nothing of the saga's.
        url = reverse("admin:purchases_purchasesaga_change", args=[obj.saga_id])
        return format_html('<a href="{}">{}</a>', url, obj.saga_id)

    @admin.display(description="body (as signed and sent)")
    def body_json(self, obj):
        return format_html("<pre style=\"white-space: pre-wrap\">{}</pre>", obj.body)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(saga_id=uuid.UUID(term)), False
        except ValueError:
            pass
        if term.isdigit():
            return queryset.filter(pk=int(term)), False
        return queryset.filter(message_id=term), False

    # --- the resend action ----------------------------------------------------------

    @admin.action(permissions=["resend"], description="Resend (same webhook-id; dry run first)")
    def resend(self, request, queryset):
        """First POST: what each resend will do, and a reason form.
        Confirmed POST with a reason: resend, write the admin log."""
        deliveries = list(queryset.select_related("endpoint").order_by("pk")
                          [:RESEND_MAX_DELIVERIES + 1])
        if len(deliveries) > RESEND_MAX_DELIVERIES:
            self.message_user(request, f"More than {RESEND_MAX_DELIVERIES} deliveries "
                              "selected. Nothing was resent.", messages.ERROR)
            return None
        form = ResendReasonForm(request.POST if request.POST.get("confirm") else None)
        if form.is_bound and form.is_valid():
            return self._resend(request, deliveries, form.cleaned_data["reason"])
        lines = _resend_plan(deliveries)
        context = {
            **self.admin_site.each_context(request),
            "title": "Resend: dry run",
            "opts": self.model._meta,
            "lines": lines,
            "allowed": [line for line in lines if not line.refused],
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/webhooks/webhookdelivery/resend_confirm.html",
                                context)

    def _resend(self, request, deliveries, reason):
        done = 0
        for delivery in deliveries:
            try:
                attempt = webhook_resend(delivery.pk, by=request.user.username, reason=reason)
            except (WebhookResendRefused, WebhookNotFound) as exc:
                self.message_user(request, f"Delivery {delivery.pk} not resent: {exc}",
                                  messages.WARNING)
                continue
            done += 1
            self.log_change(request, delivery,
                            f'Resend: attempt {attempt} armed; reason: "{reason}"')
        self.message_user(request, f"Resent {done} deliver{'y' if done == 1 else 'ies'}: the "
                          "relay hands the attempts over now.",
                          messages.SUCCESS if done else messages.WARNING)
        return None
