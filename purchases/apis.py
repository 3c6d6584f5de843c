"""The public REST API (docs/api.md). Thin: validate, call a service or a
selector, shape the answer. Errors share one shape: {"code", "detail", ...}."""

from __future__ import annotations

import logging

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.pagination import PageNumberPagination
from rest_framework.parsers import JSONParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from . import selectors, services
from .errors import IdempotencyKeyReused, SeatUnavailable, UnknownEvent, UnknownSeats
from .serializers import (
    ErrorSerializer,
    EventSerializer,
    PurchaseAcceptedSerializer,
    PurchaseDetailSerializer,
    PurchaseRequestSerializer,
    PurchaseSummarySerializer,
    SeatSerializer,
)
from .throttling import PurchaseStartThrottle, TokenThrottle

logger = logging.getLogger(__name__)

_CODES = {
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
    exceptions.ParseError: "parse_error",
    exceptions.ValidationError: "invalid",
}


def _first_message(detail) -> str:
    if isinstance(detail, dict):
        for key, value in detail.items():
            return f"{key}: {_first_message(value)}"
    if isinstance(detail, list) and detail:
        return _first_message(detail[0])
    return str(detail)


def exception_handler(exc, context):
    """DRF's handler, reshaped to {"code", "detail", ...}."""
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = next((c for cls, c in _CODES.items() if isinstance(exc, cls)), "error")
    if isinstance(exc, exceptions.ValidationError) and isinstance(exc.detail, dict):
        # "field" names the field "detail" talks about: the first one.
        response.data = {
            "code": code,
            "detail": _first_message(exc.detail),
            "field": next(iter(exc.detail)),
            "errors": exc.detail,
        }
    else:
        response.data = {"code": code, "detail": _first_message(exc.detail)}
    return response


def error(status_code: int, code: str, detail: str, **extra) -> Response:
    return Response({"code": code, "detail": detail, **extra}, status=status_code)


class _TokenSerializer(serializers.Serializer):
    token = serializers.CharField()


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
        responses={
            200: _TokenSerializer,
            400: ErrorSerializer,
            429: OpenApiResponse(ErrorSerializer, description="throttled, with `Retry-After`"),
        },
        summary="Exchange a username and password for an API token",
    )
    def post(self, request, *args, **kwargs):
        return super().post(request, *args, **kwargs)


# The catalog needs no credentials, but credentials that are sent are checked:
# a client whose token was revoked hears so (401) instead of being served as
# anonymous without knowing it.
_BAD_CREDENTIALS = OpenApiResponse(ErrorSerializer, description="credentials sent and invalid")


class EventListApi(APIView):
    permission_classes = [AllowAny]

    @extend_schema(responses={200: EventSerializer(many=True), 401: _BAD_CREDENTIALS},
                   summary="List events")
    def get(self, request):
        return Response(EventSerializer(selectors.event_list(), many=True).data)


class EventSeatsApi(APIView):
    permission_classes = [AllowAny]

    @extend_schema(
        responses={200: SeatSerializer(many=True), 401: _BAD_CREDENTIALS, 404: ErrorSerializer},
        summary="Seats of an event (informative; only the purchase decides)",
    )
    def get(self, request, event_id: int):
        seats = selectors.event_seats(event_id=event_id)
        if seats is None:
            return error(404, "not_found", "no such event")
        return Response(SeatSerializer(seats, many=True).data)


def _key_problem(key: str | None) -> Response | None:
    if key is None or key == "":
        return error(400, "idempotency_key_missing", "the Idempotency-Key header is required")
    if len(key) > 255 or not key.isprintable() or not key.isascii():
        return error(
            400, "idempotency_key_invalid",
            "the Idempotency-Key header must be 1 to 255 printable ASCII characters",
        )
    return None


class _PurchasePageSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = PurchaseSummarySerializer(many=True)


class PurchaseListCreateApi(APIView):
    def get_throttles(self):
        # Starting purchases is what a scalper hammers; reading is not throttled.
        return [PurchaseStartThrottle()] if self.request.method == "POST" else []

    @extend_schema(
        request=PurchaseRequestSerializer,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=True,
                description="1..255 printable characters; the same key and body replay the "
                "first answer",
            )
        ],
        responses={
            202: PurchaseAcceptedSerializer,
            400: ErrorSerializer,
            401: ErrorSerializer,
            409: OpenApiResponse(ErrorSerializer, description="seat_unavailable, with `seats`"),
            413: OpenApiResponse(ErrorSerializer, description="payload_too_large"),
            422: OpenApiResponse(ErrorSerializer, description="idempotency_key_reused"),
            429: OpenApiResponse(ErrorSerializer, description="throttled, with `Retry-After`"),
        },
        summary="Start a purchase (answers at once; the saga charges in the background)",
    )
    def post(self, request):
        problem = _key_problem(request.headers.get("Idempotency-Key"))
        if problem is not None:
            return problem
        payload = PurchaseRequestSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        try:
            started = services.purchase_start(
                user=request.user,
                idempotency_key=request.headers["Idempotency-Key"],
                event_id=data["event"],
                seat_refs=data["seats"],
                payment_method=data["payment_method"],
            )
        except IdempotencyKeyReused as exc:
            return error(422, exc.code, str(exc))
        except SeatUnavailable as exc:
            return error(409, exc.code, str(exc), seats=exc.seats)
        except UnknownEvent as exc:
            # Told apart from unknown seats only on the refusal path: the
            # request itself does not look the event up.
            return error(400, "invalid", str(exc), field="event",
                         errors={"event": [str(exc)]})
        except UnknownSeats as exc:
            return error(400, "invalid", str(exc), field="seats",
                         errors={"seats": [str(exc)]}, seats=exc.seats)
        link = f"/api/purchases/{started.saga_id}/"
        # The same answer for the first request and every replay of its key.
        response = Response({**started.purchase, "links": {"self": link}}, status=202)
        response["Location"] = link
        return response

    @extend_schema(
        parameters=[OpenApiParameter("page", OpenApiTypes.INT, OpenApiParameter.QUERY)],
        responses={
            200: _PurchasePageSerializer,
            401: ErrorSerializer,
            404: OpenApiResponse(ErrorSerializer, description="no such page"),
        },
        summary="Your purchases, newest first, a page at a time",
        operation_id="purchases_list",
    )
    def get(self, request):
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(selectors.purchase_list(user=request.user), request)
        return paginator.get_paginated_response(PurchaseSummarySerializer(page, many=True).data)


class PurchaseDetailApi(APIView):
    @extend_schema(
        responses={200: PurchaseDetailSerializer, 401: ErrorSerializer, 404: ErrorSerializer},
        summary="One of your purchases, with its payment and history",
    )
    def get(self, request, saga_id):
        saga = selectors.purchase_get(user=request.user, saga_id=saga_id)
        if saga is None:
            return error(404, "not_found", "no such purchase")
        return Response(PurchaseDetailSerializer(saga).data)
