"""A tiny URLconf for the fake gateway's tests: the fake mounted where the
project mounts it, plus stand-ins for a processor that is failing."""

from django.http import HttpResponse
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt


@csrf_exempt
def unavailable(request, rest):
    return HttpResponse("upstream unavailable", status=503, content_type="text/plain")


@csrf_exempt
def garbage(request, rest):
    return HttpResponse("<html>not json</html>", status=200, content_type="text/html")


urlpatterns = [
    path("fake-gateway/v1/", include("payments.fake_gateway.urls")),
    path("broken/v1/<path:rest>", unavailable),
    path("garbage/v1/<path:rest>", garbage),
]
