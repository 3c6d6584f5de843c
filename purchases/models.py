"""Events, seats, reservations and the purchase saga with its history.

Every row of a purchase carries its event id, so that one purchase's
transaction stays inside one event's rows (the sharding plan in docs/design.md, "Running").
"""

import uuid

from django.conf import settings
from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Collate
from django.db.models.lookups import Exact

from .saga.states import NON_TERMINAL, SagaState


class EventStatus(models.TextChoices):
    # docs/api.md, "Events, seat maps and prices": a draft is the seller's
    # alone (its seat map and categories may change); on sale, the public
    # catalog lists it and its seat map is frozen; cancelled stops sales.
    DRAFT = "draft"
    ON_SALE = "on_sale"
    CANCELLED = "cancelled"


class Event(models.Model):
    # The seller it belongs to (docs/api.md, "Organizers and roles"): a
    # reference table, so the event's shard needs no other node to read it.
    # An organizer with events is not deleted.
    organizer = models.ForeignKey(
        "organizers.Organizer", on_delete=models.PROTECT, related_name="events"
    )
    name = models.CharField(max_length=200)
    starts_at = models.DateTimeField()
    status = models.CharField(max_length=10, choices=EventStatus.choices, default=EventStatus.DRAFT)
    # One currency per event: every price category's (seller/seat_maps.py).
    currency = models.CharField(max_length=3)
    # The sales window; either end open when null.
    sales_start = models.DateTimeField(null=True, blank=True)
    sales_end = models.DateTimeField(null=True, blank=True)
    # How long a purchase holds its seats; null: PURCHASE_HOLD_SECONDS.
    hold_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Seats one buyer may hold or have bought for this event, all purchases
    # counted; null: no limit but MAX_SEATS_PER_PURCHASE per purchase.
    max_seats_per_buyer = models.PositiveIntegerField(null=True, blank=True)
    # The refund policy: a buyer may cancel until then (null: never), and
    # gets back the price less this percent.
    buyer_can_cancel_until = models.DateTimeField(null=True, blank=True)
    cancel_fee_percent = models.PositiveSmallIntegerField(default=0)
    published_at = models.DateTimeField(null=True, blank=True)
    # The on-sale waiting room (purchases/admission.py, docs/waiting-room.md):
    # on, off, or null: decided when the event is published, on for a seat
    # map of at least WAITING_ROOM_MIN_SEATS seats.
    waiting_room = models.BooleanField(null=True, blank=True)

    class Meta:
        ordering = ["starts_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(cancel_fee_percent__lte=100), name="event_fee_percent_at_most_100"
            ),
            models.CheckConstraint(
                condition=Q(sales_start__isnull=True)
                | Q(sales_end__isnull=True)
                | Q(sales_start__lt=models.F("sales_end")),
                name="event_sales_window_in_order",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class PriceCategory(models.Model):
    """A price category of an event (stalls, balcony...): its seats' price.

    A seat names its category by ``code`` and carries the category's price
    as it was when the seat was last offered (``Seat.price_amount``): a price
    change rewrites the seats that are not held or sold, never a held one,
    so a purchase keeps the price its seats were held at
    (seller/services.py).
    """

    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="price_categories")
    code = models.CharField(max_length=32)
    name = models.CharField(max_length=100)
    price_amount = models.PositiveIntegerField()  # minor units
    currency = models.CharField(max_length=3)

    class Meta:
        ordering = ["event", "id"]
        verbose_name_plural = "price categories"
        constraints = [
            models.UniqueConstraint(fields=["event", "code"], name="price_category_code_per_event"),
        ]

    def __str__(self) -> str:
        return f"{self.code} ({self.event_id})"


class SeatStatus(models.TextChoices):
    AVAILABLE = "available"
    HELD = "held"
    SOLD = "sold"
    # Blocked by the seller (docs/api.md: "not for sale"): only an available
    # seat can be blocked, and only a blocked one unblocked.
    UNAVAILABLE = "unavailable"


