from django.urls import path

from . import apis

# The ids are taken as any path segment and checked by the views, so that a
# malformed one (/api/purchases/not-a-uuid/) answers the API's JSON 404 and
# not Django's page, whatever DEBUG says. The schema keeps their types.
urlpatterns = [
    path("events/", apis.EventListApi.as_view(), name="event-list"),
    path("events/<str:event_id>/seats/", apis.EventSeatsApi.as_view(), name="event-seats"),
    path("events/<str:event_id>/queue/", apis.EventQueueApi.as_view(), name="event-queue"),
    path("purchases/", apis.PurchaseListCreateApi.as_view(), name="purchase-list"),
    path("purchases/<str:saga_id>/", apis.PurchaseDetailApi.as_view(), name="purchase-detail"),
    path(
        "purchases/<str:saga_id>/cancel/", apis.PurchaseCancelApi.as_view(), name="purchase-cancel"
    ),
]
