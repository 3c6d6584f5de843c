"""The buyer's side of the door in the API (docs/api.md, "Replace a ticket"):
replacing a ticket of one's own purchase with a new code. Thin: check the
path, call ``door.services.ticket_reissue``, shape the answer; the tickets
themselves are in the purchase's answer (``purchases.serializers``)."""

from __future__ import annotations

import re

from django.urls.converters import UUIDConverter
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api import NOT_AUTHENTICATED, error, error_response
from purchases.serializers import SEAT_REF_MAX, TicketSerializer

from . import services
from .errors import TicketNotFound, TicketRefused
from .tickets import VALID, TicketView

_NOT_FOUND = "no such ticket: no such purchase, another user's, or no such seat in it"


def _may_be_a_seat(ref: str) -> bool:
    return 0 < len(ref) <= SEAT_REF_MAX and "\x00" not in ref


class TicketReissueApi(APIView):
    """``POST /api/purchases/{saga_id}/tickets/{seat}/reissue/``: the buyer
    replaces a ticket (a code shared by mistake, a lost phone). The old code
    is revoked in the same commit; the new one is answered, and is the one
    the purchase's answer and page show from now on."""

    @extend_schema(
        parameters=[
            OpenApiParameter("saga_id", OpenApiTypes.UUID, OpenApiParameter.PATH, required=True),
            OpenApiParameter(
                "seat",
                OpenApiTypes.STR,
                OpenApiParameter.PATH,
                required=True,
                description="The seat's ref, e.g. A1 (the ticket's `seat`)",
            ),
        ],
        request=None,
        responses={
            200: OpenApiResponse(
                TicketSerializer,
                description="The ticket with its new code (`valid`); the old code answers "
                "`revoked` at the door from now on, offline gates too once they load their list",
            ),
            401: NOT_AUTHENTICATED,
            403: error_response(
                "`permission_denied`: session authentication without a valid CSRF token"
            ),
            404: error_response(
                "`not_found`: no such purchase, another user's (the same answer), or no "
                "ticket for that seat in it"
            ),
            409: error_response(
                "`ticket_checked_in`: the ticket was used at the door already; "
                "`ticket_revoked`: the ticket no longer lets anyone in (its seat was "
                "refunded, the purchase is not confirmed or was taken back). Nothing is written"
            ),
        },
        summary="Replace a ticket of your purchase with a new code",
        description="Not idempotent: each call revokes the code it replaces. A client that "
        "lost the answer reads the current code in the purchase's `tickets`.",
        operation_id="purchases_tickets_reissue",
    )
    def post(self, request, saga_id: str, seat: str):
        # The route takes any segment: a malformed id, or a seat ref no seat
        # can have, is a missing ticket (and never reaches a query).
        if not re.fullmatch(UUIDConverter.regex, saga_id) or not _may_be_a_seat(seat):
            return error(404, "not_found", _NOT_FOUND)
        try:
            code = services.ticket_reissue(saga_id=saga_id, seat_ref=seat, user=request.user)
        except TicketNotFound:
            return error(404, "not_found", _NOT_FOUND)
        except TicketRefused as exc:
            return error(409, exc.code, str(exc))
        return Response(TicketSerializer(TicketView(seat=seat, code=code, status=VALID)).data)
