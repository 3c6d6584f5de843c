"""The operators' admin: the saga list, the saga's timeline, the runbook.

What the operator on call reads at 3 a.m. The list says, per saga, how the
payment stands, whether it needs an operator and how long it has been in its
state; the saga page opens with its verdict (:mod:`purchases.ops.verdict`:
what happened, what is owed, what moves it next), then the evidence. Nobody
edits a saga here: every field is read-only and state moves only through the
services. The runbook actions are thin callers of :mod:`purchases.ops.runbook`
(dry run with ``action_plan``, then ``action_run`` with the operator's name
and reason), and each run lands in the admin log. The gateway is asked only
when the operator asks for it (``?gateway=1`` on the saga page), outside any
transaction.

Beside the sagas, the rows they live among: events (name and start time
editable; what the seller decides is shown, never edited here), their price
categories, seats, reservations, every saga's history and the daily sales,
all read-only. Each of these lists names the row's organizer and filters by
it, at no query per row (docs/operations.md, "Admin").
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.db.models import (
    BooleanField,
    Count,
    ExpressionWrapper,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
)
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince

from common.money import UnknownCurrency, format_money, minor_units_exponent
from common.time import format_utc_seconds
from config.admin import ReadOnlyAdminMixin, ReasonForm, exact_search
from ledger.models import LedgerEntry
from outbox.models import OutboxMessage
from payments.interface import GatewayUnavailable
from payments.registry import get_gateway
from webhooks.selectors import deliveries_for_saga

from ..admission import room_summary
from ..availability import availability_changed
from ..errors import DomainError, IllegalTransition
from ..models import (
    DailySales,
    Event,
    PriceCategory,
    PurchaseSaga,
    Reservation,
    ReservationSeat,
    SagaHistory,
    Seat,
)
from ..saga.states import SagaState
from ..selectors import ledger_sums, payment_status
from ..templatetags.saga_admin import saga_id
from .audit.money import charged, gateway_net
from .runbook import LABELS, Action, ActionRefused, action_plan, action_run, actions_for
from .verdict import (
    SagaFacts,
    needs_operator_condition,
    reservation_reading,
    saga_facts,
    seat_reading,
    verdict_from,
)

logger = logging.getLogger(__name__)

# A dry run costs a few queries per saga; a bulk action over more than this is
# almost certainly a "select all" by mistake.
RUNBOOK_MAX_SAGAS = 200

# A saga id as the list shows it (its first 8 characters), searched as a prefix.
_SHORT_ID = re.compile(r"[0-9a-f]{8}")

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
    # The payload's amount in its currency's decimals, when it carries one.
    amount: str = ""


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


def _payload_amount(payload: dict) -> str:
    amount, currency = payload.get("amount"), payload.get("currency")
    if isinstance(amount, int) and not isinstance(amount, bool) and isinstance(currency, str):
        return format_money(amount, currency)
    return ""


def _given_back(saga, links) -> int:
    """How many of a confirmed purchase's seats its refunds put back on sale."""
    if saga.state != "CONFIRMED":
        return 0
    return sum(1 for link in links if link.released_at)


def _saga_timeline(facts: SagaFacts) -> dict:
    saga, now = facts.saga, timezone.now()
    outbox = [
        _OutboxRow(
            message=m,
            kind="timer" if m.available_at > m.created_at else "event",
            status=_outbox_status(m, now),
            payload=json.dumps(m.payload, sort_keys=True, indent=2, default=str),
            amount=_payload_amount(m.payload),
        )
        for m in facts.outbox
    ]
    ledger_net = sum(e.amount for e in facts.ledger)
    return {
        "history": facts.history,
        "gateway_answers": facts.gateway_answers,
        "outbox": outbox,
        "ledger": [(e, format_money(e.amount, e.currency)) for e in facts.ledger],
        "ledger_net": ledger_net,
        "ledger_net_display": format_money(ledger_net, saga.currency),
        "reservation": saga.reservation,
        "reservation_reading": reservation_reading(
            saga.state,
            saga.reservation.status,
            given_back=_given_back(saga, facts.seat_links),
        ),
        "reservation_total": format_money(saga.reservation.total_amount, saga.reservation.currency),
        "seat_links": facts.seat_links,
        "seat_rows": [(link, seat_reading(link)) for link in facts.seat_links],
        # Outgoing webhooks announcing this saga's moves, with their attempts.
        "webhooks": deliveries_for_saga(saga_id=saga.pk),
    }


