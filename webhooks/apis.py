"""The staff REST API of outgoing webhooks (docs/api.md, "Webhooks"), and
the same views scoped to an organizer's own endpoints (at the end; docs/api.md,
"Organizers and roles"): a view acts on the endpoints of its ``scope()``.

The staff routes: staff only, holding the Django model permission the
admin asks for the same act (``webhooks/permissions.py``): anonymous → 401,
any other user → 403. The endpoints are the seller's, not a user's: a staff user who may see,
change or delete endpoints may do so to all of them, whoever created them,
and one who may resend, to any delivery.

Thin, like purchases/apis.py: parse the request (strict serializers), call
one service or selector, shape the answer. The services own the
transactions and the checks of URLs and event types; ``WebhookInvalid``
becomes ``400 invalid`` naming its ``field``, ``WebhookNotFound`` ``404
not_found``, ``WebhookResendRefused`` ``409 resend_refused``. Errors have the
project's one shape (common/api.py).
"""

from __future__ import annotations

import re

from django.urls.converters import IntConverter
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api import NOT_AUTHENTICATED, NOT_JSON, PAYLOAD_TOO_LARGE, error, error_response
from common.parsers import JSONParser
from organizers.models import Organizer
from organizers.permissions import OrganizerScopedApi
from organizers.roles import MAY, Action

from . import selectors, services
from .errors import WebhookInvalid, WebhookNotFound, WebhookResendRefused
from .models import WebhookEndpoint
from .permissions import (
    ADD_ENDPOINTS,
    CHANGE_ENDPOINTS,
    DELETE_ENDPOINTS,
    RESEND_DELIVERIES,
    VIEW_DELIVERIES,
    VIEW_ENDPOINTS,
    WebhookPermission,
    named,
)
from .serializers import (
    WebhookDeliverySerializer,
    WebhookEndpointCreatedSerializer,
    WebhookEndpointCreateSerializer,
    WebhookEndpointSerializer,
    WebhookEndpointUpdateSerializer,
    WebhookResendAcceptedSerializer,
    WebhookResendSerializer,
    WebhookSecretSerializer,
)

# Ids are bigint: a longer run of digits names no row (and must not reach
# PostgreSQL, which would refuse it as out of range).
_MAX_ID = 2**63 - 1


def _id(segment: str) -> int | None:
    """The id of a path segment, or None: the routes take any segment so
    that a malformed one gets the API's JSON 404, whatever DEBUG says."""
    if not re.fullmatch(IntConverter.regex, segment):
        return None
    value = int(segment)
    return value if value <= _MAX_ID else None


def _invalid(exc: WebhookInvalid) -> Response:
    return error(400, "invalid", str(exc), field=exc.field, errors={exc.field: [exc.message]})


def _no_endpoint() -> Response:
    return error(404, "not_found", "no such webhook endpoint")


def _no_delivery() -> Response:
    return error(404, "not_found", "no such delivery of this webhook endpoint")


def _endpoint(endpoint_id: int, organizer: Organizer | None) -> WebhookEndpoint | None:
    """The endpoint as the answers show it (with its delivery counts), if it
    is ``organizer``'s (any endpoint, for ``None``: the staff's)."""
    return selectors.endpoint_list(organizer=organizer).filter(pk=endpoint_id).first()


# --- what the schema says ---------------------------------------------------------------


def _staff_only(needed: tuple[str, ...]) -> str:
    holding = " or ".join(named(p, markdown=True) for p in needed)
    return (
        f"Staff only, holding {holding}. Webhook endpoints are the seller's, not a user's: "
        "whoever may act on one may act on all of them, whoever created them."
    )


