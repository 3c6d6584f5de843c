"""The purchase saga: domain operations (writes).

Each top-level service owns its transactions (``atomic(durable=True)``, so
nesting one by accident fails loudly) and never calls the gateway inside one:
a step commits what it is about to do, calls out, then records the answer in
a second short transaction. Every transition is one commit: a conditional
update on (state, version), the history row, and the outbox/timer/ledger rows
the move implies.

Services are keyword-only and take an injectable clock (``now``) and gateway.
Views, tasks, consumers, admin actions and commands only call them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from config import metrics
from config.transactions import in_transaction
from ledger.models import EntryKind
from ledger.services import ledger_has_charge, ledger_record
from outbox.models import OutboxMessage
from outbox.services import outbox_publish, timer_cancel, timer_schedule
from payments.interface import (
    CancelOutcome,
    ChargeOutcome,
    ChargeRequest,
    ChargeResult,
    IntentStatus,
    PaymentGateway,
    RefundOutcome,
)

from . import lock_objects
from .errors import (
    DomainError,
    IdempotencyKeyReused,
    IllegalTransition,
    SeatUnavailable,
    StaleSaga,
    UnknownEvent,
    UnknownSeats,
)
from .models import (
    Actor,
    Event,
    IdempotencyRecord,
    PurchaseSaga,
    ReconciliationProbe,
    Reservation,
    ReservationSeat,
    ReservationStatus,
    SagaHistory,
    Seat,
    SeatStatus,
)
from .states import TRANSITIONS, SagaState

logger = logging.getLogger(__name__)

S = SagaState

TOPIC_HOLD_EXPIRED = "purchase.hold_expired"
# A hold that expired while the gateway could not be reached: ask again.
TOPIC_HOLD_RECHECK = "purchase.hold_recheck"
TOPIC_RECONCILE = "purchase.reconcile"
TOPIC_REFUND_RETRY = "purchase.refund_retry"
TOPIC_CONFIRMED = "PurchaseConfirmed"
TOPIC_CANCELLED = "ReservationCancelled"
TOPIC_NEEDS_OPERATOR = "SagaNeedsOperator"


def _now(now: datetime | None) -> datetime:
    return now or timezone.now()


def _gateway(gateway: PaymentGateway | None) -> PaymentGateway:
    if gateway is not None:
        return gateway
    from payments.gateway import get_gateway

    return get_gateway()


def _log(saga: PurchaseSaga | None = None, **extra) -> dict:
    if saga is not None:
        extra.setdefault("saga_id", str(saga.pk))
        extra.setdefault("state", saga.state)
    return {"extra": extra}


# --------------------------------------------------------------------------
# Transitions
# --------------------------------------------------------------------------


def _transition(
    saga: PurchaseSaga,
    to: SagaState,
    *,
    reason: str,
    now: datetime,
    actor: str = Actor.SYSTEM,
    actor_name: str = "",
    count_attempt: bool = False,
) -> PurchaseSaga:
    """Move ``saga`` to ``to`` inside the caller's transaction.

    The table decides first (an illegal move raises before anything is
    written); then a conditional update on (state, version) makes the move,
    so a saga changed behind our back is a :class:`StaleSaga` verdict.
    """
    if not in_transaction():
        raise RuntimeError("a transition belongs inside its commit")
    source = SagaState(saga.state)
    if to not in TRANSITIONS[source]:
        raise IllegalTransition(source, to)
    changes = {
        "state": to,
        "version": F("version") + 1,
        "updated_at": now,
        "attempts": F("attempts") + (1 if count_attempt else 0),
        # Any move ends a wait for an operator (the move is the verdict).
        "awaiting_operator_since": None,
    }
    if to == S.COMPENSATING and saga.compensation_started_at is None:
        changes["compensation_started_at"] = now
    updated = PurchaseSaga.objects.filter(pk=saga.pk, state=source, version=saga.version).update(
        **changes
    )
    if updated != 1:
        raise StaleSaga(f"saga {saga.pk} is no longer {source} v{saga.version}")
    saga.state = to
    saga.version += 1
    saga.updated_at = now
    saga.awaiting_operator_since = None
    saga.compensation_started_at = changes.get("compensation_started_at",
                                               saga.compensation_started_at)
    if count_attempt:
        saga.attempts += 1
    SagaHistory.objects.create(
        saga=saga,
        from_state=source,
        to_state=to,
        at=now,
        reason=reason[:500],
        actor=actor,
        actor_name=actor_name,
        version=saga.version,
    )
    logger.info("saga %s -> %s: %s", source, to, reason, **_log(saga, actor=actor))
    transaction.on_commit(
        lambda: metrics.TRANSITIONS.labels(from_state=source.value, to_state=to.value).inc()
    )
    return saga


def _note(
    saga: PurchaseSaga,
    *,
    reason: str,
    now: datetime,
    actor: str = Actor.SYSTEM,
    actor_name: str = "",
) -> None:
    """A history entry that records a decision without a move (a refusal)."""
    SagaHistory.objects.create(
        saga=saga,
        from_state=saga.state,
        to_state=saga.state,
        at=now,
        reason=reason[:500],
        actor=actor,
        actor_name=actor_name,
        version=saga.version,
    )
    logger.info("saga note: %s", reason, **_log(saga, actor=actor))


def saga_transition(
    *,
    saga_id,
    to: SagaState,
    reason: str,
    actor: str = Actor.SYSTEM,
    actor_name: str = "",
    now: datetime | None = None,
) -> PurchaseSaga:
    """A bare, guarded move (operators' tooling and tests of the table)."""
    now = _now(now)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        return _transition(saga, to, reason=reason, now=now, actor=actor, actor_name=actor_name)


# --------------------------------------------------------------------------
# Start: one transaction under the request
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class PurchaseStarted:
    saga_id: str
    status_code: int
    body: dict
    created: bool  # False when this is a replay of the first answer


def request_fingerprint(*, event_id: int, seat_refs: list[str], payment_method: str) -> str:
    canonical = json.dumps(
        {"event": event_id, "seats": list(seat_refs), "payment_method": payment_method},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _new_reservation_ref() -> str:
    return "R" + secrets.token_hex(6).upper()


def intent_id_for(reservation_ref: str) -> str:
    return f"pi_{reservation_ref}"


class _KeyTaken(Exception):
    """Another request with the same key committed first (or is committing)."""


class _Refused(Exception):
    """This body is refused, unless its key already has an answer."""

    def __init__(self, error: DomainError):
        super().__init__(str(error))
        self.error = error


def _unknown(*, event_id: int, seats: list, missing: list[str]) -> DomainError:
    if not seats and not Event.objects.filter(pk=event_id).exists():
        return UnknownEvent(event_id)
    return UnknownSeats(missing)


_CLAIM_KEY_SQL = """
INSERT INTO {table} (user_id, key, request_hash, response_status, response_body, saga_id,
                     created_at)
VALUES (%s, %s, %s, 202, %s, %s, %s)
ON CONFLICT (user_id, key) DO NOTHING
RETURNING id
"""


def _claim_key(*, user, key: str, fingerprint: str, body: dict, saga_id, now) -> bool:
    """Insert the idempotency record unless the key is taken; True if inserted.

    ``ON CONFLICT DO NOTHING`` waits for a concurrent insert of the same key
    and answers nothing if that one commits: no savepoint, no error to catch.
    The saga it points to is inserted later in the same transaction (the
    foreign key is checked at commit).
    """
    meta = IdempotencyRecord._meta
    params = [
        user.pk, key, fingerprint,
        meta.get_field("response_body").get_db_prep_value(body, connection),
        meta.get_field("saga").get_db_prep_value(saga_id, connection),
        meta.get_field("created_at").get_db_prep_value(now, connection),
    ]
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_KEY_SQL.format(table=meta.db_table), params)
        return cursor.fetchone() is not None


def _replay(*, user, idempotency_key: str, fingerprint: str) -> PurchaseStarted | None:
    record = (
        IdempotencyRecord.objects.filter(user=user, key=idempotency_key)
        .only("request_hash", "response_status", "response_body", "saga_id")
        .first()
    )
    if record is None:
        return None
    if record.request_hash != fingerprint:
        raise IdempotencyKeyReused(
            "this Idempotency-Key was already used with a different request body"
        )
    return PurchaseStarted(
        saga_id=str(record.saga_id),
        status_code=record.response_status,
        body=_in_answer_order(record.response_body),
        created=False,
    )


_ANSWER_KEYS = ("id", "status", "event", "seats", "total", "hold_expires_at", "links")


def _in_answer_order(body: dict) -> dict:
    # jsonb does not keep key order; a replay must be byte-identical to the
    # first answer, so both are rendered in this one order.
    ordered = {k: body[k] for k in _ANSWER_KEYS if k in body}
    ordered.update({k: v for k, v in body.items() if k not in ordered})
    if isinstance(ordered.get("total"), dict):
        ordered["total"] = {
            "amount": ordered["total"]["amount"],
            "currency": ordered["total"]["currency"],
        }
    return ordered


def purchase_start(
    *,
    user,
    idempotency_key: str,
    event_id: int,
    seat_refs: list[str],
    payment_method: str,
    now: datetime | None = None,
) -> PurchaseStarted:
    """Hold the seats and start the saga, or replay the first answer for the key.

    One transaction: idempotency record, seats locked (by pk), reservation
    HELD, saga PENDING, history, hold-expiry timer. The charge is enqueued on
    commit. A taken seat rolls back everything.
    """
    now = _now(now)
    fingerprint = request_fingerprint(
        event_id=event_id, seat_refs=seat_refs, payment_method=payment_method
    )
    hold_expires_at = now + timedelta(seconds=settings.PURCHASE_HOLD_SECONDS)
    saga = PurchaseSaga(
        event_id=event_id,
        buyer=user,
        payment_method=payment_method,
        state=S.PENDING,
        version=1,
        created_at=now,
        updated_at=now,
    )
    # One transaction and one commit; a replay (the key is taken) and every
    # refusal roll it back. The statements are few on purpose: this is the
    # request path (README, "Performance").
    try:
        with transaction.atomic(durable=True):
            # Prices and refs of a seat never change: read them without a
            # lock to write the answer; availability is decided under the
            # lock below.
            seats = list(
                Seat.objects.filter(event_id=event_id, ref__in=seat_refs)
                .only("id", "ref", "price_amount", "currency")
                .order_by("id")
            )
            missing = sorted(set(seat_refs) - {s.ref for s in seats})
            if missing:
                raise _Refused(_unknown(event_id=event_id, seats=seats, missing=missing))
            currencies = {s.currency for s in seats}
            if len(currencies) != 1:
                raise _Refused(UnknownSeats(sorted(seat_refs)))  # one purchase, one currency
            saga.currency = currencies.pop()
            saga.amount = sum(s.price_amount for s in seats)
            body = {
                "id": str(saga.id),
                "status": S.PENDING.value,
                "event": event_id,
                # In seat order, as the purchase's detail lists them.
                "seats": [s.ref for s in seats],
                "total": {"amount": saga.amount, "currency": saga.currency},
                "hold_expires_at": hold_expires_at.isoformat().replace("+00:00", "Z"),
                "links": {"self": f"/api/purchases/{saga.id}/"},
            }
            # First write: a concurrent duplicate waits here on the unique
            # index until we commit or roll back, then replays our answer.
            if not _claim_key(user=user, key=idempotency_key, fingerprint=fingerprint,
                              body=body, saga_id=saga.id, now=now):
                raise _KeyTaken

            held = lock_objects.seats_hold(event_id=event_id, seat_ids=[s.id for s in seats])
            if len(held) != len(seats):
                raise SeatUnavailable(sorted(s.ref for s in seats if s.id not in held))

            reservation = Reservation.objects.create(
                ref=_new_reservation_ref(),
                event_id=event_id,
                buyer=user,
                status=ReservationStatus.HELD,
                hold_expires_at=hold_expires_at,
                total_amount=saga.amount,
                currency=saga.currency,
                created_at=now,
            )
            ReservationSeat.objects.bulk_create(
                [
                    ReservationSeat(reservation=reservation, seat_id=s.id, event_id=event_id)
                    for s in seats
                ]
            )
            saga.reservation = reservation
            saga.intent_id = intent_id_for(reservation.ref)
            saga.save(force_insert=True)
            SagaHistory.objects.create(
                saga=saga,
                from_state=None,
                to_state=S.PENDING,
                at=now,
                reason="purchase started",
                actor=Actor.SYSTEM,
                version=saga.version,
            )
            timer_schedule(
                key=saga.hold_timer_key,
                topic=TOPIC_HOLD_EXPIRED,
                payload={"saga_id": str(saga.id)},
                due_at=hold_expires_at,
                event_id=event_id,
                saga_id=saga.id,
                now=now,
            )
            saga_id = str(saga.id)
            transaction.on_commit(lambda: _enqueue_charge(saga_id), robust=True)
    except (_KeyTaken, _Refused) as exc:
        # The key's first answer wins over any refusal of this body: the same
        # body replays it, another body is refused as a reused key (422).
        replay = _replay(user=user, idempotency_key=idempotency_key, fingerprint=fingerprint)
        if replay is not None:
            return replay
        if isinstance(exc, _Refused):
            raise exc.error from None
        raise  # pragma: no cover - the unique index said the key exists

    logger.info("purchase started", **_log(saga, seats=",".join(seat_refs)))
    return PurchaseStarted(saga_id=str(saga.id), status_code=202, body=body, created=True)


def _enqueue_charge(saga_id: str) -> None:
    # If this fails (broker down), the saga stays PENDING and the resumer
    # drives it; robust=True keeps the committed purchase's 202.
    from .tasks import saga_charge_task

    saga_charge_task.delay(saga_id)


# --------------------------------------------------------------------------
# Charge
# --------------------------------------------------------------------------


def saga_charge(
    *,
    saga_id,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
    actor: str = Actor.SYSTEM,
    actor_name: str = "",
) -> PurchaseSaga:
    """Charge the card: mark CHARGING and commit, call, record the answer.

    Acts only on PENDING (a retry after a definite "no charge" comes through
    :func:`saga_reconcile`). Any other state means the saga has moved on: the
    step returns without calling the gateway, so a late or duplicate task can
    never charge a released seat.
    """
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        if saga.state != S.PENDING:
            logger.info("charge skipped: saga has moved on", **_log(saga))
            return saga
        at = _now(now)
        hold_ran_out = _hold_ran_out(saga, at)
        if not hold_ran_out:
            _transition(
                saga,
                S.CHARGING,
                reason="charge started",
                now=at,
                actor=actor,
                actor_name=actor_name,
                count_attempt=True,
            )
    if hold_ran_out:
        # The relay and the workers were down past the hold: the seats are no
        # longer the buyer's to pay for. Settle it as the expiry would (cancel
        # the intent first), never with a first charge.
        logger.warning("charge refused: the hold ran out first", **_log(saga))
        return saga_expire_hold(saga_id=saga_id, gateway=gateway, now=now)
    return _charge_and_record(
        saga=saga, gateway=_gateway(gateway), now=now, actor=actor, actor_name=actor_name
    )


def _hold_ran_out(saga: PurchaseSaga, at: datetime) -> bool:
    return at >= saga.reservation.hold_expires_at


def _charge_and_record(
    *,
    saga: PurchaseSaga,
    gateway: PaymentGateway,
    now: datetime | None,
    actor: str,
    actor_name: str = "",
    probe_attempt: int = 0,
) -> PurchaseSaga:
    result = gateway.charge(
        ChargeRequest(
            intent_id=saga.intent_id,
            amount=saga.amount,
            currency=saga.currency,
            payment_method=saga.payment_method,
        )
    )
    return saga_record_charge(
        saga_id=saga.pk,
        expected_version=saga.version,
        result=result,
        gateway=gateway,
        now=now,
        actor=actor,
        actor_name=actor_name,
        probe_attempt=probe_attempt,
    )


def saga_record_charge(
    *,
    saga_id,
    expected_version: int,
    result: ChargeResult,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
    actor: str = Actor.SYSTEM,
    actor_name: str = "",
    probe_attempt: int = 0,
) -> PurchaseSaga:
    """Record the gateway's answer to the charge made at ``expected_version``.

    ``probe_attempt`` is how many reconcile probes this saga has had: a charge
    retried after "no charge found" keeps its place in the backoff schedule.
    """
    at = _now(now)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        _probe(
            saga,
            asked="charge",
            answer=result.outcome.lower(),
            detail=result.detail,
            latency_ms=result.latency_ms,
            now=at,
        )
        if saga.state != S.CHARGING or saga.version != expected_version:
            # Someone else moved it while we were on the wire (the hold expiry
            # after a definitive gateway answer, or a reconcile). Their verdict
            # stands; ours is kept as evidence above.
            logger.warning(
                "charge answer arrived for a saga that moved on",
                **_log(saga, outcome=result.outcome, expected_version=expected_version),
            )
            return saga
        if result.outcome == ChargeOutcome.SUCCEEDED:
            _confirm(
                saga,
                charge_id=result.charge_id or "",
                reason="charge succeeded",
                now=at,
                actor=actor,
                actor_name=actor_name,
            )
            return saga
        if result.outcome == ChargeOutcome.DECLINED:
            _transition(
                saga,
                S.PAYMENT_FAILED,
                reason=f"charge declined ({result.detail})",
                now=at,
                actor=actor,
                actor_name=actor_name,
            )
        else:
            _transition(
                saga,
                S.UNKNOWN,
                reason=f"charge outcome unknown ({result.detail})",
                now=at,
                actor=actor,
                actor_name=actor_name,
            )
            _next_probe_or_escalate(
                saga, attempt=probe_attempt + 1, now=at, actor=actor, actor_name=actor_name
            )
    if saga.state == S.PAYMENT_FAILED:
        return saga_compensate(
            saga_id=saga.pk, gateway=gateway, now=now, actor=actor, actor_name=actor_name
        )
    return saga


def _probe(
    saga: PurchaseSaga,
    *,
    asked: str,
    answer: str,
    detail: str,
    latency_ms: float,
    now: datetime,
    attempt: int = 0,
) -> None:
    """Keep the gateway's answer as evidence beside the saga (and count it)."""
    logger.info(
        "gateway %s answered %s",
        asked,
        answer,
        **_log(saga, intent_id=saga.intent_id, latency_ms=round(latency_ms, 1), detail=detail),
    )
    metrics.GATEWAY_REQUESTS.labels(method=asked, outcome=answer).inc()
    metrics.GATEWAY_LATENCY.labels(method=asked).observe(latency_ms / 1000)
    if asked == "retrieve":
        metrics.RECONCILE_PROBES.labels(answer=answer).inc()
    ReconciliationProbe.objects.create(
        saga=saga,
        event_id=saga.event_id,
        at=now,
        asked=asked,
        answer=answer,
        detail=detail[:200],
        latency_ms=latency_ms,
        attempt=attempt,
    )


def _confirm(
    saga: PurchaseSaga,
    *,
    charge_id: str,
    reason: str,
    now: datetime,
    actor: str = Actor.SYSTEM,
    actor_name: str = "",
    note: str = "",
    override: bool = False,
) -> None:
    """CONFIRMED in one commit: ledger, seats sold, reservation, timer, event."""
    if saga.state == S.PENDING:
        # The gateway says charged while we had not yet recorded the attempt
        # (a crash between the two commits): record the attempt first.
        _transition(
            saga,
            S.CHARGING,
            reason="charge found at the gateway",
            now=now,
            actor=actor,
            actor_name=actor_name,
            count_attempt=True,
        )
    _transition(saga, S.CONFIRMED, reason=reason, now=now, actor=actor, actor_name=actor_name)
    ledger_record(
        intent_id=saga.intent_id,
        kind=EntryKind.CHARGE,
        amount=saga.amount,
        currency=saga.currency,
        saga_id=saga.pk,
        event_id=saga.event_id,
        now=now,
        gateway_reference=charge_id,
        note=note,
        override=override,
    )
    seat_ids = list(
        ReservationSeat.objects.filter(
            reservation_id=saga.reservation_id, released_at__isnull=True
        ).values_list("seat_id", flat=True)
    )
    sold = Seat.objects.filter(id__in=seat_ids, status=SeatStatus.HELD).update(
        status=SeatStatus.SOLD
    )
    if sold != len(seat_ids):
        # The seats were released under us: an invariant is broken. Refuse the
        # whole commit; the charge stays recorded at the gateway and the
        # reconcile/operator path settles it.
        raise IllegalTransition(saga.state, "CONFIRMED with seats not held")
    Reservation.objects.filter(pk=saga.reservation_id).update(status=ReservationStatus.CONFIRMED)
    cancel = timer_cancel(key=saga.hold_timer_key, now=now)
    logger.info("hold timer %s", cancel.status, **_log(saga))
    outbox_publish(
        topic=TOPIC_CONFIRMED,
        payload=_purchase_facts(saga),
        key=f"confirmed:{saga.pk}",
        event_id=saga.event_id,
        saga_id=saga.pk,
        now=now,
    )


def _purchase_facts(saga: PurchaseSaga) -> dict:
    reservation = saga.reservation
    return {
        "saga_id": str(saga.pk),
        "reservation": reservation.ref,
        "event_id": saga.event_id,
        "buyer_id": saga.buyer_id,
        # Who to write to, as of the purchase: the email consumers need no
        # read of their own.
        "buyer": get_user_model().objects.values("username", "email").get(pk=saga.buyer_id),
        "seats": sorted(
            ReservationSeat.objects.filter(reservation=reservation).values_list(
                "seat__ref", flat=True
            )
        ),
        "amount": saga.amount,
        "currency": saga.currency,
        "intent_id": saga.intent_id,
    }


# --------------------------------------------------------------------------
# Reconciliation of UNKNOWN: look it up, never compensate blind
# --------------------------------------------------------------------------


def _backoff() -> list[int]:
    return list(settings.RECONCILE_BACKOFF_SECONDS)


def _arm_reconcile(saga: PurchaseSaga, *, attempt: int, now: datetime) -> None:
    delay = _backoff()[attempt - 1]
    timer_schedule(
        key=f"reconcile:{saga.pk}:{saga.version}:{attempt}",
        topic=TOPIC_RECONCILE,
        payload={"saga_id": str(saga.pk), "attempt": attempt, "version": saga.version},
        due_at=now + timedelta(seconds=delay),
        event_id=saga.event_id,
        saga_id=saga.pk,
        now=now,
        # The resumer may re-drive a probe whose successor is already armed.
        if_absent=True,
    )


def _next_probe_or_escalate(
    saga: PurchaseSaga, *, attempt: int, now: datetime, actor: str, actor_name: str = ""
) -> None:
    if attempt <= len(_backoff()):
        _arm_reconcile(saga, attempt=attempt, now=now)
        return
    _transition(
        saga,
        S.UNKNOWN_EXPIRED,
        reason=f"reconcile schedule exhausted after {attempt - 1} probes",
        now=now,
        actor=actor,
        actor_name=actor_name,
    )
    raise_operator_alert(saga, why="reconciliation exhausted", now=now)


def raise_operator_alert(
    saga: PurchaseSaga, *, why: str, now: datetime, once_per: str | None = None
) -> bool:
    """Alert once per saga per escalation; True if raised now.

    An escalation is the saga's version by default (a move to an escalated
    state is one escalation). ``once_per`` names one that outlives versions,
    such as a compensation past its deadline, whose refund retries move the
    saga again and again: keyed by version it would be raised on every retry.
    """
    key = f"needs_operator:{saga.pk}:{once_per or saga.version}"
    if OutboxMessage.objects.filter(key=key).exists():
        return False
    logger.error("saga needs an operator: %s", why, **_log(saga, alert="saga_needs_operator"))
    metrics.ALERTS.labels(kind="saga_needs_operator").inc()
    outbox_publish(
        topic=TOPIC_NEEDS_OPERATOR,
        payload={"saga_id": str(saga.pk), "state": saga.state, "why": why},
        key=key,
        event_id=saga.event_id,
        saga_id=saga.pk,
        now=now,
    )
    return True


def saga_reconcile(
    *,
    saga_id,
    attempt: int = 1,
    expected_version: int | None = None,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
    actor: str = Actor.SYSTEM,
    actor_name: str = "",
) -> PurchaseSaga:
    """Probe the gateway about an UNKNOWN saga and act on a definitive answer.

    ``succeeded`` confirms; ``declined`` compensates; ``not_found`` or
    ``requires_payment`` (no charge landed) charges again with the same key;
    no answer arms the next probe, or escalates when the schedule is done.
    """
    gateway = _gateway(gateway)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        if saga.state not in (S.UNKNOWN, S.CHARGING) or (
            expected_version is not None and saga.version != expected_version
        ):
            logger.info("reconcile skipped: saga has moved on", **_log(saga))
            return saga
        version = saga.version
    lookup = gateway.retrieve(saga.intent_id)
    # This commit's own instant; the steps it leads to (a charge, a
    # compensation) take theirs, after their own network calls.
    at = _now(now)
    retry_charge = expire_instead = False
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        _probe(
            saga,
            asked="retrieve",
            answer=lookup.status.value,
            detail=lookup.detail,
            latency_ms=lookup.latency_ms,
            now=at,
            attempt=attempt,
        )
        if saga.version != version:
            return saga
        if saga.state == S.CHARGING:
            # A charge whose answer was lost (worker died): treat as unknown.
            _transition(
                saga,
                S.UNKNOWN,
                reason="charge answer lost; reconciling",
                now=at,
                actor=actor,
                actor_name=actor_name,
            )
        status = lookup.status
        if status == IntentStatus.SUCCEEDED:
            _confirm(
                saga,
                charge_id=lookup.charge_id or "",
                reason="reconciled: charged at the gateway",
                now=at,
                actor=actor,
                actor_name=actor_name,
            )
            return saga
        if status == IntentStatus.DECLINED:
            _transition(
                saga,
                S.PAYMENT_FAILED,
                reason="reconciled: declined at the gateway",
                now=at,
                actor=actor,
                actor_name=actor_name,
            )
        elif status in (IntentStatus.NOT_FOUND, IntentStatus.REQUIRES_PAYMENT):
            if _hold_ran_out(saga, at):
                # No charge landed, and the hold is over: a retry now would be
                # a first charge for seats no longer held for it.
                _note(
                    saga,
                    reason=f"reconciled: {status.value}; the hold ran out, not charging again",
                    now=at,
                    actor=actor,
                    actor_name=actor_name,
                )
                expire_instead = True
            else:
                _transition(
                    saga,
                    S.CHARGING,
                    reason=f"reconciled: {status.value}; charging again",
                    now=at,
                    actor=actor,
                    actor_name=actor_name,
                    count_attempt=True,
                )
                retry_charge = True
        elif status in (IntentStatus.CANCELED, IntentStatus.REFUNDED):
            # Only we cancel or refund an intent; seeing it here means a step
            # of ours committed at the gateway and died before recording it.
            _transition(
                saga,
                S.UNKNOWN_EXPIRED,
                reason=f"gateway reports {status.value} for an unsettled saga",
                now=at,
                actor=actor,
                actor_name=actor_name,
            )
            raise_operator_alert(saga, why=f"gateway reports {status.value}", now=at)
        else:
            _note(
                saga,
                reason=f"reconcile probe {attempt}: no answer ({lookup.detail})",
                now=at,
                actor=actor,
                actor_name=actor_name,
            )
            _next_probe_or_escalate(
                saga, attempt=attempt + 1, now=at, actor=actor, actor_name=actor_name
            )
    if expire_instead:
        return saga_expire_hold(saga_id=saga_id, gateway=gateway, now=now)
    if retry_charge:
        return _charge_and_record(
            saga=saga,
            gateway=gateway,
            now=now,
            actor=actor,
            actor_name=actor_name,
            probe_attempt=attempt,
        )
    if saga.state == S.PAYMENT_FAILED:
        return saga_compensate(
            saga_id=saga.pk, gateway=gateway, now=now, actor=actor, actor_name=actor_name
        )
    return saga


# --------------------------------------------------------------------------
# Hold expiry: an obligation delivered by the relay; decide from the state
# --------------------------------------------------------------------------

_NEEDS_DEFINITIVE_ANSWER = (S.PENDING, S.CHARGING, S.UNKNOWN, S.UNKNOWN_EXPIRED)


def saga_expire_hold(
    *,
    saga_id,
    attempt: int = 0,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
) -> PurchaseSaga:
    """The hold ran out. Re-read the saga under its lock and decide.

    CONFIRMED: refuse (recorded). A charge outcome that is not definitive:
    cancel the intent at the gateway first, so that no charge can land later,
    and only then release the seats; if the gateway says it was charged,
    confirm instead. The seats are never released on an assumption.
    """
    gateway = _gateway(gateway)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        state = SagaState(saga.state)
        if state == S.CONFIRMED:
            _note(saga, reason="expiry refused: confirmed", now=_now(now))
            return saga
        if state not in _NEEDS_DEFINITIVE_ANSWER:
            _note(saga, reason=f"expiry: nothing to do in {state}", now=_now(now))
            drive = state in (S.PAYMENT_FAILED, S.EXPIRED, S.COMPENSATING)
        else:
            drive = False
        version = saga.version
    if state not in _NEEDS_DEFINITIVE_ANSWER:
        if drive:  # a compensation that stalled: push it along (idempotent)
            return saga_compensate(saga_id=saga_id, gateway=gateway, now=now)
        return saga

    answer = gateway.cancel(saga.intent_id)
    at = _now(now)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        _probe(
            saga,
            asked="cancel",
            answer=answer.outcome.value,
            detail=answer.detail,
            latency_ms=answer.latency_ms,
            now=at,
            attempt=attempt,
        )
        if saga.version != version and saga.state not in _NEEDS_DEFINITIVE_ANSWER:
            return saga  # moved on while we asked; the gateway's answer stays as evidence
        if answer.outcome == CancelOutcome.CANCELED:
            _transition(
                saga, S.EXPIRED, reason="hold expired; intent canceled at the gateway", now=at
            )
        elif answer.outcome == CancelOutcome.ALREADY_CHARGED:
            _confirm(saga, charge_id=answer.charge_id or "",
                     reason="hold expired but the gateway had charged", now=at)
            return saga
        else:
            backoff = _backoff()
            if attempt >= len(backoff) - 1:
                raise_operator_alert(
                    saga, why="hold expired and the gateway cannot be reached", now=at
                )
            _note(
                saga,
                reason=f"expiry: gateway unreachable ({answer.detail}); will ask again",
                now=at,
            )
            delay = backoff[min(attempt, len(backoff) - 1)]
            timer_schedule(
                key=f"hold:{saga.pk}:retry:{attempt + 1}",
                topic=TOPIC_HOLD_RECHECK,
                payload={"saga_id": str(saga.pk), "attempt": attempt + 1},
                due_at=at + timedelta(seconds=delay),
                event_id=saga.event_id,
                saga_id=saga.pk,
                now=at,
                # A redelivered recheck (its worker died before the inbox
                # entry) finds its successor armed already.
                if_absent=True,
            )
            return saga
    return saga_compensate(saga_id=saga_id, gateway=gateway, now=now)


# --------------------------------------------------------------------------
# Compensation: reverse order, idempotent by state
# --------------------------------------------------------------------------

_COMPENSABLE = (S.PAYMENT_FAILED, S.EXPIRED, S.COMPENSATION_PENDING)


def saga_compensate(
    *,
    saga_id,
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
    actor: str = Actor.SYSTEM,
    actor_name: str = "",
    reason: str = "compensating",
    refund_confirmed: bool = False,
    operator_override: bool = False,
) -> PurchaseSaga:
    """Undo a purchase: refund (if charged) -> free seats -> event -> email.

    Idempotent by state: COMPENSATED is a no-op, COMPENSATING resumes where it
    stopped. ``refund_confirmed`` allows starting from CONFIRMED (a refund
    asked for by customer service, see :func:`purchase_refund`);
    ``operator_override`` allows UNKNOWN_EXPIRED, which only an operator who
    has checked the gateway (and cancelled the intent) may compensate.
    """
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        state = SagaState(saga.state)
        if saga.awaiting_operator_since is not None and actor != Actor.OPERATOR:
            # The gateway contradicted the ledger: only an operator's verdict
            # moves this saga (a late retry timer or the resumer must not).
            logger.info("compensation skipped: waiting for an operator", **_log(saga))
            return saga
        if (
            state in _COMPENSABLE
            or (state == S.CONFIRMED and refund_confirmed)
            or (state == S.UNKNOWN_EXPIRED and operator_override)
        ):
            _transition(
                saga,
                S.COMPENSATING,
                reason=reason,
                now=_now(now),
                actor=actor,
                actor_name=actor_name,
            )
        elif state != S.COMPENSATING:
            logger.info("compensation skipped in %s", state, **_log(saga))
            return saga
        needs_refund = ledger_has_charge(intent_id=saga.intent_id) and not _refunded(saga)
        version = saga.version

    refund_reference = ""
    if needs_refund:
        gateway = _gateway(gateway)
        result = gateway.refund(saga.intent_id, idempotency_key=f"refund:{saga.intent_id}")
        at = _now(now)
        with transaction.atomic(durable=True):
            saga = lock_objects.saga_for_update(saga_id=saga_id)
            _probe(
                saga,
                asked="refund",
                answer=result.outcome.value,
                detail=result.detail,
                latency_ms=result.latency_ms,
                now=at,
            )
            if saga.version != version or saga.state != S.COMPENSATING:
                return saga
            if result.outcome == RefundOutcome.NOT_CHARGED:
                # Definitive, and a contradiction: our ledger says charged, the
                # gateway says not. Asking again cannot change that; an
                # operator compares the two (docs: the runbook).
                _transition(
                    saga,
                    S.COMPENSATION_PENDING,
                    reason="refund refused: the gateway has no charge; waiting for an operator",
                    now=at,
                    actor=actor,
                    actor_name=actor_name,
                )
                PurchaseSaga.objects.filter(pk=saga.pk).update(awaiting_operator_since=at)
                saga.awaiting_operator_since = at
                raise_operator_alert(
                    saga, why="the gateway has no charge for a refund the ledger owes", now=at
                )
                return saga
            if result.outcome != RefundOutcome.REFUNDED:
                _transition(
                    saga,
                    S.COMPENSATION_PENDING,
                    reason=f"refund not confirmed ({result.outcome.value}); will retry",
                    now=at,
                    actor=actor,
                    actor_name=actor_name,
                )
                _arm_refund_retry(saga, now=at)
                return saga
        refund_reference = f"refund:{saga.intent_id}"

    at = _now(now)
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        if saga.state != S.COMPENSATING:
            return saga
        if refund_reference:
            ledger_record(
                intent_id=saga.intent_id,
                kind=EntryKind.REFUND,
                amount=-saga.amount,
                currency=saga.currency,
                saga_id=saga.pk,
                event_id=saga.event_id,
                now=at,
                gateway_reference=refund_reference,
            )
        _finish_compensation(
            saga,
            now=at,
            actor=actor,
            actor_name=actor_name,
            refunded=bool(refund_reference) or _refunded(saga),
        )
    return saga


def _finish_compensation(
    saga: PurchaseSaga,
    *,
    now: datetime,
    actor: str,
    actor_name: str,
    refunded: bool,
    reason: str = "compensated",
) -> None:
    """The last commit of a compensation: seats, reservation, event, state.

    The email is the consumer's, after this commits (reverse order: refund,
    seats, event, email).
    """
    was_confirmed = Reservation.objects.filter(
        pk=saga.reservation_id, status=ReservationStatus.CONFIRMED
    ).exists()
    _release_seats(saga, now=now)
    Reservation.objects.filter(pk=saga.reservation_id).update(status=ReservationStatus.CANCELLED)
    timer_cancel(key=saga.hold_timer_key, now=now)
    outbox_publish(
        topic=TOPIC_CANCELLED,
        payload={**_purchase_facts(saga), "was_confirmed": was_confirmed, "refunded": refunded},
        key=f"cancelled:{saga.pk}",
        event_id=saga.event_id,
        saga_id=saga.pk,
        now=now,
    )
    _transition(saga, S.COMPENSATED, reason=reason, now=now, actor=actor, actor_name=actor_name)


def _refunded(saga: PurchaseSaga) -> bool:
    from ledger.models import LedgerEntry

    return LedgerEntry.objects.filter(intent_id=saga.intent_id, kind=EntryKind.REFUND).exists()


def _arm_refund_retry(saga: PurchaseSaga, *, now: datetime) -> None:
    n = ReconciliationProbe.objects.filter(saga=saga, asked="refund").count()
    backoff = _backoff()
    timer_schedule(
        key=f"refund:{saga.pk}:{n}",
        topic=TOPIC_REFUND_RETRY,
        payload={"saga_id": str(saga.pk)},
        due_at=now + timedelta(seconds=backoff[min(n - 1, len(backoff) - 1)]),
        event_id=saga.event_id,
        saga_id=saga.pk,
        now=now,
    )


def _release_seats(saga: PurchaseSaga, *, now: datetime) -> None:
    links = ReservationSeat.objects.filter(
        reservation_id=saga.reservation_id, released_at__isnull=True
    )
    seat_ids = list(links.values_list("seat_id", flat=True))
    # Lock order: saga (held by the caller) -> seats.
    lock_objects.seats_for_update(event_id=saga.event_id, seat_ids=seat_ids)
    Seat.objects.filter(id__in=seat_ids).update(status=SeatStatus.AVAILABLE)
    links.update(released_at=now)


def purchase_refund(
    *,
    saga_id,
    reason: str,
    actor: str = Actor.OPERATOR,
    actor_name: str = "",
    gateway: PaymentGateway | None = None,
    now: datetime | None = None,
) -> PurchaseSaga:
    """Refund a CONFIRMED purchase: the full compensation, refund included.

    The buyer already has a confirmation email; the compensation's event
    carries ``was_confirmed`` so that the email consumer sends a correction.
    """
    with transaction.atomic(durable=True):
        saga = lock_objects.saga_for_update(saga_id=saga_id)
        if saga.state != S.CONFIRMED:
            raise IllegalTransition(saga.state, S.COMPENSATING)
    return saga_compensate(
        saga_id=saga_id,
        gateway=gateway,
        now=now,
        actor=actor,
        actor_name=actor_name,
        reason=f"refund requested: {reason}",
        refund_confirmed=True,
    )


# --------------------------------------------------------------------------
# Catalog writes
# --------------------------------------------------------------------------


def event_create_with_seats(
    *,
    name: str,
    starts_at: datetime,
    rows: str = "ABCDE",
    seats_per_row: int = 10,
    price_amount: int = 5000,
    currency: str = "EUR",
) -> Event:
    with transaction.atomic(durable=True):
        event = Event.objects.create(name=name, starts_at=starts_at)
        Seat.objects.bulk_create(
            [
                Seat(
                    event=event,
                    ref=f"{row}{n}",
                    row=row,
                    number=n,
                    price_amount=price_amount,
                    currency=currency,
                )
                for row in rows
                for n in range(1, seats_per_row + 1)
            ]
        )
    return event
