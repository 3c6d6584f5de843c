from django.apps import AppConfig


class SqlCountConfig(AppConfig):
    name = "bench.sqlcount"
    label = "bench_sqlcount"
    verbose_name = "bench: statements per step"

    def ready(self) -> None:
        from . import hooks

        hooks.install()
