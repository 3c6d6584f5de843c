"""Reads about accounts."""

from __future__ import annotations

from django.contrib.auth import get_user_model


def account_taken(*, username: str, email: str) -> list[str]:
    """The fields of a sign-up that an existing account already has, compared
    as the unique indexes compare them (upper case, accounts/migrations/0001):
    ``"username"``, ``"email"``, both or none. An empty email is nobody's."""
    users = get_user_model()._default_manager
    taken = []
    if users.filter(username__iexact=username).exists():
        taken.append("username")
    if email and users.filter(email__iexact=email).exists():
        taken.append("email")
    return taken
