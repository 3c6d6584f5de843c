"""What the fake card processor does, one function per endpoint.

Each function owns its transaction (``atomic(durable=True)``), records the
request in :class:`FakeRequest`, and returns an :class:`Answer`: the HTTP status
and JSON body the processor gives, plus whether that answer "times out" (the
HTTP view then stalls for ``FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS`` *after* the
commit, so the client gives up on a request whose effects already landed).
The HTTP views and the in-process fake are thin wrappers around these.

Idempotency follows card processors: the first answer for a key (errors
included) is stored under the key's unique constraint and replayed verbatim;
answers that "time out" before processing are never stored. Concurrent requests
with the same key queue on the intent's row lock, and the loser of a race on
the key itself is rolled back (the whole transaction of a charge or of a
refund of a part, a whole-charge refund's savepoint) and replays the winner's
answer, so one key never yields two charges or two refunds. Row locks live
here rather than in a ``lock_objects`` module because this app *is* the
remote processor and locks a single row (the intent) per request.

A charge is the fake's hot path (one per purchase): its statements are
written once (``common.rows``), as the product's hottest are
(docs/performance.md, "The fake processor").

Test payment methods (docs/api.md):

- ``pm_card_visa`` charges;
- ``pm_card_chargeDeclined`` declines;
- ``pm_card_timeout_charged`` charges, and the answer that charged times out;
- ``pm_card_timeout_not_charged``: the first call per key is dropped before
  anything is recorded (504 after the stall); the retry charges;
- ``pm_card_unreachable``: every call times out and charges nothing; the intent
  reads ``requires_payment`` until cancelled.

Three more charge like ``pm_card_visa`` and decide what refunds of a part of
the charge (``POST payment_intents/<id>/refunds``) do:

- ``pm_card_refundPending``: each refund answers ``pending``; the first
  look-up of it (``GET refunds/<refund_id>``) answers ``succeeded``, settling it;
- ``pm_card_refundFail``: each refund answers ``failed``
  (``failure_reason`` ``expired_or_canceled_card``) and refunds nothing;
- ``pm_card_refundTimeout``: the first request per key makes the refund
  (``succeeded``) and its answer times out; later requests with the key
  replay it.

Every other card's refunds succeed. The whole-charge ``refund`` (the saga's
compensation) refunds what is left after them and always succeeds.

Chaos: the setting ``FAKE_GATEWAY_CHAOS_TIMEOUT_RATE`` (0..1, default 0)
makes that share of successful charges, whatever the payment method, behave
like ``pm_card_timeout_charged``: the charge and its stored answer commit,
and the answer times out. The same share of refunds made by
``POST …/refunds`` lose their answer the same way.
"""

from __future__ import annotations

import functools
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Sum
from django.utils import timezone

from common import rows
from common.time import iso_z

from .models import (
    FakeCharge,
    FakeDroppedCharge,
    FakeIdempotentAnswer,
    FakeIntent,
    FakeRefund,
    FakeRequest,
)

PM_VISA = "pm_card_visa"
PM_DECLINED = "pm_card_chargeDeclined"
PM_TIMEOUT_CHARGED = "pm_card_timeout_charged"
PM_TIMEOUT_NOT_CHARGED = "pm_card_timeout_not_charged"
PM_UNREACHABLE = "pm_card_unreachable"
PM_REFUND_PENDING = "pm_card_refundPending"
PM_REFUND_FAIL = "pm_card_refundFail"
PM_REFUND_TIMEOUT = "pm_card_refundTimeout"
PAYMENT_METHODS = frozenset(
    {
        PM_VISA,
        PM_DECLINED,
        PM_TIMEOUT_CHARGED,
        PM_TIMEOUT_NOT_CHARGED,
        PM_UNREACHABLE,
        PM_REFUND_PENDING,
        PM_REFUND_FAIL,
        PM_REFUND_TIMEOUT,
    }
)
# Why a pm_card_refundFail refund fails (one of Stripe's refund failure reasons).
REFUND_FAILURE_REASON = "expired_or_canceled_card"

