"""The buyer's routes of the door under /api/ (docs/api.md, "Replace a ticket").

The ids are taken as any path segment and checked by the view, as
purchases/urls.py does, so that a malformed one answers the API's JSON 404."""

from django.urls import path

from . import buyer_apis

urlpatterns = [
    path(
        "purchases/<str:saga_id>/tickets/<str:seat>/reissue/",
        buyer_apis.TicketReissueApi.as_view(),
        name="ticket-reissue",
    ),
]
