"""The seller's event routes (docs/api.md, "Events, seat maps and prices"),
all walked by tests/test_organizer_scoping.py. The event id is any path
segment: the views answer a malformed one with the API's JSON 404."""

from django.urls import path

from . import apis

_EVENT = "organizers/<str:slug>/events/<str:event_id>/"

urlpatterns = [
    path(
        "organizers/<str:slug>/events/",
        apis.EventListCreateApi.as_view(),
        name="organizer-event-list",
    ),
    path(_EVENT, apis.EventDetailApi.as_view(), name="organizer-event-detail"),
    path(f"{_EVENT}seat-map/", apis.SeatMapApi.as_view(), name="organizer-event-seat-map"),
    path(f"{_EVENT}publish/", apis.EventPublishApi.as_view(), name="organizer-event-publish"),
    path(f"{_EVENT}seats/block/", apis.SeatsBlockApi.as_view(), name="organizer-event-seats-block"),
    path(
        f"{_EVENT}seats/unblock/",
        apis.SeatsUnblockApi.as_view(),
        name="organizer-event-seats-unblock",
    ),
]
