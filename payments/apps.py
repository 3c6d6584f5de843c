from celery import signals
from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .registry import prepare_in_pool_process  # the gateway reads settings: after setup

        # Each pool process of a Celery worker, as it starts.
        signals.worker_process_init.connect(prepare_in_pool_process, weak=False)
