"""Webhooks in the admin: endpoints, managed through the services, and
deliveries, read-only with one action, Resend (docs/operations.md, "Admin").

Endpoints are added, changed, re-keyed and deleted here as through the staff
API (``/api/webhook-endpoints/``): every write is a call of
``webhook_endpoint_create`` / ``_update`` / ``_rotate_secret`` / ``_delete``,
never ``Model.save``, and lands in the admin log. The services check the URL
(resolving its host) and own their transactions (``atomic(durable=True)``),
so these views do not run in the atomic block Django's admin opens around a
POST: no network I/O inside a transaction, and no nesting (docs/design.md,
"House rules"). A :class:`WebhookInvalid` becomes the form's error on the
field it names. The secret is shown once, on the page that answers the
creation or the rotation ("Rotate secret…", POST only, change permission),
and never on the endpoint's page. That page also lists the endpoint's latest
deliveries with their attempts, like the saga's page (one include,
``admin/webhooks/webhookdelivery/deliveries_table.html``).

A delivery's page shows its attempts (the delivery log). "Resend", for staff
holding ``webhooks.resend_webhookdelivery`` only (other staff see no action,
and a forged POST does nothing), shows what it will do first, asks for a
reason, then calls :func:`webhooks.services.webhook_resend` per delivery and
writes the admin log.

Both lists name the organizer (the endpoint's; "(platform-wide)" for an
endpoint of none, sent every organizer's events) and filter by it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.views.decorators.csrf import csrf_protect

from common.time import format_utc_seconds
from config.admin import ReadOnlyAdminMixin, ReasonForm, exact_search

from .errors import WebhookInvalid, WebhookNotFound, WebhookResendRefused
from .models import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from .selectors import endpoint_deliveries, endpoint_list
from .services import (
    webhook_endpoint_create,
    webhook_endpoint_delete,
    webhook_endpoint_rotate_secret,
    webhook_endpoint_update,
    webhook_resend,
)

# Where a new secret waits for the one page that shows it (_show_once).
_SECRET_SESSION_KEY = "webhooks:secret-shown-once"

# A resend is one POST each: more than this at once is a job for a script.
RESEND_MAX_DELIVERIES = 100
# The endpoint's page shows its latest deliveries; the rest are a link away.
ENDPOINT_PAGE_DELIVERIES = 20

csrf_protect_m = method_decorator(csrf_protect)

# An endpoint of no organizer, in the lists and their organizer filter.
PLATFORM_WIDE = "(platform-wide)"


class OrganizerFilter(admin.RelatedFieldListFilter):
    """The organizer filter, which names its "empty" choice: the platform-wide
    endpoints (and their deliveries)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.empty_value_display = format_html("{}", PLATFORM_WIDE)


