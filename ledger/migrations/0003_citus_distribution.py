"""Citus's rules for distribution by event (docs/design.md, "Running";
config/distribution.py, tests/test_citus_rules.py). Written by hand.

- One entry per (intent, kind) is per (intent, kind, event) in the database:
  the intent id names its event, so it is the same rule.
- The primary key becomes (id, event_id) in the database; the model keeps
  ``id`` (``id`` leads the key: ``WHERE id = …`` still has its index).
"""

from django.db import migrations, models


def _primary_key(schema_editor, old: list[str], new: list[str]) -> None:
    q = schema_editor.quote_name
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT conname FROM pg_constraint"
                       " WHERE conrelid = 'ledger_ledgerentry'::regclass AND contype = 'p'")
        (name,) = cursor.fetchone()
    schema_editor.execute(
        f"ALTER TABLE ledger_ledgerentry DROP CONSTRAINT {q(name)}, "
        f"ADD CONSTRAINT {q(name)} PRIMARY KEY ({', '.join(map(q, new))})")


def distribute(apps, schema_editor):
    _primary_key(schema_editor, ["id"], ["id", "event_id"])


def undistribute(apps, schema_editor):
    _primary_key(schema_editor, ["id", "event_id"], ["id"])


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0002_ledgerentry_override"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="ledgerentry",
            name="ledger_one_entry_per_kind",
        ),
        migrations.AddConstraint(
            model_name="ledgerentry",
            constraint=models.UniqueConstraint(fields=("intent_id", "kind", "event_id"),
                                               name="ledger_one_entry_per_kind"),
        ),
        migrations.RunPython(distribute, undistribute),
    ]
