from django.conf import settings
from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path
from django.views import defaults
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerView,
)

from purchases.apis import TokenApi
from purchases.ops.health import healthz_view, readyz_view
from purchases.ops.metrics import metrics_view

# The admin's "View site" link: the buyer pages (shop/, docs/api.md "Pages for buyers").
admin.site.site_url = "/"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/auth/token/", TokenApi.as_view(), name="auth-token"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # Both load their scripts from this service's static files (drf-spectacular-sidecar):
    # they work offline (docs/api.md, "Schema and docs").
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    # drf-spectacular's ReDoc page without its Google Fonts links (templates/api_docs/).
    path(
        "api/redoc/",
        SpectacularRedocView.as_view(url_name="schema", template_name="api_docs/redoc.html"),
        name="redoc",
    ),
    path("api/", include("purchases.urls")),
    # The door (docs/door.md): check-in for door staff under the organizer's
    # events, and the buyer's ticket reissue. Before the other organizer
    # routes: Django tries the patterns in order, and a door scan, the
    # busiest of them on an event's day, then tries about 10 patterns, not 40
    # (docs/performance.md, figure 16). No other route matches its paths.
    path("api/", include("door.urls")),
    path("api/", include("door.buyer_urls")),
    path("api/", include("webhooks.urls")),
    path("api/", include("organizers.urls")),
    # An organizer's webhook endpoints (the staff's are webhooks.urls).
    path("api/", include("webhooks.organizer_urls")),
    # An organizer's events, seat maps, reads and report
    # (docs/api.md, "Events, seat maps and prices").
    path("api/", include("seller.urls")),
    path("metrics", metrics_view, name="metrics"),
    # Liveness (no I/O) and readiness (database, broker, relay and beat
    # heartbeats): docs/operations.md, "Health checks".
    path("healthz", healthz_view, name="healthz"),
    path("readyz", readyz_view, name="readyz"),
    # Sign-up (api/auth/signup/ and its page) and the password reset pages.
    path("", include("accounts.urls")),
    path("", include("shop.urls")),
    # The seller pages (/seller/...).
    path("", include("seller.page_urls")),
    # The door's pages: the scanner (/door/{event_id}/).
    path("", include("door.page_urls")),
    # Stripe's signed events (docs/stripe.md, "Stripe's events"): no token, no CSRF.
    path("", include("stripe_events.urls")),
]

if settings.FAKE_GATEWAY_ENABLED:
    urlpatterns.append(path("fake-gateway/v1/", include("payments.fake_gateway.urls")))


# Under /api/ every answer is JSON in the one error shape, also for what
# never reaches a view (a path that matches no route, a server error).
def _api_or(page, status: int, code: str, detail: str):
    def handler(request, exception=None):
        if request.path.startswith("/api/"):
            return JsonResponse({"code": code, "detail": detail}, status=status)
        return page(request, exception) if exception is not None else page(request)

    return handler


handler400 = _api_or(defaults.bad_request, 400, "bad_request", "Bad request.")
handler404 = _api_or(defaults.page_not_found, 404, "not_found", "Not found.")
handler500 = _api_or(defaults.server_error, 500, "server_error", "Server error.")
