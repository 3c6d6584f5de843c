"""``POST /payments/stripe/events/``: Stripe's events, the contract's
"Paying with Stripe" (docs/stripe.md, "Stripe's events").

A plain Django view on purpose, as the fake processor's (not DRF): it is
Stripe's door, not the public API, so it stays out of the OpenAPI document
(a DRF view outside /api/ would also move the document's path prefix and
with it every generated client's module names), takes no token or session
and is CSRF-exempt (Stripe signs instead). Errors are the API's shape,
``{"code", "detail"}``.

The ``Stripe-Signature`` header is verified by the official library
(``stripe.WebhookSignature.verify_header``) over the body's exact bytes,
with ``STRIPE_WEBHOOK_SECRET`` and at most
``STRIPE_WEBHOOK_TOLERANCE_SECONDS`` old, before anything else is read or
written: missing, wrong or stale → ``400 invalid_signature`` and nothing
recorded. A verified event is stored once by its id with the obligation to
act on it, and answered ``200`` at once; the work is a worker's.
"""

from __future__ import annotations

import json
import logging

import stripe
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from common.parsers import json_depth

from .services import NotAnEvent, stripe_event_receive

logger = logging.getLogger(__name__)

# The middleware's MAX_REQUEST_BYTES guards /api/ only. An event carries a
# whole object (a PaymentIntent, a Charge, a Dispute: a few KiB each) and
# Stripe publishes no limit: room for far more than that, and a bound.
MAX_EVENT_BYTES = 256 * 1024


def _error(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"code": code, "detail": detail}, status=status)


@csrf_exempt
@require_POST
def stripe_events_view(request: HttpRequest) -> JsonResponse:
    try:
        length = int(request.META.get("CONTENT_LENGTH") or "0")
    except ValueError:
        length = 0
    if length > MAX_EVENT_BYTES:
        return _error(
            413, "payload_too_large", f"Stripe's events are limited to {MAX_EVENT_BYTES} bytes"
        )
    body = request.body
    try:
        stripe.WebhookSignature.verify_header(
            body,
            request.headers.get("Stripe-Signature"),
            settings.STRIPE_WEBHOOK_SECRET,
            settings.STRIPE_WEBHOOK_TOLERANCE_SECONDS,
        )
    except (stripe.SignatureVerificationError, UnicodeDecodeError) as exc:
        logger.warning("stripe event refused: %s", exc)
        return _error(
            400,
            "invalid_signature",
            "the Stripe-Signature header is missing, does not match the body, or is too old",
        )
    try:
        received = stripe_event_receive(event=_parse(body))
    except NotAnEvent as exc:
        return _error(400, "parse_error", str(exc))
    logger.info(
        "stripe event %s %s: %s",
        received.stripe_id,
        received.type,
        "ignored" if received.ignored else "recorded" if received.new else "a replay",
        extra={"stripe_event": received.stripe_id},
    )
    return JsonResponse({"received": True})


def _parse(body: bytes) -> dict:
    text = body.decode("utf-8")  # verified above: it decoded
    if json_depth(text) > settings.MAX_JSON_DEPTH:
        raise NotAnEvent(f"JSON nested deeper than {settings.MAX_JSON_DEPTH} levels")
    try:
        event = json.loads(text)
    except ValueError as exc:
        raise NotAnEvent(f"the body is not JSON: {exc}") from exc
    if not isinstance(event, dict) or event.get("object") != "event":
        raise NotAnEvent('not a Stripe event: its object is not "event"')
    return event
