"""The schema keeps Citus's rules for the plan in config/distribution.py
(docs/design.md, "Running").

Read from the PostgreSQL catalog after the migrations (pg_class, pg_attribute,
pg_constraint, pg_index: what Citus itself would see when the tables are
distributed), not from the models: a constraint written by hand in a migration
counts, and so does one Django made that the models no longer show.

- every table is declared, and every declared table exists;
- a distributed table's distribution column is NOT NULL;
- its primary key, every unique or exclusion constraint and every unique index
  (partial ones too) include the distribution column;
- a foreign key between distributed tables pairs their distribution columns
  (``(event_id, x_id) -> (event_id, id)``) and stays inside one co-location
  group;
- a reference table refers to reference tables only (a foreign key from a
  distributed table to a reference table is fine); a local table, and the
  tables that are not ours, neither refer to ours nor are referred to.

And, because a message with no event gets ``NO_EVENT`` rather than failing,
the product's code names the event of every outbox row and webhook it writes;
and a compensation, and the admin's dry run of one, find the reservation by
its event too (a statement without it would go to every shard).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection

from config.distribution import TABLES, Distributed, Elsewhere, Local, Placement, Reference

ROOT = Path(__file__).resolve().parent.parent

_TABLES_SQL = """
SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition
"""
_COLUMNS_SQL = """
SELECT attrelid, attnum, attname, attnotnull FROM pg_attribute
 WHERE attrelid = ANY(%s) AND attnum > 0 AND NOT attisdropped
"""
_CONSTRAINTS_SQL = """
SELECT conname, contype, conrelid, confrelid, conkey, confkey FROM pg_constraint
 WHERE conrelid = ANY(%s) AND contype IN ('p', 'u', 'x', 'f') ORDER BY conname
"""
# Unique indexes that no constraint owns (a constraint's index is checked as
# the constraint): Django's UniqueConstraint with a condition is one.
_UNIQUE_INDEXES_SQL = """
SELECT ic.relname, i.indrelid, i.indkey::int2[] FROM pg_index i
  JOIN pg_class ic ON ic.oid = i.indexrelid
 WHERE i.indrelid = ANY(%s) AND i.indisunique
   AND NOT EXISTS (SELECT 1 FROM pg_constraint k
                    WHERE k.conindid = i.indexrelid AND k.contype IN ('p', 'u', 'x'))
 ORDER BY ic.relname
