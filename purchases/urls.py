from django.urls import path

from . import apis

urlpatterns = [
    path("events/", apis.EventListApi.as_view(), name="event-list"),
    path("events/<int:event_id>/seats/", apis.EventSeatsApi.as_view(), name="event-seats"),
    path("purchases/", apis.PurchaseListCreateApi.as_view(), name="purchase-list"),
    path("purchases/<uuid:saga_id>/", apis.PurchaseDetailApi.as_view(), name="purchase-detail"),
]
