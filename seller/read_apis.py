"""The seller's reads of an event's sales (docs/api.md, "Sales and
reports"): its purchases (a page at a time, or every row as CSV) and its
report.

Scoped like every route under ``/api/organizers/{slug}/``
(``organizers.permissions``): each view takes ``READ_SALES``; the event is
looked up in the caller's organizer, so another organizer's event id is the
same ``404`` as a missing one. Thin: parse, call ``seller.reports``, shape.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator

from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.pagination import PageNumberPagination
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from common.api import NOT_AUTHENTICATED, error, error_response
from organizers.permissions import OrganizerScopedApi
from organizers.roles import MAY, Action
from purchases.models import Event, PurchaseSaga

from . import reports
from .event_paths import no_event, organizer_event
from .read_serializers import (
    CSV_HEADER,
    EventReportSerializer,
    SellerPurchaseSerializer,
    purchase_csv_row,
)

# --- what the schema says ------------------------------------------------------------------

_EVENT_ID = OpenApiParameter("event_id", OpenApiTypes.INT, OpenApiParameter.PATH, required=True)
_STATUS = OpenApiParameter(
    "status",
    {"type": "string", "enum": list(reports.PURCHASE_STATES)},
    OpenApiParameter.QUERY,
    required=False,
    description="Only the purchases in this status (a refund does not change it: a purchase "
    "refunded in full stays `CONFIRMED`, its `payment_status` says `refunded`)",
)
_SEARCH = OpenApiParameter(
    "search",
    {"type": "string", "maxLength": reports.SEARCH_MAX_CHARS},
    OpenApiParameter.QUERY,
    required=False,
    description="The buyer's username or email (contains, any case), or exactly a purchase "
    "id or a reservation reference",
)
_ROLES = ", ".join(sorted(MAY[Action.READ_SALES]))
_SCOPED = (
    f"Members whose role may {Action.READ_SALES} ({_ROLES}); anyone else who is not a member "
    "gets the same `404` as for a missing organizer."
)
_FORBIDDEN = error_response(
    f"`permission_denied`: your role may not {Action.READ_SALES} (only {_ROLES})"
)
_NOT_FOUND = error_response(
    "`not_found`: no such organizer or one you are not a member of; no such event of this "
    "organizer (another organizer's event is as missing)"
)
_BAD_FILTER = error_response(
    "`invalid` (with `field` and `errors`): a `status` that is not a purchase status "
    "(`field`: `status`), a `search` too long or with a NUL byte (`field`: `search`)"
)


class _EventReadApi(OrganizerScopedApi):
    required_action = Action.READ_SALES

    def event(self, event_id: str) -> Event | None:
        """The organizer's event of the path, or None (missing, malformed, or
        another organizer's: the same 404)."""
        return organizer_event(self.organizer, event_id)

    def purchases(self, request, event: Event) -> QuerySet[PurchaseSaga]:
        """The filtered purchases; :class:`reports.InvalidFilter` for a bad filter."""
        return reports.event_purchases(
            event=event,
            status=request.query_params.get("status"),
            search=request.query_params.get("search"),
        )


def _invalid(exc: reports.InvalidFilter) -> Response:
    return error(400, "invalid", str(exc), field=exc.field, errors={exc.field: [exc.message]})


class EventPurchaseListApi(_EventReadApi):
    """``GET /api/organizers/{slug}/events/{event_id}/purchases/``."""

    pagination_class = PageNumberPagination

    @extend_schema(
        # The page parameter and the next and previous links come from the
        # paginator that serves them.
        parameters=[_EVENT_ID, _STATUS, _SEARCH],
        responses={
            200: SellerPurchaseSerializer(many=True),
            400: _BAD_FILTER,
            401: NOT_AUTHENTICATED,
            403: _FORBIDDEN,
            404: error_response(
                "`not_found`: no such organizer or one you are not a member of; no such "
                "event of this organizer (another organizer's event is as missing); a page "
                "past the end, or not a page number"
            ),
        },
        summary="An event's purchases, newest first, a page at a time",
        description=_SCOPED,
        operation_id="organizers_events_purchases_list",
    )
    def get(self, request, slug: str, event_id: str):
        event = self.event(event_id)
        if event is None:
            return no_event()
        try:
            purchases = self.purchases(request, event)
        except reports.InvalidFilter as exc:
            return _invalid(exc)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(purchases, request, view=self)
        return paginator.get_paginated_response(SellerPurchaseSerializer(page, many=True).data)


