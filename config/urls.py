from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.authtoken.views import ObtainAuthToken

from config.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/auth/token/", ObtainAuthToken.as_view(), name="auth-token"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/", include("purchases.urls")),
    path("metrics", metrics_view, name="metrics"),
]

if settings.FAKE_GATEWAY_ENABLED:
    urlpatterns.append(path("fake-gateway/v1/", include("payments.fake_gateway.urls")))
