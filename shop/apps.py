from django.apps import AppConfig


class ShopConfig(AppConfig):
    """The buyer pages (docs/api.md, "Pages for buyers")."""

    name = "shop"
    verbose_name = "buyer pages"
