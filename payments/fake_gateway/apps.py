from django.apps import AppConfig


class FakeGatewayConfig(AppConfig):
    name = "payments.fake_gateway"
    label = "fake_gateway"
    verbose_name = "Fake payment gateway"
    default_auto_field = "django.db.models.BigAutoField"
