"""The seller pages (docs/api.md, "Pages for sellers"), all under
``/seller/``. Each view declares who may use it (seller/page_access.py), and
tests/test_seller_pages.py walks every route here as anonymous, a stranger
and each role."""

from django.urls import path

from .pages import cancellation, dashboard, events, home, members, refunds, webhooks

urlpatterns = [
    path("seller/", home.organizer_list, name="seller-home"),
    path("seller/<str:slug>/", events.event_list, name="seller-events"),
    path("seller/<str:slug>/events/new/", events.event_new, name="seller-event-new"),
    path(
        "seller/<str:slug>/events/<int:event_id>/", dashboard.event_dashboard, name="seller-event"
    ),
    path(
        "seller/<str:slug>/events/<int:event_id>/live/",
        dashboard.event_live,
        name="seller-event-live",
    ),
    path(
        "seller/<str:slug>/events/<int:event_id>/edit/", events.event_edit, name="seller-event-edit"
    ),
    path(
        "seller/<str:slug>/events/<int:event_id>/seat-map/",
        events.seat_map_upload,
        name="seller-event-seat-map",
    ),
    path(
        "seller/<str:slug>/events/<int:event_id>/publish/",
        events.event_publish,
        name="seller-event-publish",
    ),
    path(
        "seller/<str:slug>/events/<int:event_id>/prices/",
        events.event_prices,
        name="seller-event-prices",
    ),
    path(
        "seller/<str:slug>/events/<int:event_id>/purchases/",
        refunds.event_purchases,
        name="seller-event-purchases",
    ),
    path(
        "seller/<str:slug>/events/<int:event_id>/cancel/",
        cancellation.event_cancel_page,
        name="seller-event-cancel",
    ),
    path(
        "seller/<str:slug>/events/<int:event_id>/cancellation/",
        cancellation.cancellation_live,
        name="seller-event-cancellation",
    ),
    path("seller/<str:slug>/members/", members.member_list, name="seller-members"),
    path(
        "seller/<str:slug>/members/<str:username>/remove/",
        members.member_remove_page,
        name="seller-member-remove",
    ),
    path("seller/<str:slug>/webhooks/", webhooks.endpoint_list, name="seller-webhooks"),
    path(
        "seller/<str:slug>/webhooks/<str:endpoint_id>/enabled/",
        webhooks.endpoint_enable,
        name="seller-webhook-enable",
    ),
    path(
        "seller/<str:slug>/webhooks/<str:endpoint_id>/delete/",
        webhooks.endpoint_delete,
        name="seller-webhook-delete",
    ),
]
