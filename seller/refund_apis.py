"""The seller's money back: refunding a purchase, cancelling an event,
reading the cancellation's progress
(docs/api.md, "Money back: refunds and cancellations").

Scoped like every route under ``/api/organizers/{slug}/``
(``organizers.permissions``): a refund takes ``REFUND`` (finance, owner),
a cancellation ``CANCEL_EVENT`` (owner), its progress ``READ_SALES``. A
purchase or an event of another organizer is the same ``404`` as a missing
one. Thin: read the body, call one service of ``purchases.services``, shape
the answer.
"""

from __future__ import annotations

import re

from django.urls.converters import UUIDConverter
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.response import Response

from common.api import NOT_AUTHENTICATED, NOT_JSON, PAYLOAD_TOO_LARGE, error, error_response
from common.parsers import JSONParser
from organizers.permissions import OrganizerScopedApi
from organizers.roles import Action
from purchases import services
from purchases.models import Event, EventCancellation, PurchaseSaga
from purchases.refunds.errors import RefundError
from purchases.refunds.selectors import cancellation_progress
from purchases.serializers import (
    RefundConflictSerializer,
    idempotency_key_problem,
    refund_refusal,
)

from .api_common import EVENT_ID, forbidden, scoped
from .event_paths import event_pk, no_event, organizer_event
from .refund_serializers import (
    CancellationProgressSerializer,
    EventCancelRequestSerializer,
    SellerRefundRequestSerializer,
    SellerRefundSerializer,
    progress_answer,
)

# --- what the schema says ------------------------------------------------------------------

_SAGA_ID = OpenApiParameter("saga_id", OpenApiTypes.UUID, OpenApiParameter.PATH, required=True)
_IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"},
    OpenApiParameter.HEADER,
    required=True,
    description="1 to 255 printable ASCII characters, one per refund the client means to make. "
    "The same key again answers the same refund (as it is now: its `status` moves on); the "
    "same key with another body answers 422 `idempotency_key_reused`. Missing or empty: 400 "
    "`idempotency_key_missing`; longer or not printable ASCII: 400 `idempotency_key_invalid`.",
)
NO_PURCHASE = "no such purchase"


def _no_purchase() -> Response:
    return error(404, "not_found", NO_PURCHASE)


def _refused(exc: RefundError) -> Response:
    status_code, body = refund_refusal(exc)
    return Response(body, status=status_code)


# --- the views -----------------------------------------------------------------------------


class PurchaseRefundApi(OrganizerScopedApi):
    """``POST /api/organizers/{slug}/purchases/{saga_id}/refunds/``."""

    required_action = Action.REFUND
    parser_classes = [JSONParser]

    @extend_schema(
        parameters=[_SAGA_ID, _IDEMPOTENCY_KEY],
        request=SellerRefundRequestSerializer,
        responses={
            202: OpenApiResponse(
                SellerRefundSerializer,
                description="The refund is opened (`pending`) and asked of the processor in "
                "the background; the purchase's buyer sees it in `refunds`. Or the same "
                "refund again for the same key",
            ),
            400: error_response(
                "`idempotency_key_missing`, `idempotency_key_invalid` (the header); `invalid` "
                "(with `field` and `errors`): a missing or blank `reason`, or one over 500 "
                "characters (`field`: `reason`); an `amount` that is not a positive integer "
                "(`field`: `amount`); `seats` not a list of seat refs, empty, naming a seat "
                "twice, a seat that is not of this purchase, or one refunded already (`field`: "
                "`seats`); `release_seats` not a boolean; `parse_error`: a body that is not JSON"
            ),
            401: NOT_AUTHENTICATED,
            403: forbidden(Action.REFUND),
            404: error_response(
                "`not_found`: no such organizer, or one you are not a member of; no such "
                "purchase of this organizer's events (another organizer's is as missing)"
            ),
            409: OpenApiResponse(
                RefundConflictSerializer,
                description="`refund_exceeds_paid` (with `refundable` and `currency`): more "
                "than what is left to refund, or nothing is left; `not_refundable`: the "
                "purchase is not confirmed (it holds no money to give back). Nothing is "
                "written",
            ),
            413: PAYLOAD_TOO_LARGE,
            415: NOT_JSON,
            422: error_response(
                "`idempotency_key_reused`: this key made another refund of this purchase"
            ),
        },
        summary="Refund a purchase of one of the organizer's events, in part or in full",
        description=scoped(
            Action.REFUND,
            "An `amount`, or `seats` (their prices paid when no amount is given), or neither: "
            "everything left to refund. The seats stay sold unless `release_seats`. The "
            "`reason` is the organizer's; the buyer reads a sentence written for buyers.",
        ),
        operation_id="organizers_purchases_refunds_create",
    )
    def post(self, request, slug: str, saga_id: str):
        problem = idempotency_key_problem(request.headers.get("Idempotency-Key"))
        if problem is not None:
            return error(400, *problem)
        payload = SellerRefundRequestSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        if not re.fullmatch(UUIDConverter.regex, saga_id):
            return _no_purchase()
        body = payload.validated_data
        try:
            refund = services.organizer_refund(
                organizer=self.organizer,
                saga_id=saga_id,
                user=request.user,
                reason=body["reason"],
                amount=body.get("amount"),
                seats=body.get("seats"),
                release_seats=body["release_seats"],
                request_key=request.headers["Idempotency-Key"],
            )
        except PurchaseSaga.DoesNotExist:
            return _no_purchase()
        except RefundError as exc:
            return _refused(exc)
        return Response(SellerRefundSerializer(refund).data, status=202)


