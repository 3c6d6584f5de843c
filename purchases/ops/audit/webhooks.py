"""Outgoing webhooks (docs/api.md, "Webhooks"; docs/design.md, "The edges"): a
finished saga owes every endpoint that listened when it ended exactly one
delivery of the type its end calls for, and a saga an alert named owes
``purchase.needs_attention``: ``webhook_missing`` otherwise. A delivery that
announces another end than the saga's is ``webhook_contradicts``. A delivery
that ran out of attempts is the finding ``webhook_failed``: its alert was
raised when the schedule ran out, so it is listed, not counted as a violation.

"Listened" is judged on the endpoint's row as it is now: enabled, subscribed
to the type, and unchanged since before the move (``updated_at``; created
before it, then). An endpoint changed after the saga ended is not judged for
that saga: what it listened to before the change is not kept.

Set-based: the endpoints are read once per run (with none, that query is the
whole cost of this check), then per chunk the alerts (only when an endpoint
listens to them), the chunk's deliveries, the endpoints still there, and, for
the rare saga that announced ``purchase.confirmed`` and is no longer
CONFIRMED, whether its history has CONFIRMED.

Every move writes its delivery in its own commit, so no grace applies: a saga
read as finished has its deliveries in any read made after it (the alerts are
read before the deliveries for the same reason).

A confirmed purchase's refunds (docs/refunds.md) announce themselves without
moving the saga, each in the commit that settles it: ``purchase.refunded``
from the succeeded refund that brings the total to the whole amount,
``purchase.partially_refunded`` from one that leaves some of it;
``purchase.cancelled`` from a buyer's cancellation, when it is asked. Each is
owed from then, and contradicts a purchase that has no such refund. The
refund rows are read before the deliveries, for the same reason.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Max

from outbox.models import OutboxMessage
from webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint, WebhookEvent

from ...models import PurchaseSaga, RefundSource, SagaHistory
from ...saga.states import SagaState
from ...saga.topics import Topic
from .context import AuditContext
from .money import Ledger
from .refunds import SagaRefunds
from .report import WEBHOOK_CONTRADICTS, WEBHOOK_FAILED, WEBHOOK_MISSING

S = SagaState
E = WebhookEvent


@dataclass(frozen=True)
class Endpoint:
    pk: int
    url: str
    enabled: bool
    events: frozenset[str]
    updated_at: datetime

    def listened(self, event_type: str, at: datetime) -> bool:
        """Enabled and subscribed to ``event_type`` at ``at``, as far as the
        row can tell: it has not changed since."""
        return self.enabled and event_type in self.events and self.updated_at <= at


@dataclass(frozen=True)
class Delivery:
    endpoint_id: int
    event_type: str
    status: str
    message_id: str
    attempts: int


@dataclass
class WebhookFacts:
    """What one chunk's check reads about its sagas' webhooks."""

    deliveries: dict = field(default_factory=lambda: defaultdict(list))  # saga id -> [Delivery]
    alerted_at: dict = field(default_factory=dict)  # saga id -> its latest alert
    confirmed_once: set = field(default_factory=set)  # no longer CONFIRMED, but were
    endpoints: dict[int, Endpoint] = field(default_factory=dict)  # still there


def webhook_endpoints() -> list[Endpoint]:
    """Every endpoint, read once per run."""
    return [
        Endpoint(pk, url, enabled, frozenset(events or ()), updated_at)
        for pk, url, enabled, events, updated_at in WebhookEndpoint.objects.order_by(
            "pk"
        ).values_list("pk", "url", "enabled", "events", "updated_at")
    ]


def end_type(state: str, entries: Ledger) -> str | None:
    """The type a finished saga's end calls for. The compensation's rule
    (``refunded`` in purchases/saga/compensate.py): refunded when the ledger
    holds a refund entry for the intent. Every path that finishes a
    compensation writes that entry before the move, in the same commit, and
    the ledger is append-only, so the ledger read after the saga says what
    the compensation was told."""
    if state == S.CONFIRMED:
        return E.CONFIRMED
    if state == S.COMPENSATED:
        return E.REFUNDED if entries.refunds else E.FAILED
    return None


def webhook_facts(chunk: list[PurchaseSaga], endpoints: list[Endpoint]) -> WebhookFacts | None:
    """None when there is no endpoint: then there is no delivery either
    (an endpoint's deliveries go with it)."""
    if not endpoints:
        return None
    ids = [s.pk for s in chunk]
    facts = WebhookFacts()
    if any(e.enabled and E.NEEDS_ATTENTION in e.events for e in endpoints):
        facts.alerted_at = dict(
            OutboxMessage.objects.filter(saga_id__in=ids, topic=Topic.NEEDS_OPERATOR)
            .values("saga_id")
            .annotate(at=Max("created_at"))
            .values_list("saga_id", "at")
        )
    for (
        saga_id,
        endpoint_id,
        event_type,
        status,
        message_id,
        armed,
    ) in WebhookDelivery.objects.filter(saga_id__in=ids).values_list(
        "saga_id", "endpoint_id", "event_type", "status", "message_id", "armed_attempt"
    ):
        facts.deliveries[saga_id].append(
            Delivery(endpoint_id, event_type, status, message_id, armed)
        )
    # Read after the deliveries: an endpoint deleted meanwhile took its
    # deliveries along, and is not owed any.
    present = set(
        WebhookEndpoint.objects.filter(pk__in=[e.pk for e in endpoints]).values_list(
            "pk", flat=True
        )
    )
    facts.endpoints = {e.pk: e for e in endpoints if e.pk in present}
    # purchase.confirmed for a saga no longer CONFIRMED: right if it was
    # (a refund after the confirmation), which its history says.
    states = {s.pk: s.state for s in chunk}
    were = [
        saga_id
        for saga_id, rows in facts.deliveries.items()
        if states[saga_id] != S.CONFIRMED and any(d.event_type == E.CONFIRMED for d in rows)
    ]
    if were:
        facts.confirmed_once = set(
            SagaHistory.objects.filter(saga_id__in=were, to_state=S.CONFIRMED).values_list(
                "saga_id", flat=True
            )
        )
    return facts


def refund_announcements(saga: PurchaseSaga, refunds: SagaRefunds) -> dict[str, datetime]:
    """The refund webhooks a confirmed purchase owes, each from when it was
    first published (the code's rule: purchases/refunds/step.py,
    ``refund_succeeded``; purchases/refunds/requests.py, ``purchase_cancel``)."""
    if saga.state != S.CONFIRMED:
        return {}
    owed: dict[str, datetime] = {}
    total = 0
    for row in refunds.succeeded_in_order():
        total += row.amount
        kind = E.REFUNDED if total >= saga.amount else E.PARTIALLY_REFUNDED
        if row.settled_at is not None:  # always, once succeeded
            owed.setdefault(kind, row.settled_at)
    buyer = [r.created_at for r in refunds.rows if r.source == RefundSource.BUYER]
    if buyer:
        owed[E.CANCELLED] = min(buyer)
    return owed


def check_webhooks(
    ctx: AuditContext,
    saga: PurchaseSaga,
    facts: WebhookFacts | None,
    entries: Ledger,
    refunds: SagaRefunds | None = None,
) -> None:
    if facts is None:
        return
    ended = end_type(saga.state, entries)
    announced = refund_announcements(saga, refunds or SagaRefunds())
    rows = facts.deliveries.get(saga.pk, [])
    for d in rows:
        why = _contradiction(
            d.event_type, saga, ended, saga.pk in facts.confirmed_once, announced=announced
        )
        if why:
            ctx.flag(
                WEBHOOK_CONTRADICTS,
                saga.pk,
                saga.intent_id,
                f"{d.event_type} delivery {d.message_id} to endpoint {d.endpoint_id}: {why}",
            )
        if d.status == DeliveryStatus.FAILED:
            endpoint = facts.endpoints.get(d.endpoint_id)
            ctx.note(
                WEBHOOK_FAILED,
                saga.pk,
                f"{d.event_type} delivery {d.message_id} to endpoint {d.endpoint_id}"
                f"{f' ({endpoint.url})' if endpoint else ''} failed after {d.attempts} "
                "attempt(s); resend it once the receiver is fixed",
            )

    owed = []
    if ended is not None:
        # A finished saga does not move again: its last move is the end.
        owed.append((ended, saga.updated_at, f"{saga.state}{_refund_note(saga, ended)}"))
    if saga.pk in facts.alerted_at:
        owed.append((E.NEEDS_ATTENTION, facts.alerted_at[saga.pk], "an alert named it"))
    for event_type, at in announced.items():
        owed.append((event_type, at, f"CONFIRMED with {_REFUND_TYPES[event_type]}"))
    have = {(d.endpoint_id, d.event_type) for d in rows}
    for event_type, at, because in owed:
        for endpoint in facts.endpoints.values():
            if endpoint.listened(event_type, at) and (endpoint.pk, event_type) not in have:
                ctx.flag(
                    WEBHOOK_MISSING,
                    saga.pk,
                    saga.intent_id,
                    f"no {event_type} delivery to endpoint {endpoint.pk} "
                    f"({endpoint.url}), subscribed since before {at.isoformat()} "
                    f"({because})",
                )


# What makes each refund webhook right for a confirmed purchase.
_REFUND_TYPES: dict[str, str] = {
    E.REFUNDED: "succeeded refunds of its whole amount",
    E.PARTIALLY_REFUNDED: "succeeded refund of a part",
    E.CANCELLED: "cancellation by its buyer",
}


def _contradiction(
    event_type: str,
    saga: PurchaseSaga,
    ended: str | None,
    confirmed_once: bool,
    *,
    announced: dict[str, datetime],
) -> str:
    if saga.state == S.CONFIRMED and event_type in _REFUND_TYPES:
        if event_type in announced:
            return ""
        return f"the purchase has no {_REFUND_TYPES[event_type]} (it is CONFIRMED)"
    if event_type in (E.PARTIALLY_REFUNDED, E.CANCELLED):
        return f"announces money back to a purchase that is not CONFIRMED (it is {saga.state})"
    if event_type in (E.FAILED, E.REFUNDED):
        if saga.state != S.COMPENSATED:
            return f"announces an end the saga did not reach (it is {saga.state})"
        if event_type != ended:
            return f"the saga is COMPENSATED{_refund_note(saga, ended)}"
    elif event_type == E.CONFIRMED and saga.state != S.CONFIRMED and not confirmed_once:
        return f"the saga never was CONFIRMED (it is {saga.state})"
    return ""


def _refund_note(saga: PurchaseSaga, ended: str | None) -> str:
    if saga.state != S.COMPENSATED:
        return ""
    return (
        " after a refund"
        if ended == E.REFUNDED
        else " and nothing was refunded (no refund in the ledger)"
    )