# Keeps absurd amounts out of the bigint column (and mirrors processors' caps).
MAX_AMOUNT = 999_999_999_999
MAX_ID_LENGTH = 255

Status = FakeIntent.Status


@dataclass(frozen=True)
class Answer:
    status_code: int
    body: Any  # JSON-serialisable: a dict, or a list for list endpoints
    # The processor stalls before this answer leaves; the client times out.
    times_out: bool = False


def error(status_code: int, code: str, detail: str, **extra: Any) -> Answer:
    return Answer(status_code, {"code": code, "detail": detail, **extra})


# --- charge -------------------------------------------------------------------


def intent_charge(
    *,
    intent_id: str,
    idempotency_key: str,
    amount: Any,
    currency: Any,
    payment_method: Any,
) -> Answer:
    """``POST payment_intents/<intent_id>/charge``. ``amount``, ``currency`` and
    ``payment_method`` are taken as they came off the wire and validated here,
    so the HTTP and in-process paths refuse the same things."""

    def log(answer: Answer) -> None:
        _log(
            endpoint=FakeRequest.Endpoint.CHARGE,
            intent_id=intent_id,
            idempotency_key=idempotency_key,
            payment_method=payment_method if isinstance(payment_method, str) else "",
            answer=answer,
        )

    # Losing the race: another request stored an answer for this key first
    # (the same key used on another intent, so the intent's lock did not
    # serialise us), and the winner's answer is replayed.
    return _once(
        lambda: _charge(
            intent_id=intent_id,
            idempotency_key=idempotency_key,
            amount=amount,
            currency=currency,
            payment_method=payment_method,
        ),
        lost=lambda: _replay_after_race(
            endpoint=FakeIdempotentAnswer.Endpoint.CHARGE, idempotency_key=idempotency_key
        ),
        log=log,
    )


def _charge(
    *, intent_id: str, idempotency_key: str, amount: Any, currency: Any, payment_method: Any
) -> Answer:
    """The charge's answer. Storing it raises ``IntegrityError`` when another
    request stored one for the key first (:func:`intent_charge` replays)."""
    endpoint = FakeIdempotentAnswer.Endpoint.CHARGE
    if len(intent_id) > MAX_ID_LENGTH or len(idempotency_key) > MAX_ID_LENGTH:
        # Not stored: the key itself is unusable.
        return error(400, "invalid_request", f"ids are at most {MAX_ID_LENGTH} characters.")
    replay = _replay(endpoint=endpoint, idempotency_key=idempotency_key)
    if replay is not None:
        return replay

    refusal = _validate_charge(amount=amount, currency=currency, payment_method=payment_method)
    if refusal is not None:
        _store(
            endpoint=endpoint, idempotency_key=idempotency_key, intent_id=intent_id, answer=refusal
        )
        return refusal

    if payment_method == PM_UNREACHABLE:
        # The request never reaches the processor's core: nothing is charged and
        # nothing is stored for the key, but the intent exists (and reads
        # requires_payment) so look-ups and cancels behave normally.
        _intent_locked(
            intent_id=intent_id,
            status=Status.REQUIRES_PAYMENT,
            amount=amount,
            currency=currency,
            payment_method=payment_method,
        )
        return _gateway_timeout()

    if payment_method == PM_TIMEOUT_NOT_CHARGED:
        _, first_call = FakeDroppedCharge.objects.get_or_create(
            idempotency_key=idempotency_key, defaults={"intent_id": intent_id}
        )
        if first_call:
            # Dropped before processing: no intent, no answer; only the key is
            # remembered so that the retry goes through.
            return _gateway_timeout()

    intent = _intent_locked(
        intent_id=intent_id,
        status=Status.REQUIRES_PAYMENT,
        amount=amount,
        currency=currency,
        payment_method=payment_method,
    )
    # Checked again under the lock: a concurrent request with the same key
    # may have charged and answered while we waited for it.
    replay = _replay(endpoint=endpoint, idempotency_key=idempotency_key)
    if replay is not None:
        return replay
    answer = _charge_locked(
        intent=intent, amount=amount, currency=currency, payment_method=payment_method
    )
    _store(endpoint=endpoint, idempotency_key=idempotency_key, intent_id=intent_id, answer=answer)
    return answer


