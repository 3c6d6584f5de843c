from django.urls import path

from . import apis

# The slug and the username are taken as any path segment: the permission
# (and the service) answer the API's JSON 404 for one that names nothing.
urlpatterns = [
    path("organizers/", apis.OrganizerListCreateApi.as_view(), name="organizer-list"),
    path("organizers/<str:slug>/", apis.OrganizerDetailApi.as_view(), name="organizer-detail"),
    path(
        "organizers/<str:slug>/members/",
        apis.MemberListAddApi.as_view(),
        name="organizer-member-list",
    ),
    path(
        "organizers/<str:slug>/members/<str:username>/",
        apis.MemberDetailApi.as_view(),
        name="organizer-member-detail",
    ),
]
