"""Citus's rules for distribution by event (docs/design.md, "Running";
config/distribution.py declares every table, tests/test_citus_rules.py holds
the schema to it). Written by hand.

- The saga's history carries its event (backfilled from the saga).
- Unique constraints include the distribution column: the reservation's ref,
  the saga's intent id and reservation, the seat's live reservation; the
  idempotency record is distributed by buyer, so its one-per-saga is
  (saga, user), and (user, key) stays as it was.
- Primary keys become (id, event_id) in the database ((id, user_id) for the
  idempotency record). Django 5.2 cannot point a ForeignKey at a composite
  key, so the models keep ``id`` as their primary key. ``id`` leads the key,
  so the key's index still serves every ``WHERE id = …`` (and ``id`` is
  unique by its sequence or its uuid4, as it was).
- A foreign key between two of these tables pairs the event:
  (event_id, x_id) -> (event_id, id), deferrable like Django's. The models
  say ``db_constraint=False`` so that Django drops (and does not make) the
  single-column one. The idempotency record's saga is on another shard under
  Citus: no foreign key at all (the reserve writes both in one commit).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.db.models import OuterRef, Subquery

BY_EVENT = [
    "purchases_seat",
    "purchases_reservation",
    "purchases_reservationseat",
    "purchases_purchasesaga",
    "purchases_sagahistory",
    "purchases_gatewayanswer",
    "purchases_dailysales",
]
BY_BUYER = ["purchases_idempotencyrecord"]
# (table, column, referenced table): (event_id, column) -> (event_id, id).
PAIRED = [
    ("purchases_reservationseat", "reservation_id", "purchases_reservation"),
    ("purchases_reservationseat", "seat_id", "purchases_seat"),
    ("purchases_purchasesaga", "reservation_id", "purchases_reservation"),
    ("purchases_sagahistory", "saga_id", "purchases_purchasesaga"),
    ("purchases_gatewayanswer", "saga_id", "purchases_purchasesaga"),
]
# The saga's OneToOneField: unique with the event here, alone in Django's state.
SAGA_RESERVATION_ONCE = "purchases_purchasesaga_reservation_once_per_event"
SAGA_RESERVATION_KEY = "purchases_purchasesaga_reservation_id_key"  # Django's name


def _constraint(schema_editor, table: str, kind: str, columns: list[str]) -> str | None:
    """The name of the ``kind`` ('p', 'u') constraint of ``table`` on exactly ``columns``."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint k WHERE conrelid = %s::regclass AND contype = %s"
            "   AND ARRAY(SELECT attname::text FROM unnest(k.conkey) WITH ORDINALITY AS c(n, i)"
            "               JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = c.n"
            "              ORDER BY c.i) = %s",
            [table, kind, columns])
        row = cursor.fetchone()
    return row[0] if row else None


def _primary_key(schema_editor, table: str, old: list[str], new: list[str]) -> None:
    q = schema_editor.quote_name
    name = _constraint(schema_editor, table, "p", old)
    if name is None:
        raise RuntimeError(f"{table}: no primary key on ({', '.join(old)})")
    schema_editor.execute(
        f"ALTER TABLE {q(table)} DROP CONSTRAINT {q(name)}, "
        f"ADD CONSTRAINT {q(name)} PRIMARY KEY ({', '.join(map(q, new))})")


def _paired_name(table: str, column: str) -> str:
    return f"{table}_{column}_event_fk"


def distribute(apps, schema_editor):
    q = schema_editor.quote_name
    for table in BY_EVENT:
        _primary_key(schema_editor, table, ["id"], ["id", "event_id"])
    for table in BY_BUYER:
        _primary_key(schema_editor, table, ["id"], ["id", "user_id"])
    for table, column, target in PAIRED:
        schema_editor.execute(
            f"ALTER TABLE {q(table)} ADD CONSTRAINT {q(_paired_name(table, column))} "
            f"FOREIGN KEY (event_id, {q(column)}) REFERENCES {q(target)} (event_id, id) "
            "DEFERRABLE INITIALLY DEFERRED")
    alone = _constraint(schema_editor, "purchases_purchasesaga", "u", ["reservation_id"])
    if alone is not None:
        schema_editor.execute(f"ALTER TABLE purchases_purchasesaga DROP CONSTRAINT {q(alone)}")
    schema_editor.execute(
        f"ALTER TABLE purchases_purchasesaga ADD CONSTRAINT {q(SAGA_RESERVATION_ONCE)} "
        "UNIQUE (reservation_id, event_id)")


