from django.apps import AppConfig
from django.conf import settings
from django.core.checks import Error, register
from django.utils.module_loading import import_string

from .saga.topics import Topic


class PurchasesConfig(AppConfig):
    name = "purchases"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import authentication  # it imports models: not before the registry is ready

        register(check_outbox_routing)
        authentication.connect()


def check_outbox_routing(app_configs=None, **kwargs) -> list[Error]:
    """Every topic the saga writes is routed, and every routed consumer
    imports (``manage.py check``, and the commands that check at start-up:
    ``migrate``, ``runserver``)."""
    errors = []
    routing = settings.OUTBOX_CONSUMERS
    for topic in Topic:
        if not routing.get(topic.value):
            errors.append(
                Error(
                    f"outbox topic {topic.value!r} has no consumer",
                    hint="route it in purchases/saga/topics.py",
                    id="purchases.E001",
                )
            )
    for routed, consumers in routing.items():
        for path in consumers:
            try:
                import_string(path)
            except ImportError as exc:
                errors.append(
                    Error(
                        f"consumer {path!r} of {routed!r} does not import: {exc}",
                        id="purchases.E002",
                    )
                )
    return errors