"""

_KIND = {"p": "primary key", "u": "unique constraint", "x": "exclusion constraint"}


@dataclass(frozen=True)
class _Table:
    name: str
    columns: dict[int, str]  # attnum -> name
    not_null: frozenset[str]


def citus_violations(
    declared: dict[str, Placement], *, only: Callable[[str], bool] = lambda name: True
) -> list[str]:
    """What Citus would refuse in the current database's schema, one line per
    violation naming the table and the constraint; the tables looked at are
    those ``only`` accepts."""
    with connection.cursor() as cursor:
        cursor.execute(_TABLES_SQL)
        names = {oid: name for oid, name in cursor.fetchall() if only(name)}
        oids = list(names)
        cursor.execute(_COLUMNS_SQL, [oids])
        columns: dict[int, dict[int, str]] = {oid: {} for oid in oids}
        not_null: dict[int, set[str]] = {oid: set() for oid in oids}
        for oid, attnum, attname, notnull in cursor.fetchall():
            columns[oid][attnum] = attname
            if notnull:
                not_null[oid].add(attname)
        cursor.execute(_CONSTRAINTS_SQL, [oids])
        constraints = cursor.fetchall()
        cursor.execute(_UNIQUE_INDEXES_SQL, [oids])
        unique_indexes = cursor.fetchall()
    tables = {oid: _Table(names[oid], columns[oid], frozenset(not_null[oid])) for oid in oids}
    found: list[str] = []

    for table in sorted(tables.values(), key=lambda t: t.name):
        placement = declared.get(table.name)
        if placement is None:
            found.append(
                f"{table.name}: not declared in config/distribution.py (distributed, "
                "reference, local or elsewhere)"
            )
        elif isinstance(placement, Distributed):
            if placement.column not in table.columns.values():
                found.append(f"{table.name}: has no distribution column {placement.column}")
            elif placement.column not in table.not_null:
                found.append(f"{table.name}: distribution column {placement.column} may be NULL")
    present = {t.name for t in tables.values()}
    found += [
        f"{name}: declared but not in the database"
        for name in sorted(declared)
        if only(name) and name not in present
    ]

    def cols(table: _Table, keys) -> list[str]:
        return [table.columns.get(k, f"#{k}") for k in keys]

    def distributed(table: _Table) -> Distributed | None:
        placement = declared.get(table.name)
        return placement if isinstance(placement, Distributed) else None

    for conname, contype, conrelid, confrelid, conkey, confkey in constraints:
        table = tables[conrelid]
        dist = distributed(table)
        if contype in _KIND:
            if dist and dist.column not in cols(table, conkey):
                found.append(
                    f"{table.name}: {_KIND[contype]} {conname} "
                    f"({', '.join(cols(table, conkey))}) omits the distribution "
                    f"column {dist.column}"
                )
            continue
        target = tables.get(confrelid)
        if target is None:
            continue  # a table outside ``only``
        found += _foreign_key_violations(
            conname, table, target, cols(table, conkey), cols(target, confkey), declared
        )

    for indexname, indrelid, indkey in unique_indexes:
        table = tables[indrelid]
        dist = distributed(table)
        if dist and dist.column not in cols(table, indkey):
            shown = ", ".join(c if c != "#0" else "(expression)" for c in cols(table, indkey))
            found.append(
                f"{table.name}: unique index {indexname} ({shown}) omits the "
                f"distribution column {dist.column}"
            )
    return sorted(found)


def _foreign_key_violations(
    conname: str, table: _Table, target: _Table, columns: list[str], referenced: list[str], declared
) -> list[str]:
    source, dest = declared.get(table.name), declared.get(target.name)
    if source is None or dest is None:
        return []  # reported as not declared
    named = (
        f"{table.name}: foreign key {conname} ({', '.join(columns)}) -> "
        f"{target.name} ({', '.join(referenced)})"
    )
    if isinstance(source, Elsewhere) or isinstance(dest, Elsewhere):
        if isinstance(source, Elsewhere) and isinstance(dest, Elsewhere):
            return []
        return [f"{named} crosses into a database that is not ours"]
    if isinstance(source, Local) or isinstance(dest, Local):
        if isinstance(source, Local) and isinstance(dest, Local):
            return []
        return [f"{named} joins a local table to a table on the workers"]
    if isinstance(source, Reference):
        if isinstance(dest, Distributed):
            return [f"{named}: a reference table cannot refer to a distributed table"]
        return []
    if isinstance(dest, Reference):
        return []  # distributed -> reference: every node has the target
    if source.group != dest.group:
        return [f"{named} joins two co-location groups ({source.group}, {dest.group})"]
    if (source.column, dest.column) not in zip(columns, referenced, strict=True):
        return [f"{named} omits the distribution columns ({source.column} -> {dest.column})"]
    return []


# --- the project's schema -----------------------------------------------------------------


def _distributed(table: str) -> Distributed:
    placement = TABLES[table]
    assert isinstance(placement, Distributed), f"{table} is {placement}"
    return placement


@pytest.mark.django_db
def test_the_schema_keeps_citus_rules_for_the_declared_distribution():
    found = citus_violations(TABLES)
    assert not found, "Citus would refuse:\n" + "\n".join(found)


def test_every_declared_table_says_why():
    assert [name for name, placement in TABLES.items() if len(placement.reason) < 20] == []


def test_distributed_tables_are_by_event_except_the_declared_few():
    by_group: dict[str, set[str]] = {}
    for name, placement in TABLES.items():
        if isinstance(placement, Distributed):
            by_group.setdefault(placement.group, set()).add(name)
    # Another group is another commit across nodes for whoever writes both:
    # each one is a decision, with its cost in docs/design.md ("Running").
    assert by_group.keys() == {"event", "buyer", "session"}
    assert by_group["buyer"] == {"purchases_idempotencyrecord"}
    assert by_group["session"] == {"django_session"}
    assert {_distributed(name).column for name in by_group["event"]} == {"event_id", "id"}
    assert _distributed("purchases_event").column == "id"


# --- the checker catches what it must ------------------------------------------------------


PROBE_SQL = [
    # A distributed table whose primary key lacks its column.
    "CREATE TABLE citus_probe_parent (id bigint PRIMARY KEY, event_id bigint NOT NULL)",
    "CREATE UNIQUE INDEX citus_probe_parent_pair ON citus_probe_parent (id, event_id)",
    # One of each mistake: a unique constraint and a partial unique index
    # without the column, a foreign key on the id alone.
    """CREATE TABLE citus_probe_child (
         id bigint NOT NULL, event_id bigint NOT NULL, ref text, parent_id bigint,
         gone timestamptz,
         CONSTRAINT citus_probe_child_pk PRIMARY KEY (id, event_id),
         CONSTRAINT citus_probe_child_ref UNIQUE (ref),
         CONSTRAINT citus_probe_child_parent FOREIGN KEY (parent_id)
           REFERENCES citus_probe_parent (id))""",
    """CREATE UNIQUE INDEX citus_probe_child_live ON citus_probe_child (parent_id)
         WHERE gone IS NULL""",
    # Right: the composite key, the paired foreign key.
    """CREATE TABLE citus_probe_good (
         id bigint NOT NULL, event_id bigint NOT NULL, parent_id bigint,
         PRIMARY KEY (id, event_id),
         CONSTRAINT citus_probe_good_parent FOREIGN KEY (event_id, parent_id)
           REFERENCES citus_probe_parent (event_id, id))""",
    # Another group pointing into the event group, its columns paired or not.
    """CREATE TABLE citus_probe_other (
         id bigint NOT NULL, buyer_id bigint NOT NULL, parent_id bigint,
         PRIMARY KEY (id, buyer_id),
         CONSTRAINT citus_probe_other_parent FOREIGN KEY (buyer_id, parent_id)
           REFERENCES citus_probe_parent (event_id, id))""",
    # A reference table pointing at a distributed one.
    """CREATE TABLE citus_probe_ref (id bigint PRIMARY KEY, parent_id bigint,
         parent_event bigint,
         CONSTRAINT citus_probe_ref_parent FOREIGN KEY (parent_event, parent_id)
           REFERENCES citus_probe_parent (event_id, id))""",
    # A distribution column that may be NULL (a unique constraint does not
    # make it NOT NULL, a primary key would).
    """CREATE TABLE citus_probe_nullable (id bigint NOT NULL, event_id bigint,
         CONSTRAINT citus_probe_nullable_once UNIQUE (id, event_id))""",
    # Nobody said where this one goes.
    "CREATE TABLE citus_probe_stray (id bigint PRIMARY KEY)",
]

PROBES: dict[str, Placement] = {
    "citus_probe_parent": Distributed("event_id", "event", "probe"),
    "citus_probe_child": Distributed("event_id", "event", "probe"),
    "citus_probe_good": Distributed("event_id", "event", "probe"),
    "citus_probe_other": Distributed("buyer_id", "buyer", "probe"),
    "citus_probe_nullable": Distributed("event_id", "event", "probe"),
    "citus_probe_ref": Reference("probe"),
    "citus_probe_gone": Reference("probe"),
}


@pytest.mark.django_db
def test_the_checker_names_each_broken_rule_with_its_table_and_constraint():
    # given tables with every mistake, made in the test's transaction
    with connection.cursor() as cursor:
        for statement in PROBE_SQL:
            cursor.execute(statement)

    # when
    found = citus_violations(PROBES, only=lambda name: name.startswith("citus_probe_"))

    # then
    assert sorted(found) == sorted(
        [
            "citus_probe_child: foreign key citus_probe_child_parent (parent_id) -> "
            "citus_probe_parent (id) omits the distribution columns (event_id -> event_id)",
            "citus_probe_child: unique constraint citus_probe_child_ref (ref) omits the "
            "distribution column event_id",
            "citus_probe_child: unique index citus_probe_child_live (parent_id) omits the "
            "distribution column event_id",
            "citus_probe_gone: declared but not in the database",
            "citus_probe_nullable: distribution column event_id may be NULL",
            "citus_probe_other: foreign key citus_probe_other_parent (buyer_id, parent_id) -> "
            "citus_probe_parent (event_id, id) joins two co-location groups (buyer, event)",
            "citus_probe_parent: primary key citus_probe_parent_pkey (id) omits the "
            "distribution column event_id",
            "citus_probe_ref: foreign key citus_probe_ref_parent (parent_event, parent_id) -> "
            "citus_probe_parent (event_id, id): a reference table cannot refer to a distributed "
            "table",
            "citus_probe_stray: not declared in config/distribution.py (distributed, reference, "
            "local or elsewhere)",
        ]
    )


@pytest.mark.django_db
def test_the_checker_passes_a_table_that_follows_the_rules():
    with connection.cursor() as cursor:
        for statement in PROBE_SQL[:5]:
            cursor.execute(statement)

    found = citus_violations(
        PROBES, only=lambda name: name in {"citus_probe_parent", "citus_probe_good"}
    )

    assert found == [
        "citus_probe_parent: primary key citus_probe_parent_pkey (id) omits the "
        "distribution column event_id"
    ]


# --- every row the product writes names its event ----------------------------------------

# The writers whose rows would land on NO_EVENT's node if the caller did not
# say which event they belong to.
EVENT_WRITERS = {"outbox_publish", "timer_schedule", "webhook_publish"}
PRODUCT = ("purchases", "outbox", "webhooks", "ledger", "shop", "config", "stripe_events")


def _calls_without_event(source: str) -> list[int]:
    missing = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name not in EVENT_WRITERS:
            continue
        given = {k.arg: k.value for k in node.keywords}
        value = given.get("event_id")
        if value is None or (isinstance(value, ast.Constant) and value.value is None):
            missing.append(node.lineno)
    return missing


def test_the_product_names_the_event_of_every_outbox_row_and_webhook_it_writes():
    missing = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
        for line in _calls_without_event(path.read_text())
    ]
    assert missing == []


def test_the_scan_finds_a_write_without_its_event():
    source = (
        "outbox_publish(topic='a', payload={}, event_id=saga.event_id)\n"
        "services.timer_schedule(key='k', topic='a', payload={}, due_at=now)\n"
        "webhook_publish(event_type='x', saga_id=None, event_id=None, data={}, now=None)\n"
    )
    assert _calls_without_event(source) == [2, 3]


# --- at run time: a reservation is found by its event too ------------------------------


def _reservation_statements_without_event(captured) -> list[str]:
    """The statements that read or write purchases_reservation and do not
    name an event_id: under Citus each would go to every shard."""
    return [
        q["sql"]
        for q in captured
        if "purchases_reservation" in q["sql"]
        and "purchases_reservationseat" not in q["sql"]
        and "event_id" not in q["sql"]
    ]


@pytest.mark.django_db(transaction=True)
def test_a_compensation_and_its_dry_run_find_the_reservation_by_its_event(alice, gateway):
    from django.test.utils import CaptureQueriesContext

    from purchases.ops.runbook import Action, action_plan
    from purchases.services import purchase_refund, saga_charge

    from .conftest import drain_outbox, start_purchase
    from .factories import EventFactory

    event = EventFactory(seats=["A1", "A2"])
    sold = start_purchase(alice, event, seats=["A1"])
    declined = start_purchase(alice, event, seats=["A2"], payment_method="pm_card_chargeDeclined")
    saga_charge(saga_id=sold.pk)
    drain_outbox()
    sold.refresh_from_db()
    assert sold.state == "CONFIRMED"

    with CaptureQueriesContext(connection) as ctx:
        action_plan(saga=sold, action=Action.REFUND)  # the admin's dry run
        saga_charge(saga_id=declined.pk)  # declined: compensated, never confirmed
        purchase_refund(saga_id=sold.pk, reason="the buyer asked")  # was confirmed
        drain_outbox()

    sold.refresh_from_db()
    declined.refresh_from_db()
    # The refund is a row of its own: the confirmed purchase stays CONFIRMED.
    assert (sold.state, declined.state) == ("CONFIRMED", "COMPENSATED")
    assert sold.refunds.get().status == "succeeded"
    assert _reservation_statements_without_event(ctx.captured_queries) == []
