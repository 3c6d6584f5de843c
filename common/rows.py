"""Model instances from statements written as SQL (docs/performance.md,
"Statements written once").

The hottest reads of the background work (a saga's lock, a webhook
delivery's read and lock) are written once as SQL instead of being built
by the ORM on every call. These helpers keep them honest: the columns are
the models' own, in the models' order, and the instances are made with
``Model.from_db`` as the ORM makes them (tests/test_saga_statements.py
compares both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from django.db import connections, models

M = TypeVar("M", bound=models.Model)


def columns(model: type[models.Model], alias: str) -> list[str]:
    """The model's concrete columns, qualified by ``alias``, in field order."""
    return [f'{alias}."{field.column}"' for field in model._meta.concrete_fields]


def width(model: type[models.Model]) -> int:
    return len(model._meta.concrete_fields)


def instance(model: type[M], values: Sequence[Any], db: str = "default") -> M:
    """The model read from ``values``, the columns of :func:`columns` in
    order, each through the converters the ORM would apply (a JSON field's
    text into its value, for one)."""
    connection = connections[db]
    row = list(values)
    for i, (field, converters) in enumerate(_converters(model, db)):
        for convert in converters:
            row[i] = convert(row[i], field, connection)
    return model.from_db(db, [field.attname for field in model._meta.concrete_fields], row)


_CONVERTERS: dict[tuple[type[models.Model], str], list] = {}


def _converters(model: type[models.Model], db: str) -> list:
    key = (model, db)
    if key not in _CONVERTERS:
        connection = connections[db]
        table = model._meta.db_table
        out = []
        for field in model._meta.concrete_fields:
            column = field.get_col(table)
            out.append(
                (
                    column,
                    connection.ops.get_db_converters(column) + field.get_db_converters(connection),
                )
            )
        _CONVERTERS[key] = out
    return _CONVERTERS[key]
