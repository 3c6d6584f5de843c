"""Model instances from statements written as SQL (docs/performance.md,
"Statements written once").

The hottest reads of the background work (a saga's lock, a webhook
delivery's read and lock) are written once as SQL instead of being built
by the ORM on every call. These helpers keep them honest: the columns are
the models' own, in the models' order, the instances are made with
``Model.from_db`` through the ORM's converters, and an insert's values are
prepared by the fields themselves (tests/test_statements_written_once.py
compares each with the ORM's).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, TypeVar

from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper

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


def split(row: Sequence[Any], *models_: type[models.Model], db: str = "default") -> list:
    """One instance of each of ``models_`` from a row that reads their
    :func:`columns` one after the other (a join); what follows the last
    model's columns is left out."""
    out, at = [], 0
    for model in models_:
        n = width(model)
        out.append(instance(model, row[at : at + n], db))
        at += n
    return out


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


def insert_returning(objs: Sequence[M], *, ignore_conflicts: bool = False) -> list[M]:
    """Insert ``objs`` (one model, PostgreSQL) in one statement and return
    the rows written, as instances, in the order of their keys; with
    ``ignore_conflicts`` a row that meets a unique constraint is skipped
    (``ON CONFLICT DO NOTHING``) and is not among those returned. What the
    ORM's ``bulk_create`` cannot say (which rows it wrote) without a second
    read."""
    if not objs:
        return []
    model = type(objs[0])
    sql, params, connection = _insert(objs, ignore_conflicts=ignore_conflicts)
    sql += f" RETURNING {', '.join(columns(model, model._meta.db_table))}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        written = [instance(model, r, connection.alias) for r in cursor.fetchall()]
    # RETURNING promises no order: the keys' order is the order of insertion.
    return sorted(written, key=lambda obj: obj.pk)


def create(obj: M) -> M:
    """``obj.save(force_insert=True)`` as one statement written here, for the
    rows every purchase inserts (docs/performance.md, "Statements written
    once"): the key the database gives, when it is automatic, is read back
    with ``RETURNING`` and set on ``obj``. The model's ``save()`` is not
    called, nor its signals: none of the models it serves has a receiver,
    and each caller writes a complete row (what ``OutboxMessage.save``
    would fill in, its due time, ``outbox_publish`` sets)."""
    model = type(obj)
    sql, params, connection = _insert([obj], ignore_conflicts=False)
    auto = model._meta.auto_field
    if auto is not None:
        sql += f' RETURNING "{auto.column}"'
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if auto is not None:
            setattr(obj, auto.attname, cursor.fetchone()[0])
    obj._state.adding = False
    obj._state.db = connection.alias
    return obj


def insert(objs: Sequence[models.Model], *, ignore_conflicts: bool = False) -> int:
    """Insert ``objs`` (one model) in one statement; returns how many rows
    were written (with ``ignore_conflicts``, those that met a unique
    constraint were not)."""
    if not objs:
        return 0
    sql, params, connection = _insert(objs, ignore_conflicts=ignore_conflicts)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def _insert(
    objs: Sequence[models.Model], *, ignore_conflicts: bool
) -> tuple[str, list[Any], BaseDatabaseWrapper]:
    model = type(objs[0])
    connection = connections[model._default_manager.db]
    fields = _inserted_fields(model)
    params = [
        field.get_db_prep_save(getattr(obj, field.attname), connection)
        for obj in objs
        for field in fields
    ]
    return _insert_sql(model, len(objs), ignore_conflicts), params, connection


def _inserted_fields(model: type[models.Model]) -> list:
    return [f for f in model._meta.concrete_fields if f is not model._meta.auto_field]


@functools.lru_cache(maxsize=256)  # keyed by model and row count
def _insert_sql(model: type[models.Model], rows: int, ignore_conflicts: bool) -> str:
    fields = _inserted_fields(model)
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    names = ", ".join(f'"{field.column}"' for field in fields)
    return (
        f"INSERT INTO {model._meta.db_table} ({names})"
        f" VALUES {', '.join([row] * rows)}"
        f"{' ON CONFLICT DO NOTHING' if ignore_conflicts else ''}"
    )


def insert_or_lock(obj: M) -> M:
    """The row with ``obj``'s key, locked by this transaction: inserted from
    ``obj`` if there is none, read as it is otherwise (``obj``'s other values
    are then ignored). One statement, ``INSERT … ON CONFLICT (key) DO UPDATE
    … RETURNING``: the update sets the key to itself, so it changes nothing
    but takes the row's lock, and a concurrent insert of the same key makes it
    wait for that transaction's end instead of failing. Callers set what
    ``save()`` would fill in (``auto_now`` fields)."""
    model = type(obj)
    sql, params, connection = _insert([obj], ignore_conflicts=False)
    with connection.cursor() as cursor:
        cursor.execute(sql + _or_lock_sql(model), params)
        return instance(model, cursor.fetchone(), connection.alias)