def undistribute(apps, schema_editor):
    q = schema_editor.quote_name
    schema_editor.execute(
        f"ALTER TABLE purchases_purchasesaga DROP CONSTRAINT {q(SAGA_RESERVATION_ONCE)}, "
        f"ADD CONSTRAINT {q(SAGA_RESERVATION_KEY)} UNIQUE (reservation_id)")
    for table, column, _ in PAIRED:
        schema_editor.execute(
            f"ALTER TABLE {q(table)} DROP CONSTRAINT {q(_paired_name(table, column))}")
    for table in BY_BUYER:
        _primary_key(schema_editor, table, ["id", "user_id"], ["id"])
    for table in BY_EVENT:
        _primary_key(schema_editor, table, ["id", "event_id"], ["id"])


def history_event_from_saga(apps, schema_editor):
    SagaHistory = apps.get_model("purchases", "SagaHistory")
    PurchaseSaga = apps.get_model("purchases", "PurchaseSaga")
    SagaHistory.objects.filter(event__isnull=True).update(event_id=Subquery(
        PurchaseSaga.objects.filter(pk=OuterRef("saga_id")).values("event_id")[:1]))
    # Check the new foreign key now: a table with pending (deferred)
    # checks cannot be altered later in this transaction.
    schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):

    dependencies = [
        ("purchases", "0007_trace_context"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # First every single-column foreign key between distributed tables
        # goes (the primary keys they hang on change below).
        migrations.AlterField(
            model_name="reservationseat",
            name="reservation",
            field=models.ForeignKey(db_constraint=False,
                                    on_delete=django.db.models.deletion.PROTECT,
                                    related_name="seat_links", to="purchases.reservation"),
        ),
        migrations.AlterField(
            model_name="reservationseat",
            name="seat",
            field=models.ForeignKey(db_constraint=False,
                                    on_delete=django.db.models.deletion.PROTECT,
                                    related_name="+", to="purchases.seat"),
        ),
        migrations.AlterField(
            model_name="purchasesaga",
            name="reservation",
            field=models.OneToOneField(db_constraint=False,
                                       on_delete=django.db.models.deletion.PROTECT,
                                       related_name="saga", to="purchases.reservation"),
        ),
        migrations.AlterField(
            model_name="sagahistory",
            name="saga",
            field=models.ForeignKey(db_constraint=False,
                                    on_delete=django.db.models.deletion.PROTECT,
                                    related_name="history", to="purchases.purchasesaga"),
        ),
        migrations.AlterField(
            model_name="gatewayanswer",
            name="saga",
            field=models.ForeignKey(db_constraint=False,
                                    on_delete=django.db.models.deletion.PROTECT,
                                    related_name="gateway_answers",
                                    to="purchases.purchasesaga"),
        ),
        migrations.AlterField(
            model_name="idempotencyrecord",
            name="saga",
            field=models.ForeignKey(db_constraint=False,
                                    on_delete=django.db.models.deletion.PROTECT,
                                    related_name="+", to="purchases.purchasesaga"),
        ),
        # The history's event.
        migrations.AddField(
            model_name="sagahistory",
            name="event",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT,
                                    related_name="+", to="purchases.event"),
        ),
        migrations.RunPython(history_event_from_saga, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="sagahistory",
            name="event",
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT,
                                    related_name="+", to="purchases.event"),
        ),
        # Unique constraints with the distribution column.
        migrations.AlterField(
            model_name="reservation",
            name="ref",
            field=models.CharField(max_length=20),
        ),
        migrations.AddConstraint(
            model_name="reservation",
            constraint=models.UniqueConstraint(fields=("ref", "event"),
                                               name="reservation_ref_unique_per_event"),
        ),
        migrations.AlterField(
            model_name="purchasesaga",
            name="intent_id",
            field=models.CharField(max_length=100),
        ),
        migrations.AddConstraint(
            model_name="purchasesaga",
            constraint=models.UniqueConstraint(fields=("intent_id", "event"),
                                               name="saga_intent_unique_per_event"),
        ),
        migrations.RemoveConstraint(
            model_name="reservationseat",
            name="seat_taken_by_one_live_reservation",
        ),
        migrations.AddConstraint(
            model_name="reservationseat",
            constraint=models.UniqueConstraint(condition=models.Q(("released_at__isnull", True)),
                                               fields=("seat", "event"),
                                               name="seat_taken_by_one_live_reservation"),
        ),
        migrations.AddConstraint(
            model_name="idempotencyrecord",
            constraint=models.UniqueConstraint(fields=("saga", "user"),
                                               name="idempotency_one_per_saga"),
        ),
        # Primary keys, paired foreign keys, the saga's reservation.
        migrations.RunPython(distribute, undistribute),
    ]
