from django.urls import path

from . import apis

# An organizer's own endpoints: the staff API's views, scoped (docs/api.md,
# "Organizers and roles"; webhooks/apis.py). Apart from webhooks/urls.py,
# whose routes are the staff's (tests/test_webhooks_permissions.py walks
# them); every route here is walked by tests/test_organizer_scoping.py. The
# ids are any path segment, checked by the views, as there.
urlpatterns = [
    path(
        "organizers/<str:slug>/webhook-endpoints/",
        apis.OrganizerWebhookEndpointListCreateApi.as_view(),
        name="organizer-webhook-endpoint-list",
    ),
    path(
        "organizers/<str:slug>/webhook-endpoints/<str:endpoint_id>/",
        apis.OrganizerWebhookEndpointDetailApi.as_view(),
        name="organizer-webhook-endpoint-detail",
    ),
    path(
        "organizers/<str:slug>/webhook-endpoints/<str:endpoint_id>/rotate-secret/",
        apis.OrganizerWebhookEndpointRotateSecretApi.as_view(),
        name="organizer-webhook-endpoint-rotate-secret",
    ),
    path(
        "organizers/<str:slug>/webhook-endpoints/<str:endpoint_id>/deliveries/",
        apis.OrganizerWebhookDeliveryListApi.as_view(),
        name="organizer-webhook-delivery-list",
    ),
    path(
        "organizers/<str:slug>/webhook-endpoints/<str:endpoint_id>/deliveries/"
        "<str:delivery_id>/resend/",
        apis.OrganizerWebhookDeliveryResendApi.as_view(),
        name="organizer-webhook-delivery-resend",
    ),
]