# What a charge attempt writes on its intent.
_CHARGED_FIELDS = ("status", "amount", "currency", "payment_method", "updated")


def _charge_locked(
    *, intent: FakeIntent, amount: int, currency: str, payment_method: str
) -> Answer:
    if intent.status == Status.CANCELED:
        return error(
            409, "intent_canceled", "This payment intent was cancelled; it cannot be charged."
        )
    if intent.status in (Status.SUCCEEDED, Status.REFUNDED):
        # Only ever one charge per intent, whatever key the second attempt uses.
        return error(
            409,
            "already_charged",
            "This payment intent was already charged with another idempotency key.",
        )

    # requires_payment or declined: a new attempt, as processors allow after a
    # decline.
    now = timezone.now()
    intent.amount, intent.currency, intent.payment_method = amount, currency, payment_method
    intent.updated = now
    if payment_method == PM_DECLINED:
        intent.status = Status.DECLINED
        rows.update_fields(intent, _CHARGED_FIELDS)
        return Answer(200, {"status": "declined", "charge_id": None})

    charge = rows.create(
        FakeCharge(
            intent=intent,
            amount=amount,
            currency=currency,
            status=FakeCharge.Status.SUCCEEDED,
            created=now,
        )
    )
    intent.status = Status.SUCCEEDED
    rows.update_fields(intent, _CHARGED_FIELDS)
    return Answer(
        200,
        {"status": "succeeded", "charge_id": charge.id},
        # The charge commits; only the answer is lost on the way back.
        times_out=payment_method == PM_TIMEOUT_CHARGED or _chaos_loses_answer(),
    )


def chaos_timeout_rate() -> float:
    """``settings.FAKE_GATEWAY_CHAOS_TIMEOUT_RATE``, clamped to 0..1."""
    return min(1.0, max(0.0, float(settings.FAKE_GATEWAY_CHAOS_TIMEOUT_RATE)))


def _chaos_loses_answer() -> bool:
    rate = chaos_timeout_rate()
    return rate > 0 and random.random() < rate


def _validate_charge(*, amount: Any, currency: Any, payment_method: Any) -> Answer | None:
    # bool is an int in Python but never an amount.
    if not isinstance(amount, int) or isinstance(amount, bool) or not 0 < amount <= MAX_AMOUNT:
        return error(400, "invalid_amount", "amount must be a positive integer in minor units.")
    if not (
        isinstance(currency, str)
        and len(currency) == 3
        and currency.isascii()
        and currency.isalpha()
    ):
        return error(400, "invalid_currency", "currency must be a three-letter ISO 4217 code.")
    if payment_method not in PAYMENT_METHODS:
        return error(
            400,
            "invalid_payment_method",
            f"payment_method must be one of {', '.join(sorted(PAYMENT_METHODS))}.",
        )
    return None


def _gateway_timeout() -> Answer:
    return Answer(
        504,
        {"code": "gateway_timeout", "detail": "The processor did not answer in time."},
        times_out=True,
    )


# --- look-ups -----------------------------------------------------------------


def intent_retrieve(*, intent_id: str) -> Answer:
    """``GET payment_intents/<intent_id>``."""
    with transaction.atomic(durable=True):
        intent = FakeIntent.objects.filter(pk=intent_id).first()
        if intent is None:
            answer = error(404, "not_found", "No such payment intent.")
        else:
            answer = Answer(200, _intent_body(intent))
        _log(endpoint=FakeRequest.Endpoint.RETRIEVE, intent_id=intent_id, answer=answer)
    return answer


