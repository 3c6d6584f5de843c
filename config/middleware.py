"""The project's middleware: refuse oversized request bodies, and bodies of
no stated length, before anything reads them; skip the connection health
check while a connection is busy."""

import json
import time

from django.conf import settings
from django.db import connections
from django.http import HttpResponse


class RequestSizeLimitMiddleware:
    """Refuse an API request's body over its route's limit before anything
    reads it: ``MAX_REQUEST_BYTES``, or the view's own ``max_request_bytes``
    where it declares one (the seller's seat maps: seller/apis.py). Judged
    in ``process_view``, once the route is known and before any view (or a
    later middleware's ``process_view``, CSRF's) can read the body."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.path.startswith("/api/"):
            return self.get_response(request)
        length = request.META.get("CONTENT_LENGTH") or ""
        if not length and "HTTP_TRANSFER_ENCODING" in request.META:
            # A chunked body: its size is known only once read, and Django
            # reads CONTENT_LENGTH bytes of it, none, so the view would judge
            # an empty body. Ask for the length instead.
            return _error(
                411,
                "length_required",
                "a request body needs a Content-Length header (chunked bodies are not taken)",
            )
        return self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        if not request.path.startswith("/api/"):
            return None
        view_class = getattr(view_func, "view_class", None)
        limit = getattr(view_class, "max_request_bytes", None) or settings.MAX_REQUEST_BYTES
        try:
            too_big = int(request.META.get("CONTENT_LENGTH") or "0") > limit
        except ValueError:
            too_big = False
        if too_big:
            return _error(413, "payload_too_large", f"request bodies are limited to {limit} bytes")
        return None


def _error(status: int, code: str, detail: str) -> HttpResponse:
    # The API's error shape (docs/api.md, "Errors"), before any view runs.
    body = {"code": code, "detail": detail}
    return HttpResponse(json.dumps(body), status=status, content_type="application/json")


class BusyConnectionMiddleware:
    """Skip Django's connection health check while a connection is busy.

    With ``CONN_HEALTH_CHECKS`` Django checks a reused connection with a
    ``SELECT 1`` at the start of every request: a transaction of its own,
    about one in seven of a purchase's (docs/performance.md). A connection
    this thread used less than ``DB_IDLE_CHECK_AFTER_SECONDS`` ago is taken
    as alive; one idle for longer, or one on which an error occurred, is
    still checked. A PostgreSQL restart under load then fails at most the
    request that meets each connection (a 500 with nothing committed; the
    client retries with its Idempotency-Key), and Django closes that
    connection at the request's end. The Celery workers do the same
    (config/celery.py).
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        now = time.monotonic()
        for conn in connections.all(initialized_only=True):
            used = getattr(conn, "boxoffice_last_used", None)
            if (
                conn.connection is not None
                and not conn.errors_occurred
                and used is not None
                and now - used < settings.DB_IDLE_CHECK_AFTER_SECONDS
            ):
                conn.health_check_done = True  # type: ignore[attr-defined]  # stubs lack it
        try:
            return self.get_response(request)
        finally:
            now = time.monotonic()
            for conn in connections.all(initialized_only=True):
                if conn.connection is not None:
                    conn.boxoffice_last_used = now  # type: ignore[attr-defined]  # our mark on it
