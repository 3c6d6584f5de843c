from django.apps import AppConfig


class StripeEventsConfig(AppConfig):
    name = "stripe_events"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Stripe's events"
