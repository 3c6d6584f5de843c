from django.urls import path

from .views import stripe_events_view

urlpatterns = [
    path("payments/stripe/events/", stripe_events_view, name="stripe-events"),
]
