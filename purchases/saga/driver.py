"""What drives a saga that stopped moving: the one table of "state -> next
action", used by the resumer, the runbook's "resume now" and "reconcile
now" (docs/design.md, "Resumer").

No double charge by construction: PENDING charges with the saga's own intent
id (the gateway replays a charge that already landed); CHARGING and UNKNOWN
look the intent up before anything else. UNKNOWN_EXPIRED is an operator's and
is never driven.

(The hold expiry drives stalled compensations too, but calls the
compensation directly: a table that imports every step cannot be imported by
one of them.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from payments.interface import PaymentGateway

from ..models import GatewayAnswer, PurchaseSaga
from .charge import saga_charge
from .compensate import saga_compensate
from .reconcile import saga_reconcile
from .states import SagaState
from .transition import RESUMER, By

S = SagaState


@dataclass(frozen=True)
class Drive:
    why: str
    run: Callable[..., PurchaseSaga]  # (saga_id, gateway, now, by) -> saga


def _charge(*, saga_id, gateway, now, by) -> PurchaseSaga:
    return saga_charge(saga_id=saga_id, gateway=gateway, now=now, by=by)


def _look_up(*, saga_id, gateway, now, by) -> PurchaseSaga:
    # Keeps its place in the backoff schedule: the next probe number.
    probes = GatewayAnswer.objects.filter(saga_id=saga_id, asked="retrieve").count()
    return saga_reconcile(saga_id=saga_id, attempt=probes + 1, gateway=gateway, now=now, by=by)


def _compensate(*, saga_id, gateway, now, by) -> PurchaseSaga:
    return saga_compensate(
        saga_id=saga_id, gateway=gateway, now=now, by=by, reason="resumed: compensating"
    )


DRIVES: dict[SagaState, Drive] = {
    S.PENDING: Drive("never charged (the enqueue was lost?): charge with its intent id", _charge),
    S.CHARGING: Drive("charge answer never recorded (worker died?): look the intent up", _look_up),
    S.UNKNOWN: Drive("reconcile probe not scheduled: look the intent up", _look_up),
    S.REQUIRES_ACTION: Drive("waiting on the buyer's authentication: look the intent up", _look_up),
    S.PAYMENT_FAILED: Drive("declined, compensation never ran: compensate", _compensate),
    S.EXPIRED: Drive("expired, compensation never ran: compensate", _compensate),
    S.COMPENSATING: Drive("compensation interrupted: resume it", _compensate),
    S.COMPENSATION_PENDING: Drive("refund retry not scheduled: retry the refund", _compensate),
}
DRIVABLE = frozenset(DRIVES)


def saga_drive(
    *,
    saga_id,
    by: By = RESUMER,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
) -> PurchaseSaga:
    """Drive one saga again from its current state, with its own intent id;
    a state with nothing to drive (terminal, UNKNOWN_EXPIRED) is left as is."""
    saga = PurchaseSaga.objects.get(pk=saga_id)
    drive = DRIVES.get(SagaState(saga.state))
    if drive is None:
        return saga
    return drive.run(saga_id=saga_id, gateway=gateway, now=now, by=by)
