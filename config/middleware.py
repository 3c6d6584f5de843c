"""Refuse oversized request bodies before anything reads them."""

import json

from django.conf import settings
from django.http import HttpResponse


class RequestSizeLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        length = request.META.get("CONTENT_LENGTH") or "0"
        try:
            too_big = int(length) > settings.MAX_REQUEST_BYTES
        except ValueError:
            too_big = False
        if too_big and request.path.startswith("/api/"):
            body = {"code": "payload_too_large",
                    "detail": f"request bodies are limited to {settings.MAX_REQUEST_BYTES} bytes"}
            return HttpResponse(json.dumps(body), status=413, content_type="application/json")
        return self.get_response(request)
