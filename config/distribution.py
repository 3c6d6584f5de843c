"""Where every table goes past one PostgreSQL: the Citus plan, declared
(docs/design.md, "Running").

Distribute by event, so that a purchase's transactions stay inside one event's
rows. Every table of the database is declared here, once, with why:

- ``Distributed(column, group)``: hash-distributed on ``column``; the tables of
  one ``group`` are co-located (the rows of one value of the column sit on one
  node), so a transaction that stays inside one value stays on one node;
- ``Reference()``: a full copy on every node (small, read everywhere, rarely
  written: a write is replicated to every node);
- ``Local()``: a plain table on the coordinator, which nothing distributed
  refers to;
- ``Elsewhere()``: not in this database in production at all.

``tests/test_citus_rules.py`` holds the real schema (the PostgreSQL catalog
after the migrations) to Citus's rules against this declaration: a table not
declared, a distribution column that may be NULL, a primary key, unique
constraint or unique index without the distribution column, a foreign key
between distributed tables that does not pair their distribution columns (or
joins two groups), a reference table pointing at a distributed one: each
fails the test. This module is data: it imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

# The event id of a row that belongs to no event. Every row the product
# writes names its event (tests/test_citus_rules.py checks the calls); a
# message written without one (a test's bare outbox row) gets this, because
# the distribution column cannot be NULL. No event has it: ids start at 1.
NO_EVENT = 0

# Co-location groups.
EVENT = "event"  # an event and everything its purchases write
BUYER = "buyer"  # per buyer, across events (the idempotency record)
SESSION = "session"  # a login session, on its own


@dataclass(frozen=True)
class Distributed:
    column: str
    group: str
    reason: str


@dataclass(frozen=True)
class Reference:
    reason: str


@dataclass(frozen=True)
class Local:
    reason: str


@dataclass(frozen=True)
class Elsewhere:
    reason: str


Placement = Distributed | Reference | Local | Elsewhere

_PROCESSOR = (
    "the fake card processor's: in production the processor's own database "
    "(Compose runs the fake on its own), reached over HTTP only"
)
_STAFF = "staff permissions: a few rows, read by the admin, written by hand"

TABLES: dict[str, Placement] = {
    # --- by event: a purchase's commits stay on its event's node ------------------------
    "purchases_event": Distributed(
        "id", EVENT, "the group's anchor: an event's row lives with its seats and purchases"
    ),
    "purchases_seat": Distributed(
        "event_id", EVENT, "an event's seats, locked and held by its purchases"
    ),
    "purchases_pricecategory": Distributed(
        "event_id", EVENT, "an event's price categories, read with its seats"
    ),
    "purchases_reservation": Distributed(
        "event_id", EVENT, "a purchase's hold on an event's seats, written by the reserve"
    ),
    "purchases_reservationseat": Distributed(
        "event_id", EVENT, "the seats a reservation holds; a seat is live in one at most"
    ),
    "purchases_purchasesaga": Distributed(
        "event_id", EVENT, "the saga, locked and moved by every step of the purchase"
    ),
    "purchases_sagahistory": Distributed(
        "event_id", EVENT, "a row in every commit that moves (or notes) the saga"
    ),
    "purchases_gatewayanswer": Distributed(
        "event_id", EVENT, "the gateway's answers about a saga, written in its step's commit"
    ),
    "purchases_dispute": Distributed(
        "event_id", EVENT, "a chargeback on a purchase, written beside its saga's ledger rows"
    ),
    "purchases_refund": Distributed(
        "event_id", EVENT, "money going back to a purchase, written beside its saga's rows"
    ),
    "purchases_eventcancellation": Distributed(
        "event_id", EVENT, "an event's cancellation run, locked by each of its ticks"
    ),
    "purchases_waitingroom": Distributed(
        "event_id", EVENT, "an event's waiting room, locked by its ticks, read by its starts"
    ),
    "purchases_waitingroomentry": Distributed(
        "event_id", EVENT, "a buyer waiting for an event's sale, numbered by its room's row"
    ),
    "purchases_dailysales": Distributed(
        "event_id", EVENT, "an event's sales per day, counted in the delivery's commit"
    ),
    "outbox_outboxmessage": Distributed(
        "event_id", EVENT, "events and timers, written in the commit of the move they announce"
    ),
    "outbox_inboxentry": Distributed(
        "event_id", EVENT, "what ran for a message, written in its delivery's commit"
    ),
    "ledger_ledgerentry": Distributed(
        "event_id", EVENT, "money moved by a saga, written in the commit that records it"
    ),
    "webhooks_webhookdelivery": Distributed(
        "event_id", EVENT, "a webhook, written in the saga's commit that announces it"
    ),
    "webhooks_webhookattempt": Distributed(
        "event_id", EVENT, "an attempt of a delivery, recorded in the delivery's commit"
    ),
    "door_eventkey": Distributed(
        "event_id", EVENT, "an event's ticket signing keys, read to sign and scan its tickets"
    ),
    "door_checkin": Distributed(
        "event_id", EVENT, "a ticket let in, inserted against its seat link in one statement"
    ),
    "door_scan": Distributed(
        "event_id", EVENT, "every scan at an event's gates, written in its check-in's commit"
    ),
    "door_ticketrevocation": Distributed(
        "event_id", EVENT, "a voided ticket version, written in the commit that voids its link"
    ),
    # --- by buyer -----------------------------------------------------------------------
    "purchases_idempotencyrecord": Distributed(
        "user_id",
        BUYER,
        "an Idempotency-Key is the buyer's, across events (docs/api.md: another body is a "
        "422 whatever its event), so only the buyer can be its shard key; the reserve's "
        "commit then spans the buyer's node and the event's (docs/design.md, \"Running\")",
    ),
    # --- by session key -----------------------------------------------------------------
    "django_session": Distributed(
        "session_key",
        SESSION,
        "a buyer's or staff login: written at every login (an on-sale is many), read by "
        "key, joined to nothing; a reference table would copy each login to every node",
    ),
    # --- reference: small, read everywhere, rarely written ------------------------------
    "auth_user": Reference(
        "buyers and staff: read by every request, referred to by sagas, reservations and "
        "idempotency records of every group"
    ),
    "authtoken_token": Reference(
        "API tokens: read by every API request, written when one is issued"
    ),
    "auth_group": Reference(_STAFF),
    "auth_group_permissions": Reference(_STAFF),
    "auth_permission": Reference(_STAFF),
    "auth_user_groups": Reference(_STAFF),
    "auth_user_user_permissions": Reference(_STAFF),
    "django_content_type": Reference(
        "Django's model registry: read by permissions and the admin log, written by migrations"
    ),
    "django_admin_log": Reference("staff actions in the admin: rare, read in the admin"),
    "organizers_organizer": Reference(
        "the sellers: a few rows, read by every organizer-scoped request and referred to by "
        "events (distributed) and webhook endpoints (reference)"
    ),
    "organizers_membership": Reference(
        "who may act for a seller, and in which role: read by every organizer-scoped "
        "request, written when members change"
    ),
    "webhooks_webhookendpoint": Reference(
        "the seller's endpoints: a handful, read (FOR KEY SHARE) by every commit that "
        "announces a webhook, whatever its event; written by the seller's API calls"
    ),
    "purchases_sweepheartbeat": Reference(
        "one row per sweep, updated by each of its runs (a few a minute)"
    ),
    "purchases_auditrun": Reference("one row per run of the auditor (hours apart)"),
    # --- the coordinator's own ----------------------------------------------------------
    "stripe_events_stripeevent": Local(
        "Stripe's events as received, one row per event id: written by the endpoint, read by "
        "id by its consumer, joined to nothing; as a reference table each would be copied to "
        "every node, and it belongs to no event"
    ),
    "django_migrations": Local(
        "Django's record of applied migrations: `migrate` reads and writes it, on the coordinator"
    ),
    # --- not ours -----------------------------------------------------------------------
    "fake_gateway_fakeintent": Elsewhere(_PROCESSOR),
    "fake_gateway_fakecharge": Elsewhere(_PROCESSOR),
    "fake_gateway_fakeidempotentanswer": Elsewhere(_PROCESSOR),
    "fake_gateway_fakedroppedcharge": Elsewhere(_PROCESSOR),
    "fake_gateway_fakerequest": Elsewhere(_PROCESSOR),
    "fake_gateway_fakerefund": Elsewhere(_PROCESSOR),
}