class Seat(models.Model):
    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="seats")
    ref = models.CharField(max_length=32)
    section = models.CharField(max_length=64, blank=True, default="")
    row = models.CharField(max_length=16)
    number = models.PositiveIntegerField()
    # The code of the seat's PriceCategory ("" for a seat made before
    # categories existed, priced on its own).
    category = models.CharField(max_length=32, blank=True, default="")
    # Where the seat-map page draws it.
    x = models.FloatField(default=0)
    y = models.FloatField(default=0)
    accessible = models.BooleanField(default=False)
    price_amount = models.PositiveIntegerField()  # minor units
    currency = models.CharField(max_length=3)
    status = models.CharField(
        max_length=11, choices=SeatStatus.choices, default=SeatStatus.AVAILABLE
    )
    # Why the seller blocked it (status unavailable).
    block_reason = models.CharField(max_length=200, blank=True, default="")
    # Not columns: the first and last number of the seat's row, on the seats
    # best available reads (purchases/saga/start.py, ``_CANDIDATES_SQL``).
    row_first: int
    row_last: int

    class Meta:
        ordering = ["row", "number"]
        constraints = [
            models.UniqueConstraint(fields=["event", "ref"], name="seat_ref_unique_per_event"),
        ]
        indexes = [
            # Best available reads the available seats in row order, a chunk
            # at a time, and stops at the first row with a block
            # (purchases/saga/start.py, ``_find_best_block``): sold seats leave
            # this index, so a sold-out front of the hall costs nothing.
            models.Index(
                F("event"),
                Collate(F("section"), "C"),
                Collate(F("row"), "C"),
                F("number"),
                # Written with the status compared byte by byte (COLLATE "C"),
                # as only the search writes it: a statement that says
                # status = 'available' (a hold by seat ids) cannot be served
                # by this index, however stale the planner's statistics.
                condition=Q(Exact(Collate(F("status"), "C"), "available")),
                name="seat_available_in_row_order",
            ),
            # A row's first and last numbers, whatever the seats' status.
            models.Index(fields=["event", "section", "row", "number"], name="seat_in_row_order"),
        ]

    def __str__(self) -> str:
        return f"{self.ref} ({self.event_id})"


class ReservationStatus(models.TextChoices):
    HELD = "HELD"
    CONFIRMED = "CONFIRMED"
    CANCELLED = "CANCELLED"


class Reservation(models.Model):
    # Unique per event (``Meta``): the database can hold no wider uniqueness
    # under Citus. It ends with the event's id, so it is unique everywhere by
    # construction, and so is the intent id made of it, which the gateway
    # needs (purchases/saga/start.py, ``reservation_ref``).
    ref = models.CharField(max_length=20)
    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="reservations")
    buyer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reservations"
    )
    status = models.CharField(max_length=10, choices=ReservationStatus.choices)
    hold_expires_at = models.DateTimeField()
    total_amount = models.PositiveIntegerField()
    currency = models.CharField(max_length=3)
    created_at = models.DateTimeField()
    seats = models.ManyToManyField(Seat, through="ReservationSeat", related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["ref", "event"], name="reservation_ref_unique_per_event"
            ),
        ]
        indexes = [
            # A buyer's seats for an event (the limit per buyer,
            # purchases/saga/start.py) and a seller's search by buyer.
            models.Index(fields=["event", "buyer"], name="reservation_event_buyer_idx"),
        ]

    def __str__(self) -> str:
        return self.ref


class ReservationSeat(models.Model):
    """A seat taken by a reservation, until ``released_at``.

    The partial unique index is the last line of defence for "a seat is sold
    at most once": even a bug in the locking cannot give one seat to two live
    reservations.
    """

    # db_constraint=False here and on every foreign key between two tables
    # distributed by event: the database's key is (event_id, x_id) ->
    # (event_id, id), written in purchases/migrations/0008_citus_distribution.py.
    # Found by (reservation, event), one index for both: with one index each,
    # a planner without statistics ANDed them (docs/performance.md).
    reservation = models.ForeignKey(
        Reservation,
        on_delete=models.PROTECT,
        related_name="seat_links",
        db_constraint=False,
        db_index=False,
    )
    seat = models.ForeignKey(Seat, on_delete=models.PROTECT, related_name="+", db_constraint=False)
    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="+")
    released_at = models.DateTimeField(null=True, blank=True)
    # What the buyer paid for this seat (the price it was held at): a refund
    # of some seats refunds these, whatever the seat costs today. Null only
    # on links older than refunds (docs/refunds.md, "Amounts").
    price_amount = models.PositiveIntegerField(null=True, blank=True)
    # The version of the seat's ticket (docs/door.md, "A ticket"): a reissue
    # bumps it, and a code of an older version no longer admits. The db
    # default keeps raw INSERTs (the reserve's) valid.
    ticket_version = models.PositiveSmallIntegerField(default=0, db_default=0)

    class Meta:
        indexes = [models.Index(fields=["reservation", "event"], name="reservation_seats_idx")]
        constraints = [
            models.UniqueConstraint(
                fields=["seat", "event"],
                condition=Q(released_at__isnull=True),
                name="seat_taken_by_one_live_reservation",
            ),
        ]


