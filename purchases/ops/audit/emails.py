"""One confirmation email per confirmed saga, one failure (or correction)
email per compensated saga, one refund email per succeeded refund (its
``refund.settled`` message, written in the commit that settled it), whatever
the number of deliveries: counted by message and by the consumer's inbox
entry."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Exists, OuterRef
from django.db.models.fields.json import KeyTextTransform

from outbox.models import InboxEntry, OutboxMessage

from ...models import PurchaseSaga, RefundStatus
from ...saga.states import SagaState
from ...saga.topics import CANCELLATION_EMAIL, CONFIRMATION_EMAIL, ROUTING, Topic
from .report import EMAILS_EXACTLY_ONCE

S = SagaState
REFUND_EMAIL = ROUTING[Topic.REFUND_SETTLED][0]


# Each email topic and the consumer that sends it.
_SENT_BY = {
    Topic.CONFIRMED: CONFIRMATION_EMAIL,
    Topic.CANCELLED: CANCELLATION_EMAIL,
    Topic.REFUND_SETTLED: REFUND_EMAIL,
}


def email_messages(saga_ids: list) -> dict:
    """saga id -> topic -> [(created_at, sent)] for the saga's two email
    topics; and ``("refund", refund id)`` -> the same for each refund's."""
    out: dict = defaultdict(lambda: defaultdict(list))
    rows = (
        OutboxMessage.objects.filter(saga_id__in=saga_ids, topic__in=list(_SENT_BY))
        .annotate(
            **{
                f"sent_{n}": Exists(
                    InboxEntry.objects.filter(message=OuterRef("pk"), consumer=consumer)
                )
                for n, consumer in enumerate(_SENT_BY.values())
            }
        )
        .annotate(refund=KeyTextTransform("refund_id", "payload"))
        .values_list("saga_id", "topic", "created_at", "refund", "sent_0", "sent_1", "sent_2")
    )
    for saga_id, topic, created_at, refund, *sent in rows:
        is_sent = sent[[str(t) for t in _SENT_BY].index(topic)]
        key = ("refund", refund) if topic == Topic.REFUND_SETTLED else topic
        out[saga_id][key].append((created_at, is_sent))
    return out


def check_emails(ctx, saga: PurchaseSaga, messages: dict, refunds=None) -> None:
    """``refunds``: the saga's :class:`~.refunds.SagaRefunds` (None: none)."""
    _check_refund_emails(ctx, saga, messages, refunds.rows if refunds is not None else [])
    confirmed = messages.get(Topic.CONFIRMED, [])
    cancelled = messages.get(Topic.CANCELLED, [])
    for topic, rows in ((Topic.CONFIRMED, confirmed), (Topic.CANCELLED, cancelled)):
        if len(rows) > 1:
            ctx.flag(EMAILS_EXACTLY_ONCE, saga.pk, saga.intent_id, f"{len(rows)} {topic} messages")
    if saga.state == S.CONFIRMED:
        one_sent(ctx, saga, Topic.CONFIRMED, confirmed, CONFIRMATION_EMAIL)
        if cancelled:
            ctx.flag(
                EMAILS_EXACTLY_ONCE,
                saga.pk,
                saga.intent_id,
                f"CONFIRMED but a {Topic.CANCELLED} message exists",
            )
    elif saga.state == S.COMPENSATED:
        one_sent(ctx, saga, Topic.CANCELLED, cancelled, CANCELLATION_EMAIL)


def _check_refund_emails(ctx, saga: PurchaseSaga, messages: dict, rows: list) -> None:
    for row in rows:
        mails = messages.get(("refund", row.id), [])
        if len(mails) > 1:
            ctx.flag(
                EMAILS_EXACTLY_ONCE,
                saga.pk,
                saga.intent_id,
                f"{len(mails)} {Topic.REFUND_SETTLED} messages for refund {row.id}",
            )
        if row.status == RefundStatus.SUCCEEDED:
            one_sent(ctx, saga, f"{Topic.REFUND_SETTLED} (refund {row.id})", mails, REFUND_EMAIL)
        elif mails:
            ctx.flag(
                EMAILS_EXACTLY_ONCE,
                saga.pk,
                saga.intent_id,
                f"refund {row.id} is {row.status} but its {Topic.REFUND_SETTLED} message exists",
            )


def one_sent(ctx, saga: PurchaseSaga, topic: str, rows: list, consumer: str) -> None:
    if not rows:
        ctx.flag(
            EMAILS_EXACTLY_ONCE, saga.pk, saga.intent_id, f"{saga.state} without a {topic} message"
        )
        return
    for created_at, sent in rows:
        if not sent and created_at <= ctx.cutoff:
            ctx.flag(
                EMAILS_EXACTLY_ONCE,
                saga.pk,
                saga.intent_id,
                f"{topic} not processed by {consumer} after {ctx.age(created_at)}",
            )
