"""What every REST API view of the project shares (docs/api.md, "Errors"):
the one error shape, as an answer (:func:`error`) and as the schema's
``Error`` component (:class:`ErrorSerializer`, :func:`error_response`), and
the descriptions of answers that many operations give. Each app's
``apis.py`` imports them from here, so that no app imports another's views
for them."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.response import Response


def error(status_code: int, code: str, detail: str, **extra: Any) -> Response:
    return Response({"code": code, "detail": detail, **extra}, status=status_code)


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
