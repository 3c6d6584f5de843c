"""The seller's API routes, all under ``/api/organizers/{slug}/`` and so
scoped by ``organizers.permissions`` (tests/test_organizer_scoping.py walks
every one)."""

from .event_urls import urlpatterns as event_patterns
from .read_urls import urlpatterns as read_patterns
from .refund_urls import urlpatterns as refund_patterns

urlpatterns = [*event_patterns, *read_patterns, *refund_patterns]