_FORBIDDEN = error_response(
    "`permission_denied`: the user is not staff or lacks the permission the operation "
    "takes, or session authentication without a valid CSRF token"
)
_FORBIDDEN_READ = error_response(
    "`permission_denied`: the user is not staff or lacks the permission the operation takes"
)
_NO_ENDPOINT = error_response("`not_found`: no such endpoint, or an id that is not one")
_ENDPOINT_ID = OpenApiParameter(
    "endpoint_id", OpenApiTypes.INT, OpenApiParameter.PATH, required=True
)
_DELIVERY_ID = OpenApiParameter(
    "delivery_id", OpenApiTypes.INT, OpenApiParameter.PATH, required=True
)


def _bad_body(fields: str) -> OpenApiResponse:
    return error_response(
        f"`invalid` (with `field` and `errors`): {fields}; a field the operation does not "
        "take (named in `field`), or a value of the wrong JSON type; `parse_error`: a body "
        "that is not JSON"
    )


# What each staff operation answers (the organizers' operations reuse them, with
# their own refusals: ``_organizers``).
_RESPONSES: dict[str, dict] = {
    "webhook_endpoints_list": {
        200: WebhookEndpointSerializer(many=True),
        401: NOT_AUTHENTICATED,
        403: _FORBIDDEN_READ,
        404: error_response("`not_found`: a page past the end, or not a page number"),
    },
    "webhook_endpoints_create": {
        201: OpenApiResponse(
            WebhookEndpointCreatedSerializer,
            description="Created, enabled. The only answer, with a rotation's, that shows "
            "the secret",
        ),
        400: _bad_body(
            "a URL that is not `https://` to public addresses, or not a URL "
            "(`field`: `url`); an unknown event type or an empty list "
            "(`events`); a description over 300 characters (`description`); "
            "a missing field"
        ),
        401: NOT_AUTHENTICATED,
        403: _FORBIDDEN,
        413: PAYLOAD_TOO_LARGE,
        415: NOT_JSON,
    },
    "webhook_endpoints_retrieve": {
        200: WebhookEndpointSerializer,
        401: NOT_AUTHENTICATED,
        403: _FORBIDDEN_READ,
        404: _NO_ENDPOINT,
    },
    "webhook_endpoints_partial_update": {
        200: WebhookEndpointSerializer,
        400: _bad_body(
            "a URL that is not `https://` to public addresses (`field`: `url`); "
            "an unknown event type or an empty list (`events`); a description "
            "over 300 characters (`description`); `enabled` not a boolean; any "
            "other field (`id`, `secret`...)"
        ),
        401: NOT_AUTHENTICATED,
        403: _FORBIDDEN,
        404: _NO_ENDPOINT,
        413: PAYLOAD_TOO_LARGE,
        415: NOT_JSON,
    },
    "webhook_endpoints_destroy": {
        204: OpenApiResponse(
            description="Deleted, with its deliveries and their "
            "attempts; nothing more is sent to it"
        ),
        401: NOT_AUTHENTICATED,
        403: _FORBIDDEN,
        404: _NO_ENDPOINT,
    },
    "webhook_endpoints_rotate_secret": {
        200: WebhookSecretSerializer,
        401: NOT_AUTHENTICATED,
        403: _FORBIDDEN,
        404: _NO_ENDPOINT,
    },
    "webhook_endpoints_deliveries_list": {
        200: WebhookDeliverySerializer(many=True),
        401: NOT_AUTHENTICATED,
        403: _FORBIDDEN_READ,
        404: error_response(
            "`not_found`: no such endpoint, an id that is not one, or a page past the end"
        ),
    },
    "webhook_endpoints_deliveries_resend": {
        202: OpenApiResponse(
            WebhookResendAcceptedSerializer,
            description="The attempt is armed, due now, with the delivery's `webhook-id`; "
            "a worker makes it. No retry follows it: its outcome is in the "
            "delivery's attempts",
        ),
        400: _bad_body("a `reason` that is not a text of at most 500 characters"),
        401: NOT_AUTHENTICATED,
        403: _FORBIDDEN,
        404: error_response(
            "`not_found`: no such endpoint, no such delivery of that "
            "endpoint, or an id that is not one"
        ),
        409: error_response(
            "`resend_refused`: an attempt is already owed (the delivery "
            "is `pending`), or the endpoint is disabled"
        ),
        413: PAYLOAD_TOO_LARGE,
        415: NOT_JSON,
    },
}


