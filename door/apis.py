"""The door staff's API (docs/door.md, "The door API"):
scanning a code in, the offline gates' list and upload, the progress.

Scoped like every route under ``/api/organizers/{slug}/``
(``organizers.permissions``): each takes ``CHECK_IN`` (door, manager,
owner); an event of another organizer is the same ``404`` as a missing
one. Thin: read the body, call one service of ``door.services``, shape the
answer.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from common.api import NOT_AUTHENTICATED, NOT_JSON, PAYLOAD_TOO_LARGE, error_response
from common.parsers import JSONParser
from common.paths import event_pk, no_event
from organizers.permissions import OrganizerScopedApi
from organizers.roles import MAY, Action
from purchases.models import Event

from . import selectors, services
from .serializers import (
    UPLOAD_MAX_SCANS,
    CheckinAnswerSerializer,
    CheckinListSerializer,
    CheckinProgressSerializer,
    CheckinRequestSerializer,
    UploadAnswerSerializer,
    UploadRequestSerializer,
    checkin_request,
)

# --- what the schema says (as the seller's routes say it: seller/api_common.py) -----------

EVENT_ID = OpenApiParameter("event_id", OpenApiTypes.INT, OpenApiParameter.PATH, required=True)
_ROLES = ", ".join(sorted(MAY[Action.CHECK_IN]))
_FORBIDDEN = error_response(
    f"`permission_denied`: your role may not {Action.CHECK_IN} (only {_ROLES}), or session "
    "authentication without a valid CSRF token"
)
_NOT_FOUND = error_response(
    "`not_found`: no such organizer, or one you are not a member of; or no such event of it "
    "(another organizer's event answers the same)"
)


def _scoped(what: str) -> str:
    return (
        f"{what}\n\nMembers whose role may {Action.CHECK_IN} ({_ROLES}); anyone else who is "
        "not a member gets the same `404` as for a missing organizer."
    )


def _event(view: OrganizerScopedApi, segment: str) -> Event | None:
    """The organizer's event of the path segment, or None (missing,
    malformed, or another organizer's: the same 404)."""
    found = event_pk(segment)
    return None if found is None else selectors.event_of(organizer=view.organizer, event_id=found)


def _event_id(view: OrganizerScopedApi, segment: str) -> int | None:
    """:func:`_event` as the id alone, remembered by the process: a scan
    does not read the event."""
    found = event_pk(segment)
    if found is None:
        return None
    return selectors.event_id_of(organizer=view.organizer, event_id=found)


# --- the views -----------------------------------------------------------------------------


class CheckinApi(OrganizerScopedApi):
    """``POST /api/organizers/{slug}/events/{event_id}/checkin/``."""

    required_action = Action.CHECK_IN
    parser_classes = [JSONParser]
    renderer_classes = [JSONRenderer]  # a gate's answer, never a page to browse

    @extend_schema(
        parameters=[EVENT_ID],
        request=CheckinRequestSerializer,
        responses={
            200: CheckinAnswerSerializer,
            400: error_response(
                "`invalid` (with `field` and `errors`): no `code`, or one over 2000 "
                "characters; a `gate` over 64 characters; `parse_error`: a body that is not JSON"
            ),
            401: NOT_AUTHENTICATED,
            403: _FORBIDDEN,
            404: _NOT_FOUND,
            413: PAYLOAD_TOO_LARGE,
            415: NOT_JSON,
        },
        summary="Scan a ticket in at a gate",
        description=_scoped(
            "Whatever the code, the answer is 200 with its `result`, and the scan is kept. "
            "Two gates scanning one code at once: exactly one `ok`. A refunded or replaced "
            "ticket is `revoked`; a ticket of another event `wrong_event`."
        ),
        operation_id="organizers_events_checkin_create",
    )
    def post(self, request, slug: str, event_id: str):
        event = _event_id(self, event_id)
        if event is None:
            return no_event()
        code, gate = checkin_request(request.data)
        answer = services.checkin(event, code, gate, request.user)
        # The service's answer is already the documented shape (the schema's
        # CheckinAnswerSerializer): rendered as it is, a scan being the
        # door's hot path (docs/performance.md, figure 16).
        return Response(answer)


class CheckinListApi(OrganizerScopedApi):
    """``GET /api/organizers/{slug}/events/{event_id}/checkin/list/``."""

    required_action = Action.CHECK_IN

    @extend_schema(
        parameters=[EVENT_ID],
        responses={
            200: CheckinListSerializer,
            401: NOT_AUTHENTICATED,
            403: _FORBIDDEN,
            404: _NOT_FOUND,
        },
        summary="What an offline gate needs: the keys, the revoked and checked-in codes",
        description=_scoped(
            "A gate that loses its connection verifies codes against `public_keys` (Ed25519 "
            "over the code's first 25 bytes) and refuses those in `revoked` and "
            "`checked_in`; it uploads what it scanned to `…/checkin/upload/` once back."
        ),
        operation_id="organizers_events_checkin_list_retrieve",
    )
    def get(self, request, slug: str, event_id: str):
        event = _event(self, event_id)
        if event is None:
            return no_event()
        return Response(CheckinListSerializer(services.checkin_list(event)).data)


class CheckinUploadApi(OrganizerScopedApi):
    """``POST /api/organizers/{slug}/events/{event_id}/checkin/upload/``."""

    required_action = Action.CHECK_IN
    parser_classes = [JSONParser]

    @extend_schema(
        parameters=[EVENT_ID],
        request=UploadRequestSerializer,
        responses={
            200: UploadAnswerSerializer,
            400: error_response(
                f"`invalid` (with `field` and `errors`): no `scans`, more than "
                f"{UPLOAD_MAX_SCANS}, or a scan without `code` or `at`; `parse_error`: a body "
                "that is not JSON"
            ),
            401: NOT_AUTHENTICATED,
            403: _FORBIDDEN,
            404: _NOT_FOUND,
            413: PAYLOAD_TOO_LARGE,
            415: NOT_JSON,
        },
        summary="Upload the scans an offline gate made",
        description=_scoped(
            "Each scan is checked in as if online at its own `at`, in the order given, and "
            "kept. A ticket in already gets `already_checked_in` with `conflict: true` (the "
            "gate let someone in twice). The same scan (code, gate, at) uploaded again is "
            "answered as the first time and recorded once."
        ),
        operation_id="organizers_events_checkin_upload_create",
    )
    def post(self, request, slug: str, event_id: str):
        event = _event(self, event_id)
        if event is None:
            return no_event()
        payload = UploadRequestSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        results = services.checkin_upload(event, payload.validated_data["scans"], request.user)
        return Response(UploadAnswerSerializer({"results": results}).data)


class CheckinProgressApi(OrganizerScopedApi):
    """``GET /api/organizers/{slug}/events/{event_id}/checkin/progress/``."""

    required_action = Action.CHECK_IN

    @extend_schema(
        parameters=[EVENT_ID],
        responses={
            200: CheckinProgressSerializer,
            401: NOT_AUTHENTICATED,
            403: _FORBIDDEN,
            404: _NOT_FOUND,
        },
        summary="How many came in, of how many, by gate",
        description=_scoped("Read live from the check-ins: the door's dashboard polls it."),
        operation_id="organizers_events_checkin_progress_retrieve",
    )
    def get(self, request, slug: str, event_id: str):
        event = _event(self, event_id)
        if event is None:
            return no_event()
        return Response(CheckinProgressSerializer(services.checkin_progress(event)).data)
