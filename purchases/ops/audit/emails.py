"""One confirmation email per confirmed saga, one failure (or correction)
email per compensated saga, whatever the number of deliveries: counted by
message and by the consumer's inbox entry."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Exists, OuterRef

from outbox.models import InboxEntry, OutboxMessage

from ...models import PurchaseSaga
from ...saga.states import SagaState
from ...saga.topics import CANCELLATION_EMAIL, CONFIRMATION_EMAIL, Topic
from .report import EMAILS_EXACTLY_ONCE

S = SagaState


def email_messages(saga_ids: list) -> dict:
    """saga id -> topic -> [(created_at, sent)] for the two email topics."""
    out: dict = defaultdict(lambda: defaultdict(list))
    sent = {
        Topic.CONFIRMED: CONFIRMATION_EMAIL,
        Topic.CANCELLED: CANCELLATION_EMAIL,
    }
    rows = (
        OutboxMessage.objects.filter(saga_id__in=saga_ids, topic__in=list(sent))
        .annotate(
            confirmation_sent=Exists(
                InboxEntry.objects.filter(message=OuterRef("pk"), consumer=CONFIRMATION_EMAIL)
            ),
            cancellation_sent=Exists(
                InboxEntry.objects.filter(message=OuterRef("pk"), consumer=CANCELLATION_EMAIL)
            ),
        )
        .values_list("saga_id", "topic", "created_at", "confirmation_sent", "cancellation_sent")
    )
    for saga_id, topic, created_at, confirmation_sent, cancellation_sent in rows:
        is_sent = confirmation_sent if topic == Topic.CONFIRMED else cancellation_sent
        out[saga_id][topic].append((created_at, is_sent))
    return out


def check_emails(ctx, saga: PurchaseSaga, messages: dict) -> None:
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
