"""The Stripe adapter of the payment gateway port (docs/stripe.md, "The adapter").

:class:`StripePaymentGateway` speaks Stripe's API through the official
``stripe`` library (``StripeClient``, public API only), to Stripe itself or
to localstripe (``settings.STRIPE_API_BASE``). Each of our intents is one
PaymentIntent: ``create`` makes it (no money moves), the saga records its id
(``pi_…``) in a commit, ``charge`` confirms it. The library never retries
(``max_network_retries=0``): a call without an answer is UNKNOWN and the saga
reconciles with :meth:`~StripePaymentGateway.retrieve`. No method raises for
a network failure except :meth:`~StripePaymentGateway.list_charges`
and :meth:`~StripePaymentGateway.list_refunds`
(:class:`~payments.interface.GatewayUnavailable`), as the HTTP adapter.

Refunds of a part (or all) of a charge are Refunds on the PaymentIntent,
made once under our refund's key (``refund:<refund_id>``) with our ids in
their metadata, and found again by their id (``re_…``) or, when the
create's answer was lost, by ``metadata.refund_id`` among the
PaymentIntent's (docs/stripe.md, "Refunds").

A *reference* (the port's ``intent_id`` argument) is a PaymentIntent's id or
our own intent id, when a create's answer was lost. Ours start with ``pi_``
too (``purchases.saga.start.intent_id_for``), so no prefix tells them apart:
a reference is asked for as a PaymentIntent id first and, when Stripe knows
no such id, searched for by ``metadata.intent_id``. Several PaymentIntents
of one intent (a lost create made again without idempotency, as localstripe
does, or after Stripe's 24 hours of idempotency) are settled there: the one
that matters is kept and every other that could still be charged is
cancelled.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time

import httpx
import stripe
from django.conf import settings

from ..guards import assert_no_transaction
from ..interface import (
    CancelOutcome,
    CancelResult,
    ChargeOutcome,
    ChargeRequest,
    ChargeResult,
    CreateOutcome,
    CreateResult,
    GatewayCharge,
    GatewayRefund,
    GatewayUnavailable,
    IntentLookup,
    IntentStatus,
    RefundAnswer,
    RefundOutcome,
    RefundRequest,
    RefundResult,
    RefundState,
)
from .answers import (
    CANCELLABLE,
    charge_id_of,
    charge_result_of,
    error_code,
    failure_detail,
    gateway_charge_of,
    gateway_refund_of,
    is_not_found,
    is_refusal,
    lookup_of,
    our_refund_id,
    refund_answer_of,
    refund_error_answer,
    refusal_detail,
    refuses_payment_method,
    search_query,
    the_one_that_matters,
)

logger = logging.getLogger(__name__)

# More PaymentIntents than this for one intent would be a bug of ours, not
# lost answers: the search reads no further.
MAX_INTENTS_PER_REF = 20

# The API version every request names (Stripe-Version), whatever the
# account's default: the last major release (Dahlia) whose PaymentIntent
# create still takes ``payment_method_types``. The library's own default
# (2026-10-28.endive) refuses that parameter (400
# ``payment_method_types_no_longer_supported``) and wants
# ``allowed_payment_method_types`` instead, which localstripe refuses: this
# one version is understood by both (docs/stripe.md, "The adapter").
API_VERSION = "2026-06-24.dahlia"

# The PaymentIntent's latest charge comes with it: its id, whether it was
# refunded (one round trip, not two).
_WITH_CHARGE = ["latest_charge"]


class StripePaymentGateway:
    """:class:`~payments.interface.IntentCreatingGateway` on Stripe.

    ``api_key``, ``api_base`` and ``timeout`` default to
    ``settings.STRIPE_SECRET_KEY``, ``STRIPE_API_BASE`` and
    ``STRIPE_TIMEOUT_SECONDS``, read when the client is built: once per
    process (a client inherited across ``fork``, Celery's prefork pool, would
    share its sockets with the parent, so a child builds its own).
    """

    creates_intent = True
    processor = "stripe"
    # Stripe's Search API is eventually consistent: a PaymentIntent made this
    # long ago may not show yet. The hold's expiry does not take "none found"
    # by our intent id as definitive sooner after a create (docs/stripe.md,
    # "The charge").
    search_settles_seconds = 60

    def __init__(
        self,
        *,
        api_key: str | None = None,
        api_base: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self._api_key = api_key
        self._api_base = api_base
        self._timeout = timeout
        self._client: stripe.StripeClient | None = None
        self._http: stripe.HTTPXClient | None = None
        self._client_pid: int | None = None
        self._client_lock = threading.Lock()

    def prepare(self) -> None:
        """Build this process's client now (its TLS context costs tens of
        milliseconds of CPU): see ``registry.prepare_in_pool_process``."""
        self._stripe()

    # The port ------------------------------------------------------------------

    def create(self, request: ChargeRequest) -> CreateResult:
        assert_no_transaction("create")
        started = time.perf_counter()
        metadata = {
            key: value
            for key, value in (
                ("intent_id", request.intent_id),
                ("purchase_id", request.purchase_id),
                ("reservation", request.reservation),
            )
            if value  # an empty value would unset the key in Stripe's metadata
        }
        try:
            pi = self._stripe().v1.payment_intents.create(
                # payment_method_types: typed out of the library's (newer)
                # API version, valid in ours (API_VERSION).
                params={  # type: ignore[typeddict-unknown-key]
                    "amount": request.amount,
                    "currency": request.currency.lower(),
                    "payment_method": request.payment_method,
                    "payment_method_types": ["card"],
                    "metadata": metadata,
                },
                # Every create of this intent, from any process, is the same
                # request to Stripe (for its 24 hours of idempotency).
                options={"idempotency_key": f"{request.intent_id}:create"},
            )
            result = CreateResult(
                CreateOutcome.CREATED, processor_ref=pi.id, latency_ms=_since(started)
            )
        except stripe.StripeError as err:
            result = _create_failed(err, started)
        _log(
            "create",
            result.processor_ref,
            result.label,
            result.detail,
            result.latency_ms,
            intent_id=request.intent_id,
        )
        return result

    def charge(self, request: ChargeRequest) -> ChargeResult:
        assert_no_transaction("charge")
        ref = request.processor_ref
        if not ref:
            raise ValueError("charge confirms a recorded PaymentIntent: processor_ref is empty")
        started = time.perf_counter()
        try:
            pi = self._stripe().v1.payment_intents.confirm(
                ref,
                # The payment method was attached at create (localstripe's
                # confirm refuses one anyway).
                params={"expand": _WITH_CHARGE},
                options={"idempotency_key": f"{request.intent_id}:confirm:{request.attempt}"},
            )
            result = charge_result_of(pi, latency_ms=_since(started))
        except stripe.CardError as err:
            result = ChargeResult(
                ChargeOutcome.DECLINED, detail=refusal_detail(err), latency_ms=_since(started)
            )
        except stripe.StripeError as err:
            result = self._charge_not_confirmed(ref, err, started)
        _log(
            "charge",
            ref,
            result.label,
            result.detail,
            result.latency_ms,
            intent_id=request.intent_id,
        )
        return result

    def retrieve(self, intent_id: str) -> IntentLookup:
        assert_no_transaction("retrieve")
        started = time.perf_counter()
        try:
            pi = self._find_one(intent_id)
        except stripe.StripeError as err:
            result = IntentLookup(
                IntentStatus.UNKNOWN, detail=failure_detail(err), latency_ms=_since(started)
            )
        else:
            if pi is None:
                result = IntentLookup(IntentStatus.NOT_FOUND, latency_ms=_since(started))
            else:
                result = lookup_of(pi, latency_ms=_since(started))
        _log("retrieve", intent_id, result.label, result.detail, result.latency_ms)
        return result

    def cancel(self, intent_id: str) -> CancelResult:
        assert_no_transaction("cancel")
        started = time.perf_counter()
        try:
            outcome, detail, charge_id = self._cancel(intent_id)
        except stripe.StripeError as err:
            outcome, detail, charge_id = CancelOutcome.UNKNOWN, failure_detail(err), None
        result = CancelResult(outcome, detail, latency_ms=_since(started), charge_id=charge_id)
        _log("cancel", intent_id, result.label, result.detail, result.latency_ms)
        return result

    def refund(self, intent_id: str, *, idempotency_key: str) -> RefundResult:
        assert_no_transaction("refund")
        started = time.perf_counter()
        try:
            outcome, detail = self._refund(intent_id, idempotency_key)
        except stripe.StripeError as err:
            outcome, detail = RefundOutcome.UNKNOWN, failure_detail(err)
        result = RefundResult(outcome, detail, latency_ms=_since(started))
        _log("refund", intent_id, result.label, result.detail, result.latency_ms)
        return result

    def list_charges(self, intent_id: str) -> list[GatewayCharge]:
        """Every charge that holds (or held) money on any PaymentIntent of
        this intent: read only, no extra PaymentIntent is cancelled here."""
        assert_no_transaction("list_charges")
        try:
            intents = self._find(intent_id)
            # Asked by the recorded PaymentIntent's id, the others of the
            # same purchase too (found by its metadata): the auditor's "one
            # charge per intent" must see a second one that holds money.
            ours = {_our_intent_id(pi) for pi in intents} - {"", intent_id}
            seen = {pi.id for pi in intents}
            for other in ours:
                intents += [pi for pi in self._search(str(other)) if pi.id not in seen]
        except stripe.StripeError as err:
            raise GatewayUnavailable(f"list charges: {failure_detail(err)}") from err
        return [charge for pi in intents if (charge := gateway_charge_of(pi)) is not None]

    def create_refund(self, request: RefundRequest) -> RefundAnswer:
        assert_no_transaction("create_refund")
        started = time.perf_counter()
        metadata = {
            key: value
            for key, value in (("refund_id", request.refund_id), ("intent_id", request.intent_id))
            if value  # an empty value would unset the key in Stripe's metadata
        }
        try:
            refund = self._stripe().v1.refunds.create(
                params={
                    "payment_intent": request.intent_ref,
                    "amount": request.amount,
                    "metadata": metadata,
                },
                # Every retry of this refund, from any process, is the same
                # request to Stripe (for its 24 hours of idempotency).
                options={"idempotency_key": request.idempotency_key},
            )
            result = refund_answer_of(refund, latency_ms=_since(started))
        except stripe.StripeError as err:
            result = refund_error_answer(err, latency_ms=_since(started))
        _log_refund("create_refund", request, result)
        return result

    def retrieve_refund(self, request: RefundRequest) -> RefundAnswer:
        assert_no_transaction("retrieve_refund")
        started = time.perf_counter()
        try:
            refund = self._refund_of(request)
        except stripe.StripeError as err:
            result = RefundAnswer(
                RefundState.UNKNOWN, detail=failure_detail(err), latency_ms=_since(started)
            )
        else:
            if refund is None:
                result = RefundAnswer(RefundState.NOT_FOUND, latency_ms=_since(started))
            else:
                result = refund_answer_of(refund, latency_ms=_since(started))
        _log_refund("retrieve_refund", request, result)
        return result

    def list_refunds(self, intent_ref: str) -> list[GatewayRefund]:
        """Every Refund on the intent's PaymentIntents, whatever its status
        and whoever made it (``refund_id`` "" when not us)."""
        assert_no_transaction("list_refunds")
        try:
            refunds = self._refunds_on(intent_ref)
        except stripe.StripeError as err:
            raise GatewayUnavailable(f"list refunds: {failure_detail(err)}") from err
        return [gateway_refund_of(refund) for refund in refunds]

    # The steps -----------------------------------------------------------------

    def _charge_not_confirmed(
        self, ref: str, err: stripe.StripeError, started: float
    ) -> ChargeResult:
        """A confirm that failed without a card error. Refused (400: the
        PaymentIntent is not confirmable, e.g. it already succeeded, Stripe's
        ``payment_intent_unexpected_state``): answer from where it stands.
        No answer: UNKNOWN."""
        if not is_refusal(err):
            return ChargeResult(
                ChargeOutcome.UNKNOWN, detail=failure_detail(err), latency_ms=_since(started)
            )
        try:
            pi = self._get(ref)
        except stripe.StripeError as again:
            detail = error_code(again) or failure_detail(again)
            return ChargeResult(ChargeOutcome.UNKNOWN, detail=detail, latency_ms=_since(started))
        if pi.status == "requires_confirmation":
            # Refused, yet still waiting for a confirm: say what Stripe said.
            detail = error_code(err) or f"http_{err.http_status}"
            return ChargeResult(ChargeOutcome.UNKNOWN, detail=detail, latency_ms=_since(started))
        return charge_result_of(pi, latency_ms=_since(started))

    def _cancel(self, ref: str) -> tuple[CancelOutcome, str, str | None]:
        """Cancel the PaymentIntent (one call when ``ref`` is its id). Raises
        the library's error when there is no answer."""
        try:
            pi = self._cancel_call(ref)
        except stripe.StripeError as err:
            if is_not_found(err):
                kept = self._settle(ref, self._search(ref))
                if kept is None:
                    # Nothing exists that could be charged.
                    return CancelOutcome.CANCELED, "not_found", None
                pi = self._cancel_call(kept.id) if kept.status in CANCELLABLE else kept
            elif is_refusal(err):
                # Not cancellable (already succeeded or cancelled): say why.
                pi = self._get(ref)
            else:
                raise
        if pi.status == "canceled":
            return CancelOutcome.CANCELED, "", None
        if pi.status == "succeeded":
            return CancelOutcome.ALREADY_CHARGED, "", charge_id_of(pi)
        if pi.status in ("processing", "requires_capture"):
            return CancelOutcome.UNKNOWN, "processing", None
        return CancelOutcome.UNKNOWN, pi.status, None

    def _refund(self, ref: str, idempotency_key: str) -> tuple[RefundOutcome, str]:
        """Refund the charge of the intent's PaymentIntent in full, unless a
        refund of it already did or is under way. Raises the library's error
        when there is no answer."""
        pi = self._find_one(ref)
        if pi is None:
            return RefundOutcome.NOT_CHARGED, "not_found"
        if pi.status in ("processing", "requires_capture"):
            return RefundOutcome.UNKNOWN, "processing"
        if pi.status == "requires_action":
            # Nothing charged yet, but the buyer may still authenticate:
            # cancel it first, then nothing can be.
            return RefundOutcome.UNKNOWN, "requires_action"
        if pi.status != "succeeded":
            return RefundOutcome.NOT_CHARGED, pi.status
        client = self._stripe()
        done = client.v1.refunds.list(params={"payment_intent": pi.id, "limit": 100})
        refunded = sum(r.amount for r in done.data if r.status == "succeeded")
        if refunded >= pi.amount:
            return RefundOutcome.REFUNDED, ""
        if any(r.status in ("pending", "requires_action") for r in done.data):
            return RefundOutcome.UNKNOWN, "refund_pending"  # not yet done
        try:
            # What is left of the charge after refunds of parts (ours, or
            # made in Stripe's dashboard), named: Stripe would take no amount
            # as that too, localstripe as the whole charge.
            made = client.v1.refunds.create(
                params={"payment_intent": pi.id, "amount": pi.amount - refunded},
                options={"idempotency_key": idempotency_key},
            )
        except stripe.InvalidRequestError as err:
            if error_code(err) == "charge_already_refunded":
                return RefundOutcome.REFUNDED, ""
            return RefundOutcome.UNKNOWN, error_code(err) or failure_detail(err)
        if made.status == "succeeded":
            return RefundOutcome.REFUNDED, ""
        if made.status in ("pending", "requires_action"):
            return RefundOutcome.UNKNOWN, "refund_pending"
        return RefundOutcome.UNKNOWN, f"refund_{made.status}"

    def _refund_of(self, request: RefundRequest) -> stripe.Refund | None:
        """The Refund: by its id when one was recorded, else by our refund
        id in its metadata, among the intent's. None: Stripe holds none.
        Raises the library's error when there is no answer."""
        if request.processor_ref:
            try:
                return self._stripe().v1.refunds.retrieve(request.processor_ref)
            except stripe.InvalidRequestError as err:
                if is_not_found(err) or error_code(err) == "resource_missing":
                    return None
                raise
        for refund in self._refunds_on(request.intent_ref):
            if our_refund_id(refund) == request.refund_id:
                return refund
        return None

    def _refunds_on(self, ref: str) -> list[stripe.Refund]:
        """Every Refund on the PaymentIntents of the reference (found as
        :meth:`retrieve` finds them, read only), newest first. One without
        a charge holds none and is not asked (localstripe answers that list
        with a 500: docs/stripe.md, "What localstripe lacks")."""
        found: list[stripe.Refund] = []
        for pi in self._find(ref):
            if charge_id_of(pi) is None:
                continue
            listed = self._stripe().v1.refunds.list(params={"payment_intent": pi.id, "limit": 100})
            found.extend(listed.auto_paging_iter())
        return found

    # Finding an intent's PaymentIntents ---------------------------------------

    def _find_one(self, ref: str) -> stripe.PaymentIntent | None:
        return self._settle(ref, self._find(ref))

    def _find(self, ref: str) -> list[stripe.PaymentIntent]:
        try:
            return [self._get(ref)]
        except stripe.InvalidRequestError as err:
            if not is_not_found(err):
                raise
        return self._search(ref)

    def _get(self, pi_id: str) -> stripe.PaymentIntent:
        return self._stripe().v1.payment_intents.retrieve(pi_id, params={"expand": _WITH_CHARGE})

    def _search(self, intent_id: str) -> list[stripe.PaymentIntent]:
        # Stripe's search is eventually consistent (up to a minute behind): a
        # create whose answer was lost may not show yet. Made again, it is the
        # same create to Stripe (its idempotency key), not a second one.
        found = self._stripe().v1.payment_intents.search(
            params={
                "query": search_query(intent_id),
                "limit": MAX_INTENTS_PER_REF,
                "expand": ["data.latest_charge"],
            }
        )
        return list(itertools.islice(found.auto_paging_iter(), MAX_INTENTS_PER_REF))

    def _settle(self, ref: str, intents: list[stripe.PaymentIntent]) -> stripe.PaymentIntent | None:
        """The PaymentIntent that matters of those found, after cancelling
        every other one that could still be charged: no second one ever can
        be. A cancel without an answer raises, and the look-up is UNKNOWN."""
        if not intents:
            return None
        kept = the_one_that_matters(intents)
        for extra in intents:
            if extra.id == kept.id or extra.status == "canceled":
                continue
            if extra.status in CANCELLABLE:
                self._cancel_call(extra.id)
                logger.warning(
                    "stripe: extra PaymentIntent cancelled",
                    extra={"gateway_ref": ref, "kept": kept.id, "cancelled": extra.id},
                )
            else:
                # Money on two PaymentIntents of one intent: the audit's
                # list_charges shows both; nothing here can undo it.
                logger.error(
                    "stripe: two PaymentIntents of one intent hold money",
                    extra={"gateway_ref": ref, "kept": kept.id, "other": extra.id},
                )
        return kept

    def _cancel_call(self, pi_id: str) -> stripe.PaymentIntent:
        return self._stripe().v1.payment_intents.cancel(pi_id, params={"expand": _WITH_CHARGE})

    # Plumbing ------------------------------------------------------------------

    @property
    def timeout(self) -> float:
        if self._timeout is not None:
            return self._timeout
        return settings.STRIPE_TIMEOUT_SECONDS

    def _stripe(self) -> stripe.StripeClient:
        pid = os.getpid()
        if self._client is None or self._client_pid != pid:
            with self._client_lock:
                if self._client is None or self._client_pid != pid:
                    # The parent's client (if any) is deliberately not closed
                    # here: its sockets belong to the parent.
                    self._http = stripe.HTTPXClient(
                        timeout=httpx.Timeout(self.timeout), allow_sync_methods=True
                    )
                    self._client = stripe.StripeClient(
                        self._api_key or settings.STRIPE_SECRET_KEY,
                        base_addresses={"api": self._api_base or settings.STRIPE_API_BASE},
                        stripe_version=API_VERSION,
                        http_client=self._http,
                        # We reconcile ourselves: a retry would hide a lost answer.
                        max_network_retries=0,
                    )
                    self._client_pid = pid
        return self._client

    def close(self) -> None:
        with self._client_lock:
            if self._http is not None and self._client_pid == os.getpid():
                self._http.close()
            self._client = None
            self._http = None
            self._client_pid = None


