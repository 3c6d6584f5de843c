"""The fake processor's HTTP face: thin wrappers around :mod:`.services`.

Plain Django views on purpose (not DRF): the fake stands for a remote
processor, so it stays out of the project's OpenAPI schema, needs no
authentication and is CSRF-exempt. Every answer, errors included, is JSON of
the shape ``{"code", "detail"}`` for errors.

Delays are simulated here, never inside a transaction: ``FAKE_GATEWAY_LATENCY_MS``
before every request, and ``FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS`` after the
service committed an answer that "times out". Settings are read per request so
tests can override them.

A stall is logged here, once, at INFO ("stalled ... on purpose"): it is the
fake's job (docs/api.md, "Test payment methods"), so its 504 must not read as a
server error of this service, which is how Django's request logger would log
it (at ERROR, like every 5xx).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.utils.log import log_response
from django.views.decorators.csrf import csrf_exempt

from . import services
from .services import Answer, error

logger = logging.getLogger(__name__)


def _respond(request: HttpRequest, answer: Answer) -> JsonResponse:
    response = JsonResponse(answer.body, status=answer.status_code, safe=False)
    if answer.times_out:
        delay = settings.FAKE_GATEWAY_TIMEOUT_DELAY_SECONDS
        time.sleep(delay)
        # Marks the response as logged: Django's request logger leaves it alone.
        log_response(
            "fake gateway stalled %ss on purpose, then answered %s (the client gave up): %s",
            delay,
            answer.status_code,
            request.path,
            response=response,
            request=request,
            logger=logger,
            level="info",
        )
    return response


def _endpoint(method: str) -> Callable:
    """Accept only ``method``, answer JSON otherwise, and add the latency."""

    def decorate(view: Callable[..., Answer]) -> Callable[..., JsonResponse]:
        @csrf_exempt
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
            latency_ms = settings.FAKE_GATEWAY_LATENCY_MS
            if latency_ms:
                time.sleep(latency_ms / 1000)
            if request.method != method:
                response = _respond(
                    request, error(405, "method_not_allowed", f"Use {method} on this endpoint.")
                )
                response["Allow"] = method
                return response
            return _respond(request, view(request, *args, **kwargs))

        return wrapper

    return decorate


def _json_object(request: HttpRequest) -> dict | None:
    try:
        payload = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


def _cut_off(request: HttpRequest) -> bool:
    """Whether fewer bytes came than the headers promised. Django hands the
    view what arrived before the connection closed, and an empty body would
    read as ``{}``."""
    try:
        promised = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return False
    return len(request.body) < promised


def _keyed_body(request: HttpRequest, what: str) -> tuple[str, dict] | Answer:
    """The ``Idempotency-Key`` and the JSON object body that ``what`` (say,
    "Charges") need, or the 400 for the first of them missing."""
    key = request.headers.get("Idempotency-Key", "")
    if not key:
        return error(400, "idempotency_key_missing", f"{what} need an Idempotency-Key header.")
    if _cut_off(request):
        # Not an answer to store: the client died sending (its retry brings the
        # whole body under the same key), and a processor acts on no half request.
        return error(400, "incomplete_body", "The body is shorter than its Content-Length.")
    payload = _json_object(request)
    if payload is None:
        return error(400, "invalid_json", "The body must be a JSON object.")
    return key, payload


@_endpoint("POST")
def charge(request: HttpRequest, intent_id: str) -> Answer:
    keyed = _keyed_body(request, "Charges")
    if isinstance(keyed, Answer):
        return keyed
    key, payload = keyed
    return services.intent_charge(
        intent_id=intent_id,
        idempotency_key=key,
        amount=payload.get("amount"),
        currency=payload.get("currency"),
        payment_method=payload.get("payment_method"),
    )


@_endpoint("GET")
def retrieve(request: HttpRequest, intent_id: str) -> Answer:
    return services.intent_retrieve(intent_id=intent_id)


@_endpoint("POST")
def cancel(request: HttpRequest, intent_id: str) -> Answer:
    return services.intent_cancel(intent_id=intent_id)


@_endpoint("POST")
def refund(request: HttpRequest, intent_id: str) -> Answer:
    return services.intent_refund(
        intent_id=intent_id, idempotency_key=request.headers.get("Idempotency-Key", "")
    )


@_endpoint("POST")
def create_refund(request: HttpRequest, intent_id: str) -> Answer:
    keyed = _keyed_body(request, "Refunds")
    if isinstance(keyed, Answer):
        return keyed
    key, payload = keyed
    return services.refund_create(
        intent_id=intent_id,
        idempotency_key=key,
        amount=payload.get("amount"),
        refund_id=payload.get("refund_id"),
    )


@_endpoint("GET")
def retrieve_refund(request: HttpRequest, refund_id: str) -> Answer:
    return services.refund_retrieve(refund_id=refund_id)


@_endpoint("GET")
def list_refunds(request: HttpRequest) -> Answer:
    intent_id = request.GET.get("payment_intent", "")
    if not intent_id:
        return error(
            400, "payment_intent_missing", "Name the intent: refunds?payment_intent=<intent_id>."
        )
    return services.refund_list(intent_id=intent_id)


@_endpoint("GET")
def list_charges(request: HttpRequest) -> Answer:
    intent_id = request.GET.get("payment_intent", "")
    if not intent_id:
        return error(
            400, "payment_intent_missing", "Name the intent: charges?payment_intent=<intent_id>."
        )
    return services.charge_list(intent_id=intent_id)


@csrf_exempt
def unknown_endpoint(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    # Not "not_found": that code means "no such intent", and a client must not
    # read a wrong URL as proof that nothing was charged.
    return _respond(request, error(404, "unknown_endpoint", "No such endpoint on this gateway."))