class _StaffApi(APIView):
    permission_classes = [WebhookPermission]
    # What each method takes (webhooks/permissions.py checks it).
    required_permissions: dict[str, tuple[str, ...]] = {}
    # JSON only, like the purchases (a generated client sends every content
    # type the schema lists).
    parser_classes = [JSONParser]

    def scope(self) -> Organizer | None:
        """Whose endpoints this view acts on: every endpoint, for staff; an
        organizer's own, under /api/organizers/{slug}/ (``_OrganizerApi``)."""
        return None

    def _in_scope(self, endpoint_id: int) -> bool:
        return selectors.endpoint_in_scope(endpoint_id=endpoint_id, organizer=self.scope())


class WebhookEndpointListCreateApi(_StaffApi):
    """``GET | POST /api/webhook-endpoints/``. Whoever may see endpoints sees
    every one: they are the seller's, not the user's."""

    pagination_class = PageNumberPagination
    required_permissions = {"GET": VIEW_ENDPOINTS, "POST": ADD_ENDPOINTS}

    @extend_schema(
        responses=_RESPONSES["webhook_endpoints_list"],
        summary="Every webhook endpoint, oldest first, a page at a time",
        description=_staff_only(VIEW_ENDPOINTS),
        operation_id="webhook_endpoints_list",
    )
    def get(self, request):
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(selectors.endpoint_list(organizer=self.scope()), request)
        return paginator.get_paginated_response(WebhookEndpointSerializer(page, many=True).data)

    @extend_schema(
        request=WebhookEndpointCreateSerializer,
        responses=_RESPONSES["webhook_endpoints_create"],
        summary="Register a webhook endpoint; the answer shows its secret once",
        description=_staff_only(ADD_ENDPOINTS),
        operation_id="webhook_endpoints_create",
    )
    def post(self, request):
        payload = WebhookEndpointCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            endpoint = services.webhook_endpoint_create(
                organizer=self.scope(), **payload.validated_data
            )
        except WebhookInvalid as exc:
            return _invalid(exc)
        return Response(WebhookEndpointCreatedSerializer(endpoint).data, status=201)


class WebhookEndpointDetailApi(_StaffApi):
    """``GET | PATCH | DELETE /api/webhook-endpoints/{id}/``; never the
    secret. Any endpoint (they are the seller's)."""

    required_permissions = {
        "GET": VIEW_ENDPOINTS,
        "PATCH": CHANGE_ENDPOINTS,
        "DELETE": DELETE_ENDPOINTS,
    }

    @extend_schema(
        parameters=[_ENDPOINT_ID],
        responses=_RESPONSES["webhook_endpoints_retrieve"],
        summary="One webhook endpoint (without its secret)",
        description=_staff_only(VIEW_ENDPOINTS),
        operation_id="webhook_endpoints_retrieve",
    )
    def get(self, request, endpoint_id: str):
        pk = _id(endpoint_id)
        endpoint = None if pk is None else _endpoint(pk, self.scope())
        if endpoint is None:
            return _no_endpoint()
        return Response(WebhookEndpointSerializer(endpoint).data)

    @extend_schema(
        parameters=[_ENDPOINT_ID],
        request=WebhookEndpointUpdateSerializer,
        responses=_RESPONSES["webhook_endpoints_partial_update"],
        summary="Change a webhook endpoint's url, events, description or enabled",
        description=_staff_only(CHANGE_ENDPOINTS)
        + " What is not given stays as it is. A disabled endpoint gets no new delivery, and "
        "an attempt that comes due while it is disabled fails without being sent (resend it "
        "once enabled again).",
        operation_id="webhook_endpoints_partial_update",
    )
    def patch(self, request, endpoint_id: str):
        pk = _id(endpoint_id)
        if pk is None or not self._in_scope(pk):
            return _no_endpoint()
        payload = WebhookEndpointUpdateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            services.webhook_endpoint_update(endpoint_id=pk, **payload.validated_data)
        except WebhookInvalid as exc:
            return _invalid(exc)
        except WebhookNotFound:
            return _no_endpoint()
        endpoint = _endpoint(pk, self.scope())
        if endpoint is None:  # deleted since, by someone else
            return _no_endpoint()
        return Response(WebhookEndpointSerializer(endpoint).data)

    @extend_schema(
        parameters=[_ENDPOINT_ID],
        responses=_RESPONSES["webhook_endpoints_destroy"],
        summary="Delete a webhook endpoint",
        description=_staff_only(DELETE_ENDPOINTS),
        operation_id="webhook_endpoints_destroy",
    )
    def delete(self, request, endpoint_id: str):
        pk = _id(endpoint_id)
        if pk is None or not self._in_scope(pk):
            return _no_endpoint()
        try:
            services.webhook_endpoint_delete(endpoint_id=pk)
        except WebhookNotFound:
            return _no_endpoint()
        return Response(status=204)