def charge_list(*, intent_id: str) -> Answer:
    """``GET charges?payment_intent=<intent_id>``: every charge ever made on the
    intent, oldest first (an unknown intent simply has none)."""
    with transaction.atomic(durable=True):
        charges = FakeCharge.objects.filter(intent_id=intent_id).order_by("created", "id")
        answer = Answer(
            200,
            [
                {"id": c.id, "amount": c.amount, "status": c.status, "created": iso_z(c.created)}
                for c in charges
            ],
        )
        _log(endpoint=FakeRequest.Endpoint.LIST_CHARGES, intent_id=intent_id, answer=answer)
    return answer


def _intent_body(intent: FakeIntent) -> dict:
    return {
        "id": intent.intent_id,
        "status": intent.status,
        "amount": intent.amount,
        "currency": intent.currency or None,
        "latest_charge": _latest_charge(intent.intent_id),
    }


def _latest_charge(intent_id: str) -> str | None:
    """The id of the intent's latest successful charge (refunded or not),
    as processors name it on the intent: a look-up that finds the money also
    finds its reference."""
    return (
        FakeCharge.objects.filter(intent_id=intent_id)
        .order_by("-created", "-id")
        .values_list("id", flat=True)
        .first()
    )


# --- cancel and refund ----------------------------------------------------------


def intent_cancel(*, intent_id: str) -> Answer:
    """``POST payment_intents/<intent_id>/cancel``. Idempotent. An intent not
    seen yet is created cancelled, so a charge that is still in flight can
    never land afterwards."""
    with transaction.atomic(durable=True):
        if len(intent_id) > MAX_ID_LENGTH:
            answer = error(400, "invalid_request", f"ids are at most {MAX_ID_LENGTH} characters.")
        else:
            intent = _intent_locked(intent_id=intent_id, status=Status.CANCELED)
            if intent.status in (Status.SUCCEEDED, Status.REFUNDED):
                answer = error(
                    409,
                    "already_charged",
                    "This payment intent was charged; refund it instead.",
                    latest_charge=_latest_charge(intent_id),
                )
            else:
                if intent.status != Status.CANCELED:
                    intent.status = Status.CANCELED
                    intent.save(update_fields=["status", "updated"])
                answer = Answer(200, {"status": "canceled"})
        _log(endpoint=FakeRequest.Endpoint.CANCEL, intent_id=intent_id, answer=answer)
    return answer


def intent_refund(*, intent_id: str, idempotency_key: str = "") -> Answer:
    """``POST payment_intents/<intent_id>/refund``: the whole charge, or what
    is left of it after refunds of parts (recorded as one more
    :class:`FakeRefund`, under the key). Idempotent by state (a refunded
    intent answers "refunded" again) and, when a key is given, by key."""
    endpoint = FakeIdempotentAnswer.Endpoint.REFUND
    with transaction.atomic(durable=True):
        if len(idempotency_key) > MAX_ID_LENGTH:
            answer = error(400, "invalid_request", f"ids are at most {MAX_ID_LENGTH} characters.")
        elif (
            idempotency_key
            and (replay := _replay(endpoint=endpoint, idempotency_key=idempotency_key)) is not None
        ):
            answer = replay
        else:
            try:
                with transaction.atomic():  # a lost race on the key rolls back to here
                    answer = _refund_locked(intent_id=intent_id, idempotency_key=idempotency_key)
                    if idempotency_key:
                        _store(
                            endpoint=endpoint,
                            idempotency_key=idempotency_key,
                            intent_id=intent_id,
                            answer=answer,
                        )
            except IntegrityError:
                answer = _replay_after_race(endpoint=endpoint, idempotency_key=idempotency_key)
        _log(
            endpoint=FakeRequest.Endpoint.REFUND,
            intent_id=intent_id,
            idempotency_key=idempotency_key,
            answer=answer,
        )
    return answer


def _refund_locked(*, intent_id: str, idempotency_key: str) -> Answer:
    intent = FakeIntent.objects.select_for_update().filter(pk=intent_id).first()
    if intent is None or intent.status not in (Status.SUCCEEDED, Status.REFUNDED):
        return error(409, "not_charged", "This payment intent has no successful charge.")
    if intent.status == Status.SUCCEEDED:
        # What is left after the refunds of parts of it (pending ones count:
        # they are on their way), as one more refund, which always succeeds.
        left = _left_to_refund(intent)
        if left > 0:
            FakeRefund.objects.create(
                refund_id=_whole_refund_id(intent_id=intent_id, idempotency_key=idempotency_key),
                intent=intent,
                amount=left,
                currency=intent.currency,
                status=FakeRefund.Status.SUCCEEDED,
            )
        _mark_refunded(intent)
    return Answer(200, {"status": "refunded"})