def _gateway_view(saga: PurchaseSaga, *, ledger_net: int) -> dict:
    """The gateway's view of the intent, asked live. Call outside any
    transaction (the adapters assert it): this is network I/O."""
    gateway = get_gateway()
    view: dict = {"fetched_at": timezone.now(), "intent_id": saga.intent_id}
    try:
        lookup = gateway.retrieve(saga.gateway_ref)
    except Exception as exc:  # the page must render whatever the gateway does
        logger.exception("admin gateway look-up failed", extra={"saga_id": str(saga.pk)})
        view["error"] = f"look-up failed: {type(exc).__name__}: {exc}"
    else:
        view.update(
            status=lookup.status.value,
            detail=lookup.detail,
            latency_ms=round(lookup.latency_ms, 1),
            raw=lookup.raw,
        )
    try:
        charges = gateway.list_charges(saga.gateway_ref)
    except GatewayUnavailable as exc:
        view["charges_error"] = str(exc)
    except Exception as exc:
        logger.exception("admin gateway charge list failed", extra={"saga_id": str(saga.pk)})
        view["charges_error"] = f"{type(exc).__name__}: {exc}"
    else:
        try:  # a charge partly refunded stays "succeeded": its refunds say what is kept
            refunds = gateway.list_refunds(saga.gateway_ref) if charged(charges) else []
        except GatewayUnavailable as exc:
            refunds, view["charges_error"] = [], f"list refunds: {exc}"
        captured = gateway_net(charges, refunds)
        view.update(
            charges=[(c, format_money(c.amount, saga.currency)) for c in charges],
            captured=format_money(captured, saga.currency),
            agrees_with_ledger=captured == ledger_net,
        )
    return view


# --- the organizer of every row ---------------------------------------------------

# Every list of an event's rows filters by the event's organizer (the seller
# whose sale it is): Django's related-field filter, titled "organizer".
ORGANIZER = "event__organizer"


class OrganizerColumn:
    """The "organizer" column of a list of an event's rows. The list's
    ``list_select_related`` names ``event__organizer``, so the column costs
    no query per row (tests/test_admin_organizers.py counts them)."""

    @admin.display(description="organizer", ordering="event__organizer__slug")
    def organizer(self, obj):
        return obj.event.organizer


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
        value = self.value()
        bucket = None if value is None else self.BUCKETS.get(value)
        if bucket is None:
            return queryset
        _, youngest, oldest = bucket
        now = timezone.now()
        if youngest is not None:
            queryset = queryset.filter(created_at__lte=now - youngest)
        if oldest is not None:
            queryset = queryset.filter(created_at__gt=now - oldest)
        return queryset


