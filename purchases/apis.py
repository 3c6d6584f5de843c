"""The public REST API (docs/api.md). Thin: validate, call a service or a
selector, shape the answer. Errors share one shape: {"code", "detail", ...}."""

from __future__ import annotations

import json
import logging
import re

from django.http import HttpResponse, HttpResponseNotModified
from django.urls.converters import IntConverter, UUIDConverter
from django.utils.http import parse_etags
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api import NOT_AUTHENTICATED as _NOT_AUTHENTICATED
from common.api import NOT_JSON as _NOT_JSON
from common.api import PAYLOAD_TOO_LARGE as _TOO_LARGE
from common.api import RETRY_AFTER as _RETRY_AFTER
from common.api import error, retry_after
from common.api import error_response as _errors
from common.parsers import JSONParser
from common.time import iso_z

from . import availability, catalog_answers, selectors, services
from .errors import (
    BuyerLimitReached,
    DomainError,
    IdempotencyKeyReused,
    InWaitingRoom,
    NotEnoughSeats,
    PaymentsPaused,
    SalesClosed,
    SalesNotOpen,
    SeatUnavailable,
    UnknownCategory,
    UnknownEvent,
    UnknownSeats,
)
from .models import PurchaseSaga
from .refunds.errors import CancellationNotAllowed, NotRefundable, RefundError
from .serializers import (
    EventSerializer,
    PurchaseAcceptedSerializer,
    PurchaseCancelledSerializer,
    PurchaseCancelRequestSerializer,
    PurchaseConflictSerializer,
    PurchaseDetailSerializer,
    PurchasePausedSerializer,
    PurchaseRequestSerializer,
    PurchaseSummarySerializer,
    QueuePlaceSerializer,
    RefundConflictSerializer,
    RefundSerializer,
    SeatSerializer,
    TokenSerializer,
    idempotency_key_problem,
    plain_purchase_request,
    refund_refusal,
)
from .throttling import PurchaseThrottled, TokenThrottle, purchase_start_throttled

logger = logging.getLogger(__name__)

# --- what the schema says about answers (docs/api.md, "Errors") ----------------------
# Each error response lists the codes it carries; the body is the one Error
# shape (common/api.py, shared with the webhooks' staff API).

_INVALID_CREDENTIALS = _errors(
    "`authentication_failed`: credentials were sent and are invalid or revoked (none are "
    "needed here, but those sent are checked)"
)
_LOCATION = OpenApiParameter(
    "Location",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=True,
    response=[202],
    description="The purchase's path, the same as `links.self`",
)
_KEY_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"}
_IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    _KEY_SCHEMA,
    OpenApiParameter.HEADER,
    required=True,
    description=(
        "1 to 255 printable ASCII characters, chosen by the client, one per purchase it "
        "means to make. Keys are per user: two users may use the same key. The same key "
        "with the same body, again or concurrently, answers what the first request "
        "answered (the same status and body) and creates nothing; the same key with "
        "another body answers 422 `idempotency_key_reused`; for a key that already has an "
        "answer, that answer wins over any refusal of the new body. Missing or empty: 400 "
        "`idempotency_key_missing`; longer or not printable ASCII: 400 "
        "`idempotency_key_invalid`."
    ),
)


class TokenApi(ObtainAuthToken):
    """``POST /api/auth/token/``: DRF's token view, JSON in (docs/api.md),
    with its answers documented."""

    parser_classes = [JSONParser]
    # No authentication to get a token: a stale token in the header must not
    # stand between a user and a new one.
    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = [TokenThrottle]

    @extend_schema(
        request=AuthTokenSerializer,
        auth=[],
        parameters=[_RETRY_AFTER],
        responses={
            200: TokenSerializer,
            400: _errors(
                "`invalid` (with `field` and `errors`): a wrong username or password "
                "(`field`: `non_field_errors`) or a missing field; `parse_error`: a body that "
                "is not JSON"
            ),
            413: _TOO_LARGE,
            415: _NOT_JSON,
            429: _errors(
                "`throttled`: more than `AUTH_TOKEN_THROTTLE_RATE` attempts from one client "
                "address; `Retry-After` says when to try again"
            ),
        },
        summary="Exchange a username and password for an API token",
        description="Send the token on later requests as `Authorization: Token <token>`; the "
        "same token every time for one user. Takes no credentials itself.",
    )
    def post(self, request, *args, **kwargs):
        return super().post(request, *args, **kwargs)


# The catalog needs no credentials (so the schema declares no security
# requirement, and a generated client calls it without any), but credentials
# that are sent are checked: a client whose token was revoked hears so (401)
# instead of being served as anonymous without knowing it.


