"""The organizers' REST API (docs/api.md, "Organizers and roles").

``/api/organizers/`` is any signed-in user's: the organizers they belong
to, and a new one with them as its owner. Everything under
``/api/organizers/{slug}/`` is scoped by ``OrganizerScopedApi``: each view
declares its action, ``organizers.permissions`` checks it. Thin, like the
other apps' APIs: parse, call one service or selector, shape the answer;
errors in the project's one shape (common/api.py).
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api import NOT_AUTHENTICATED, NOT_JSON, PAYLOAD_TOO_LARGE, error, error_response

from . import selectors, services
from .errors import MemberNotFound, OrganizerConflict, OrganizerInvalid, OrganizerNotFound
from .models import SLUG_RULE
from .permissions import NOT_FOUND, OrganizerScopedApi
from .roles import MAY, Action
from .serializers import (
    MemberAddSerializer,
    MemberSerializer,
    OrganizerCreateSerializer,
    OrganizerSerializer,
)


def _invalid(exc: OrganizerInvalid) -> Response:
    return error(400, "invalid", str(exc), field=exc.field, errors={exc.field: [exc.message]})


def _conflict(exc: OrganizerConflict) -> Response:
    return error(409, exc.code, str(exc))


def _roles(action: Action) -> str:
    return ", ".join(sorted(MAY[action]))


def _scoped(action: Action) -> str:
    return (
        f"Members whose role may {action} ({_roles(action)}); anyone else who is not a "
        "member gets the same `404` as for a missing organizer."
    )


NOT_A_MEMBER = error_response(
    "`not_found`: no such organizer, or one you are not a member of (the same answer)"
)


def _forbidden(action: Action) -> OpenApiResponse:
    return error_response(
        f"`permission_denied`: your role may not {action} (only {_roles(action)}), or session "
        "authentication without a valid CSRF token"
    )


def _bad_body(fields: str) -> OpenApiResponse:
    return error_response(
        f"`invalid` (with `field` and `errors`): {fields}; `parse_error`: a body that is not JSON"
    )


class OrganizerListCreateApi(APIView):
    """``GET | POST /api/organizers/``: any signed-in user."""

    @extend_schema(
        responses={200: OrganizerSerializer(many=True), 401: NOT_AUTHENTICATED},
        summary="The organizers you belong to, with your role in each, by slug",
        operation_id="organizers_list",
    )
    def get(self, request):
        memberships = selectors.memberships_of(user=request.user)
        return Response(OrganizerSerializer(memberships, many=True).data)

    @extend_schema(
        request=OrganizerCreateSerializer,
        responses={
            201: OpenApiResponse(OrganizerSerializer, description="Created; you are its owner"),
            400: _bad_body(
                f"a slug that is not {SLUG_RULE}, or is taken (`field`: `slug`); "
                f"an empty name or one over {services.NAME_MAX_CHARS} characters (`name`); "
                "a missing field"
            ),
            401: NOT_AUTHENTICATED,
            403: error_response(
                "`permission_denied`: session authentication without a valid CSRF token"
            ),
            413: PAYLOAD_TOO_LARGE,
            415: NOT_JSON,
        },
        summary="Create an organizer, with you as its owner",
        operation_id="organizers_create",
    )
    def post(self, request):
        payload = OrganizerCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            membership = services.organizer_create(owner=request.user, **payload.validated_data)
        except OrganizerInvalid as exc:
            return _invalid(exc)
        return Response(OrganizerSerializer(membership).data, status=201)


class OrganizerDetailApi(OrganizerScopedApi):
    """``GET | DELETE /api/organizers/{slug}/``."""

    required_actions = {"GET": Action.VIEW_ORGANIZER, "DELETE": Action.DELETE_ORGANIZER}

    @extend_schema(
        responses={
            200: OrganizerSerializer,
            401: NOT_AUTHENTICATED,
            404: NOT_A_MEMBER,
        },
        summary="One of your organizers, with your role",
        description=_scoped(Action.VIEW_ORGANIZER),
        operation_id="organizers_retrieve",
    )
    def get(self, request, slug: str):
        return Response(OrganizerSerializer(self.membership).data)

    @extend_schema(
        responses={
            204: OpenApiResponse(description="Deleted, with its members and webhook endpoints"),
            401: NOT_AUTHENTICATED,
            403: _forbidden(Action.DELETE_ORGANIZER),
            404: NOT_A_MEMBER,
            409: error_response("`organizer_has_events`: it has events"),
        },
        summary="Delete an organizer that has no events",
        description=_scoped(Action.DELETE_ORGANIZER),
        operation_id="organizers_destroy",
    )
    def delete(self, request, slug: str):
        try:
            services.organizer_delete(organizer=self.organizer)
        except OrganizerConflict as exc:
            return _conflict(exc)
        except OrganizerNotFound:  # deleted meanwhile
            return error(404, "not_found", NOT_FOUND)
        return Response(status=204)


class MemberListAddApi(OrganizerScopedApi):
    """``GET | POST /api/organizers/{slug}/members/``."""

    required_action = Action.MANAGE_MEMBERS

    @extend_schema(
        responses={
            200: MemberSerializer(many=True),
            401: NOT_AUTHENTICATED,
            403: _forbidden(Action.MANAGE_MEMBERS),
            404: NOT_A_MEMBER,
        },
        summary="An organizer's members and their roles, by username",
        description=_scoped(Action.MANAGE_MEMBERS),
        operation_id="organizers_members_list",
    )
    def get(self, request, slug: str):
        return Response(
            MemberSerializer(selectors.members_of(organizer=self.organizer), many=True).data
        )

    @extend_schema(
        request=MemberAddSerializer,
        responses={
            200: OpenApiResponse(MemberSerializer, description="A member's role changed"),
            201: OpenApiResponse(MemberSerializer, description="A new member"),
            400: _bad_body(
                "no such user (`field`: `username`); a role that is not one of the four "
                "(`role`); a missing field"
            ),
            401: NOT_AUTHENTICATED,
            403: _forbidden(Action.MANAGE_MEMBERS),
            404: NOT_A_MEMBER,
            409: error_response("`last_owner`: the last owner's role cannot change"),
            413: PAYLOAD_TOO_LARGE,
            415: NOT_JSON,
        },
        summary="Add a member with a role, or give a member another role",
        description=_scoped(Action.MANAGE_MEMBERS),
        operation_id="organizers_members_create",
    )
    def post(self, request, slug: str):
        payload = MemberAddSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            membership, created = services.member_add(
                organizer=self.organizer, **payload.validated_data
            )
        except OrganizerInvalid as exc:
            return _invalid(exc)
        except OrganizerConflict as exc:
            return _conflict(exc)
        except OrganizerNotFound:  # deleted meanwhile
            return error(404, "not_found", NOT_FOUND)
        return Response(MemberSerializer(membership).data, status=201 if created else 200)


class MemberDetailApi(OrganizerScopedApi):
    """``DELETE /api/organizers/{slug}/members/{username}/``."""

    required_action = Action.MANAGE_MEMBERS

    @extend_schema(
        responses={
            204: OpenApiResponse(description="No longer a member"),
            401: NOT_AUTHENTICATED,
            403: _forbidden(Action.MANAGE_MEMBERS),
            404: error_response(
                "`not_found`: no such organizer, one you are not a member of, or no such "
                "member of it"
            ),
            409: error_response("`last_owner`: the last owner cannot be removed"),
        },
        summary="Remove a member",
        description=_scoped(Action.MANAGE_MEMBERS),
        operation_id="organizers_members_destroy",
    )
    def delete(self, request, slug: str, username: str):
        try:
            services.member_remove(organizer=self.organizer, username=username)
        except MemberNotFound:
            return error(404, "not_found", "no such member of this organizer")
        except OrganizerConflict as exc:
            return _conflict(exc)
        except OrganizerNotFound:  # deleted meanwhile
            return error(404, "not_found", NOT_FOUND)
        return Response(status=204)
