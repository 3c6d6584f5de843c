"""Every saga reaches CONFIRMED or COMPENSATED, or an escalated state an alert
names: none is silently stuck; and an unknown charge outcome is never
compensated before a definitive gateway answer."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db.models import Q

from outbox.models import OutboxMessage

from ...models import Actor, GatewayAnswer, PurchaseSaga, SagaHistory
from ...saga.states import SagaState
from ...saga.topics import DRIVING, Topic
from .context import AuditContext
from .report import NO_SILENT_STUCK

S = SagaState

ESCALATED = (S.UNKNOWN_EXPIRED, S.COMPENSATION_PENDING)
COMPENSATION_UNFINISHED = (S.COMPENSATING, S.COMPENSATION_PENDING)
COMPENSATION_STATES = (S.COMPENSATING, S.COMPENSATION_PENDING, S.COMPENSATED)
# The states after which a charge may land without our knowing yet: an
# unknown answer, and an authentication (3-D Secure) the buyer may complete.
UNKNOWN_STATES = (S.UNKNOWN, S.UNKNOWN_EXPIRED, S.REQUIRES_ACTION)

# Gateway answers that settle whether a charge landed (or can still land).
DEFINITIVE_ANSWERS = (
    Q(
        asked="retrieve",
        answer__in=["succeeded", "declined", "not_found", "requires_payment", "canceled"],
    )
    | Q(asked="cancel", answer="canceled")
    | Q(asked="refund", answer="refunded")
)


def live_signals(ctx: AuditContext, live: list) -> tuple[dict, set]:
    """For live sagas: when alerts named them, and which a timer drives."""
    alerts: dict = defaultdict(list)
    if not live:
        return alerts, set()
    for saga_id, at in OutboxMessage.objects.filter(
        saga_id__in=live, topic=Topic.NEEDS_OPERATOR
    ).values_list("saga_id", "created_at"):
        alerts[saga_id].append(at)
    # A pending row overdue by more than the threshold drives nothing
    # (a stalled relay or a message that fails on every delivery).
    driven = set(
        OutboxMessage.objects.filter(
            saga_id__in=live,
            topic__in=DRIVING,
            completed_at__isnull=True,
            cancelled_at__isnull=True,
            available_at__gt=ctx.cutoff,
        ).values_list("saga_id", flat=True)
    )
    return alerts, driven


def check_stuck(ctx, saga: PurchaseSaga, alerts: list[datetime], driven: bool) -> None:
    started = saga.compensation_started_at
    if (
        saga.state in COMPENSATION_UNFINISHED
        and started is not None
        and started + ctx.compensation_deadline <= ctx.cutoff
    ):
        # Past its deadline (with the usual grace) a compensation must be
        # named by an alert raised since it started, however busy its
        # retries keep it: being driven is not being settled.
        if not any(at >= started for at in alerts):
            ctx.flag(
                NO_SILENT_STUCK,
                saga.pk,
                saga.intent_id,
                f"{saga.state}: compensation started {ctx.age(started)} ago, past "
                "its deadline, and no alert names it",
            )
        return
    if saga.updated_at > ctx.cutoff or driven:
        return
    # The alert must name the saga in its current state, not an earlier one.
    if saga.state in ESCALATED and any(at >= saga.updated_at for at in alerts):
        return
    why = "no alert names it" if saga.state in ESCALATED else "no timer drives it"
    ctx.flag(
        NO_SILENT_STUCK,
        saga.pk,
        saga.intent_id,
        f"{saga.state} for {ctx.age(saga.updated_at)}, {why}",
    )


def compensated_blind(saga_ids: list) -> dict:
    """saga id -> detail, for compensations decided without a definitive
    gateway answer after the charge outcome became unknown."""
    if not saga_ids:
        return {}
    history: dict = defaultdict(list)
    for row in (
        SagaHistory.objects.filter(saga_id__in=saga_ids)
        .order_by("saga_id", "at", "id")
        .values("saga_id", "to_state", "at", "actor", "actor_name")
    ):
        history[row["saga_id"]].append(row)
    moves = {}
    for saga_id, rows in history.items():
        unknown_at = None
        for row in rows:
            if row["to_state"] in UNKNOWN_STATES:
                unknown_at = row["at"]
            elif row["to_state"] == S.CONFIRMED:
                unknown_at = None  # settled: a later refund compensates a known charge
            elif row["to_state"] == S.COMPENSATING and unknown_at is not None:
                moves[saga_id] = (unknown_at, row)
                break
    if not moves:
        return {}
    evidence: dict = defaultdict(list)
    for saga_id, at in GatewayAnswer.objects.filter(
        DEFINITIVE_ANSWERS, saga_id__in=list(moves)
    ).values_list("saga_id", "at"):
        evidence[saga_id].append(at)
    blind = {}
    for saga_id, (unknown_at, move) in moves.items():
        if move["actor"] == Actor.OPERATOR:
            continue
        if any(unknown_at <= at <= move["at"] for at in evidence[saga_id]):
            continue
        blind[saga_id] = (
            f"moved to COMPENSATING by {move['actor']} at {move['at'].isoformat()} after "
            f"an unknown charge outcome ({unknown_at.isoformat()}) without a definitive "
            "gateway answer"
        )
    return blind