def _event_id(segment: str) -> int | None:
    """The event id of a path segment, or None: the route takes any segment so
    that a malformed one gets the API's JSON 404, whatever DEBUG says."""
    return int(segment) if re.fullmatch(IntConverter.regex, segment) else None


# Both are served from the availability cache (purchases/availability.py): a
# cached answer costs no query, and a 304 one cache round trip.
_IF_NONE_MATCH = OpenApiParameter(
    "If-None-Match",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    description="The `ETag` of an earlier answer: `304` and no body while the availability "
    "is still the one it names",
)
_ETAG = OpenApiParameter(
    "ETag",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    response=[200, 304],
    description="Changes exactly when the availability shown changes; send it back in "
    "`If-None-Match`. Absent only when the cache cannot be reached",
)
# Retry-After on the start's 429 (the throttle) and 503 (payments paused).
_RETRY_AFTER_429_503 = retry_after(429, 503)


_NOT_MODIFIED = OpenApiResponse(
    description="The availability is still the one `If-None-Match` names: no body"
)


def _held_etags(request) -> list[str]:
    return parse_etags(request.headers.get("If-None-Match", ""))


def _catalog_answer(request, catalog: availability.Catalog):
    """``304`` and no body when the client holds the current answer, else
    ``200``; the ETag on both. The cached body is the JSON as rendered, sent
    as it is; the browsable API renders the data itself."""
    response: HttpResponse
    if catalog.body is None:
        response = HttpResponseNotModified()
    elif request.accepted_renderer.format == JSONRenderer.format:
        response = HttpResponse(catalog.body, content_type=JSONRenderer.media_type)
    else:
        response = Response(json.loads(catalog.body))
    if catalog.etag is not None:
        response["ETag"] = catalog.etag
    return response


class EventListApi(APIView):
    permission_classes = [AllowAny]

    @extend_schema(
        parameters=[_IF_NONE_MATCH, _ETAG],
        responses={200: EventSerializer(many=True), 304: _NOT_MODIFIED, 401: _INVALID_CREDENTIALS},
        auth=[],
        summary="List events",
    )
    def get(self, request):
        return _catalog_answer(request, catalog_answers.event_list(held=_held_etags(request)))


class EventSeatsApi(APIView):
    permission_classes = [AllowAny]

    @extend_schema(
        parameters=[
            OpenApiParameter("event_id", OpenApiTypes.INT, OpenApiParameter.PATH, required=True),
            _IF_NONE_MATCH,
            _ETAG,
        ],
        responses={
            200: SeatSerializer(many=True),
            304: _NOT_MODIFIED,
            401: _INVALID_CREDENTIALS,
            404: _errors("`not_found`: no such event"),
        },
        auth=[],
        summary="Seats of an event (informative; only the purchase decides)",
    )
    def get(self, request, event_id: str):
        event_pk = _event_id(event_id)
        catalog = (
            None
            if event_pk is None
            else catalog_answers.event_seats(event_id=event_pk, held=_held_etags(request))
        )
        if catalog is None:
            return error(404, "not_found", "no such event")
        return _catalog_answer(request, catalog)


_EVENT_ID = OpenApiParameter("event_id", OpenApiTypes.INT, OpenApiParameter.PATH, required=True)
_WAITING_ROOM_PASS = OpenApiParameter(
    "Waiting-Room-Pass",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    description="The buyer's pass of `GET /api/events/{id}/queue/` (`admitted`): lets this "
    "buyer in through the event's waiting room until it expires. Without it, a buyer whose "
    "turn has come is let in too; another buyer's pass lets nobody in",
)


class EventQueueApi(APIView):
    """``/api/events/{id}/queue/``: the buyer's place in the event's waiting
    room (docs/waiting-room.md)."""

    def _answer(self, request, event_id: str, *, join_room: bool) -> Response:
        event_pk = _event_id(event_id)
        place = (
            None
            if event_pk is None
            else services.waiting_room_place(
                event_id=event_pk, user_id=request.user.pk, join_room=join_room
            )
        )
        if place is None:
            return error(404, "not_found", "no such event")
        answer: dict = {"status": place.status}
        if place.status == "waiting":
            answer.update(position=place.position, retry_after=place.retry_after)
            if place.sales_start is not None:
                answer["sales_start"] = iso_z(place.sales_start)
        if place.status == "admitted":
            assert place.pass_expires_at is not None  # an admitted place has both
            answer.update(
                {"pass": place.pass_token, "pass_expires_at": iso_z(place.pass_expires_at)}
            )
        return Response(answer)

    _RESPONSES = {
        200: QueuePlaceSerializer,
        401: _NOT_AUTHENTICATED,
        404: _errors("`not_found`: no such event"),
    }

    @extend_schema(
        parameters=[_EVENT_ID],
        responses=_RESPONSES,
        summary="Your place in the event's waiting room",
        operation_id="events_queue_retrieve",
    )
    def get(self, request, event_id: str):
        return self._answer(request, event_id, join_room=False)

    @extend_schema(
        parameters=[_EVENT_ID],
        request=None,
        responses=_RESPONSES,
        summary="Join the event's waiting room (when it lets buyers in in turn)",
        description="What a purchase refused with `503 waiting_room` does: the buyer joins "
        "at the back (or keeps their place). While the room lets everyone through: `open`.",
        operation_id="events_queue_create",
    )
    def post(self, request, event_id: str):
        return self._answer(request, event_id, join_room=True)


