"""The URLconf of the fake gateway's own process: the fake processor and
nothing else (no API, no admin, no metrics).

docker-compose.yml's ``gateway`` service selects it with
``ROOT_URLCONF=payments.fake_gateway.standalone_urls``; it stands for a card
processor, reached by the app over ``PAYMENT_GATEWAY_URL`` (docs/api.md,
"Fake gateway"). ``FAKE_GATEWAY_ENABLED`` still decides whether the fake is
mounted at all.
"""

from django.conf import settings
from django.urls import include, path

from . import views

urlpatterns = []
if settings.FAKE_GATEWAY_ENABLED:
    urlpatterns.append(path("fake-gateway/v1/", include("payments.fake_gateway.urls")))

# Outside the prefix too, the answer is the processor's JSON 404.
handler404 = views.unknown_endpoint
