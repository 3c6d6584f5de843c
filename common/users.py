"""What a request reads of its user, for the reads that build the user
without the ORM's query: the token cache (purchases/authentication.py) and
the token read with the membership (organizers/selectors.py)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# The permissions read is_active, is_staff and is_superuser; never the
# password. The others load from the database if something asks for them.
USER_FIELDS = ("id", "username", "email", "is_active", "is_staff", "is_superuser")


@functools.cache
def model_order() -> tuple[str, ...]:
    """``USER_FIELDS`` in the user model's field order, which ``from_db``
    takes: the model's fields do not change while the process runs, so this
    is computed once, not on every authenticated request."""
    model = get_user_model()
    return tuple(f.attname for f in model._meta.concrete_fields if f.attname in USER_FIELDS)


def user_from_values(values: tuple | list) -> User:
    """The user of ``values``, given in :func:`model_order`, as the ORM
    would have built it from a row."""
    return get_user_model().from_db(DEFAULT_DB_ALIAS, model_order(), values)