def _key_problem(key: str | None) -> Response | None:
    problem = idempotency_key_problem(key)
    return None if problem is None else error(400, *problem)


class PurchaseListCreateApi(APIView):
    # JSON only: a body is one document, never JSON, form and multipart at
    # once (a generated client sends every content type the schema lists).
    parser_classes = [JSONParser]
    pagination_class = PageNumberPagination

    def get_throttles(self):
        # Starting purchases is what a scalper hammers (reading is not
        # throttled), but not here, before the view: post() decides it once
        # the key and the body are valid, so that a stored answer replays
        # whatever the count says and bad input spends nothing (docs/api.md,
        # "Throttling").
        return []

    @extend_schema(
        request=PurchaseRequestSerializer,
        parameters=[_IDEMPOTENCY_KEY, _WAITING_ROOM_PASS, _LOCATION, _RETRY_AFTER_429_503],
        responses={
            202: OpenApiResponse(
                PurchaseAcceptedSerializer,
                description="The purchase started (status `PENDING`), or the first answer "
                "again for the same key and body. `Location` is the purchase",
            ),
            400: _errors(
                "`idempotency_key_missing`, `idempotency_key_invalid` (the header); `invalid` "
                "(with `field` and `errors`): an unknown event, or one not published yet "
                "(`field`: `event`), unknown seats (`field`: `seats`, the refs in `seats`), "
                "seats of different currencies, an empty list, duplicates, more than "
                "`MAX_SEATS_PER_PURCHASE` seats, a missing field; a `quantity` that is not an "
                "integer from 1 to `MAX_SEATS_PER_PURCHASE` (`field`: `quantity`); both `seats` "
                "and `quantity` (`field`: `quantity`), neither (`field`: `seats`); a `category` "
                "with `seats`, or one the event does not have (`field`: `category`); "
                "`parse_error`: a body that is not JSON"
            ),
            401: _NOT_AUTHENTICATED,
            403: _errors("`permission_denied`: session authentication without a valid CSRF token"),
            409: OpenApiResponse(
                PurchaseConflictSerializer,
                description="`seat_unavailable` (with `seats`, those held, sold or blocked by "
                "the seller); `not_enough_seats` (a `quantity`: no row has that many available "
                "seats next to each other, of the `category` asked for if any; with "
                "`available`, the event's (or the category's) seats available and not being "
                "taken right now); `sales_not_open` (with `sales_start`, when they open); "
                "`sales_closed` (the sales window has ended, or the event was cancelled); "
                "`buyer_limit_reached` (with `limit`, the event's seats per buyer, and "
                "`held_or_bought`, the seats this buyer already holds or bought for it, every "
                "purchase counted, also those made at the same time). Nothing is written",
            ),
            413: _TOO_LARGE,
            415: _NOT_JSON,
            422: _errors(
                "`idempotency_key_reused`: this user sent this key before with another body"
            ),
            429: _errors(
                "`throttled`: more than `PURCHASE_THROTTLE_RATE` starts by this user; "
                "`Retry-After` says when to try again"
            ),
            503: OpenApiResponse(
                PurchasePausedSerializer,
                description="`payments_paused` (with `retry_after`, seconds, also in "
                "`Retry-After`): the card processor stopped answering and its circuit breaker "
                "is open; `waiting_room` (with `position` and `retry_after`, and `sales_start` "
                "before the sale opens): the event's waiting room lets buyers in in turn and "
                "this buyer is in it; ask again after `Retry-After` (or send the pass of "
                "`GET /api/events/{id}/queue/` in `Waiting-Room-Pass`). Nothing was held or "
                "charged. A replay of a key that started a purchase still answers",
            ),
        },
        summary="Start a purchase (answers at once; the saga charges in the background)",
        description="The seats are named (`seats`) or chosen by the server (`quantity`, best "
        "available: that many seats next to each other in one row, of the price `category` "
        "if one is given; rows in order, in a row the block nearest its middle). Exactly one "
        "of `seats` and `quantity`. The event's rules are checked with the seats: its sales "
        "window, and its limit of seats per buyer; the hold lasts the event's hold time. The "
        "`202` lists the seats held, and `total` is their price at the moment they were "
        "held; a replay of the key lists the same seats.",
    )
    def post(self, request):
        problem = _key_problem(request.headers.get("Idempotency-Key"))
        if problem is not None:
            return problem
        data = plain_purchase_request(request.data)
        if data is None:
            payload = PurchaseRequestSerializer(data=request.data)
            payload.is_valid(raise_exception=True)
            data = payload.validated_data
        try:
            # The throttle is decided here, once the key and the body are
            # valid (docs/api.md, "Throttling"), not before the view.
            started = purchase_start_throttled(
                request,
                self,
                idempotency_key=request.headers["Idempotency-Key"],
                event_id=data["event"],
                seat_refs=data.get("seats"),
                quantity=data.get("quantity"),
                category=data.get("category"),
                payment_method=data["payment_method"],
                admission_pass=request.headers.get("Waiting-Room-Pass"),
            )
        except PurchaseThrottled as exc:
            raise exceptions.Throttled(wait=exc.wait) from None  # as DRF's check_throttles
        except DomainError as exc:
            refusal = _purchase_refusal(exc)
            if refusal is None:
                raise
            return refusal
        link = f"/api/purchases/{started.saga_id}/"
        # The same answer for the first request and every replay of its key.
        response = Response({**started.purchase, "links": {"self": link}}, status=202)
        response["Location"] = link
        return response

    @extend_schema(
        # Paginated by pagination_class: the page parameter and the next and
        # previous links in the schema come from the paginator that serves them.
        responses={
            200: PurchaseSummarySerializer(many=True),
            401: _NOT_AUTHENTICATED,
            404: _errors("`not_found`: a page past the end, or not a page number"),
        },
        summary="Your purchases, newest first, a page at a time",
        operation_id="purchases_list",
    )
    def get(self, request):
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(selectors.purchase_list(user=request.user), request)
        return paginator.get_paginated_response(PurchaseSummarySerializer(page, many=True).data)