class PurchaseSaga(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # In the database, unique with the event, (reservation_id, event_id), not
    # alone as Django believes (0008_citus_distribution.py): a later
    # migration that alters this field's uniqueness must say so by hand.
    reservation = models.OneToOneField(
        Reservation, on_delete=models.PROTECT, related_name="saga", db_constraint=False
    )
    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="+")
    buyer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    # Derived from the reservation; the idempotency key of every charge.
    # Unique per event in the database (``Meta``), everywhere by construction
    # (the reservation's ref names its event).
    intent_id = models.CharField(max_length=100)
    payment_method = models.CharField(max_length=100)
    amount = models.PositiveIntegerField()
    currency = models.CharField(max_length=3)
    state = models.CharField(max_length=30, choices=SagaState.choices)
    version = models.PositiveIntegerField(default=1)
    # Charge attempts made (a retry after "not found" counts).
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    # When the compensation began (the first move to COMPENSATING). The
    # chaser's deadline runs from here: every refund retry moves the saga and
    # resets ``updated_at``, so a deadline measured from that never arrives.
    compensation_started_at = models.DateTimeField(null=True, blank=True)
    # Set when the gateway contradicted the ledger (a refund answered "not
    # charged"): nothing automatic drives the saga any more, an alert names
    # it, and the next move (an operator's) clears it.
    awaiting_operator_since = models.DateTimeField(null=True, blank=True)
    # The W3C traceparent of the request that started the purchase (empty
    # when tracing is off): every later step continues that trace from here,
    # whatever carried it to the worker (config/tracing.py). The db default
    # keeps raw INSERTs valid.
    trace_context = models.CharField(max_length=128, blank=True, default="", db_default="")
    # The processor that charges it (settings.PAYMENT_GATEWAY when it began):
    # "fake" or "stripe" (docs/stripe.md).
    processor = models.CharField(max_length=10, default="fake", db_default="fake")
    # The processor's own id of the intent (Stripe's ``pi_…``), recorded in a
    # commit after the create and before the charge; empty for the fake,
    # whose intents are named by ``intent_id``.
    processor_ref = models.CharField(max_length=255, blank=True, default="", db_default="")
    # While REQUIRES_ACTION: what the buyer's browser completes the
    # authentication with (Stripe's client secret); cleared by the move out
    # of it. Shown only to the buyer (docs/api.md, "Paying with Stripe").
    action_secret = models.CharField(max_length=255, blank=True, default="", db_default="")

    class Meta:
        ordering = ["-created_at"]
        permissions = [
            (
                "run_saga_runbook",
                "Can run runbook actions (reconcile, resume, confirm, "
                "compensate, refund) on purchase sagas",
            ),
        ]
        indexes = [
            # The resumer and the chaser only look at live sagas: the index
            # does not grow with the number of finished ones.
            models.Index(
                fields=["state", "updated_at"],
                name="saga_live_idx",
                condition=Q(state__in=NON_TERMINAL),
            ),
            models.Index(fields=["buyer", "-created_at"], name="saga_buyer_recent_idx"),
            # A processor's event names the intent by its own id (pi_…) when
            # it carries no purchase id of ours: only Stripe's sagas have one.
            models.Index(
                fields=["processor_ref"],
                name="saga_processor_ref_idx",
                condition=~Q(processor_ref=""),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["intent_id", "event"], name="saga_intent_unique_per_event"
            ),
        ]

    def __str__(self) -> str:
        return f"saga {self.id} ({self.state})"

    @property
    def hold_timer_key(self) -> str:
        return f"hold:{self.id}"

    @property
    def gateway_ref(self) -> str:
        """How the gateway port names this saga's intent: the processor's id
        once recorded, else ours (payments/interface.py)."""
        return self.processor_ref or self.intent_id