@functools.lru_cache(maxsize=64)
def _or_lock_sql(model: type[models.Model]) -> str:
    key = f'"{model._meta.pk.column}"'
    returning = ", ".join(columns(model, model._meta.db_table))
    return f" ON CONFLICT ({key}) DO UPDATE SET {key} = EXCLUDED.{key} RETURNING {returning}"


def update_fields(obj: models.Model, names: Sequence[str]) -> int:
    """``obj.save(update_fields=names)`` as one statement written here: the
    named fields of the row with ``obj``'s key; returns the rows updated."""
    model = type(obj)
    connection = connections[model._default_manager.db]
    fields = _named(model, names)
    assignments = ", ".join(f'"{field.column}" = %s' for field in fields)
    params = [field.get_db_prep_save(getattr(obj, field.attname), connection) for field in fields]
    sql = f'UPDATE {model._meta.db_table} SET {assignments} WHERE "{model._meta.pk.column}" = %s'
    with connection.cursor() as cursor:
        cursor.execute(sql, params + [model._meta.pk.get_db_prep_value(obj.pk, connection)])
        return cursor.rowcount


def update_fields_many(objs: Sequence[models.Model], names: Sequence[str]) -> int:
    """:func:`update_fields` of several rows of one model, in one statement
    (``UPDATE … FROM (VALUES …)``, each value cast to its column's type, so
    that a column NULL in every row still has one). Returns the rows
    updated."""
    if not objs:
        return 0
    model = type(objs[0])
    connection = connections[model._default_manager.db]
    if len(objs) == 1:
        return sum(update_fields(obj, names) for obj in objs)
    fields = [model._meta.pk, *_named(model, names)]
    params = [
        field.get_db_prep_save(getattr(obj, field.attname), connection)
        for obj in objs
        for field in fields
    ]
    with connection.cursor() as cursor:
        cursor.execute(_update_many_sql(model, tuple(names), len(objs), connection.alias), params)
        return cursor.rowcount


@functools.lru_cache(maxsize=256)  # keyed by model, fields and row count
def _update_many_sql(model: type[models.Model], names: tuple[str, ...], rows: int, db: str) -> str:
    connection = connections[db]
    pk = model._meta.pk
    fields = [pk, *_named(model, names)]
    row = "(" + ", ".join(f"%s::{field.db_type(connection)}" for field in fields) + ")"
    aliases = ", ".join(f'"{field.column}"' for field in fields)
    assignments = ", ".join(f'"{field.column}" = v."{field.column}"' for field in fields[1:])
    table = model._meta.db_table
    return (
        f"UPDATE {table} SET {assignments} FROM (VALUES {', '.join([row] * rows)})"
        f' AS v ({aliases}) WHERE {table}."{pk.column}" = v."{pk.column}"'
    )


def _named(model: type[models.Model], names: Sequence[str]) -> list:
    """The model's concrete fields of those names, in the order named."""
    by_name = {field.name: field for field in model._meta.concrete_fields}
    return [by_name[name] for name in names]


def insert_select(
    template: models.Model, *, source: str, exprs: dict[str, str]
) -> tuple[str, list]:
    """``INSERT … SELECT`` of rows of the template's model, one per row of
    ``source`` (a table or a CTE of the caller's statement): every column
    takes the template's value, prepared by its field as :func:`insert` does,
    but those named in ``exprs`` (by attname), which take that SQL over
    ``source``'s columns. The statement's text (written once per model,
    source and expressions, as :func:`insert`'s) and its parameters, in
    order; the caller adds ``RETURNING`` and runs it (PostgreSQL)."""
    model = type(template)
    connection = connections[model._default_manager.db]
    sql = _insert_select_sql(model, source, tuple(exprs.items()))
    params = [
        field.get_db_prep_save(getattr(template, field.attname), connection)
        for field in _inserted_fields(model)
        if field.attname not in exprs
    ]
    return sql, params


@functools.lru_cache(maxsize=64)
def _insert_select_sql(
    model: type[models.Model], source: str, exprs: tuple[tuple[str, str], ...]
) -> str:
    fields = _inserted_fields(model)
    by_attname = dict(exprs)
    unknown = set(by_attname) - {field.attname for field in fields}
    if unknown:
        raise ValueError(f"{model.__name__} has no column {', '.join(sorted(unknown))}")
    values = [by_attname.get(field.attname, "%s") for field in fields]
    names = ", ".join(f'"{field.column}"' for field in fields)
    return f"INSERT INTO {model._meta.db_table} ({names}) SELECT {', '.join(values)} FROM {source}"