class EventCancelApi(OrganizerScopedApi):
    """``POST /api/organizers/{slug}/events/{event_id}/cancel/``."""

    required_action = Action.CANCEL_EVENT
    parser_classes = [JSONParser]

    @extend_schema(
        parameters=[EVENT_ID],
        request=EventCancelRequestSerializer,
        responses={
            202: OpenApiResponse(
                CancellationProgressSerializer,
                description="Cancelled: sales stopped in this commit, and the run that "
                "refunds every confirmed purchase started; its progress. The same answer "
                "(the run's progress now) for an event cancelled already",
            ),
            400: error_response(
                "`invalid` (with `field` and `errors`): a missing or blank `reason`, or one "
                "over 500 characters (`field`: `reason`); `parse_error`: a body that is not JSON"
            ),
            401: NOT_AUTHENTICATED,
            403: forbidden(Action.CANCEL_EVENT),
            404: error_response(
                "`not_found`: no such organizer, or one you are not a member of; or no such "
                "event of it (another organizer's event answers the same)"
            ),
            413: PAYLOAD_TOO_LARGE,
            415: NOT_JSON,
        },
        summary="Cancel an event: sales stop, every confirmed purchase is refunded in full",
        description=scoped(
            Action.CANCEL_EVENT,
            "Purchases being charged are settled first (no charge lands after the cancel); "
            "then each confirmed purchase gets one full refund (everything left of it), its "
            "seats released and its tickets void, and its buyer one email. Refunds are paced "
            "at `REFUND_RATE_PER_SECOND`; the run survives restarts. Read its progress at "
            "`GET …/events/{event_id}/cancellation/`.",
        ),
        operation_id="organizers_events_cancel",
    )
    def post(self, request, slug: str, event_id: str):
        pk = event_pk(event_id)
        if pk is None:
            return no_event()
        payload = EventCancelRequestSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            run = services.event_cancel(
                organizer=self.organizer,
                event_id=pk,
                reason=payload.validated_data["reason"],
                user=request.user,
            )
        except EventCancellation.DoesNotExist:
            return no_event()
        except RefundError as exc:
            return _refused(exc)
        event = Event.objects.only("currency").get(pk=run.event_id)
        return Response(progress_answer(cancellation_progress(run), event=event), status=202)


class EventCancellationApi(OrganizerScopedApi):
    """``GET /api/organizers/{slug}/events/{event_id}/cancellation/``."""

    required_action = Action.READ_SALES

    @extend_schema(
        parameters=[EVENT_ID],
        responses={
            200: CancellationProgressSerializer,
            401: NOT_AUTHENTICATED,
            403: forbidden(Action.READ_SALES),
            404: error_response(
                "`not_found`: no such organizer, or one you are not a member of; no such "
                "event of it (another organizer's event answers the same); or the event is "
                "not cancelled"
            ),
        },
        summary="The progress of an event's cancellation",
        description=scoped(
            Action.READ_SALES,
            "`done` once nothing is being charged, no purchase waits for its refund and no "
            "refund is pending. `purchases` counts the event's confirmed purchases, "
            "`refunded` those given back in full, `failed` those whose cancellation refund "
            "the processor refused; `owed` is what is not given back yet.",
        ),
        operation_id="organizers_events_cancellation_retrieve",
    )
    def get(self, request, slug: str, event_id: str):
        event = organizer_event(self.organizer, event_id)
        if event is None:
            return no_event()
        run = EventCancellation.objects.filter(event_id=event.pk).first()
        if run is None:
            return error(404, "not_found", "this event is not cancelled")
        return Response(progress_answer(cancellation_progress(run), event=event))
