"""The buyer pages (docs/api.md, "Pages for buyers"). Logging in and out,
signing up and the password reset are the accounts' (accounts/urls.py)."""

from django.urls import path

from . import views

urlpatterns = [
    path("", views.event_list, name="shop-events"),
    path("events/<int:event_id>/", views.event_seat_map, name="shop-seat-map"),
    path("events/<int:event_id>/queue/", views.event_queue, name="shop-queue"),
    path("events/<int:event_id>/queue/live/", views.event_queue_live, name="shop-queue-live"),
    path("purchases/", views.purchase_list, name="shop-purchases"),
    path("purchases/<uuid:saga_id>/", views.purchase_detail, name="shop-purchase"),
    path("purchases/<uuid:saga_id>/live/", views.purchase_live, name="shop-purchase-live"),
    path(
        "purchases/<uuid:saga_id>/cancel/", views.purchase_cancel_page, name="shop-purchase-cancel"
    ),
    path(
        "purchases/<uuid:saga_id>/tickets/<str:seat>/reissue/",
        views.purchase_ticket_reissue,
        name="shop-ticket-reissue",
    ),
]