def _whole_refund_id(*, intent_id: str, idempotency_key: str) -> str:
    """The refund id a whole-charge refund is recorded under: its key (or
    one made of the intent's id without a key), unless that is taken."""
    candidate = idempotency_key or f"whole:{intent_id}"
    if len(candidate) > MAX_ID_LENGTH or FakeRefund.objects.filter(refund_id=candidate).exists():
        candidate = f"whole:{secrets.token_hex(12)}"
    return candidate


def _left_to_refund(intent: FakeIntent) -> int:
    """The intent's charge less its refunds that succeeded or are pending."""
    refunded = intent.refunds.filter(status__in=_COUNTED_REFUNDS).aggregate(total=Sum("amount"))
    return (intent.amount or 0) - (refunded["total"] or 0)


_COUNTED_REFUNDS = (FakeRefund.Status.SUCCEEDED, FakeRefund.Status.PENDING)


def _mark_refunded(intent: FakeIntent) -> None:
    intent.charges.filter(status=FakeCharge.Status.SUCCEEDED).update(
        status=FakeCharge.Status.REFUNDED
    )
    intent.status = Status.REFUNDED
    intent.save(update_fields=["status", "updated"])


# --- refunds of a part --------------------------------------------------------------


def refund_create(*, intent_id: str, idempotency_key: str, amount: Any, refund_id: Any) -> Answer:
    """``POST payment_intents/<intent_id>/refunds`` ``{"amount", "refund_id"}``:
    one refund of ``amount`` of the intent's charge, named by the client's
    ``refund_id``. ``amount`` and ``refund_id`` are taken as they came off
    the wire and validated here. Concurrent requests on one intent queue on
    its lock, so refunds never add up to more than the charge."""

    def log(answer: Answer) -> None:
        _log(
            endpoint=FakeRequest.Endpoint.CREATE_REFUND,
            intent_id=intent_id,
            idempotency_key=idempotency_key,
            refund_id=refund_id if isinstance(refund_id, str) else "",
            answer=answer,
        )

    # Losing the race: another request, on another intent (whose lock did
    # not serialise us), stored an answer for this key or made a refund
    # under this refund id first.
    return _once(
        lambda: _create_refund(
            intent_id=intent_id,
            idempotency_key=idempotency_key,
            amount=amount,
            refund_id=refund_id,
        ),
        lost=lambda: (
            _replay(
                endpoint=FakeIdempotentAnswer.Endpoint.CREATE_REFUND,
                idempotency_key=idempotency_key,
            )
            or _refund_id_in_use()
        ),
        log=log,
    )


def _create_refund(*, intent_id: str, idempotency_key: str, amount: Any, refund_id: Any) -> Answer:
    """The answer, stored for the key. Storing it (or the refund) raises
    ``IntegrityError`` when a request on another intent won the race."""
    endpoint = FakeIdempotentAnswer.Endpoint.CREATE_REFUND
    if len(intent_id) > MAX_ID_LENGTH or len(idempotency_key) > MAX_ID_LENGTH:
        # Not stored: the key itself is unusable.
        return error(400, "invalid_request", f"ids are at most {MAX_ID_LENGTH} characters.")
    replay = _replay(endpoint=endpoint, idempotency_key=idempotency_key)
    if replay is not None:
        return replay
    answer = _validate_refund(amount=amount, refund_id=refund_id)
    if answer is None:
        intent = FakeIntent.objects.select_for_update().filter(pk=intent_id).first()
        # Checked again under the lock: a concurrent request with the same
        # key may have refunded and answered while we waited for it.
        replay = _replay(endpoint=endpoint, idempotency_key=idempotency_key)
        if replay is not None:
            return replay
        answer = _refund_part_locked(intent=intent, amount=amount, refund_id=refund_id)
    _store(endpoint=endpoint, idempotency_key=idempotency_key, intent_id=intent_id, answer=answer)
    return answer