class EndpointForm(forms.ModelForm):
    """An endpoint's add and change form, saved through the services.

    Its validation ends with the service call, in place of the model's own
    validation and ``save``: the service is what checks the URL (it resolves
    the host, so it must run outside a transaction) and it writes in the same
    call, so its :class:`WebhookInvalid` can only become a form error if the
    form is still being validated. Once valid, ``instance`` is the endpoint
    as the service left it (with ``secret`` after a creation) and the admin
    saves nothing itself (``WebhookEndpointAdmin.save_model``)."""

    events = forms.MultipleChoiceField(
        label="Events",
        choices=[(e.value, f"{e.value}: {e.label}") for e in WebhookEvent],
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": "Choose at least one event type."},
        help_text="Each is sent at most once per purchase.",
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["organizer", "url", "events", "description", "enabled"]
        widgets = {"url": forms.TextInput(attrs={"size": 80})}
        help_texts = {
            "url": "https:// and public addresses only (unless WEBHOOK_ALLOW_LOCAL_URLS): "
            "checked now, and again before each attempt.",
            "enabled": "A disabled endpoint is sent nothing new; an attempt that comes due "
            "meanwhile fails without sending.",
            "organizer": "Sent this organizer's events only; none: a platform-wide endpoint, "
            "sent every event's. It cannot change later.",
        }

    def _post_clean(self):
        if self.errors:  # as full_clean left them (it runs this last)
            return
        data = self.cleaned_data
        try:
            if self.instance.pk is None:
                self.instance = webhook_endpoint_create(
                    url=data["url"],
                    events=data["events"],
                    description=data["description"],
                    organizer=data.get("organizer"),
                )
            elif self.changed_data:
                self.instance = webhook_endpoint_update(
                    endpoint_id=self.instance.pk, **{name: data[name] for name in self.changed_data}
                )
        except WebhookInvalid as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
        except WebhookNotFound:
            self.add_error(None, "This endpoint was deleted meanwhile.")


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    # Not ReadOnlyAdminMixin: an endpoint is configuration, not money or
    # inventory, and every write goes through its service (see EndpointForm).
    # The permissions are Django's own: add, change (and rotate), delete.
    form = EndpointForm
    list_display = [
        "id",
        "url",
        "organizer",
        "event_types",
        "enabled",
        "deliveries",
        "description",
        "updated",
    ]
    list_filter = ["enabled", ("organizer", OrganizerFilter)]
    search_fields = ["url", "description"]
    # The secret is never among them.
    readonly_fields = ["id", "deliveries", "secret_note", "created", "updated"]

    def get_queryset(self, request):
        return endpoint_list().select_related("organizer")

    def get_readonly_fields(self, request, obj=None):
        # An endpoint's organizer is chosen when it is added, never changed.
        return [*self.readonly_fields, *(["organizer"] if obj is not None else [])]

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["organizer", "url", "events", "description"]  # a new endpoint is enabled
        return [
            "id",
            "organizer",
            "url",
            "events",
            "enabled",
            "description",
            "deliveries",
            "secret_note",
            "created",
            "updated",
        ]

    def get_urls(self):
        rotate = path(
            "<path:object_id>/rotate-secret/",
            self.admin_site.admin_view(self.rotate_secret_view),
            name=f"{self.opts.app_label}_{self.opts.model_name}_rotate_secret",
        )
        shown = path(
            "<path:object_id>/secret/",
            self.admin_site.admin_view(self.secret_view),
            name=f"{self.opts.app_label}_{self.opts.model_name}_secret",
        )
        return [rotate, shown, *super().get_urls()]

    # --- columns ------------------------------------------------------------------

    @admin.display(description="events")
    def event_types(self, obj):
        return ", ".join(obj.events)

    @admin.display(description="deliveries")
    def deliveries(self, obj):
        return (
            f"{obj.delivered_count} delivered · {obj.pending_count} pending · "
            f"{obj.failed_count} failed"
        )

    @admin.display(description="secret")
    def secret_note(self, obj):
        return (
            "Shown once, when the endpoint was created or its secret rotated. To hand it "
            "over again, rotate it: the old one stops working at once."
        )

    @admin.display(description="created", ordering="created_at")
    def created(self, obj):
        return format_utc_seconds(obj.created_at)

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj):
        return format_utc_seconds(obj.updated_at)

    # --- add and change: through the services, outside any transaction -------------

    @csrf_protect_m
    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # Django runs a POST's _changeform_view inside transaction.atomic; the
        # services open their own, durable, and resolve the URL's host first.
        return self._changeform_view(  # type: ignore[attr-defined]  # Django's; not in the stubs
            request, object_id, form_url, extra_context
        )

    def change_view(self, request, object_id, form_url="", extra_context=None):
        latest = None  # no section: the deliveries are not this user's to read
        if request.user.has_perm("webhooks.view_webhookdelivery"):
            try:
                endpoint_id = int(unquote(object_id))
            except ValueError:
                endpoint_id = None  # the admin answers "no such endpoint"
            latest = (
                []
                if endpoint_id is None
                else list(endpoint_deliveries(endpoint_id=endpoint_id)[:ENDPOINT_PAGE_DELIVERIES])
            )
        extra_context = {
            **(extra_context or {}),
            "deliveries": latest,
            "deliveries_shown": ENDPOINT_PAGE_DELIVERIES,
        }
        return super().change_view(request, object_id, form_url, extra_context)

    def save_model(self, request, obj, form, change):
        pass  # saved by its service while the form was validated (EndpointForm)

    def response_add(self, request, obj, post_url_continue=None):
        return self._show_once(
            request, obj, secret=obj.secret, done="The endpoint was added, enabled."
        )

    # --- the secret: shown once ------------------------------------------------------

    def rotate_secret_view(self, request, object_id):
        """GET: what rotating does, and the button. POST: rotate, write the
        admin log, show the new secret (the only time it is shown)."""
        if request.method not in ("GET", "HEAD", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        endpoint = self.get_object(request, unquote(object_id))
        if not self.has_change_permission(request, endpoint):
            raise PermissionDenied
        if endpoint is None:
            raise Http404("No such webhook endpoint.")
        if request.method != "POST":
            return self._secret_page(request, endpoint)
        try:
            secret = webhook_endpoint_rotate_secret(endpoint_id=endpoint.pk)
        except WebhookNotFound as exc:
            raise Http404("No such webhook endpoint.") from exc
        self.log_change(request, endpoint, "Rotated the secret (the old one stopped working).")
        return self._show_once(
            request,
            endpoint,
            secret=secret,
            done="The secret was rotated: the old one no longer signs "
            "anything, retries of older deliveries included.",
        )

    def _show_once(self, request, endpoint, *, secret: str, done: str):
        """Post/redirect/get: the secret waits in the session for the one GET
        that shows it, so a reload neither repeats the POST (a second
        endpoint, another rotation) nor shows the secret again."""
        request.session[_SECRET_SESSION_KEY] = {
            "endpoint": endpoint.pk,
            "secret": secret,
            "done": done,
        }
        url = reverse(
            f"admin:{self.opts.app_label}_{self.opts.model_name}_secret", args=[endpoint.pk]
        )
        return HttpResponseRedirect(url, status=303)

    def secret_view(self, request, object_id):
        endpoint = self.get_object(request, unquote(object_id))
        if endpoint is None:
            raise Http404("No such webhook endpoint.")
        if not self.has_view_permission(request, endpoint):
            raise PermissionDenied
        waiting = request.session.pop(_SECRET_SESSION_KEY, None)
        if not waiting or waiting.get("endpoint") != endpoint.pk:
            if waiting:
                request.session[_SECRET_SESSION_KEY] = waiting  # another endpoint's
            return self._secret_page(request, endpoint)
        return self._secret_page(request, endpoint, secret=waiting["secret"], done=waiting["done"])

    def _change_url(self, endpoint) -> str:
        return reverse(
            f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=[endpoint.pk]
        )

    def _secret_page(self, request, endpoint, *, secret="", done=""):
        context = {
            **self.admin_site.each_context(request),
            "title": "Signing secret" if secret else "Rotate the signing secret",
            "opts": self.opts,
            "endpoint": endpoint,
            "endpoint_url": self._change_url(endpoint),
            "secret": secret,
            "done": done,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/webhooks/webhookendpoint/secret.html", context)

    # --- delete: through the service, outside any transaction ------------------------

    @csrf_protect_m
    def delete_view(self, request, object_id, extra_context=None):
        # As changeform_view: no atomic block of Django's around the service's.
        return self._delete_view(  # type: ignore[attr-defined]  # Django's; not in the stubs
            request, object_id, extra_context
        )

    def delete_model(self, request, obj):
        webhook_endpoint_delete(endpoint_id=obj.pk)

    def delete_queryset(self, request, queryset):
        for endpoint_id in queryset.values_list("pk", flat=True):
            try:
                webhook_endpoint_delete(endpoint_id=endpoint_id)
            except WebhookNotFound:
                pass  # deleted meanwhile: what was asked

    def get_deleted_objects(self, objs, request):
        """What a delete takes with it, counted rather than listed (an
        endpoint may have many thousand deliveries). Its deliveries and their
        attempts go with it in the service's commit: deleting them needs no
        permission of their own (their admin is read-only)."""
        endpoints = list(objs)
        lines, total = [], 0
        for endpoint in endpoints:
            count = endpoint.delivered_count + endpoint.pending_count + endpoint.failed_count
            total += count
            lines += [
                format_html(
                    'Webhook endpoint: <a href="{}">{}</a>',
                    self._change_url(endpoint),
                    endpoint.url,
                ),
                [f"{count} deliver{'y' if count == 1 else 'ies'}, with their attempts"],
            ]
        model_count = {
            WebhookEndpoint._meta.verbose_name_plural: len(endpoints),
            WebhookDelivery._meta.verbose_name_plural: total,
        }
        return lines, model_count, set(), []


class WebhookAttemptInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = WebhookAttempt
    fields = ("number", "when", "resend", "status_code", "latency_ms", "error", "response_excerpt")
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
            lines.append(
                ResendLine(d, refused=f"attempt {d.armed_attempt} is already owed (due {due})")
            )
        elif not d.endpoint.enabled:
            lines.append(ResendLine(d, refused="the endpoint is disabled"))
        else:
            lines.append(ResendLine(d, attempt=d.armed_attempt + 1))
    return lines


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "id",
        "event_type",
        "status",
        "organizer",
        "endpoint",
        "saga_id",
        "message_id",
        "attempt_count",
        "created",
        "settled",
    ]
    list_filter = ["status", "event_type", ("endpoint__organizer", OrganizerFilter)]
    list_select_related = ["endpoint__organizer"]
    search_fields = ["message_id"]  # see get_search_results
    search_help_text = "Saga id, webhook-id (msg_…) or delivery id (exact)."
    show_full_result_count = False
    actions = ["resend"]
    fields = (
        "id",
        "message_id",
        "event_type",
        "status",
        "endpoint",
        "saga_link",
        "event_id",
        "created",
        "settled",
        "next_attempt",
        "armed_attempt",
        "body_json",
    )
    readonly_fields = fields
    inlines = [WebhookAttemptInline]

    def has_resend_permission(self, request):
        return request.user.has_perm("webhooks.resend_webhookdelivery")

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(attempts_made=Count("attempts"))

    # --- columns ------------------------------------------------------------------

    @admin.display(description="organizer", ordering="endpoint__organizer__slug")
    def organizer(self, obj):
        # The endpoint's: a delivery goes to one organizer's endpoint, or to a
        # platform-wide one (sent every organizer's events).
        return obj.endpoint.organizer or PLATFORM_WIDE

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
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', obj.body)

    def get_search_results(self, request, queryset, search_term):
        return exact_search(queryset, search_term, field="message_id")

    # --- the resend action ----------------------------------------------------------

    @admin.action(permissions=["resend"], description="Resend (same webhook-id; dry run first)")
    def resend(self, request, queryset):
        """First POST: what each resend will do, and a reason form.
        Confirmed POST with a reason: resend, write the admin log."""
        deliveries = list(
            queryset.select_related("endpoint").order_by("pk")[: RESEND_MAX_DELIVERIES + 1]
        )
        if len(deliveries) > RESEND_MAX_DELIVERIES:
            self.message_user(
                request,
                f"More than {RESEND_MAX_DELIVERIES} deliveries selected. Nothing was resent.",
                messages.ERROR,
            )
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
        return TemplateResponse(
            request, "admin/webhooks/webhookdelivery/resend_confirm.html", context
        )

    def _resend(self, request, deliveries, reason):
        done = 0
        for delivery in deliveries:
            try:
                attempt = webhook_resend(delivery.pk, by=request.user.username, reason=reason)
            except (WebhookResendRefused, WebhookNotFound) as exc:
                self.message_user(
                    request, f"Delivery {delivery.pk} not resent: {exc}", messages.WARNING
                )
                continue
            done += 1
            self.log_change(
                request, delivery, f'Resend: attempt {attempt} armed; reason: "{reason}"'
            )
        self.message_user(
            request,
            f"Resent {done} deliver{'y' if done == 1 else 'ies'}: the "
            "relay hands the attempts over now.",
            messages.SUCCESS if done else messages.WARNING,
        )
        return None
