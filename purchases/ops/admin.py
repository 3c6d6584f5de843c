"""The operators' admin: the saga list, the saga's timeline, the runbook.

What the operator on call reads at 3 a.m. Nobody edits a saga here: every
field is read-only and state moves only through the services. The runbook
actions are thin callers of :mod:`purchases.runbook` (dry run with
``action_plan``, then ``action_run`` with the operator's name and reason), and
each run lands in the admin log. The gateway is asked only when the operator
asks for it (``?gateway=1`` on the saga page), outside any transaction.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.db.models import Prefetch, Q, QuerySet
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.timesince import timesince

from common.money import format_money
from config.admin import ReadOnlyAdminMixin, ReasonForm
from ledger.models import LedgerEntry
from outbox.models import OutboxMessage
from payments.interface import GatewayUnavailable
from payments.registry import get_gateway

from ..errors import DomainError, IllegalTransition
from ..models import (
    Event,
    GatewayAnswer,
    PurchaseSaga,
    Reservation,
    ReservationSeat,
    SagaHistory,
    Seat,
)
from ..saga.states import SagaState
from .runbook import LABELS, Action, ActionRefused, action_plan, action_run, actions_for

logger = logging.getLogger(__name__)

# A dry run costs a few queries per saga; a bulk action over more than this is
# almost certainly a "select all" by mistake.
RUNBOOK_MAX_SAGAS = 200

# What the operator is expected to do with a saga that waits for one.
_GUIDANCE = {
    SagaState.UNKNOWN_EXPIRED: (
        "The charge outcome is unknown and reconciliation is exhausted. Check the gateway "
        "(live view below): if charged, confirm after manual check; if not, compensate "
        "after manual check and write it up."
    ),
    SagaState.COMPENSATION_PENDING: (
        "A refund was not confirmed by the gateway and is being retried. Check the gateway: "
        "if the refund is there, confirm after manual check; otherwise compensate (retry "
        "the refund) after manual check."
    ),
}

# --- private selectors (reads only) ---------------------------------------------


def _sagas_with_seats(qs: QuerySet[PurchaseSaga]) -> QuerySet[PurchaseSaga]:
    # ``links`` is what selectors.saga_seat_refs reads, so action_plan does
    # not query the seats once per saga.
    return qs.select_related("reservation", "event", "buyer").prefetch_related(
        Prefetch(
            "reservation__seat_links",
            queryset=ReservationSeat.objects.select_related("seat").order_by("id"),
            to_attr="links",
        )
    )


@dataclass
class _OutboxRow:
    message: OutboxMessage
    kind: str  # "timer" | "event"
    status: str
    payload: str


def _outbox_status(message: OutboxMessage, now) -> str:
    if message.cancelled_at:
        return "cancelled"
    if message.completed_at:
        return "completed"
    if message.dead_at:
        return f"dead letter: {message.last_error}" if message.last_error else "dead letter"
    if message.fired_at:
        return "fired, not completed yet"
    if message.available_at > now:
        return "armed"
    return "due, waiting for the relay"


def _saga_timeline(saga: PurchaseSaga) -> dict:
    now = timezone.now()
    outbox = [
        _OutboxRow(
            message=m,
            kind="timer" if m.available_at > m.created_at else "event",
            status=_outbox_status(m, now),
            payload=json.dumps(m.payload, sort_keys=True, default=str),
        )
        for m in OutboxMessage.objects.filter(saga_id=saga.pk).order_by("created_at", "id")
    ]
    ledger = list(LedgerEntry.objects.filter(saga_id=saga.pk).order_by("created_at", "id"))
    ledger_net = sum(e.amount for e in ledger)
    return {
        "history": list(SagaHistory.objects.filter(saga=saga).order_by("at", "id")),
        "gateway_answers": list(GatewayAnswer.objects.filter(saga=saga).order_by("at", "id")),
        "outbox": outbox,
        "ledger": [(e, format_money(e.amount, e.currency)) for e in ledger],
        "ledger_net": ledger_net,
        "ledger_net_display": format_money(ledger_net, saga.currency),
        "reservation": saga.reservation,
        "reservation_total": format_money(saga.reservation.total_amount, saga.reservation.currency),
        "seat_links": list(
            ReservationSeat.objects.filter(reservation_id=saga.reservation_id)
            .select_related("seat")
            .order_by("seat__row", "seat__number", "id")
        ),
    }


def _gateway_view(saga: PurchaseSaga, *, ledger_net: int) -> dict:
    """The gateway's view of the intent, asked live. Call outside any
    transaction (the adapters assert it): this is network I/O."""
    gateway = get_gateway()
    view: dict = {"fetched_at": timezone.now(), "intent_id": saga.intent_id}
    try:
        lookup = gateway.retrieve(saga.intent_id)
    except Exception as exc:  # the page must render whatever the gateway does
        logger.exception("admin gateway look-up failed", extra={"saga_id": str(saga.pk)})
        view["error"] = f"look-up failed: {type(exc).__name__}: {exc}"
    else:
        view.update(status=lookup.status.value, detail=lookup.detail,
                    latency_ms=round(lookup.latency_ms, 1), raw=lookup.raw)
    try:
        charges = gateway.list_charges(saga.intent_id)
    except GatewayUnavailable as exc:
        view["charges_error"] = str(exc)
    except Exception as exc:
        logger.exception("admin gateway charge list failed", extra={"saga_id": str(saga.pk)})
        view["charges_error"] = f"{type(exc).__name__}: {exc}"
    else:
        captured = sum(c.amount for c in charges if c.status == "succeeded")
        view.update(
            charges=[(c, format_money(c.amount, saga.currency)) for c in charges],
            captured=format_money(captured, saga.currency),
            agrees_with_ledger=captured == ledger_net,
        )
    return view


# --- list filters -----------------------------------------------------------------


class AgeFilter(admin.SimpleListFilter):
    """Age of the saga (since ``created_at``), in buckets an operator thinks in."""

    title = "age"
    parameter_name = "age"
    # value -> (label, youngest, oldest): age in [youngest, oldest)
    BUCKETS = {
        "lt5m": ("< 5 min", None, timedelta(minutes=5)),
        "5m-1h": ("5 min – 1 h", timedelta(minutes=5), timedelta(hours=1)),
        "1h-1d": ("1 h – 1 day", timedelta(hours=1), timedelta(days=1)),
        "gt1d": ("> 1 day", timedelta(days=1), None),
    }

    def lookups(self, request, model_admin):
        return [(value, label) for value, (label, _, _) in self.BUCKETS.items()]

    def queryset(self, request, queryset):
        bucket = self.BUCKETS.get(self.value())
        if bucket is None:
            return queryset
        _, youngest, oldest = bucket
        now = timezone.now()
        if youngest is not None:
            queryset = queryset.filter(created_at__lte=now - youngest)
        if oldest is not None:
            queryset = queryset.filter(created_at__gt=now - oldest)
        return queryset


# --- runbook forms ------------------------------------------------------------------


class RunbookReasonForm(ReasonForm):
    override = forms.BooleanField(
        required=False,
        label="Override",
        help_text="Only for a manual confirmation while the gateway cannot be reached: write "
        "the money on my word. The ledger entry and the history are marked, and the auditor "
        "reports it until the gateway's records agree. It never overrules a gateway that "
        "answers and disagrees.",
    )


@dataclass
class _ResultRow:
    saga: PurchaseSaga
    before: str
    after: str
    outcome: str  # "done" | "refused" | "failed"
    message: str


def _runbook_action(action: Action):
    """One admin action per runbook action (the admin needs distinct names)."""

    def run(modeladmin, request, queryset):
        return modeladmin.runbook(request, queryset, action)

    run.__name__ = action.value
    run.__qualname__ = f"runbook_{action.value}"
    return admin.action(permissions=["run_saga_runbook"], description=LABELS[action])(run)


# --- the saga admin -----------------------------------------------------------------


@admin.register(PurchaseSaga)
class PurchaseSagaAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "state", "age", "event", "buyer", "total", "attempts", "updated_at"]
    list_filter = ["state", AgeFilter, "event"]
    # The pk is a UUID: matched exactly in get_search_results, not with icontains.
    search_fields = ["intent_id", "reservation__ref", "buyer__username"]
    search_help_text = "Saga id (exact), intent id, reservation ref or buyer username."
    list_select_related = ["event", "buyer", "reservation"]
    show_full_result_count = False  # no count(*) over every saga on each page
    actions = [_runbook_action(a) for a in Action]
    fields = ["id", "state", "version", "attempts", "event", "buyer", "reservation",
              "intent_id", "payment_method", "total", "created_at", "updated_at"]
    readonly_fields = fields

    # Read-only (ReadOnlyAdminMixin): viewing needs the view permission;
    # nobody adds, changes or deletes a saga by hand.

    def has_run_saga_runbook_permission(self, request):
        return request.user.has_perm("purchases.run_saga_runbook")

    # --- list ---------------------------------------------------------------------

    @admin.display(description="age", ordering="-created_at")  # ascending age: newest first
    def age(self, obj):
        return timesince(obj.created_at, timezone.now(), depth=1)

    @admin.display(description="total", ordering="amount")
    def total(self, obj):
        return format_money(obj.amount, obj.currency)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        try:
            saga_id = uuid.UUID(term)
        except ValueError:
            saga_id = None
        if saga_id is None:
            return super().get_search_results(request, queryset, search_term)
        # A UUID is a saga id (icontains on a uuid column casts every row to
        # text); keep the text fields too, should a username look like one.
        matches, _ = super().get_search_results(request, queryset, term)
        return queryset.filter(Q(pk=saga_id) | Q(pk__in=matches.values("pk"))), False

    # --- the saga page ------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = dict(extra_context or {})
        saga = self.get_object(request, unquote(object_id))
        if saga is not None and self.has_view_or_change_permission(request, saga):
            timeline = _saga_timeline(saga)
            extra_context.update(timeline)
            extra_context["guidance"] = _GUIDANCE.get(SagaState(saga.state), "")
            extra_context["gateway_requested"] = request.GET.get("gateway") == "1"
            if request.method == "GET" and extra_context["gateway_requested"]:
                # Before the admin's view opens anything: no transaction here
                # (ATOMIC_REQUESTS is off), and the adapter checks it.
                extra_context["gateway_view"] = _gateway_view(
                    saga, ledger_net=timeline["ledger_net"]
                )
            if self.has_run_saga_runbook_permission(request):
                extra_context["runbook_actions"] = [
                    (a.value, LABELS[a]) for a in actions_for(saga.state)
                ]
                extra_context["action_checkbox_name"] = helpers.ACTION_CHECKBOX_NAME
        return super().change_view(request, object_id, form_url, extra_context)

    # --- runbook actions ----------------------------------------------------------

    def runbook(self, request, queryset, action: Action):
        """First POST: the dry run and a reason form. Confirmed POST with a
        reason: run each allowed saga, one at a time, and report each."""
        selected = queryset.count()
        if selected > RUNBOOK_MAX_SAGAS:
            self.message_user(
                request,
                f"{selected} sagas selected: a runbook action takes at most "
                f"{RUNBOOK_MAX_SAGAS} at a time. Nothing was run.",
                messages.ERROR,
            )
            return None
        sagas = list(_sagas_with_seats(queryset).order_by("created_at", "pk"))
        confirmed = bool(request.POST.get("confirm") or request.POST.get("post"))
        form = RunbookReasonForm(request.POST if confirmed else None)
        if confirmed and form.is_valid():
            return self._runbook_run(request, sagas, action, form.cleaned_data["reason"],
                                     override=form.cleaned_data["override"])
        return self._runbook_confirm(request, sagas, action, form)

    def _runbook_confirm(self, request, sagas, action, form):
        rows = [(saga, action_plan(saga=saga, action=action)) for saga in sagas]
        allowed = sum(1 for _, plan in rows if plan.allowed)
        context = {
            **self.admin_site.each_context(request),
            "title": f"{LABELS[action]}: dry run",
            "opts": self.model._meta,
            "action": action.value,
            "label": LABELS[action],
            "rows": rows,
            "allowed_count": allowed,
            "refused_count": len(rows) - allowed,
            "override_needed": any(plan.override_needed for _, plan in rows),
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/purchases/purchasesaga/runbook_confirm.html", context
        )

    def _runbook_run(self, request, sagas, action, reason, *, override=False):
        operator = request.user.username
        results = []
        for saga in sagas:
            results.append(self._runbook_run_one(request, saga, action, operator, reason,
                                                 override=override))
        counts = {k: sum(1 for r in results if r.outcome == k)
                  for k in ("done", "refused", "failed")}
        self.message_user(
            request,
            f"{LABELS[action]}: {counts['done']} done, {counts['refused']} refused, "
            f"{counts['failed']} failed.",
            messages.SUCCESS if counts["done"] and not counts["failed"] else messages.WARNING,
        )
        context = {
            **self.admin_site.each_context(request),
            "title": f"{LABELS[action]}: results",
            "opts": self.model._meta,
            "label": LABELS[action],
            "reason": reason,
            "results": results,
            "counts": counts,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/purchases/purchasesaga/runbook_result.html", context
        )

    def _runbook_run_one(self, request, saga, action, operator, reason, *,
                         override=False) -> _ResultRow:
        before = saga.state
        # The operator confirmed what the dry run showed at this version; a
        # saga that moved since is looked at again, not acted on blind.
        seen = request.POST.get(f"version_{saga.pk}")
        if seen and seen != str(saga.version):
            return _ResultRow(saga, before, before, "refused",
                              f"moved on since the dry run (v{seen} → v{saga.version}, now "
                              f"{before}): look again")
        # The table's verdict only: the gateway is asked by the action itself,
        # after the operator's note is on the record.
        plan = action_plan(saga=saga, action=action, ask_gateway=False)
        if not plan.allowed:
            return _ResultRow(saga, before, before, "refused", plan.why)
        extra = {"saga_id": str(saga.pk), "runbook_action": action.value, "operator": operator,
                 "override": override}
        try:
            action_run(saga_id=saga.pk, action=action, operator=operator, reason=reason,
                       override=override)
        except (ActionRefused, IllegalTransition) as exc:
            outcome, message = "refused", str(exc)
        except DomainError as exc:
            outcome, message = "failed", f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # one saga's failure must not stop the others
            logger.exception("runbook action failed", extra=extra)
            outcome, message = "failed", f"{type(exc).__name__}: {exc}"
        else:
            outcome, message = "done", ""
        fresh = PurchaseSaga.objects.get(pk=saga.pk)
        if outcome == "done":
            message = (f"{before} → {fresh.state}" if fresh.state != before
                       else f"still {fresh.state}")
        logger.log(logging.INFO if outcome == "done" else logging.WARNING,
                   "runbook action %s: %s", action.value, outcome,
                   extra={**extra, "outcome": outcome, "state": fresh.state})
        self.log_change(
            request, fresh,
            f'Runbook "{LABELS[action]}" ({action.value}); reason: "{reason}"; '
            f"result: {outcome}: {message}",
        )
        return _ResultRow(saga, before, fresh.state, outcome, message)


# --- the catalogue ------------------------------------------------------------------


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "starts_at"]


@admin.register(Seat)
class SeatAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    # Read-only: prices and seat status change only through the services.
    list_display = ["ref", "event", "status", "price"]
    list_filter = ["event", "status"]
    fields = ["event", "ref", "row", "number", "price", "status"]
    readonly_fields = fields

    @admin.display(description="price", ordering="price_amount")
    def price(self, obj):
        return format_money(obj.price_amount, obj.currency)


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    # Read-only: a reservation moves only with its saga.
    list_display = ["ref", "event", "buyer", "status", "hold_expires_at", "total"]
    list_filter = ["status", "event"]
    search_fields = ["ref", "buyer__username"]
    fields = ["ref", "event", "buyer", "status", "hold_expires_at", "total", "created_at"]
    readonly_fields = fields

    @admin.display(description="total", ordering="total_amount")
    def total(self, obj):
        return format_money(obj.total_amount, obj.currency)
