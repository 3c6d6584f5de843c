"""Citus's rules for distribution by event (docs/design.md, "Running";
config/distribution.py, tests/test_citus_rules.py). Written by hand.

- Every outbox row carries an event id: NOT NULL (a distribution column);
  a row written without one (the product names its event on every row) gets
  NO_EVENT, 0, which no event has.
- Inbox entries carry their message's event (backfilled).
- The timer key is unique per event; the inbox's (consumer, message) too.
- Primary keys become (id, event_id) in the database (the models keep ``id``:
  Django 5.2 cannot point a ForeignKey at a composite key; ``id`` leads, so
  ``WHERE id = …`` still has its index), and the inbox's foreign key is
  (event_id, message_id) -> (event_id, id), deferrable like Django's.
"""

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import OuterRef, Subquery

NO_EVENT = 0  # config.distribution.NO_EVENT, as it was when this was written
TABLES = ["outbox_outboxmessage", "outbox_inboxentry"]
PAIRED = "outbox_inboxentry_message_id_event_fk"


def _primary_key(schema_editor, table: str, old: list[str], new: list[str]) -> None:
    q = schema_editor.quote_name
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint k WHERE conrelid = %s::regclass AND contype = 'p'"
            "   AND ARRAY(SELECT attname::text FROM unnest(k.conkey) WITH ORDINALITY AS c(n, i)"
            "               JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = c.n"
            "              ORDER BY c.i) = %s",
            [table, old])
        row = cursor.fetchone()
    if row is None:
        raise RuntimeError(f"{table}: no primary key on ({', '.join(old)})")
    schema_editor.execute(
        f"ALTER TABLE {q(table)} DROP CONSTRAINT {q(row[0])}, "
        f"ADD CONSTRAINT {q(row[0])} PRIMARY KEY ({', '.join(map(q, new))})")


def distribute(apps, schema_editor):
    for table in TABLES:
        _primary_key(schema_editor, table, ["id"], ["id", "event_id"])
    schema_editor.execute(
        f"ALTER TABLE outbox_inboxentry ADD CONSTRAINT {PAIRED} FOREIGN KEY (event_id, message_id)"
        " REFERENCES outbox_outboxmessage (event_id, id) DEFERRABLE INITIALLY DEFERRED")


def undistribute(apps, schema_editor):
    schema_editor.execute(f"ALTER TABLE outbox_inboxentry DROP CONSTRAINT {PAIRED}")
    for table in TABLES:
        _primary_key(schema_editor, table, ["id", "event_id"], ["id"])


def events_everywhere(apps, schema_editor):
    OutboxMessage = apps.get_model("outbox", "OutboxMessage")
    InboxEntry = apps.get_model("outbox", "InboxEntry")
    OutboxMessage.objects.filter(event_id__isnull=True).update(event_id=NO_EVENT)
    InboxEntry.objects.filter(event_id__isnull=True).update(event_id=Subquery(
        OutboxMessage.objects.filter(pk=OuterRef("message_id")).values("event_id")[:1]))
    # No check left pending: the tables are altered below.
    schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):

    dependencies = [
        ("outbox", "0003_trace_context"),
    ]

    operations = [
        # The single-column foreign key goes first (the key it hangs on changes).
        migrations.AlterField(
            model_name="inboxentry",
            name="message",
            field=models.ForeignKey(db_constraint=False,
                                    on_delete=django.db.models.deletion.PROTECT,
                                    related_name="inbox", to="outbox.outboxmessage"),
        ),
        migrations.AddField(
            model_name="inboxentry",
            name="event_id",
            field=models.BigIntegerField(null=True),
        ),
        migrations.RunPython(events_everywhere, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="inboxentry",
            name="event_id",
            field=models.BigIntegerField(),
        ),
        migrations.AlterField(
            model_name="outboxmessage",
            name="event_id",
            field=models.BigIntegerField(default=NO_EVENT),
        ),
        migrations.AlterField(
            model_name="outboxmessage",
            name="key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddConstraint(
            model_name="outboxmessage",
            constraint=models.UniqueConstraint(fields=("key", "event_id"),
                                               name="outbox_key_once_per_event"),
        ),
        migrations.RemoveConstraint(
            model_name="inboxentry",
            name="inbox_once_per_consumer",
        ),
        migrations.AddConstraint(
            model_name="inboxentry",
            constraint=models.UniqueConstraint(fields=("consumer", "message", "event_id"),
                                               name="inbox_once_per_consumer"),
        ),
        migrations.RunPython(distribute, undistribute),
    ]