def _purchase_refusal(exc: DomainError) -> Response | None:
    """The answer to a start refused (docs/api.md); None for an error that
    is not a refusal of the request (a bug: the 500 it becomes says so)."""
    if isinstance(exc, IdempotencyKeyReused):
        return error(422, exc.code, str(exc))
    if isinstance(exc, PaymentsPaused | InWaitingRoom):
        # Both ask again later: the body's retry_after and the header.
        place: dict = {}
        if isinstance(exc, InWaitingRoom):
            place["position"] = exc.position
            if exc.sales_start is not None:
                place["sales_start"] = iso_z(exc.sales_start)
        response = error(503, exc.code, str(exc), retry_after=exc.retry_after, **place)
        response["Retry-After"] = str(exc.retry_after)
        return response
    if isinstance(exc, SeatUnavailable):
        return error(409, exc.code, str(exc), seats=exc.seats)
    if isinstance(exc, NotEnoughSeats):
        return error(409, exc.code, str(exc), available=exc.available)
    if isinstance(exc, SalesNotOpen):
        return error(409, exc.code, str(exc), sales_start=iso_z(exc.sales_start))
    if isinstance(exc, SalesClosed):
        return error(409, exc.code, str(exc))
    if isinstance(exc, BuyerLimitReached):
        return error(409, exc.code, str(exc), limit=exc.limit, held_or_bought=exc.held_or_bought)
    if isinstance(exc, UnknownEvent):
        # Told apart from unknown seats only on the refusal path: the
        # request itself does not look the event up.
        return error(400, "invalid", str(exc), field="event", errors={"event": [str(exc)]})
    if isinstance(exc, UnknownCategory):
        return error(400, "invalid", str(exc), field="category", errors={"category": [str(exc)]})
    if isinstance(exc, UnknownSeats):
        return error(
            400, "invalid", str(exc), field="seats", errors={"seats": [str(exc)]}, seats=exc.seats
        )
    return None


