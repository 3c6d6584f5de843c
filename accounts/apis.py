"""``POST /api/auth/signup/`` (docs/api.md, "Accounts"). Thin: validate, call
the service, shape the answer."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api import NOT_JSON, PAYLOAD_TOO_LARGE, RETRY_AFTER, error_response
from common.parsers import JSONParser

# The token endpoint's throttle, and its count: sign-ups and password
# guesses from one address share AUTH_TOKEN_THROTTLE_RATE (a sign-up says
# whether a username is taken, so it is a guess of a kind too).
from purchases.throttling import TokenThrottle

from . import services
from .serializers import AccountSerializer, SignupSerializer


class SignupApi(APIView):
    """``POST /api/auth/signup/``: a new buyer's account."""

    parser_classes = [JSONParser]
    # Takes no credentials, as the token endpoint: a stale token in the
    # header must not stand between a visitor and an account.
    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = [TokenThrottle]

    @extend_schema(
        request=SignupSerializer,
        auth=[],
        parameters=[RETRY_AFTER],
        responses={
            201: AccountSerializer,
            400: error_response(
                "`invalid` (with `field` and `errors`): a missing or malformed field, a "
                "`username` or `email` an account already has (whatever its case), or a "
                "`password` Django's validators refuse (`errors.password` lists why); "
                "`parse_error`: a body that is not JSON"
            ),
            413: PAYLOAD_TOO_LARGE,
            415: NOT_JSON,
            429: error_response(
                "`throttled`: more than `AUTH_TOKEN_THROTTLE_RATE` attempts from one client "
                "address, counted with those at `POST /api/auth/token/` and the posts of the "
                "sign-up and password reset pages; `Retry-After` says when to try again"
            ),
        },
        summary="Sign up: create a buyer's account",
        description="Then exchange the username and password for a token at "
        "`POST /api/auth/token/`. Takes no credentials itself.",
    )
    def post(self, request, *args, **kwargs):
        payload = SignupSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            user = services.account_create(**payload.validated_data)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from exc
        return Response(AccountSerializer(user).data, status=201)
