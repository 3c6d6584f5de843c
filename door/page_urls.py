"""The door's pages (docs/door.md, "The scanner page"), included at the
site root by config/urls.py: the scanner of an event."""

from django.urls import path

from . import pages

urlpatterns: list = [
    path("door/<int:event_id>/", pages.scanner, name="door-scanner"),
]