class _Echo:
    """A file for ``csv.writer`` that hands each line back instead of keeping it."""

    def write(self, line: str) -> str:
        return line


class _JSONWhateverAccepted(BaseContentNegotiation):
    """The CSV's errors are JSON, whatever ``Accept`` asks for (a client
    that asks for ``text/csv`` still gets the error's body, not a ``406``);
    the CSV itself is streamed, past the renderers."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None


class EventPurchaseCsvApi(_EventReadApi):
    """``GET /api/organizers/{slug}/events/{event_id}/purchases.csv``."""

    renderer_classes = [JSONRenderer]
    content_negotiation_class = _JSONWhateverAccepted

    @extend_schema(
        parameters=[_EVENT_ID, _STATUS, _SEARCH],
        responses={
            (200, "text/csv"): OpenApiResponse(
                OpenApiTypes.STR,
                description="Every purchase (the filters as the list's), newest first, one "
                f"line each after the header `{','.join(CSV_HEADER)}`; a cell starting with "
                "`=`, `+`, `-`, `@`, a tab or a carriage return is written after a `'`. Sent "
                "as an attachment, `event-<id>-purchases.csv`",
            ),
            400: _BAD_FILTER,
            401: NOT_AUTHENTICATED,
            403: _FORBIDDEN,
            404: _NOT_FOUND,
        },
        summary="An event's purchases as CSV, every one",
        description=_SCOPED,
        operation_id="organizers_events_purchases_csv",
    )
    def get(self, request, slug: str, event_id: str):
        event = self.event(event_id)
        if event is None:
            return no_event()
        try:
            purchases = self.purchases(request, event)
        except reports.InvalidFilter as exc:
            return _invalid(exc)
        response = StreamingHttpResponse(
            _csv_lines(purchases), content_type="text/csv; charset=utf-8"
        )
        response["Content-Disposition"] = f'attachment; filename="event-{event.pk}-purchases.csv"'
        return response


def _csv_lines(purchases: QuerySet[PurchaseSaga]) -> Iterator[str]:
    """The header, then a line per purchase as the batches are read."""
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_HEADER)
    for saga in reports.every_purchase(purchases):
        yield writer.writerow(purchase_csv_row(saga))


class EventReportApi(_EventReadApi):
    """``GET /api/organizers/{slug}/events/{event_id}/report/``."""

    @extend_schema(
        parameters=[_EVENT_ID],
        responses={
            200: EventReportSerializer,
            401: NOT_AUTHENTICATED,
            403: _FORBIDDEN,
            404: _NOT_FOUND,
        },
        summary="An event's report: seats by status, the ledger's money, sales by category",
        description=f"{_SCOPED} `gross` is the ledger's charges of the event's purchases, "
        "`refunded` its refunds (those that succeeded: a pending one counts once it does), "
        "`net` the difference; `by_category` counts the seats sold now and the prices they "
        "were sold at. Without refunds its `gross` adds up to `net`; a refund moves `net` "
        "apart by what it gives back beside the seats it releases (an amount, seats refunded "
        "and kept) or keeps of them (a cancellation's fee). The invariant auditor checks the "
        "money against the ledger.",
        operation_id="organizers_events_report",
    )
    def get(self, request, slug: str, event_id: str):
        event = self.event(event_id)
        if event is None:
            return no_event()
        return Response(EventReportSerializer(reports.event_report(event=event)).data)
