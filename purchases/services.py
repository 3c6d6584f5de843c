"""The purchase saga's public operations (docs/design.md, "The saga").

Views, tasks, consumers, the runbook, commands and tests call these; the
code lives in ``purchases.saga``, one module per step. Every top-level
service owns its transactions (``atomic(durable=True)``, so nesting one by
accident fails loudly) and never calls the gateway inside one. Services are
keyword-only and take an injectable clock (``now``) and gateway.

``purchase_start`` takes the seats named (``seat_refs``) or a ``quantity``
(best available); a refused quantity raises ``NotEnoughSeats`` (exported here
for the callers that catch it).
"""

from .catalog import event_create_with_seats
from .errors import NotEnoughSeats
from .saga.alerts import raise_operator_alert
from .saga.charge import saga_charge
from .saga.compensate import finish_compensation, purchase_refund, saga_compensate
from .saga.confirm import confirm
from .saga.driver import DRIVES, saga_drive
from .saga.expiry import saga_expire_hold
from .saga.reconcile import saga_reconcile
from .saga.start import PurchaseStarted, purchase_replay, purchase_start, request_fingerprint
from .saga.step import Ask, gateway_or_default, gateway_step, record_answer
from .saga.transition import (
    RESUMER,
    SYSTEM,
    By,
    clock,
    move,
    note_decision,
    saga_transition,
)

__all__ = [
    "DRIVES",
    "RESUMER",
    "SYSTEM",
    "Ask",
    "By",
    "clock",
    "NotEnoughSeats",
    "PurchaseStarted",
    "confirm",
    "event_create_with_seats",
    "finish_compensation",
    "gateway_or_default",
    "gateway_step",
    "move",
    "note_decision",
    "purchase_refund",
    "purchase_replay",
    "purchase_start",
    "raise_operator_alert",
    "record_answer",
    "request_fingerprint",
    "saga_charge",
    "saga_compensate",
    "saga_drive",
    "saga_expire_hold",
    "saga_reconcile",
    "saga_transition",
]
