"""The seller's reads of an event's sales (seller/read_apis.py). The ids are
any path segment, checked by the views, as the other organizer routes do."""

from django.urls import path

from . import read_apis

urlpatterns = [
    path(
        "organizers/<str:slug>/events/<str:event_id>/purchases/",
        read_apis.EventPurchaseListApi.as_view(),
        name="organizer-event-purchase-list",
    ),
    path(
        "organizers/<str:slug>/events/<str:event_id>/purchases.csv",
        read_apis.EventPurchaseCsvApi.as_view(),
        name="organizer-event-purchase-csv",
    ),
    path(
        "organizers/<str:slug>/events/<str:event_id>/report/",
        read_apis.EventReportApi.as_view(),
        name="organizer-event-report",
    ),
]