class Dispute(models.Model):
    """A buyer's bank disputing a confirmed purchase's charge (a chargeback),
    as the processor last told us: one row per processor dispute, updated in
    place as it moves (purchases/disputes.py). The money it moves is in the
    ledger (``dispute`` / ``dispute_reversal`` entries), not here."""

    saga = models.ForeignKey(
        PurchaseSaga, on_delete=models.PROTECT, related_name="disputes", db_constraint=False
    )
    # The saga's event: the row lives on the saga's shard.
    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="+")
    processor_ref = models.CharField(max_length=255)  # Stripe's dp_…
    # Stripe's dispute status: warning_needs_response, needs_response,
    # under_review, won, lost, ...
    status = models.CharField(max_length=40)
    amount = models.PositiveIntegerField()  # minor units
    currency = models.CharField(max_length=3)
    reason = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["processor_ref", "event"], name="dispute_once_per_processor_ref"
            ),
        ]

    def __str__(self) -> str:
        return f"dispute {self.processor_ref} ({self.status})"


class RefundStatus(models.TextChoices):
    PENDING = "pending"  # owed: asked for, or asked and not settled
    SUCCEEDED = "succeeded"  # the processor refunded it (ledger entry written)
    FAILED = "failed"  # the processor refused it: nothing refunded (alerted)


class RefundSource(models.TextChoices):
    BUYER = "buyer"  # the buyer cancelled within the event's policy
    ORGANIZER = "organizer"  # finance or an owner refunded
    EVENT_CANCELLATION = "event_cancellation"  # the event was cancelled
    OPERATOR = "operator"  # the runbook's refund (customer service)


