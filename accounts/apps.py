from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Buyers' accounts: sign-up (the API and a page), and the pages of
    Django's password reset (docs/api.md, "Accounts")."""

    name = "accounts"
    verbose_name = "accounts"