class WebhookEndpointRotateSecretApi(_StaffApi):
    """``POST /api/webhook-endpoints/{id}/rotate-secret/``: the new secret,
    shown this once. It takes the permission to change the endpoint, as the
    admin's "Rotate secret…" does."""

    required_permissions = {"POST": CHANGE_ENDPOINTS}

    @extend_schema(
        parameters=[_ENDPOINT_ID],
        request=None,
        responses=_RESPONSES["webhook_endpoints_rotate_secret"],
        summary="Give a webhook endpoint a new secret; the answer shows it once",
        description=_staff_only(CHANGE_ENDPOINTS)
        + " Every attempt from now on, retries of earlier deliveries too, is signed with the "
        "new secret alone.",
        operation_id="webhook_endpoints_rotate_secret",
    )
    def post(self, request, endpoint_id: str):
        pk = _id(endpoint_id)
        if pk is None or not self._in_scope(pk):
            return _no_endpoint()
        try:
            secret = services.webhook_endpoint_rotate_secret(endpoint_id=pk)
        except WebhookNotFound:
            return _no_endpoint()
        return Response({"secret": secret})


class WebhookDeliveryListApi(_StaffApi):
    """``GET /api/webhook-endpoints/{id}/deliveries/``: the delivery log,
    newest first, each delivery with its attempts (the count, the page and
    the page's attempts: three queries, however many deliveries and
    attempts, as the selector prefetches them)."""

    pagination_class = PageNumberPagination
    required_permissions = {"GET": VIEW_DELIVERIES}

    @extend_schema(
        parameters=[_ENDPOINT_ID],
        responses=_RESPONSES["webhook_endpoints_deliveries_list"],
        summary="A webhook endpoint's deliveries, newest first, with their attempts",
        description=_staff_only(VIEW_DELIVERIES),
        operation_id="webhook_endpoints_deliveries_list",
    )
    def get(self, request, endpoint_id: str):
        pk = _id(endpoint_id)
        if pk is None:
            return _no_endpoint()
        paginator = self.pagination_class()
        deliveries = selectors.endpoint_deliveries(endpoint_id=pk, organizer=self.scope())
        page = paginator.paginate_queryset(deliveries, request)
        # Only an empty page asks whether the endpoint exists: the selector
        # counts every delivery of it, which costs nothing only then.
        if not page and _endpoint(pk, self.scope()) is None:
            return _no_endpoint()
        return paginator.get_paginated_response(WebhookDeliverySerializer(page, many=True).data)


