"""Creating accounts (docs/api.md, "Accounts"): the one way the sign-up API
and the sign-up page make a user."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model, password_validation
from django.contrib.auth.models import BaseUserManager
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from . import selectors

if TYPE_CHECKING:
    # AUTH_USER_MODEL is Django's.
    from django.contrib.auth.models import User

TAKEN = {
    "username": "A user with that username already exists.",
    "email": "A user with that email address already exists.",
}
# The unique indexes that refuse a second account, and the field each is
# about: Django's on the username, and the case-insensitive ones of
# accounts/migrations/0001. Two sign-ups at once both pass the look-up; the
# index refuses the second, which is told what the look-up would have said.
_INDEX_FIELDS = {
    "auth_user_username_key": "username",
    "accounts_user_username_upper_uniq": "username",
    "accounts_user_email_upper_uniq": "email",
}


def normalized_username(username: str) -> str:
    """The username as it is stored and compared: Unicode's NFKC form, as
    Django's own user creation stores it. It may be longer."""
    return get_user_model().normalize_username(username)


def normalized_email(email: str) -> str:
    """The email as it is stored: its domain in lower case, as Django's own
    user creation stores it. It may be longer."""
    return BaseUserManager.normalize_email(email)


def account_create(*, username: str, email: str, password: str) -> User:
    """A new active account, not staff, with ``password`` (which must pass
    ``AUTH_PASSWORD_VALIDATORS``, judged against the username and email too).

    Raises ``ValidationError`` by field: ``password`` with the validators'
    messages, ``username`` and/or ``email`` when an account already has it
    (whatever its case), also when another sign-up took it a moment ago.
    The arguments are what ``SignupSerializer`` validated: its fields check
    the normalized forms (their lengths too), which this applies again."""
    username, email = normalized_username(username), normalized_email(email)
    user = get_user_model()(username=username, email=email)
    try:
        password_validation.validate_password(password, user)
    except ValidationError as exc:
        raise ValidationError({"password": exc.error_list}) from exc
    # Hashing takes a while on purpose: before the transaction, not in it.
    user.set_password(password)
    try:
        with transaction.atomic(durable=True):
            taken = selectors.account_taken(username=username, email=email)
            if taken:
                raise _taken(taken)
            user.save(force_insert=True)
    except IntegrityError as exc:
        field = _INDEX_FIELDS.get(_index_of(exc) or "")
        if field is None:
            raise
        raise _taken([field]) from exc
    return user


def _taken(fields: list[str]) -> ValidationError:
    return ValidationError({field: ValidationError(TAKEN[field], code="taken") for field in fields})


def _index_of(exc: IntegrityError) -> str | None:
    """The constraint or unique index PostgreSQL names in the violation."""
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)