def _refund_part_locked(*, intent: FakeIntent | None, amount: int, refund_id: str) -> Answer:
    if intent is None or intent.status not in (Status.SUCCEEDED, Status.REFUNDED):
        return error(409, "not_charged", "This payment intent has no successful charge.")
    if FakeRefund.objects.filter(refund_id=refund_id).exists():
        return _refund_id_in_use()
    left = _left_to_refund(intent)
    if amount > left:
        return error(
            409,
            "amount_too_large",
            f"The refund is more than what is left to refund on this intent ({left}).",
            refundable=left,
        )
    method = intent.payment_method
    status = {
        PM_REFUND_PENDING: FakeRefund.Status.PENDING,
        PM_REFUND_FAIL: FakeRefund.Status.FAILED,
    }.get(method, FakeRefund.Status.SUCCEEDED)
    refund = FakeRefund.objects.create(
        refund_id=refund_id,
        intent=intent,
        amount=amount,
        currency=intent.currency,
        status=status,
        failure_reason=REFUND_FAILURE_REASON if status == FakeRefund.Status.FAILED else "",
    )
    if status != FakeRefund.Status.FAILED and amount == left:
        _mark_refunded(intent)
    return Answer(
        200,
        _refund_body(refund),
        # The refund commits; only the answer is lost on the way back.
        times_out=method == PM_REFUND_TIMEOUT or _chaos_loses_answer(),
    )


def _validate_refund(*, amount: Any, refund_id: Any) -> Answer | None:
    # bool is an int in Python but never an amount.
    if not isinstance(amount, int) or isinstance(amount, bool) or not 0 < amount <= MAX_AMOUNT:
        return error(400, "invalid_amount", "amount must be a positive integer in minor units.")
    if not isinstance(refund_id, str) or not 0 < len(refund_id) <= MAX_ID_LENGTH:
        return error(
            400,
            "invalid_refund_id",
            f"refund_id must be a string of 1 to {MAX_ID_LENGTH} characters.",
        )
    return None


def _refund_id_in_use() -> Answer:
    # Not a refusal: a refund exists under this id (made with another key),
    # and a look-up by the id finds it.
    return error(
        409, "refund_id_in_use", "A refund was already made under this refund_id, with another key."
    )


def refund_retrieve(*, refund_id: str) -> Answer:
    """``GET refunds/<refund_id>``, by the client's refund id. The first
    look-up of a pending refund settles it: it answers ``succeeded``."""
    with transaction.atomic(durable=True):
        refund = FakeRefund.objects.select_for_update().filter(refund_id=refund_id).first()
        if refund is None:
            answer = error(404, "not_found", "No refund was made under this refund_id.")
        else:
            if refund.status == FakeRefund.Status.PENDING:
                refund.status = FakeRefund.Status.SUCCEEDED
                refund.settled = timezone.now()
                refund.save(update_fields=["status", "settled"])
            answer = Answer(200, _refund_body(refund))
        _log(
            endpoint=FakeRequest.Endpoint.RETRIEVE_REFUND,
            intent_id=refund.intent_id if refund is not None else "",
            refund_id=refund_id,
            answer=answer,
        )
    return answer


def refund_list(*, intent_id: str) -> Answer:
    """``GET refunds?payment_intent=<intent_id>``: every refund made on the
    intent (failed ones too), oldest first, as they stand (a list settles
    nothing); an unknown intent simply has none."""
    with transaction.atomic(durable=True):
        refunds = FakeRefund.objects.filter(intent_id=intent_id).order_by("created", "id")
        answer = Answer(200, [_refund_body(refund) for refund in refunds])
        _log(endpoint=FakeRequest.Endpoint.LIST_REFUNDS, intent_id=intent_id, answer=answer)
    return answer