class PurchaseDetailApi(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("saga_id", OpenApiTypes.UUID, OpenApiParameter.PATH, required=True)
        ],
        responses={
            200: PurchaseDetailSerializer,
            401: _NOT_AUTHENTICATED,
            404: _errors("`not_found`: no such purchase, or another user's (the same answer)"),
        },
        summary="One of your purchases, with its payment and history",
    )
    def get(self, request, saga_id: str):
        # The route takes any segment: a malformed id is a missing purchase,
        # answered as JSON whatever DEBUG says.
        saga = (
            selectors.purchase_get(user=request.user, saga_id=saga_id)
            if re.fullmatch(UUIDConverter.regex, saga_id)
            else None
        )
        if saga is None:
            return _no_purchase()
        return Response(PurchaseDetailSerializer(saga).data)


def _no_purchase() -> Response:
    return error(404, "not_found", "no such purchase")


def _refund_refusal(exc: RefundError) -> Response:
    """The answer to a cancellation refused: a purchase that is not
    confirmed cannot be cancelled
    (docs/api.md, "Money back: refunds and cancellations")."""
    if isinstance(exc, NotRefundable):
        return error(
            409, CancellationNotAllowed.code, f"only a confirmed purchase can be cancelled: {exc}"
        )
    status_code, body = refund_refusal(exc)
    return Response(body, status=status_code)


class PurchaseCancelApi(APIView):
    """``POST /api/purchases/{saga_id}/cancel/``: the buyer cancels seats of
    their purchase within the event's refund policy."""

    parser_classes = [JSONParser]

    @extend_schema(
        parameters=[
            OpenApiParameter("saga_id", OpenApiTypes.UUID, OpenApiParameter.PATH, required=True),
            OpenApiParameter(
                "Idempotency-Key",
                _KEY_SCHEMA,
                OpenApiParameter.HEADER,
                required=True,
                description="1 to 255 printable ASCII characters, one per cancellation the "
                "client means to make. The same key again answers the same refund (as it is "
                "now: its `status` moves on); the same key with other `seats` answers 422 "
                "`idempotency_key_reused`. Missing or empty: 400 `idempotency_key_missing`; "
                "longer or not printable ASCII: 400 `idempotency_key_invalid`.",
            ),
        ],
        request=PurchaseCancelRequestSerializer,
        responses={
            202: OpenApiResponse(
                PurchaseCancelledSerializer,
                description="The seats are released for sale and their tickets void; the "
                "refund (`pending`) is their prices less the event's cancellation fee, and "
                "is asked of the processor in the background. Or the same refund again for "
                "the same key",
            ),
            400: _errors(
                "`idempotency_key_missing`, `idempotency_key_invalid` (the header); `invalid` "
                "(with `field` and `errors`): `seats` not a list of seat refs, empty, naming "
                "a seat twice, a seat that is not of this purchase, or one cancelled or "
                "refunded already (`field`: `seats`); a refund of nothing (`field`: "
                "`amount`); `parse_error`: a body that is not JSON"
            ),
            401: _NOT_AUTHENTICATED,
            403: _errors("`permission_denied`: session authentication without a valid CSRF token"),
            404: _errors("`not_found`: no such purchase, or another user's (the same answer)"),
            409: OpenApiResponse(
                RefundConflictSerializer,
                description="`cancellation_not_allowed`: the purchase is not confirmed, the "
                "event's refund policy allows no cancellation or its time has passed, the "
                "event is cancelled (everyone is refunded without asking), or every seat is "
                "cancelled already; `refund_exceeds_paid` (with `refundable` and `currency`): "
                "nothing is left to refund. Nothing is written",
            ),
            413: _TOO_LARGE,
            415: _NOT_JSON,
            422: _errors(
                "`idempotency_key_reused`: this key cancelled other seats of this purchase"
            ),
        },
        summary="Cancel seats of your purchase, for a refund (the event's policy permitting)",
        description="All the seats not cancelled yet when `seats` is absent. Allowed while "
        "the purchase's `cancellable_until` has not passed. The refund is listed in the "
        "purchase's `refunds` and reaches `succeeded` once the processor has refunded it.",
        operation_id="purchases_cancel",
    )
    def post(self, request, saga_id: str):
        problem = _key_problem(request.headers.get("Idempotency-Key"))
        if problem is not None:
            return problem
        payload = PurchaseCancelRequestSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        if not re.fullmatch(UUIDConverter.regex, saga_id):
            return _no_purchase()
        try:
            refund = services.purchase_cancel(
                saga_id=saga_id,
                user=request.user,
                seats=payload.validated_data.get("seats"),
                request_key=request.headers["Idempotency-Key"],
            )
        except PurchaseSaga.DoesNotExist:
            return _no_purchase()
        except RefundError as exc:
            return _refund_refusal(exc)
        return Response({"refund": RefundSerializer(refund).data}, status=202)
