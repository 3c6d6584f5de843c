"""Every outbox topic the saga writes, and who consumes each (docs/design.md,
"Messaging").

This is the routing table of the outbox: ``config/settings.py`` reads
``ROUTING`` as ``OUTBOX_CONSUMERS``, and the purchases app checks at start-up
that every topic is routed and every consumer imports. So this module
imports nothing of ours.

A consumer is named by its dotted path, and that name is what the inbox
stores for "this consumer processed that message": moving a consumer to
another module re-runs it for every message still in flight. Keep the paths.
"""

from __future__ import annotations

import enum


class Topic(enum.StrEnum):
    # Timers: due later, each re-reads the saga under its lock and decides.
    HOLD_EXPIRED = "purchase.hold_expired"
    # A hold that expired while the gateway could not be reached: ask again.
    HOLD_RECHECK = "purchase.hold_recheck"
    RECONCILE = "purchase.reconcile"
    REFUND_RETRY = "purchase.refund_retry"
    # Events: due at once, for the choreography (emails, analytics, alerts).
    CONFIRMED = "purchase.confirmed"
    CANCELLED = "purchase.cancelled"
    NEEDS_OPERATOR = "purchase.needs_operator"
    # Stripe's signed event, recorded once by its id (stripe_events/): act on it.
    STRIPE_EVENT = "stripe.event"
    # Money back (docs/refunds.md): ask the processor for a refund or look it
    # up (due now, then on the backoff), chase one past its deadline, tell the
    # buyer once it is done; drive an event's cancellation a tick further.
    REFUND_EXECUTE = "refund.execute"
    REFUND_CHASE = "refund.chase"
    REFUND_SETTLED = "refund.settled"
    CANCELLATION_TICK = "event.cancellation_tick"


# Timers whose delivery drives a live saga forward: a saga waiting on one is
# on schedule, not stuck (the resumer and the auditor both ask).
DRIVING = frozenset({Topic.RECONCILE, Topic.REFUND_RETRY, Topic.HOLD_RECHECK})

CONFIRMATION_EMAIL = "purchases.consumers.confirmation_email"
CANCELLATION_EMAIL = "purchases.consumers.cancellation_email"
ANALYTICS_ON_CONFIRMED = "purchases.analytics.analytics_on_confirmed"
ANALYTICS_ON_CANCELLED = "purchases.analytics.analytics_on_cancelled"
ANALYTICS_ON_REFUND = "purchases.analytics.analytics_on_refund"

ROUTING: dict[str, list[str]] = {
    Topic.HOLD_EXPIRED: ["purchases.consumers.hold_expired"],
    Topic.HOLD_RECHECK: ["purchases.consumers.hold_expired"],
    Topic.RECONCILE: ["purchases.consumers.reconcile_due"],
    Topic.REFUND_RETRY: ["purchases.consumers.refund_retry_due"],
    # Analytics after the email: a failing analytics consumer cannot hold it up.
    Topic.CONFIRMED: [CONFIRMATION_EMAIL, ANALYTICS_ON_CONFIRMED],
    Topic.CANCELLED: [CANCELLATION_EMAIL, ANALYTICS_ON_CANCELLED],
    Topic.NEEDS_OPERATOR: ["purchases.consumers.operator_alert"],
    # Re-reads the object from Stripe, then probes the saga or records the dispute.
    Topic.STRIPE_EVENT: ["stripe_events.consumers.stripe_event_act"],
    Topic.REFUND_EXECUTE: ["purchases.consumers.refund_execute_due"],
    Topic.REFUND_CHASE: ["purchases.consumers.refund_chase_due"],
    Topic.REFUND_SETTLED: ["purchases.consumers.refund_email", ANALYTICS_ON_REFUND],
    Topic.CANCELLATION_TICK: ["purchases.consumers.cancellation_tick_due"],
}

# Money back's work that runs on its own queue and pool (settings'
# CELERY_REFUND_QUEUE): asking the processor (and looking a refund up),
# chasing one past its deadline, telling the buyer and counting the day's
# figures once one settled, an event cancellation's ticks. Not the
# compensation's REFUND_RETRY: it drives a saga that never confirmed.
REFUND_QUEUE_TOPICS = frozenset(
    {Topic.REFUND_EXECUTE, Topic.REFUND_CHASE, Topic.REFUND_SETTLED, Topic.CANCELLATION_TICK}
)

# The Celery task that charges a new purchase (enqueued on the start's commit
# by name, so that the saga does not import the task module).
CHARGE_TASK = "purchases.charge"