class Refund(models.Model):
    """Money going back to a confirmed purchase's buyer: a part or the whole
    of its charge, with a life of its own (docs/refunds.md).

    Created ``pending`` in the commit that releases its seats (when it says
    so); asked of the processor once, under its own idempotency key
    (``refund:<id>``), outside any transaction; an answer that is not
    definitive is looked up on the backoff, never re-sent blind; the ledger
    entry is written in the commit that records ``succeeded``.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    saga = models.ForeignKey(
        PurchaseSaga, on_delete=models.PROTECT, related_name="refunds", db_constraint=False
    )
    # The saga's event: the row lives on the saga's shard.
    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="+")
    amount = models.PositiveIntegerField()  # minor units, > 0
    currency = models.CharField(max_length=3)
    # The refs of the seats it pays for ([]: an amount, no seats named).
    seats = models.JSONField(default=list)
    # Whether it put seats back on sale (their tickets void) when it was
    # opened, and which: a refund of everything left also releases seats an
    # earlier refund paid for and kept sold.
    released = models.BooleanField(default=False)
    released_seats = models.JSONField(default=list)
    source = models.CharField(max_length=20, choices=RefundSource.choices)
    # The seller's or operator's words: never shown to the buyer.
    reason = models.CharField(max_length=500, blank=True, default="")
    # The sentence the buyer reads (docs/api.md, "Money back: refunds and cancellations").
    public_reason = models.CharField(max_length=300)
    status = models.CharField(
        max_length=10, choices=RefundStatus.choices, default=RefundStatus.PENDING
    )
    # The processor's id of the refund (Stripe's re_…), once it named one.
    processor_ref = models.CharField(max_length=255, blank=True, default="")
    # Why it failed, or the last doubt ("timeout", "http_503"...).
    detail = models.CharField(max_length=200, blank=True, default="")
    # Whether the processor was ever asked to make it, and how many look-ups.
    asked = models.BooleanField(default=False)
    lookups = models.PositiveSmallIntegerField(default=0)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="+",
        null=True,
        blank=True,
    )
    # The request's Idempotency-Key ("" for the runbook's and a cancellation's)
    # and what it asked (a hash of its normalised body): the same key with
    # another request is refused.
    request_key = models.CharField(max_length=255, blank=True, default="")
    request_hash = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["saga", "event"], name="refund_saga_idx"),
            models.Index(
                fields=["status", "created_at"],
                name="refund_pending_idx",
                condition=Q(status="pending"),
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="refund_amount_positive"),
            # A request's key makes it once (replays return the same row).
            models.UniqueConstraint(
                fields=["saga", "source", "request_key", "event"],
                condition=~Q(request_key=""),
                name="refund_once_per_request_key",
            ),
            # An event's cancellation refunds each purchase once.
            models.UniqueConstraint(
                fields=["saga", "event"],
                condition=Q(source="event_cancellation"),
                name="refund_one_per_event_cancellation",
            ),
        ]

    def __str__(self) -> str:
        return f"refund {self.id} {self.amount} {self.currency} ({self.status})"

    @property
    def idempotency_key(self) -> str:
        return f"refund:{self.id}"


class CancellationStatus(models.TextChoices):
    RUNNING = "running"
    DONE = "done"


class EventCancellation(models.Model):
    """An event's cancellation: the bulk run that settles its purchases in
    flight and refunds every confirmed one in full (docs/refunds.md, "Event
    cancellation"). The run's state is this row and the refund rows: a crash
    anywhere resumes from them."""

    event = models.OneToOneField(
        Event, on_delete=models.PROTECT, primary_key=True, related_name="cancellation"
    )
    reason = models.CharField(max_length=500)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True
    )
    status = models.CharField(
        max_length=10, choices=CancellationStatus.choices, default=CancellationStatus.RUNNING
    )
    # Refunds asked per second (REFUND_RATE_PER_SECOND when it started).
    rate = models.FloatField()
    # When the run's one live tick is due: a tick delivered for another time
    # (a redelivery, a stale timer) does nothing, so the ticks stay one chain.
    tick_due = models.DateTimeField()
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"cancellation of event {self.event_id} ({self.status})"


class WaitingRoom(models.Model):
    """An event's waiting room (purchases/admission.py, docs/waiting-room.md):
    what its ticks decided. Buyers are numbered in the order they joined
    (those who came before the sale opened, in the order of the draw at the
    opening); everyone up to ``admitted_through`` has been let in."""

    event = models.OneToOneField(
        Event, on_delete=models.PROTECT, primary_key=True, related_name="+"
    )
    # Whether a start must be let in (the last tick's decision): someone
    # waits, or the charges in flight fill what a hold can serve.
    active = models.BooleanField(default=False)
    # The next number to give; numbers start at 1.
    next_number = models.BigIntegerField(default=1)
    admitted_through = models.BigIntegerField(default=0)
    # When the buyers who came before the sale opened were drawn.
    drawn_at = models.DateTimeField(null=True, blank=True)
    # What the last tick measured: charges answered per second (all events)
    # and this event's purchases waiting for their charge.
    charge_rate = models.FloatField(default=0)
    backlog = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"waiting room of event {self.event_id}"


class WaitingRoomEntry(models.Model):
    """A buyer in an event's waiting room: one row per buyer and event."""

    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="+")
    buyer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    # Null until the draw, for a buyer who came before the sale opened.
    number = models.BigIntegerField(null=True, blank=True)
    joined_at = models.DateTimeField()
    # When the tick let the buyer in: a start may use it for
    # WAITING_ROOM_PASS_SECONDS; ``used_at`` is the first start that did.
    admitted_at = models.DateTimeField(null=True, blank=True)
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "waiting room entries"
        constraints = [
            models.UniqueConstraint(fields=["event", "buyer"], name="waiting_room_once_per_buyer"),
        ]
        indexes = [
            models.Index(fields=["event", "number"], name="waiting_room_order"),
            models.Index(fields=["event", "admitted_at"], name="waiting_room_admitted"),
        ]

    def __str__(self) -> str:
        return f"{self.buyer_id} in event {self.event_id}'s room (#{self.number})"


class Actor(models.TextChoices):
    SYSTEM = "system"
    RESUMER = "resumer"
    OPERATOR = "operator"


class SagaHistory(models.Model):
    saga = models.ForeignKey(
        PurchaseSaga, on_delete=models.PROTECT, related_name="history", db_constraint=False
    )
    # The saga's event: the row lives on the saga's shard.
    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="+")
    from_state = models.CharField(max_length=30, null=True, blank=True)
    to_state = models.CharField(max_length=30)
    at = models.DateTimeField()
    reason = models.CharField(max_length=500)
    actor = models.CharField(max_length=20, choices=Actor.choices, default=Actor.SYSTEM)
    # The operator's username when actor == operator.
    actor_name = models.CharField(max_length=150, blank=True, default="")
    version = models.PositiveIntegerField()

    class Meta:
        ordering = ["at", "id"]
        verbose_name_plural = "saga history"

    def __str__(self) -> str:
        return f"{self.from_state} -> {self.to_state}: {self.reason}"


