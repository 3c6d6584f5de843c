"""The seller's event API (docs/api.md, "Events, seat maps and prices"):
events, their seat maps and price categories, publishing, blocks.

Every view is under ``/api/organizers/{slug}/`` and declares its action
(``organizers.permissions``). Thin: read the body with ``seller.seat_maps``
(every problem at once), call one service or selector, shape the answer. A
400 names the first problem (``field``, ``detail``) and lists them all by
path in ``errors``. An event id that is not the organizer's answers as a
missing one.

The routes that take a seat map read bodies up to ``SEAT_MAP_MAX_BYTES``
(``max_request_bytes``: 100,000 seats are about 15 MB of JSON), the others
the project's ``MAX_REQUEST_BYTES``.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from typing import IO, Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.exceptions import ParseError
from rest_framework.pagination import PageNumberPagination
from rest_framework.parsers import BaseParser
from rest_framework.response import Response

from common.api import NOT_AUTHENTICATED, PayloadTooLarge, error, error_response
from common.parsers import JSONParser
from organizers.permissions import OrganizerScopedApi
from organizers.roles import Action
from purchases.models import EventStatus

from . import selectors, services
from .api_common import EVENT_ID, forbidden, scoped
from .errors import (
    EventError,
    EventInvalid,
    EventNotDraft,
    EventNotFound,
    SeatMapInvalid,
    SeatsNotBlockable,
    UnknownSeatRefs,
)
from .event_paths import event_pk, no_event, organizer_event
from .seat_maps import (
    NON_FIELD,
    event_from_json,
    seat_map_from_json,
    seats_from_csv,
)
from .serializers import (
    SellerEventChangeSerializer,
    SellerEventCreateSerializer,
    SellerEventSerializer,
    SellerSeatMapAnswerSerializer,
    SellerSeatMapPutSerializer,
    SellerSeatsChangedSerializer,
    SellerSeatsSerializer,
    event_answer,
    seat_map_answer,
)

# 100,000 seats of JSON (about 15 MB written compactly) with room to spare.
SEAT_MAP_MAX_BYTES = 32 * 1024 * 1024


# --- bodies ----------------------------------------------------------------------------------


def _bounded(stream: IO[bytes] | None) -> bytes:
    """The body, refused past ``SEAT_MAP_MAX_BYTES`` (``413``) without
    reading more than one byte beyond."""
    body = stream.read(SEAT_MAP_MAX_BYTES + 1) if stream is not None else b""
    if len(body) > SEAT_MAP_MAX_BYTES:
        raise PayloadTooLarge(f"request bodies here are limited to {SEAT_MAP_MAX_BYTES} bytes")
    return body


class SeatMapJSONParser(BaseParser):
    """The project's JSON parser (its depth limit, its messages), for bodies
    up to ``SEAT_MAP_MAX_BYTES``.

    Not a subclass of DRF's ``JSONParser``: DRF reads the body of a request
    for one of those through ``request.body``, which Django refuses past
    ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (2.5 MB); this one reads the stream,
    bounded by its own limit."""

    media_type = "application/json"
    renderer_class = JSONParser.renderer_class

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        return JSONParser().parse(io.BytesIO(_bounded(stream)), media_type, parser_context)


class SeatMapCSVParser(BaseParser):
    """A ``text/csv`` seat map, as text (UTF-8 unless the ``charset`` says
    otherwise; a byte-order mark is dropped by ``seats_from_csv``)."""

    media_type = "text/csv"

    def parse(  # type: ignore[override]  # request.data is what a parser answers: the text
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> str:
        body = _bounded(stream)
        charset = re.search(r"charset=([\w.-]+)", media_type or "")
        try:
            return body.decode(charset.group(1) if charset else "utf-8")
        except (LookupError, ValueError):  # an unknown charset, or not text in it
            raise ParseError(
                "CSV parse error - not text in its charset (UTF-8 by default)"
            ) from None


# --- answers ---------------------------------------------------------------------------------


def _invalid(errors: list[tuple[str, str]]) -> Response:
    by_path: dict[str, list[str]] = {}
    for path, message in errors:
        by_path.setdefault(path, []).append(message)
    field, message = errors[0]
    return error(400, "invalid", f"{field}: {message}", field=field, errors=by_path)


def _refused(exc: EventError | SeatMapInvalid) -> Response:
    """The answer to what a service or a reader refused."""
    if isinstance(exc, SeatMapInvalid):
        return _invalid(exc.errors)
    if isinstance(exc, EventNotFound):
        return no_event()
    if isinstance(exc, UnknownSeatRefs):
        detail = str(exc)
        return error(
            400, "invalid", detail, field="seats", errors={"seats": [detail]}, seats=exc.refs
        )
    if isinstance(exc, SeatsNotBlockable):
        return error(409, exc.code, str(exc), seats=exc.refs)
    if isinstance(exc, EventInvalid):
        return _invalid([(exc.field, exc.message)])
    return error(exc.status, exc.code, str(exc))


def _not_an_object() -> Response:
    return _invalid([(NON_FIELD, "expected a JSON object")])


# --- what the schema says --------------------------------------------------------------------

_NO_EVENT = error_response(
    "`not_found`: no such organizer, or one you are not a member of; or no such event of "
    "it (another organizer's event answers the same)"
)
_TOO_LARGE = error_response(
    f"`payload_too_large`: a body over {SEAT_MAP_MAX_BYTES} bytes here (the seat map "
    "routes), over `MAX_REQUEST_BYTES` elsewhere"
)
_SMALL_BODY_TOO_LARGE = error_response(
    "`payload_too_large`: a body over `MAX_REQUEST_BYTES` (16 KiB by default)"
)
_NOT_JSON = error_response("`unsupported_media_type`: a body that is not `application/json`")


def _bad_body(fields: str) -> OpenApiResponse:
    return error_response(
        "`invalid`: every problem, each named by its path in `errors` "
        "(`seat_map.sections[0].rows[2].seats[5].ref`, `price_categories[1].code`; for a CSV "
        f"`line 17: ref`), the first in `field` and `detail`: {fields}. At most 100, then "
        "`...`: `... and N more`. `parse_error`: a body that is not JSON (or CSV)"
    )


_CONFLICT_STATE = (
    "`event_not_draft`: the event is on sale or cancelled; `event_cancelled`: the event is "
    "cancelled"
)


# --- the views -------------------------------------------------------------------------------


class EventListCreateApi(OrganizerScopedApi):
    """``GET | POST /api/organizers/{slug}/events/``."""

    required_actions = {"GET": Action.VIEW_ORGANIZER, "POST": Action.MANAGE_EVENTS}
    parser_classes = [SeatMapJSONParser]
    pagination_class = PageNumberPagination
    max_request_bytes = SEAT_MAP_MAX_BYTES

    @extend_schema(
        # Paginated by pagination_class (the page parameter and the links).
        responses={
            200: SellerEventSerializer(many=True),
            401: NOT_AUTHENTICATED,
            404: error_response(
                "`not_found`: no such organizer, or one you are not a member of; a page past "
                "the end, or not a page number"
            ),
        },
        summary="The organizer's events, newest first, a page at a time",
        description=scoped(Action.VIEW_ORGANIZER),
        operation_id="organizers_events_list",
    )
    def get(self, request, slug: str):
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(selectors.events_of(organizer=self.organizer), request)
        return paginator.get_paginated_response(SellerEventSerializer(page, many=True).data)

    @extend_schema(
        request={"application/json": SellerEventCreateSerializer},
        responses={
            201: OpenApiResponse(SellerEventSerializer, description="Created, a `draft`"),
            400: _bad_body(
                "a missing name, starts_at or currency; a currency that is not ISO 4217; "
                "sales_start not before sales_end; hold_seconds outside 60 to 3600; "
                "max_seats_per_buyer under 1; fee_percent outside 0 to 100; a category code "
                "twice, or a category's currency not the event's; a seat ref twice, a seat "
                "naming no category of the event, a number under 1, a coordinate that is not "
                "a finite number; more than 100,000 seats (one error, on `seat_map`)"
            ),
            401: NOT_AUTHENTICATED,
            403: forbidden(Action.MANAGE_EVENTS),
            404: error_response("`not_found`: no such organizer, or one you are not a member of"),
            413: _TOO_LARGE,
            415: _NOT_JSON,
        },
        summary="Create an event (a draft) with its price categories and seat map",
        description=scoped(
            Action.MANAGE_EVENTS,
            "The body is validated whole: nothing is written unless all of it is right.",
        ),
        operation_id="organizers_events_create",
    )
    def post(self, request, slug: str):
        try:
            spec = event_from_json(request.data)
            event = services.event_create(organizer=self.organizer, spec=spec)
        except (SeatMapInvalid, EventError) as exc:
            return _refused(exc)
        created = selectors.event_of(organizer=self.organizer, event_id=event.pk)
        return Response(event_answer(created), status=201)


class EventDetailApi(OrganizerScopedApi):
    """``GET | PATCH /api/organizers/{slug}/events/{event_id}/``."""

    required_actions = {"GET": Action.VIEW_ORGANIZER, "PATCH": Action.MANAGE_EVENTS}

    @extend_schema(
        parameters=[EVENT_ID],
        responses={200: SellerEventSerializer, 401: NOT_AUTHENTICATED, 404: _NO_EVENT},
        summary="One of the organizer's events",
        description=scoped(Action.VIEW_ORGANIZER),
        operation_id="organizers_events_retrieve",
    )
    def get(self, request, slug: str, event_id: str):
        event = organizer_event(self.organizer, event_id)
        if event is None:
            return no_event()
        return Response(event_answer(event))

    @extend_schema(
        parameters=[EVENT_ID],
        request={"application/json": SellerEventChangeSerializer},
        responses={
            200: OpenApiResponse(SellerEventSerializer, description="Changed"),
            400: _bad_body(
                "as for a create; `price_categories` naming a category that seats of the "
                "draft still name; a new currency without price_categories in it"
            ),
            401: NOT_AUTHENTICATED,
            403: forbidden(Action.MANAGE_EVENTS),
            404: _NO_EVENT,
            409: error_response(
                "`event_cancelled`: the event is cancelled; `event_not_draft`: a new currency, "
                "or categories added or removed, on an event no longer a draft"
            ),
            413: _SMALL_BODY_TOO_LARGE,
            415: _NOT_JSON,
        },
        summary="Change an event: its fields, its price categories and their prices",
        description=scoped(
            Action.MANAGE_EVENTS,
            "Only the fields sent change. Name, times, sales window, hold, buyer limit and "
            "refund policy change at any time but on a cancelled event; so do the prices "
            "(and names) of the existing categories: a new price reaches the seats that are "
            "available or blocked, never one held or sold (a purchase keeps the price its "
            "seats were held at). The currency, and adding or removing categories, only "
            "while the event is a draft.",
        ),
        operation_id="organizers_events_partial_update",
    )
    def patch(self, request, slug: str, event_id: str):
        pk = event_pk(event_id)
        if pk is None:
            return no_event()
        try:
            services.event_update(organizer=self.organizer, event_id=pk, changes=request.data)
            event = selectors.event_of(organizer=self.organizer, event_id=pk)
        except (SeatMapInvalid, EventError) as exc:
            return _refused(exc)
        return Response(event_answer(event))


_SEAT_ROWS = (
    "ref",
    "section",
    "row",
    "number",
    "category",
    "x",
    "y",
    "accessible",
    "status",
    "block_reason",
)


class SeatMapApi(OrganizerScopedApi):
    """``GET | PUT /api/organizers/{slug}/events/{event_id}/seat-map/``."""

    required_actions = {"GET": Action.VIEW_ORGANIZER, "PUT": Action.MANAGE_EVENTS}
    parser_classes = [SeatMapJSONParser, SeatMapCSVParser]
    max_request_bytes = SEAT_MAP_MAX_BYTES

    @extend_schema(
        parameters=[EVENT_ID],
        responses={200: SellerSeatMapAnswerSerializer, 401: NOT_AUTHENTICATED, 404: _NO_EVENT},
        summary="An event's seat map, with each seat's status, and its price categories",
        description=scoped(
            Action.VIEW_ORGANIZER,
            "Sections and rows in the order the map gave them; the shape `PUT` takes.",
        ),
        operation_id="organizers_events_seat_map_retrieve",
    )
    def get(self, request, slug: str, event_id: str):
        event = organizer_event(self.organizer, event_id)
        if event is None:
            return no_event()
        rows = selectors.seat_map_of(event=event).values_list(*_SEAT_ROWS)
        categories = selectors.categories_of(event=event)
        return Response(seat_map_answer(rows=rows, categories=categories))

    @extend_schema(
        parameters=[EVENT_ID],
        # CSV is taken too (described below), but not listed: a generated
        # client cannot send it and refuses an operation that lists it.
        request={"application/json": SellerSeatMapPutSerializer},
        responses={
            200: OpenApiResponse(SellerEventSerializer, description="The map replaced"),
            400: _bad_body(
                "`seat_map` missing; the rules of a create's seat map and categories; "
                "for CSV, a header without `row`, `number`, `ref` or `category`, an unknown "
                "column, a line with another number of fields"
            ),
            401: NOT_AUTHENTICATED,
            403: forbidden(Action.MANAGE_EVENTS),
            404: _NO_EVENT,
            409: error_response(
                "`event_not_draft`: the event is on sale or cancelled (its seat map is "
                "frozen); `seat_unavailable`: seats of it are held or sold (listed in `seats`)"
            ),
            413: _TOO_LARGE,
            415: error_response(
                "`unsupported_media_type`: a body that is neither `application/json` nor `text/csv`"
            ),
        },
        summary="Replace a draft's whole seat map (JSON, or CSV)",
        description=scoped(
            Action.MANAGE_EVENTS,
            'JSON: `{"seat_map": {"sections": [...]}, "price_categories"?: [...]}` '
            "(with `price_categories`, they replace the event's too). Or CSV, with "
            "`Content-Type: text/csv`: a header naming the columns "
            "`section,row,number,ref,category,x,y,accessible` (any order; `section`, `x`, "
            "`y` and `accessible` may be left out), then a seat a line; `accessible` is "
            "true/false, yes/no or 1/0; an error names its line (`line 17: ref`, line 1 "
            "being the header). Up to 100,000 seats, validated whole: nothing is written "
            "unless all of it is right.",
        ),
        operation_id="organizers_events_seat_map_update",
    )
    def put(self, request, slug: str, event_id: str):
        pk = event_pk(event_id)
        if pk is None:
            return no_event()
        try:
            event = selectors.event_of(organizer=self.organizer, event_id=pk)
            if event.status != EventStatus.DRAFT:
                # Before reading a large body: the service refuses it anyway.
                raise EventNotDraft("the seat map changes only while the event is a draft")
            codes = {c.code for c in event.price_categories.all()}
            categories = None
            if isinstance(request.data, str):
                seats = seats_from_csv(request.data, categories=codes)
            else:
                seats, categories = seat_map_from_json(
                    request.data, currency=event.currency, categories=codes
                )
            services.seat_map_replace(
                organizer=self.organizer, event_id=pk, seats=seats, categories=categories
            )
            event = selectors.event_of(organizer=self.organizer, event_id=pk)
        except (SeatMapInvalid, EventError) as exc:
            return _refused(exc)
        return Response(event_answer(event))


class EventPublishApi(OrganizerScopedApi):
    """``POST /api/organizers/{slug}/events/{event_id}/publish/``."""

    required_action = Action.MANAGE_EVENTS

    @extend_schema(
        parameters=[EVENT_ID],
        request=None,
        responses={
            200: OpenApiResponse(SellerEventSerializer, description="On sale"),
            401: NOT_AUTHENTICATED,
            403: forbidden(Action.MANAGE_EVENTS),
            404: _NO_EVENT,
            409: error_response(
                "`event_not_draft`: it is on sale or cancelled already; `event_has_no_seats`: "
                "its seat map is empty"
            ),
        },
        summary="Put a draft on sale",
        description=scoped(
            Action.MANAGE_EVENTS,
            "The public catalog lists it from then on; its seat map and categories are "
            "frozen (prices may still change).",
        ),
        operation_id="organizers_events_publish",
    )
    def post(self, request, slug: str, event_id: str):
        pk = event_pk(event_id)
        if pk is None:
            return no_event()
        try:
            services.event_publish(organizer=self.organizer, event_id=pk)
            event = selectors.event_of(organizer=self.organizer, event_id=pk)
        except EventError as exc:
            return _refused(exc)
        return Response(event_answer(event))


def _seats_body(data: Any) -> tuple[list[str], str] | Response:
    """The refs and reason of a block or unblock body, or the 400."""
    if not isinstance(data, dict):
        return _not_an_object()
    refs = data.get("seats")
    if not isinstance(refs, list):
        message = "this field is required" if refs is None else "must be a list of seat refs"
        return _invalid([("seats", message)])
    return refs, data.get("reason", "")


_SEATS_RESPONSES = {
    400: _bad_body(
        "`seats` missing or empty, over 100,000 refs, a ref that is not 1 to 32 printable "
        "characters (`seats[N]`); a reason over 200 characters; refs that name no seat of "
        "the event (`field` `seats`, listed in `seats`)"
    ),
    401: NOT_AUTHENTICATED,
    403: forbidden(Action.MANAGE_EVENTS),
    404: _NO_EVENT,
    413: _TOO_LARGE,
    415: _NOT_JSON,
}


class SeatsBlockApi(OrganizerScopedApi):
    """``POST /api/organizers/{slug}/events/{event_id}/seats/block/``."""

    required_action = Action.MANAGE_EVENTS
    parser_classes = [SeatMapJSONParser]
    max_request_bytes = SEAT_MAP_MAX_BYTES

    @extend_schema(
        parameters=[EVENT_ID],
        request={"application/json": SellerSeatsSerializer},
        responses={
            200: OpenApiResponse(SellerSeatsChangedSerializer, description="Blocked"),
            **_SEATS_RESPONSES,
            409: error_response(
                "`seat_unavailable`: seats held or sold (listed in `seats`): none is blocked; "
                "`event_cancelled`: the event is cancelled"
            ),
        },
        summary="Take seats off sale (status `unavailable`), all or none",
        description=scoped(
            Action.MANAGE_EVENTS,
            "A seat held or sold cannot be blocked: then none is. A seat blocked already "
            "stays so (its reason becomes this one).",
        ),
        operation_id="organizers_events_seats_block",
    )
    def post(self, request, slug: str, event_id: str):
        return _seats_changed(
            request,
            event_id,
            status="unavailable",
            change=lambda pk, refs, reason: services.seats_block(
                organizer=self.organizer, event_id=pk, refs=refs, reason=reason
            ),
        )


class SeatsUnblockApi(OrganizerScopedApi):
    """``POST /api/organizers/{slug}/events/{event_id}/seats/unblock/``."""

    required_action = Action.MANAGE_EVENTS
    parser_classes = [SeatMapJSONParser]
    max_request_bytes = SEAT_MAP_MAX_BYTES

    @extend_schema(
        parameters=[EVENT_ID],
        request={"application/json": SellerSeatsSerializer},
        responses={
            200: OpenApiResponse(SellerSeatsChangedSerializer, description="Unblocked"),
            **_SEATS_RESPONSES,
            409: error_response("`event_cancelled`: the event is cancelled"),
        },
        summary="Put blocked seats back on sale (status `available`)",
        description=scoped(
            Action.MANAGE_EVENTS,
            "A seat that is not blocked (available, held, sold) is left as it is. The reason "
            "is not read.",
        ),
        operation_id="organizers_events_seats_unblock",
    )
    def post(self, request, slug: str, event_id: str):
        return _seats_changed(
            request,
            event_id,
            status="available",
            change=lambda pk, refs, reason: services.seats_unblock(
                organizer=self.organizer, event_id=pk, refs=refs
            ),
        )


def _seats_changed(request, event_id: str, *, status: str, change) -> Response:
    """Block or unblock: the event's id and the body read, ``change(pk,
    refs, reason)`` called, the answer shaped (the seats named, once each,
    in the order given)."""
    pk = event_pk(event_id)
    if pk is None:
        return no_event()
    body = _seats_body(request.data)
    if isinstance(body, Response):
        return body
    refs, reason = body
    try:
        changed = change(pk, refs, reason)
    except EventError as exc:
        return _refused(exc)
    return Response({"status": status, "seats": list(dict.fromkeys(refs)), "changed": changed})