class WebhookDeliveryResendApi(_StaffApi):
    """``POST /api/webhook-endpoints/{id}/deliveries/{delivery_id}/resend/``:
    one more attempt, same ``webhook-id``; the log records who asked."""

    required_permissions = {"POST": RESEND_DELIVERIES}

    @extend_schema(
        parameters=[_ENDPOINT_ID, _DELIVERY_ID],
        request=WebhookResendSerializer,
        responses=_RESPONSES["webhook_endpoints_deliveries_resend"],
        summary="Resend a delivered or failed webhook delivery",
        description=_staff_only(RESEND_DELIVERIES),
        operation_id="webhook_endpoints_deliveries_resend",
    )
    def post(self, request, endpoint_id: str, delivery_id: str):
        pk, delivery_pk = _id(endpoint_id), _id(delivery_id)
        if pk is None or delivery_pk is None:
            return _no_delivery()
        payload = WebhookResendSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        # The delivery must be this endpoint's: a path names one resource.
        deliveries = selectors.endpoint_deliveries(endpoint_id=pk, organizer=self.scope())
        if not deliveries.filter(pk=delivery_pk).exists():
            return _no_delivery()
        try:
            attempt = services.webhook_resend(
                delivery_pk,
                by=request.user.get_username(),
                reason=payload.validated_data.get("reason", ""),
            )
        except WebhookNotFound:  # deleted since, with its endpoint
            return _no_delivery()
        except WebhookResendRefused as exc:
            return error(409, "resend_refused", str(exc))
        return Response({"delivery": delivery_pk, "attempt": attempt}, status=202)


# --- an organizer's endpoints: /api/organizers/{slug}/webhook-endpoints/ ---------------
#
# The staff views above, scoped (organizers/permissions.py): each is the staff
# view with the organizer's permission and its own endpoints (``scope``), so
# the same code answers with the same shapes. Members whose role may manage
# webhooks (owner, manager) may do everything the staff API does to the
# organizer's endpoints; an endpoint made here is sent its events only.


class _OrganizerApi(OrganizerScopedApi, _StaffApi):
    required_action = Action.MANAGE_WEBHOOKS

    def scope(self) -> Organizer | None:
        return self.organizer


_ROLES = ", ".join(sorted(MAY[Action.MANAGE_WEBHOOKS]))
_MEMBERS_ONLY = (
    f"Members of the organizer whose role may manage its webhook endpoints ({_ROLES}); "
    "anyone else who is not a member gets the same `404` as for a missing organizer. "
    "The organizer's own endpoints only: they are sent its events' webhooks only."
)
_NOT_A_MEMBER = "no such organizer, or one you are not a member of (the same answer); "
_ROLE_FORBIDDEN = error_response(
    f"`permission_denied`: your role may not manage webhook endpoints (only {_ROLES}), "
    "or session authentication without a valid CSRF token"
)


def _organizers(staff_responses: dict, operation_id: str, summary: str, *, not_found: str, **more):
    """The schema of a scoped operation: the staff one's answers, with the
    organizer's refusals."""
    return extend_schema(
        responses={
            **staff_responses,
            403: _ROLE_FORBIDDEN,
            404: error_response(
                f"`not_found`: {_NOT_A_MEMBER}" + (f"; {not_found}" if not_found else "")
            ),
        },
        summary=summary,
        description=_MEMBERS_ONLY,
        operation_id=operation_id,
        **more,
    )


class OrganizerWebhookEndpointListCreateApi(_OrganizerApi, WebhookEndpointListCreateApi):
    """``GET | POST /api/organizers/{slug}/webhook-endpoints/``."""

    @_organizers(
        _RESPONSES["webhook_endpoints_list"],
        "organizer_webhook_endpoints_list",
        "An organizer's webhook endpoints, oldest first, a page at a time",
        not_found="a page past the end, or not a page number",
    )
    def get(self, request, slug: str):
        return super().get(request)

    @_organizers(
        _RESPONSES["webhook_endpoints_create"],
        "organizer_webhook_endpoints_create",
        "Register an organizer's webhook endpoint; the answer shows its secret once",
        not_found="",
        request=WebhookEndpointCreateSerializer,
    )
    def post(self, request, slug: str):
        return super().post(request)