class GatewayAnswer(models.Model):
    """Evidence: one question put to the gateway about a saga's intent (a
    charge, a look-up, a cancel, a refund) and what came back, kept beside the
    saga whatever the saga made of it."""

    saga = models.ForeignKey(
        PurchaseSaga, on_delete=models.PROTECT, related_name="gateway_answers", db_constraint=False
    )
    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="+")
    at = models.DateTimeField()
    # What was asked: "retrieve", "charge", "cancel", "refund".
    asked = models.CharField(max_length=20)
    # What came back, normalised ("succeeded", "not_found", "unknown", ...).
    answer = models.CharField(max_length=30)
    detail = models.CharField(max_length=200, blank=True, default="")
    latency_ms = models.FloatField()
    # 1-based position in the backoff schedule (0: not part of a schedule).
    attempt = models.PositiveSmallIntegerField(default=0)
    # The refund row the question was about ("refund_create", "refund_lookup").
    refund_id = models.UUIDField(null=True, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [
            # The waiting room measures the charge rate from the last
            # seconds' answers (purchases/admission.py): rows arrive in time
            # order, so a block range index finds them for almost nothing
            # on each insert.
            BrinIndex(fields=["at"], name="gateway_answer_at_brin"),
        ]


class IdempotencyRecord(models.Model):
    """The first answer to a (user, Idempotency-Key): the purchase as it was
    first answered; replays return it.

    A key is the buyer's across events, so the record is distributed by buyer,
    not by event (config/distribution.py): its saga lives on another shard, and
    the database has no foreign key to it (the reserve writes both in one
    commit)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    response_body = models.JSONField()
    saga = models.ForeignKey(
        PurchaseSaga, on_delete=models.PROTECT, related_name="+", db_constraint=False
    )
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="idempotency_key_per_user"),
            # One record per saga (the buyer's: the distribution column).
            models.UniqueConstraint(fields=["saga", "user"], name="idempotency_one_per_saga"),
        ]


class SweepHeartbeat(models.Model):
    """Each run of a sweep (resumer, chaser, auditor) leaves its pulse here, so
    a sweeper that stalls is itself visible."""

    name = models.CharField(max_length=50, unique=True)
    interval_seconds = models.PositiveIntegerField()
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_succeeded_at = models.DateTimeField(null=True, blank=True)
    last_failed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    rows_seen = models.PositiveIntegerField(default=0)
    rows_acted = models.PositiveIntegerField(default=0)
    # The stall alert for the current silence was raised (reset on success).
    stall_alerted_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


class DailySales(models.Model):
    """Analytics, materialized from purchase.confirmed / purchase.cancelled
    through the inbox (each message counted exactly once)."""

    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="+")
    day = models.DateField()
    currency = models.CharField(max_length=3)
    confirmed_count = models.PositiveIntegerField(default=0)
    confirmed_amount = models.BigIntegerField(default=0)
    cancelled_count = models.PositiveIntegerField(default=0)
    refunded_count = models.PositiveIntegerField(default=0)
    refunded_amount = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["event", "day", "currency"], name="daily_sales_once"),
        ]
        verbose_name_plural = "daily sales"

    def __str__(self) -> str:
        return f"{self.event_id} {self.day}"


class AuditRun(models.Model):
    """One run of the invariant auditor: what it checked and what it found."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    sagas_checked = models.PositiveIntegerField(default=0)
    violations = models.PositiveIntegerField(default=0)
    report = models.JSONField(default=list)
    # Intents whose money the run could not verify (the gateway gave no
    # answer): an incomplete run, which is not a violation.
    unverified = models.PositiveIntegerField(default=0)
    unverified_report = models.JSONField(default=list)
    gateway_url = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        incomplete = f", {self.unverified} unverified" if self.unverified else ""
        return f"audit {self.started_at:%Y-%m-%d %H:%M} ({self.violations} violations{incomplete})"
