"""Citus's rules for distribution by event (docs/design.md, "Running";
config/distribution.py, tests/test_citus_rules.py). Written by hand.

- Every delivery carries an event id: NOT NULL (a distribution column); one
  written without it (the product names its event) gets NO_EVENT, 0, which no
  event has. Attempts carry their delivery's (backfilled).
- Unique constraints include the event: the webhook-id (a random UUID's hex:
  unique everywhere in fact), one delivery per (endpoint, saga, type), one
  attempt per (delivery, number).
- Primary keys become (id, event_id) in the database (the models keep ``id``:
  Django 5.2 cannot point a ForeignKey at a composite key; ``id`` leads, so
  ``WHERE id = …`` still has its index), and an attempt's foreign key is
  (event_id, delivery_id) -> (event_id, id), deferrable like Django's.
"""

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import OuterRef, Subquery

NO_EVENT = 0  # config.distribution.NO_EVENT, as it was when this was written
TABLES = ["webhooks_webhookdelivery", "webhooks_webhookattempt"]
PAIRED = "webhooks_webhookattempt_delivery_id_event_fk"


def _primary_key(schema_editor, table: str, new: list[str]) -> None:
    q = schema_editor.quote_name
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT conname FROM pg_constraint"
                       " WHERE conrelid = %s::regclass AND contype = 'p'", [table])
        (name,) = cursor.fetchone()
    schema_editor.execute(
        f"ALTER TABLE {q(table)} DROP CONSTRAINT {q(name)}, "
        f"ADD CONSTRAINT {q(name)} PRIMARY KEY ({', '.join(map(q, new))})")


def distribute(apps, schema_editor):
    for table in TABLES:
        _primary_key(schema_editor, table, ["id", "event_id"])
    schema_editor.execute(
        f"ALTER TABLE webhooks_webhookattempt ADD CONSTRAINT {PAIRED}"
        " FOREIGN KEY (event_id, delivery_id) REFERENCES webhooks_webhookdelivery (event_id, id)"
        " DEFERRABLE INITIALLY DEFERRED")


def undistribute(apps, schema_editor):
    schema_editor.execute(f"ALTER TABLE webhooks_webhookattempt DROP CONSTRAINT {PAIRED}")
    for table in TABLES:
        _primary_key(schema_editor, table, ["id"])


def events_everywhere(apps, schema_editor):
    WebhookDelivery = apps.get_model("webhooks", "WebhookDelivery")
    WebhookAttempt = apps.get_model("webhooks", "WebhookAttempt")
    WebhookDelivery.objects.filter(event_id__isnull=True).update(event_id=NO_EVENT)
    WebhookAttempt.objects.filter(event_id__isnull=True).update(event_id=Subquery(
        WebhookDelivery.objects.filter(pk=OuterRef("delivery_id")).values("event_id")[:1]))
    # No check left pending: the tables are altered below.
    schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0002_delivery_status_index"),
    ]

    operations = [
        # The single-column foreign key goes first (the key it hangs on changes).
        migrations.AlterField(
            model_name="webhookattempt",
            name="delivery",
            field=models.ForeignKey(db_constraint=False,
                                    on_delete=django.db.models.deletion.CASCADE,
                                    related_name="attempts", to="webhooks.webhookdelivery"),
        ),
        migrations.AddField(
            model_name="webhookattempt",
            name="event_id",
            field=models.BigIntegerField(null=True),
        ),
        migrations.RunPython(events_everywhere, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="webhookattempt",
            name="event_id",
            field=models.BigIntegerField(),
        ),
        migrations.AlterField(
            model_name="webhookdelivery",
            name="event_id",
            field=models.BigIntegerField(default=NO_EVENT),
        ),
        migrations.AlterField(
            model_name="webhookdelivery",
            name="message_id",
            field=models.CharField(max_length=40),
        ),
        migrations.AddConstraint(
            model_name="webhookdelivery",
            constraint=models.UniqueConstraint(fields=("message_id", "event_id"),
                                               name="webhook_message_id_once_per_event"),
        ),
        migrations.RemoveConstraint(
            model_name="webhookdelivery",
            name="webhook_once_per_endpoint_saga_type",
        ),
        migrations.AddConstraint(
            model_name="webhookdelivery",
            constraint=models.UniqueConstraint(
                fields=("endpoint", "saga_id", "event_type", "event_id"),
                name="webhook_once_per_endpoint_saga_type"),
        ),
        migrations.RemoveConstraint(
            model_name="webhookattempt",
            name="webhook_attempt_once",
        ),
        migrations.AddConstraint(
            model_name="webhookattempt",
            constraint=models.UniqueConstraint(fields=("delivery", "number", "event_id"),
                                               name="webhook_attempt_once"),
        ),
        migrations.RunPython(distribute, undistribute),
    ]
