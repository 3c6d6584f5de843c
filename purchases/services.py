"""The purchase saga's public operations (docs/design.md, "The saga").

Views, tasks, consumers, the runbook, commands and tests call these; the
code lives in ``purchases.saga``, one module per step. Every top-level
service owns its transactions (``atomic(durable=True)``, so nesting one by
accident fails loudly) and never calls the gateway inside one. Services are
keyword-only and take an injectable clock (``now``) and gateway.

Operations only: the saga's machinery (the one move, the step helper, the
confirming commit, the compensation's last commit) stays inside
``purchases.saga``. An operator's verdict is a step of its own
(``saga_confirm_manual`` and its neighbours, docs/design.md, "Operators'
steps"), not machinery lent to the runbook; the import contracts in
pyproject.toml and ``tests/test_saga_boundary.py`` keep it so.

Besides the operations, the words their callers need: who acts (``By``,
``SYSTEM``), what the driver does from each state (``DRIVES``), the results
and refusals they return or raise. ``purchase_start`` takes the seats named
(``seat_refs``) or a ``quantity`` (best available); a refused quantity raises
``NotEnoughSeats``. ``raise_operator_alert`` is the one that runs inside its
caller's commit: the chaser claims the sagas it alerts about itself, with
``SKIP LOCKED``.

Money back (``purchases.refunds``, docs/refunds.md): ``purchase_cancel``
(the buyer), ``organizer_refund``, ``purchase_refund`` (the runbook's),
``event_cancel`` and its ``cancellation_tick``; ``refund_execute`` asks the
processor for a refund row or looks it up, ``refund_chase`` alerts on one
past its deadline.
"""

from .admission import buyer_place as waiting_room_place
from .admission import rooms_tick as waiting_rooms_tick
from .catalog import event_create_with_seats
from .errors import NotEnoughSeats
from .refunds.cancellation import cancellation_tick, event_cancel
from .refunds.requests import organizer_refund, purchase_cancel, purchase_refund
from .refunds.step import refund_chase, refund_execute
from .saga.alerts import raise_operator_alert
from .saga.burst import saga_charge_burst
from .saga.charge import saga_charge
from .saga.compensate import saga_compensate
from .saga.driver import DRIVES, saga_drive
from .saga.expiry import saga_expire_hold
from .saga.operator import (
    ActionRefused,
    saga_compensate_manual,
    saga_confirm_manual,
    saga_look_up_escalated,
    saga_note,
)
from .saga.reconcile import purchase_processor_event, saga_reconcile
from .saga.start import PurchaseStarted, purchase_replay, purchase_start, request_fingerprint
from .saga.transition import SYSTEM, By, saga_transition

__all__ = [
    "DRIVES",
    "SYSTEM",
    "ActionRefused",
    "By",
    "NotEnoughSeats",
    "PurchaseStarted",
    "cancellation_tick",
    "event_cancel",
    "event_create_with_seats",
    "organizer_refund",
    "purchase_cancel",
    "purchase_processor_event",
    "purchase_refund",
    "purchase_replay",
    "purchase_start",
    "raise_operator_alert",
    "refund_chase",
    "refund_execute",
    "request_fingerprint",
    "saga_charge",
    "saga_charge_burst",
    "saga_compensate",
    "saga_compensate_manual",
    "saga_confirm_manual",
    "saga_drive",
    "saga_expire_hold",
    "saga_look_up_escalated",
    "saga_note",
    "saga_reconcile",
    "saga_transition",
    "waiting_room_place",
    "waiting_rooms_tick",
]