class NeedsOperatorFilter(admin.SimpleListFilter):
    """Sagas waiting for a person (``verdict.needs_operator_condition``)."""

    title = "needs an operator"
    parameter_name = "needs_operator"

    def lookups(self, request, model_admin):
        return [("yes", "yes"), ("no", "no")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(needs_operator_condition())
        if self.value() == "no":
            return queryset.exclude(needs_operator_condition())
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
    # The ledger entries the action wrote ("refund -25.00 EUR (refund:pi_…)").
    ledger: list[str] = field(default_factory=list)


def _runbook_action(action: Action):
    """One admin action per runbook action (the admin needs distinct names)."""

    def run(modeladmin, request, queryset):
        return modeladmin.runbook(request, queryset, action)

    run.__name__ = action.value
    run.__qualname__ = f"runbook_{action.value}"
    return admin.action(permissions=["run_saga_runbook"], description=LABELS[action])(run)


# --- the saga admin -----------------------------------------------------------------


@admin.register(PurchaseSaga)
class PurchaseSagaAdmin(ReadOnlyAdminMixin, OrganizerColumn, admin.ModelAdmin):
    # "age" stays the third column (after the checkbox): ``?o=3`` sorts by age.
    list_display = [
        "short_id",
        "state",
        "age",
        "in_state",
        "needs_operator",
        "payment_status",
        "payment_method",
        "total",
        "organizer",
        "event",
        "buyer",
        "attempts",
    ]
    list_filter = ["state", NeedsOperatorFilter, AgeFilter, ORGANIZER, "event"]
    # The pk is a UUID: matched exactly (or by the 8 characters the list shows)
    # in get_search_results, not with icontains.
    search_fields = ["intent_id", "reservation__ref", "buyer__username"]
    search_help_text = (
        "Saga id (whole, or its first 8 characters), intent id, reservation ref or buyer username."
    )
    list_select_related = ["event__organizer", "buyer", "reservation"]
    show_full_result_count = False  # no count(*) over every saga on each page
    actions = [_runbook_action(a) for a in Action]
    fields = (
        "id",
        "state",
        "version",
        "attempts",
        "event",
        "buyer",
        "reservation",
        "intent_id",
        "payment_method",
        "total",
        "created",
        "last_move",
    )
    # Shown only once they are set (no empty rows on the page).
    when_set = {
        "compensation_started_at": "compensation_started",
        "awaiting_operator_since": "waiting_for_an_operator_since",
    }
    readonly_fields = [*fields, *when_set.values()]

    # Read-only (ReadOnlyAdminMixin): viewing needs the view permission;
    # nobody adds, changes or deletes a saga by hand.

    def has_run_saga_runbook_permission(self, request):
        return request.user.has_perm("purchases.run_saga_runbook")

    def get_queryset(self, request):
        # What the list shows per row, read in the page's one query: the
        # ledger's word on the payment and whether the saga needs a person.
        return (
            super()
            .get_queryset(request)
            .annotate(
                **ledger_sums(),
                needs_op=ExpressionWrapper(needs_operator_condition(), output_field=BooleanField()),
            )
        )

    def get_fields(self, request, obj=None):
        return [
            *self.fields,
            *(
                shown
                for field, shown in self.when_set.items()
                if obj is not None and getattr(obj, field) is not None
            ),
        ]

    # --- list ---------------------------------------------------------------------

    @admin.display(description="id")
    def short_id(self, obj):
        return saga_id(obj.pk)

    @admin.display(description="age", ordering="-created_at")  # ascending age: newest first
    def age(self, obj):
        return timesince(obj.created_at, timezone.now(), depth=1)

    @admin.display(description="in state", ordering="-updated_at")
    def in_state(self, obj):
        # updated_at is the last move (a note does not touch it).
        return timesince(obj.updated_at, timezone.now(), depth=2)

    @admin.display(description="needs an operator", ordering="-needs_op")
    def needs_operator(self, obj):
        if getattr(obj, "needs_op", False):
            return format_html('<strong class="saga-needs-operator">{}</strong>', "yes")
        return ""

    @admin.display(description="payment")
    def payment_status(self, obj):
        # From the list's annotations: one query per page, not one per row.
        return payment_status(
            state=obj.state, charged=obj.ledger_charged, refunded=obj.ledger_refunded
        )

    @admin.display(description="total", ordering="amount")
    def total(self, obj):
        return format_money(obj.amount, obj.currency)

    # --- the saga page's fields, times written one way ---------------------------------

    @admin.display(description="created")
    def created(self, obj):
        return format_utc_seconds(obj.created_at)

    @admin.display(description="last move")
    def last_move(self, obj):
        return format_utc_seconds(obj.updated_at)

    @admin.display(description="compensation started")
    def compensation_started(self, obj):
        return format_utc_seconds(obj.compensation_started_at)

    @admin.display(description="waiting for an operator since")
    def waiting_for_an_operator_since(self, obj):
        return format_utc_seconds(obj.awaiting_operator_since)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        try:
            saga_pk = uuid.UUID(term)
        except ValueError:
            saga_pk = None
        if saga_pk is not None:
            wanted = Q(pk=saga_pk)
        elif _SHORT_ID.fullmatch(term.lower()):
            # The 8 characters the list shows: a range on the primary key.
            prefix = term.lower()
            wanted = Q(
                pk__gte=uuid.UUID(f"{prefix}-0000-0000-0000-000000000000"),
                pk__lte=uuid.UUID(f"{prefix}-ffff-ffff-ffff-ffffffffffff"),
            )
        else:
            return super().get_search_results(request, queryset, search_term)
        # A saga id (icontains on a uuid column casts every row to text); keep
        # the text fields too, should a username look like one.
        matches, _ = super().get_search_results(request, queryset, term)
        return queryset.filter(wanted | Q(pk__in=matches.values("pk"))), False

    # --- the saga page ------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = dict(extra_context or {})
        saga = self.get_object(request, unquote(object_id))
        if saga is not None and self.has_view_or_change_permission(request, saga):
            facts = saga_facts(saga)
            timeline = _saga_timeline(facts)
            extra_context.update(timeline)
            extra_context["verdict"] = verdict_from(facts)
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
            return self._runbook_run(
                request,
                sagas,
                action,
                form.cleaned_data["reason"],
                override=form.cleaned_data["override"],
            )
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
            results.append(
                self._runbook_run_one(request, saga, action, operator, reason, override=override)
            )
        counts = {
            k: sum(1 for r in results if r.outcome == k) for k in ("done", "refused", "failed")
        }
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

    def _runbook_run_one(
        self, request, saga, action, operator, reason, *, override=False
    ) -> _ResultRow:
        before = saga.state
        refusal = _runbook_refusal(request, saga, action)
        if refusal is not None:
            return _ResultRow(saga, before, before, "refused", refusal)
        written_before = _ledger_ids(saga.pk)
        extra = {
            "saga_id": str(saga.pk),
            "runbook_action": action.value,
            "operator": operator,
            "override": override,
        }
        outcome, message = _runbook_attempt(
            saga, action, operator, reason, override=override, extra=extra
        )
        fresh = PurchaseSaga.objects.get(pk=saga.pk)
        if outcome == "done":
            message = (
                f"{before} → {fresh.state}" if fresh.state != before else f"still {fresh.state}"
            )
        logger.log(
            logging.INFO if outcome == "done" else logging.WARNING,
            "runbook action %s: %s",
            action.value,
            outcome,
            extra={**extra, "outcome": outcome, "state": fresh.state},
        )
        self.log_change(
            request,
            fresh,
            f'Runbook "{LABELS[action]}" ({action.value}); reason: "{reason}"; '
            f"result: {outcome}: {message}",
        )
        written = _ledger_written(saga.pk, written_before)
        return _ResultRow(saga, before, fresh.state, outcome, message, written)


def _runbook_refusal(request, saga, action: Action) -> str | None:
    """Why the confirmed ``action`` is not run on ``saga`` after all; None to run it."""
    # The operator confirmed what the dry run showed at this version; a
    # saga that moved since is looked at again, not acted on blind.
    seen = request.POST.get(f"version_{saga.pk}")
    if seen and seen != str(saga.version):
        return (
            f"moved on since the dry run (v{seen} → v{saga.version}, now {saga.state}): look again"
        )
    # The table's verdict only: the gateway is asked by the action itself,
    # after the operator's note is on the record.
    plan = action_plan(saga=saga, action=action, ask_gateway=False)
    if not plan.allowed:
        return plan.why
    return None


def _runbook_attempt(
    saga, action: Action, operator: str, reason: str, *, override: bool, extra: dict
) -> tuple[str, str]:
    """Run ``action`` on ``saga``: its outcome ("done", "refused", "failed") and why."""
    try:
        action_run(
            saga_id=saga.pk, action=action, operator=operator, reason=reason, override=override
        )
    except (ActionRefused, IllegalTransition) as exc:
        outcome, message = "refused", str(exc)
    except DomainError as exc:
        outcome, message = "failed", f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # one saga's failure must not stop the others
        logger.exception("runbook action failed", extra=extra)
        outcome, message = "failed", f"{type(exc).__name__}: {exc}"
    else:
        outcome, message = "done", ""
    return outcome, message


def _ledger_ids(saga_id) -> set:
    return set(LedgerEntry.objects.filter(saga_id=saga_id).values_list("pk", flat=True))


def _ledger_written(saga_id, written_before: set) -> list[str]:
    """The saga's ledger entries not in ``written_before``, as the result page shows them."""
    return [
        f"{e.kind} {'+' if e.amount > 0 else ''}{format_money(e.amount, e.currency)}"
        f"{' (' + e.gateway_reference + ')' if e.gateway_reference else ''}"
        for e in LedgerEntry.objects.filter(saga_id=saga_id)
        .exclude(pk__in=written_before)
        .order_by("created_at", "id")
    ]


# --- the catalogue ------------------------------------------------------------------


class EventForm(forms.ModelForm):
    class Meta:
        model = Event
        fields = ["organizer", "name", "starts_at", "currency", "waiting_room"]
        help_texts = {
            "waiting_room": "On: buyers are let in in turn when purchases arrive faster than "
            "they are charged within a hold (docs/waiting-room.md). Unknown: decided when the "
            "event is published (on from WAITING_ROOM_MIN_SEATS seats).",
            "currency": "ISO 4217 code (EUR, JPY...): every price of the event is in it. "
            "It cannot change later.",
        }

    def clean_currency(self):
        code = self.cleaned_data["currency"].strip().upper()
        try:
            minor_units_exponent(code)
        except UnknownCurrency as exc:
            raise forms.ValidationError("Not an ISO 4217 currency code.") from exc
        return code


class PriceCategoryInline(ReadOnlyAdminMixin, admin.TabularInline):
    # Read-only: a price change rewrites the seats that are not held or sold
    # in the same commit (the seller's API); saved here, it would not.
    model = PriceCategory
    fields = ("code", "name", "price", "seats")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def get_queryset(self, request):
        # Each category's seats, counted in the inline's one query.
        seats = (
            Seat.objects.filter(event=OuterRef("event"), category=OuterRef("code"))
            .order_by()
            .values("event")
            .annotate(n=Count("pk"))
            .values("n")
        )
        return super().get_queryset(request).annotate(seat_count=Subquery(seats))

    @admin.display(description="price")
    def price(self, obj):
        return format_money(obj.price_amount, obj.currency)

    @admin.display(description="seats")
    def seats(self, obj):
        return obj.seat_count or 0


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    """Events: their name and start time stay editable (the catalogue, not
    money nor inventory). What the seller's API decides (status, currency,
    the sales rules, the refund policy, the price categories and the seat
    map) is shown here and changed there only: publishing and cancelling
    are services with effects (a cancellation refunds every buyer), a price
    change rewrites seats, and a seat map on sale is frozen."""

    form = EventForm
    list_display = ["id", "name", "organizer", "status", "starts_at", "currency", "published"]
    list_filter = ["organizer", "status"]
    list_select_related = ["organizer"]
    search_fields = ["name", "organizer__slug", "organizer__name"]
    inlines = [PriceCategoryInline]
    # The seller's, shown read-only on an event's page (see get_fieldsets).
    # What an operator may change on an event that exists.
    EDITABLE = ("name", "starts_at", "waiting_room")
    SELLER_FIELDS = (
        "status",
        "currency",
        "published",
        "sales_window",
        "hold",
        "buyer_limit",
        "refund_policy",
        "room_state",
    )

    def get_fieldsets(self, request, obj=None):
        if obj is None:
            # A new event is a draft without seats: its seller builds the
            # seat map and publishes it
            # (docs/api.md, "Events, seat maps and prices"). Its organizer is
            # chosen now, once.
            return [(None, {"fields": ["organizer", "name", "starts_at", "currency"]})]
        return [
            (
                None,
                {"fields": ["organizer", "name", "starts_at", "status", "currency", "published"]},
            ),
            (
                "Sales rules (the seller's, changed through the organizer's API)",
                {"fields": ["sales_window", "hold", "buyer_limit", "refund_policy"]},
            ),
            ("Waiting room (docs/waiting-room.md)", {"fields": ["waiting_room", "room_state"]}),
        ]

    def get_readonly_fields(self, request, obj=None):
        # An event's organizer is chosen when it is added: its sales are that
        # organizer's (docs/api.md, "Organizers and roles").
        return ["organizer", *self.SELLER_FIELDS] if obj is not None else []

    def save_model(self, request, obj, form, change):
        if change:
            # Only the fields this form changed (name, start): a whole-row
            # save would write back the status and the seller's rules as
            # they were read, undoing a publish or a rule that the seller
            # committed meanwhile.
            changed = [f for f in form.changed_data if f in self.EDITABLE]
            if changed:
                obj.save(update_fields=changed)
        else:
            super().save_model(request, obj, form, change)
        # The events list shows the new name or time at once (on commit).
        availability_changed(obj.pk)

    @admin.display(description="published", ordering="published_at")
    def published(self, obj):
        return format_utc_seconds(obj.published_at) if obj.published_at else "-"

    @admin.display(description="sales window")
    def sales_window(self, obj):
        start = format_utc_seconds(obj.sales_start) if obj.sales_start else "open"
        end = format_utc_seconds(obj.sales_end) if obj.sales_end else "open"
        return f"from {start} until {end}"

    @admin.display(description="hold")
    def hold(self, obj):
        if obj.hold_seconds is None:
            return f"{settings.PURCHASE_HOLD_SECONDS} s (PURCHASE_HOLD_SECONDS)"
        return f"{obj.hold_seconds} s"

    @admin.display(description="the room now")
    def room_state(self, obj):
        summary = room_summary(obj.pk)
        return "no room" if summary is None else str(summary)

    @admin.display(description="seats per buyer")
    def buyer_limit(self, obj):
        return "no limit" if obj.max_seats_per_buyer is None else obj.max_seats_per_buyer

    @admin.display(description="refund policy")
    def refund_policy(self, obj):
        if obj.buyer_can_cancel_until is None:
            return "buyers cannot cancel"
        return (
            f"buyers may cancel until {format_utc_seconds(obj.buyer_can_cancel_until)}, "
            f"fee {obj.cancel_fee_percent}%"
        )


@admin.register(PriceCategory)
class PriceCategoryAdmin(ReadOnlyAdminMixin, OrganizerColumn, admin.ModelAdmin):
    # Read-only, as on the event's page (PriceCategoryInline).
    list_display = ["code", "name", "organizer", "event", "price"]
    list_filter = [ORGANIZER]
    list_select_related = ["event__organizer"]
    search_fields = ["code", "name", "event__name"]
    fields = ("event", "code", "name", "price")
    readonly_fields = fields

    @admin.display(description="price", ordering="price_amount")
    def price(self, obj):
        return format_money(obj.price_amount, obj.currency)


@admin.register(Seat)
class SeatAdmin(ReadOnlyAdminMixin, OrganizerColumn, admin.ModelAdmin):
    # Read-only: prices, seat status and the seat map change only through the
    # services (a seat map on sale is frozen; blocks are the seller's).
    list_display = [
        "ref",
        "organizer",
        "event",
        "section",
        "category",
        "accessible",
        "status",
        "price",
    ]
    list_filter = [ORGANIZER, "event", "status", "accessible"]
    list_select_related = ["event__organizer"]
    search_fields = ["=ref"]
    fields = (
        "event",
        "ref",
        "section",
        "row",
        "number",
        "category",
        "x",
        "y",
        "accessible",
        "price",
        "status",
        "block_reason",
    )
    readonly_fields = fields

    @admin.display(description="price", ordering="price_amount")
    def price(self, obj):
        return format_money(obj.price_amount, obj.currency)


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdminMixin, OrganizerColumn, admin.ModelAdmin):
    # Read-only: a reservation moves only with its saga.
    list_display = ["ref", "organizer", "event", "buyer", "status", "hold_expires_at", "total"]
    list_filter = ["status", ORGANIZER, "event"]
    list_select_related = ["event__organizer", "buyer"]
    search_fields = ["ref", "buyer__username"]
    fields = ("ref", "event", "buyer", "status", "hold_expires_at", "total", "created_at")
    readonly_fields = fields

    @admin.display(description="total", ordering="total_amount")
    def total(self, obj):
        return format_money(obj.total_amount, obj.currency)


