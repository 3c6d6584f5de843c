"""The door's seller routes (door/apis.py), under
``/api/organizers/{slug}/events/{event_id}/checkin/`` and so scoped by
``organizers.permissions`` (tests/test_organizer_scoping.py walks every
one). The ids are any path segment, checked by the views, as the seller's
routes do."""

from django.urls import path

from . import apis

_CHECKIN = "organizers/<str:slug>/events/<str:event_id>/checkin/"

urlpatterns = [
    path(_CHECKIN, apis.CheckinApi.as_view(), name="organizer-event-checkin"),
    path(f"{_CHECKIN}list/", apis.CheckinListApi.as_view(), name="organizer-event-checkin-list"),
    path(
        f"{_CHECKIN}upload/",
        apis.CheckinUploadApi.as_view(),
        name="organizer-event-checkin-upload",
    ),
    path(
        f"{_CHECKIN}progress/",
        apis.CheckinProgressApi.as_view(),
        name="organizer-event-checkin-progress",
    ),
]
