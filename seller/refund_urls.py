"""The seller's money back routes (seller/refund_apis.py), walked by
tests/test_organizer_scoping.py. The ids are any path segment, checked by
the views, as the other organizer routes do."""

from django.urls import path

from . import refund_apis

_EVENT = "organizers/<str:slug>/events/<str:event_id>/"

urlpatterns = [
    path(
        "organizers/<str:slug>/purchases/<str:saga_id>/refunds/",
        refund_apis.PurchaseRefundApi.as_view(),
        name="organizer-purchase-refunds",
    ),
    path(f"{_EVENT}cancel/", refund_apis.EventCancelApi.as_view(), name="organizer-event-cancel"),
    path(
        f"{_EVENT}cancellation/",
        refund_apis.EventCancellationApi.as_view(),
        name="organizer-event-cancellation",
    ),
]