def _refund_body(refund: FakeRefund) -> dict:
    body = {
        "id": refund.id,
        "refund_id": refund.refund_id,
        "payment_intent": refund.intent_id,
        "amount": refund.amount,
        "currency": refund.currency,
        "status": refund.status,
        "created": iso_z(refund.created),
    }
    if refund.status == FakeRefund.Status.FAILED:
        body["failure_reason"] = refund.failure_reason
    return body


# --- helpers --------------------------------------------------------------------


def _intent_locked(
    *,
    intent_id: str,
    status: str,
    amount: int | None = None,
    currency: str = "",
    payment_method: str = "",
) -> FakeIntent:
    """The intent, locked until this transaction ends: created with these
    values if it does not exist yet, an existing one as it is. One statement
    (``common.rows.insert_or_lock``); a concurrent first request for the
    same id waits for this one's commit instead of failing, so racing first
    requests queue on the one row."""
    now = timezone.now()
    return rows.insert_or_lock(
        FakeIntent(
            intent_id=intent_id,
            status=status,
            amount=amount,
            currency=currency,
            payment_method=payment_method,
            created=now,
            updated=now,
        )
    )


@functools.cache
def _replay_sql() -> str:
    table = FakeIdempotentAnswer._meta.db_table
    return (
        f"SELECT {', '.join(rows.columns(FakeIdempotentAnswer, table))} FROM {table}"
        ' WHERE "endpoint" = %s AND "idempotency_key" = %s'
    )


def _replay(*, endpoint: str, idempotency_key: str) -> Answer | None:
    with connection.cursor() as cursor:
        cursor.execute(_replay_sql(), [endpoint, idempotency_key])
        row = cursor.fetchone()
    if row is None:
        return None
    stored = rows.instance(FakeIdempotentAnswer, row)
    return Answer(stored.status_code, stored.body)


def _store(*, endpoint: str, idempotency_key: str, intent_id: str, answer: Answer) -> None:
    """Remember the first answer for the key. Raises IntegrityError if another
    request stored one first: callers roll back (a savepoint or their whole
    transaction) and replay."""
    rows.insert(
        [
            FakeIdempotentAnswer(
                endpoint=endpoint,
                idempotency_key=idempotency_key,
                intent_id=intent_id,
                status_code=answer.status_code,
                body=answer.body,
                created=timezone.now(),
            )
        ]
    )


def _once(
    work: Callable[[], Answer], *, lost: Callable[[], Answer], log: Callable[[Answer], None]
) -> Answer:
    """``work``'s answer, logged in its transaction. Should storing it raise
    ``IntegrityError`` (another request won a race on a unique index), all of
    ``work`` rolls back and ``lost``'s answer is logged instead. No savepoint
    on the way: the race is rare, and a savepoint costs every request two
    round trips."""
    try:
        with transaction.atomic(durable=True):
            answer = work()
            log(answer)
    except IntegrityError:
        with transaction.atomic(durable=True):
            answer = lost()
            log(answer)
    return answer


def _replay_after_race(*, endpoint: str, idempotency_key: str) -> Answer:
    # The unique index made us wait for the winner's commit, so its answer is
    # visible to this (read committed) statement.
    replay = _replay(endpoint=endpoint, idempotency_key=idempotency_key)
    if replay is None:  # pragma: no cover - only if the constraint lied
        raise RuntimeError(f"no stored {endpoint} answer for {idempotency_key!r} after a race")
    return replay


def _log(
    *,
    endpoint: str,
    intent_id: str,
    answer: Answer,
    idempotency_key: str = "",
    payment_method: str = "",
    refund_id: str = "",
) -> None:
    rows.insert(
        [
            FakeRequest(
                endpoint=endpoint,
                intent_id=intent_id[:MAX_ID_LENGTH],
                idempotency_key=idempotency_key[:MAX_ID_LENGTH],
                refund_id=refund_id[:MAX_ID_LENGTH],
                payment_method=payment_method[:64],
                status_code=answer.status_code,
                timed_out=answer.times_out,
                created=timezone.now(),
            )
        ]
    )