class MovedToFilter(admin.SimpleListFilter):
    """The state a move led to, from the states' list (not a DISTINCT over
    every move ever made, which Django's own filter would read)."""

    title = "moved to"
    parameter_name = "to_state"

    def lookups(self, request, model_admin):
        return SagaState.choices

    def queryset(self, request, queryset):
        return queryset.filter(to_state=self.value()) if self.value() else queryset


@admin.register(SagaHistory)
class SagaHistoryAdmin(ReadOnlyAdminMixin, OrganizerColumn, admin.ModelAdmin):
    """Every saga's moves in one list, newest first (a saga's own are on its
    page): which organizer's sales an operator moved, or what moved today."""

    list_display = [
        "when",
        "saga_link",
        "organizer",
        "event",
        "move",
        "actor",
        "actor_name",
        "reason",
    ]
    list_filter = [ORGANIZER, "actor", MovedToFilter]
    list_select_related = ["event__organizer"]
    # By the primary key's index: the table grows with every move.
    ordering = ["-id"]
    show_full_result_count = False
    search_fields = ["actor_name"]  # see get_search_results
    search_help_text = "Saga id (whole) or operator name (exact)."
    fields = (
        "saga_link",
        "event",
        "from_state",
        "to_state",
        "when",
        "actor",
        "actor_name",
        "reason",
        "version",
    )
    readonly_fields = fields

    def get_search_results(self, request, queryset, search_term):
        return exact_search(queryset, search_term, field="actor_name")

    @admin.display(description="at", ordering="at")
    def when(self, obj):
        return format_utc_seconds(obj.at)

    @admin.display(description="saga")
    def saga_link(self, obj):
        # From the row's own column: no query for the saga.
        url = reverse("admin:purchases_purchasesaga_change", args=[obj.saga_id])
        return format_html('<a href="{}">{}</a>', url, saga_id(obj.saga_id))

    @admin.display(description="move")
    def move(self, obj):
        return f"{obj.from_state or '-'} → {obj.to_state}"


@admin.register(DailySales)
class DailySalesAdmin(ReadOnlyAdminMixin, OrganizerColumn, admin.ModelAdmin):
    # Read-only: materialized from the outbox, each message counted once.
    list_display = [
        "day",
        "organizer",
        "event",
        "confirmed_count",
        "confirmed",
        "cancelled_count",
        "refunded_count",
        "refunded",
    ]
    list_filter = [ORGANIZER, "event"]
    list_select_related = ["event__organizer"]
    date_hierarchy = "day"
    ordering = ["-day", "event_id", "currency"]
    fields = (
        "event",
        "day",
        "currency",
        "confirmed_count",
        "confirmed",
        "cancelled_count",
        "refunded_count",
        "refunded",
    )
    readonly_fields = fields

    @admin.display(description="confirmed", ordering="confirmed_amount")
    def confirmed(self, obj):
        return format_money(obj.confirmed_amount, obj.currency)

    @admin.display(description="refunded", ordering="refunded_amount")
    def refunded(self, obj):
        return format_money(obj.refunded_amount, obj.currency)