class OrganizerWebhookEndpointDetailApi(_OrganizerApi, WebhookEndpointDetailApi):
    """``GET | PATCH | DELETE /api/organizers/{slug}/webhook-endpoints/{id}/``."""

    @_organizers(
        _RESPONSES["webhook_endpoints_retrieve"],
        "organizer_webhook_endpoints_retrieve",
        "One of an organizer's webhook endpoints (without its secret)",
        not_found="no such endpoint of it, or an id that is not one",
        parameters=[_ENDPOINT_ID],
    )
    def get(self, request, slug: str, endpoint_id: str):
        return super().get(request, endpoint_id)

    @_organizers(
        _RESPONSES["webhook_endpoints_partial_update"],
        "organizer_webhook_endpoints_partial_update",
        "Change an organizer's webhook endpoint's url, events, description or enabled",
        not_found="no such endpoint of it, or an id that is not one",
        parameters=[_ENDPOINT_ID],
        request=WebhookEndpointUpdateSerializer,
    )
    def patch(self, request, slug: str, endpoint_id: str):
        return super().patch(request, endpoint_id)

    @_organizers(
        _RESPONSES["webhook_endpoints_destroy"],
        "organizer_webhook_endpoints_destroy",
        "Delete an organizer's webhook endpoint",
        not_found="no such endpoint of it, or an id that is not one",
        parameters=[_ENDPOINT_ID],
    )
    def delete(self, request, slug: str, endpoint_id: str):
        return super().delete(request, endpoint_id)


class OrganizerWebhookEndpointRotateSecretApi(_OrganizerApi, WebhookEndpointRotateSecretApi):
    """``POST /api/organizers/{slug}/webhook-endpoints/{id}/rotate-secret/``."""

    @_organizers(
        _RESPONSES["webhook_endpoints_rotate_secret"],
        "organizer_webhook_endpoints_rotate_secret",
        "Give an organizer's webhook endpoint a new secret; the answer shows it once",
        not_found="no such endpoint of it, or an id that is not one",
        parameters=[_ENDPOINT_ID],
        request=None,
    )
    def post(self, request, slug: str, endpoint_id: str):
        return super().post(request, endpoint_id)


class OrganizerWebhookDeliveryListApi(_OrganizerApi, WebhookDeliveryListApi):
    """``GET /api/organizers/{slug}/webhook-endpoints/{id}/deliveries/``."""

    @_organizers(
        _RESPONSES["webhook_endpoints_deliveries_list"],
        "organizer_webhook_endpoints_deliveries_list",
        "An organizer's webhook endpoint's deliveries, newest first, with their attempts",
        not_found="no such endpoint of it, an id that is not one, or a page past the end",
        parameters=[_ENDPOINT_ID],
    )
    def get(self, request, slug: str, endpoint_id: str):
        return super().get(request, endpoint_id)


class OrganizerWebhookDeliveryResendApi(_OrganizerApi, WebhookDeliveryResendApi):
    """``POST /api/organizers/{slug}/webhook-endpoints/{id}/deliveries/{delivery_id}/resend/``."""

    @_organizers(
        _RESPONSES["webhook_endpoints_deliveries_resend"],
        "organizer_webhook_endpoints_deliveries_resend",
        "Resend a delivered or failed delivery of an organizer's webhook endpoint",
        not_found="no such endpoint of it, no such delivery of that endpoint, or an id "
        "that is not one",
        parameters=[_ENDPOINT_ID, _DELIVERY_ID],
        request=WebhookResendSerializer,
    )
    def post(self, request, slug: str, endpoint_id: str, delivery_id: str):
        return super().post(request, endpoint_id, delivery_id)
