"""What the answers about money back read (docs/api.md, "Money back:
refunds and cancellations")."""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from ..models import (
    Event,
    EventCancellation,
    EventStatus,
    PurchaseSaga,
    Refund,
    RefundSource,
    RefundStatus,
)
from ..saga.states import NON_TERMINAL, SagaState


def purchase_refunds(saga: PurchaseSaga) -> list[Refund]:
    return list(
        Refund.objects.filter(saga_id=saga.pk, event_id=saga.event_id).order_by("created_at", "id")
    )


# Read as each refund settles (on the refunds' pool): written once.
_REFUNDED_SQL = (
    f"SELECT coalesce(sum(amount), 0) FROM {Refund._meta.db_table}"
    " WHERE saga_id = %s AND event_id = %s AND status = %s"
)


def refunded_amount(saga: PurchaseSaga) -> int:
    """What the purchase's refunds have given back."""
    with connection.cursor() as cursor:
        cursor.execute(_REFUNDED_SQL, [saga.pk, saga.event_id, RefundStatus.SUCCEEDED])
        (done,) = cursor.fetchone()
    return int(done)


def cancellable_until(saga: PurchaseSaga, event: Event, *, now: datetime) -> datetime | None:
    """Until when the buyer may cancel this purchase (None: they may not)."""
    until = event.buyer_can_cancel_until
    if (
        saga.state != SagaState.CONFIRMED
        or event.status == EventStatus.CANCELLED
        or until is None
        or now >= until
    ):
        return None
    return until


_PROGRESS_SQL = """
SELECT count(*),
       count(*) FILTER (WHERE r.done >= s.amount),
       count(*) FILTER (WHERE r.failed > 0 AND r.done < s.amount),
       count(*) FILTER (WHERE r.done < s.amount),
       COALESCE(sum(GREATEST(s.amount - r.done, 0)), 0)
  FROM {saga} s
 CROSS JOIN LATERAL (
   SELECT COALESCE(sum(x.amount) FILTER (WHERE x.status = %s), 0) AS done,
          count(*) FILTER (WHERE x.status = %s AND x.source = %s) AS failed
     FROM {refund} x WHERE x.saga_id = s.id AND x.event_id = s.event_id) r
 WHERE s.event_id = %s AND s.state = %s
"""


def cancellation_progress(run: EventCancellation) -> dict:
    """The run's progress: its status; the confirmed purchases, those
    refunded in full, those whose cancellation refund failed, those still
    owed something (``owed``) and how much (``owed_amount``, minor units of
    the event's currency); the purchases still in flight."""
    sql = _PROGRESS_SQL.format(saga=PurchaseSaga._meta.db_table, refund=Refund._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            [
                RefundStatus.SUCCEEDED.value,
                RefundStatus.FAILED.value,
                RefundSource.EVENT_CANCELLATION.value,
                run.event_id,
                SagaState.CONFIRMED.value,
            ],
        )
        purchases, refunded, failed, owed, owed_amount = cursor.fetchone()
    in_flight = PurchaseSaga.objects.filter(event_id=run.event_id, state__in=NON_TERMINAL).count()
    return {
        "status": run.status,
        "purchases": purchases,
        "refunded": refunded,
        "failed": failed,
        "owed": owed,
        "owed_amount": int(owed_amount),
        "in_flight": in_flight,
        "reason": run.reason,
        "rate_per_second": run.rate,
        "started_at": run.created_at,
        "finished_at": run.finished_at,
    }
