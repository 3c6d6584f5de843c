"""Topic names in one style (purchase.<what happened>), and an idempotency
record that stores the purchase, not an HTTP status (the API owns that)."""

from django.db import migrations

RENAMED = {
    "PurchaseConfirmed": "purchase.confirmed",
    "ReservationCancelled": "purchase.cancelled",
    "SagaNeedsOperator": "purchase.needs_operator",
}


def rename_topics(apps, schema_editor, renames=RENAMED):
    OutboxMessage = apps.get_model("outbox", "OutboxMessage")
    for old, new in renames.items():
        OutboxMessage.objects.filter(topic=old).update(topic=new)


def restore_topics(apps, schema_editor):
    rename_topics(apps, schema_editor, renames={new: old for old, new in RENAMED.items()})


class Migration(migrations.Migration):

    dependencies = [
        ("purchases", "0005_gateway_answer"),
        ("outbox", "0002_dead_letters"),
    ]

    operations = [
        migrations.RunPython(rename_topics, restore_topics),
        migrations.RemoveField(model_name="idempotencyrecord", name="response_status"),
    ]
