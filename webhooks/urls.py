from django.urls import path

from . import apis

# The ids are taken as any path segment and checked by the views, so that a
# malformed one (/api/webhook-endpoints/abc/) answers the API's JSON 404 and
# not Django's page, whatever DEBUG says. The schema keeps their types.
urlpatterns = [
    path(
        "webhook-endpoints/",
        apis.WebhookEndpointListCreateApi.as_view(),
        name="webhook-endpoint-list",
    ),
    path(
        "webhook-endpoints/<str:endpoint_id>/",
        apis.WebhookEndpointDetailApi.as_view(),
        name="webhook-endpoint-detail",
    ),
    path(
        "webhook-endpoints/<str:endpoint_id>/rotate-secret/",
        apis.WebhookEndpointRotateSecretApi.as_view(),
        name="webhook-endpoint-rotate-secret",
    ),
    path(
        "webhook-endpoints/<str:endpoint_id>/deliveries/",
        apis.WebhookDeliveryListApi.as_view(),
        name="webhook-delivery-list",
    ),
    path(
        "webhook-endpoints/<str:endpoint_id>/deliveries/<str:delivery_id>/resend/",
        apis.WebhookDeliveryResendApi.as_view(),
        name="webhook-delivery-resend",
    ),
]
