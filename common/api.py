"""What every REST API view of the project shares (docs/api.md, "Errors"):
the one error shape, as an answer (:func:`error`), as what any exception
becomes (:func:`exception_handler`, ``REST_FRAMEWORK["EXCEPTION_HANDLER"]``)
and as the schema's ``Error`` component (:class:`ErrorSerializer`,
:func:`error_response`), and the descriptions of answers that many
operations give. Each app's ``apis.py`` imports them from here, so that no
app imports another's views for them."""

from __future__ import annotations

import logging
from typing import Any

from django.core import exceptions as django_exceptions
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import exceptions, serializers
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def error(status_code: int, code: str, detail: str, **extra: Any) -> Response:
    return Response({"code": code, "detail": detail, **extra}, status=status_code)


# --- what any exception becomes ----------------------------------------------------


class BadRequest(exceptions.APIException):
    """Django's ``SuspiciousOperation`` and ``BadRequest`` in a view: 400,
    as Django answers them outside one (config/urls.py, ``handler400``)."""

    status_code = 400
    default_detail = "Bad request."
    default_code = "bad_request"


class PayloadTooLarge(exceptions.APIException):
    """Django's ``RequestDataTooBig``: the code the size limit answers with
    (config/middleware.py)."""

    status_code = 413
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


def _as_api_exception(exc: Exception) -> exceptions.APIException | None:
    """The DRF exception ``exc`` is answered as; None for one neither Django
    nor DRF raises for a request (a bug)."""
    if isinstance(exc, exceptions.APIException):
        return exc
    message = str(exc.args[0]) if exc.args and exc.args[0] else None
    if isinstance(exc, Http404):
        # DRF raises a bare Http404 for an unknown ?format=.
        return exceptions.NotFound(message)
    if isinstance(exc, django_exceptions.PermissionDenied):
        return exceptions.PermissionDenied(message)
    if isinstance(exc, django_exceptions.RequestDataTooBig):
        return PayloadTooLarge()
    if isinstance(exc, django_exceptions.SuspiciousOperation):
        # Logged where Django logs it outside a view, for the alerts on it;
        # its message (a host name, a path) is for the log, not the client.
        logging.getLogger(f"django.security.{type(exc).__name__}").error(
            str(exc), exc_info=exc, extra={"status_code": 400}
        )
        return BadRequest()
    if isinstance(exc, django_exceptions.BadRequest):
        return BadRequest()
    return None


def _first_message(detail: Any) -> str:
    if isinstance(detail, dict):
        for key, value in detail.items():
            return f"{key}: {_first_message(value)}"
        return ""
    if isinstance(detail, list):
        return _first_message(detail[0]) if detail else ""
    return str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, total over what Django and DRF raise, and reshaped to
    {"code", "detail", ...} (docs/api.md, "Errors"): ``code`` is the DRF
    exception's ``default_code`` (``invalid`` for a ``ValidationError``,
    which also names its first ``field`` and lists its ``errors``). Any
    other exception is a bug: left to Django, which logs it with its
    traceback and answers ``500 server_error`` (config/urls.py)."""
    api_exc = _as_api_exception(exc)
    if api_exc is None:
        return None
    # DRF's: the status, Retry-After, WWW-Authenticate, the rollback.
    response = drf_exception_handler(api_exc, context)
    if response is None:  # pragma: no cover  # DRF answers every APIException
        return None
    code = api_exc.default_code
    detail = api_exc.detail
    message = _first_message(detail) or str(type(api_exc).default_detail)
    if isinstance(api_exc, exceptions.ValidationError) and isinstance(detail, dict) and detail:
        # "field" names the field "detail" talks about: the first one.
        response.data = {
            "code": code,
            "detail": message,
            "field": next(iter(detail)),
            "errors": detail,
        }
    else:
        response.data = {"code": code, "detail": message}
    _answer_in_json(context.get("request"))
    return response


def _answer_in_json(request: Any) -> None:
    """An error is JSON, but for someone browsing the API. A failed content
    negotiation (an unknown ``?format=``, an ``Accept`` nothing serves)
    leaves no renderer chosen, and DRF would then take the view's first
    one: the schema's is YAML."""
    if request is None:
        return
    chosen = getattr(request, "accepted_renderer", None)
    if not isinstance(chosen, JSONRenderer | BrowsableAPIRenderer):
        request.accepted_renderer = JSONRenderer()
        request.accepted_media_type = JSONRenderer.media_type


class ErrorSerializer(serializers.Serializer):
    """Every error (docs/api.md, "Errors"). Each response lists its codes."""

    code = serializers.CharField(read_only=True, help_text="snake_case, e.g. seat_unavailable")
    detail = serializers.CharField(read_only=True, help_text="A sentence for a person")
    field = serializers.CharField(
        required=False, help_text="400 invalid: the field `detail` talks about"
    )
    errors = serializers.DictField(  # type: ignore[assignment]  # DRF's metaclass moves it off
        required=False, help_text="400 invalid: every problem, by field"
    )
    seats = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="409 seat_unavailable: the seats held or sold; 400 invalid: the unknown seats",
    )


# --- what the schema says about answers ---------------------------------------------
# Each error response lists the codes it carries; the body is ErrorSerializer.


def error_response(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description)


NOT_AUTHENTICATED = error_response(
    "`not_authenticated`: no credentials; `authentication_failed`: invalid or revoked "
    "credentials. Checked before anything else about the request"
)
PAYLOAD_TOO_LARGE = error_response(
    "`payload_too_large`: a body over `MAX_REQUEST_BYTES` (16 KiB by default)"
)
NOT_JSON = error_response("`unsupported_media_type`: a body that is not `application/json`")


def retry_after(*statuses: int) -> OpenApiParameter:
    """The ``Retry-After`` header of the answers with ``statuses``."""
    return OpenApiParameter(
        "Retry-After",
        OpenApiTypes.INT,
        OpenApiParameter.HEADER,
        required=True,
        response=list(statuses),
        description="Seconds to wait before trying again",
    )


# The header of every throttled answer (429).
RETRY_AFTER = retry_after(429)
