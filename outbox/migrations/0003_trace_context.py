"""The trace context of the span that wrote an outbox row
(config/tracing.py). Written by hand; a column with a constant default is
added without rewriting the table."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("outbox", "0002_dead_letters"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxmessage",
            name="trace_context",
            field=models.CharField(blank=True, db_default="", default="", max_length=128),
        ),
    ]
