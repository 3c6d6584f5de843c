"""The trace context of the request that started a purchase
(config/tracing.py). Written by hand; a column with a constant default is
added without rewriting the table."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("purchases", "0006_topics_and_idempotency_answer"),
    ]

    operations = [
        migrations.AddField(
            model_name="purchasesaga",
            name="trace_context",
            field=models.CharField(blank=True, db_default="", default="", max_length=128),
        ),
    ]
