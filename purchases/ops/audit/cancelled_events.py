"""A cancelled event gives everything back (docs/refunds.md, "Event
cancellation"): once its cancellation run is ``done``, the ledger nets zero
over the intents of its confirmed purchases (``cancelled_event_not_refunded``,
per purchase). Its purchases that were never confirmed are the other
checks' (a compensated one nets zero: ``confirmed_has_one_charge_entry``).

A dispute's entries are the bank's money, as everywhere in the auditor
(money.py): not counted. One statement over the done runs, whatever their
number: a done run never starts again, and what its purchases' refunds
still do (an operator's new refund after a failed one) only brings their
net closer to zero, so a single read is judged as it is.
"""

from __future__ import annotations

from django.db.models import Q, Sum

from ledger.models import EntryKind, LedgerEntry

from ...models import CancellationStatus, EventCancellation, PurchaseSaga
from ...saga.states import SagaState
from .context import AuditContext
from .report import CANCELLED_EVENT_NOT_REFUNDED


def check_cancelled_events(ctx: AuditContext) -> None:
    done = EventCancellation.objects.filter(status=CancellationStatus.DONE).values("event_id")
    confirmed = PurchaseSaga.objects.filter(event_id__in=done, state=SagaState.CONFIRMED).values(
        "intent_id"
    )
    for event_id, saga_id, intent_id, net in (
        LedgerEntry.objects.filter(intent_id__in=confirmed)
        .exclude(kind__in=[EntryKind.DISPUTE, EntryKind.DISPUTE_REVERSAL])
        .order_by()
        .values("event_id", "saga_id", "intent_id")
        .annotate(net=Sum("amount"))
        .filter(~Q(net=0))
        .values_list("event_id", "saga_id", "intent_id", "net")
    ):
        ctx.flag(
            CANCELLED_EVENT_NOT_REFUNDED,
            saga_id,
            intent_id,
            f"event {event_id} is cancelled and its run is done, but this confirmed "
            f"purchase still nets {net} in the ledger",
        )