def _create_failed(err: stripe.StripeError, started: float) -> CreateResult:
    if refuses_payment_method(err):
        return CreateResult(
            CreateOutcome.DECLINED, detail=refusal_detail(err), latency_ms=_since(started)
        )
    if is_refusal(err):
        # Nothing was created, but the buyer's card is not why: a request of
        # ours Stripe does not take. UNKNOWN: the saga reconciles, and the
        # operator sees it rather than buyers being told "declined".
        logger.error(
            "stripe: create refused", extra={"code": error_code(err), "status": err.http_status}
        )
        return CreateResult(
            CreateOutcome.UNKNOWN, detail=refusal_detail(err), latency_ms=_since(started)
        )
    return CreateResult(
        CreateOutcome.UNKNOWN, detail=failure_detail(err), latency_ms=_since(started)
    )


def _since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _log(
    operation: str,
    ref: str,
    outcome: str,
    detail: str,
    latency_ms: float,
    *,
    intent_id: str = "",
) -> None:
    # Never the client secret, the key or the payment method.
    logger.info(
        "gateway %s",
        operation,
        extra={
            "processor": "stripe",
            "intent_id": intent_id,
            "gateway_ref": ref,
            "gateway_operation": operation,
            "outcome": outcome,
            "detail": detail,
            "latency_ms": round(latency_ms, 1),
        },
    )


def _log_refund(operation: str, request: RefundRequest, result: RefundAnswer) -> None:
    logger.info(
        "gateway %s",
        operation,
        extra={
            "processor": "stripe",
            "intent_id": request.intent_id,
            "gateway_ref": request.intent_ref,
            "refund_id": request.refund_id,
            "refund_ref": result.processor_ref or request.processor_ref,
            "gateway_operation": operation,
            "outcome": result.label,
            "detail": result.detail,
            "latency_ms": round(result.latency_ms, 1),
        },
    )


def _our_intent_id(pi: stripe.PaymentIntent) -> str:
    """The intent id of ours a PaymentIntent carries in its metadata ("" if none)."""
    metadata = pi.to_dict().get("metadata") or {}
    return str(metadata.get("intent_id") or "")
