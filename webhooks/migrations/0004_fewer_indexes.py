"""Three indexes fewer on the deliveries and their attempts.

Every delivery is inserted once and updated at least once (delivered,
retried or failed), and that update changes an indexed column (``status``),
so every index of the table is written again. Three were covered by others
that lead with the same column: ``endpoint_id`` (the by-endpoint, by-status
and once-per-type indexes), ``saga_id`` (the once-per-type constraint, which
now leads with the saga: a saga's page and the auditor read by it) and the
attempts' ``delivery_id`` (``webhook_attempt_once``). docs/performance.md,
"The webhooks' sweep".
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0003_citus_distribution"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="webhookdelivery",
            name="webhook_once_per_endpoint_saga_type",
        ),
        migrations.AlterField(
            model_name="webhookattempt",
            name="delivery",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="attempts",
                to="webhooks.webhookdelivery",
            ),
        ),
        migrations.AlterField(
            model_name="webhookdelivery",
            name="endpoint",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="deliveries",
                to="webhooks.webhookendpoint",
            ),
        ),
        migrations.AlterField(
            model_name="webhookdelivery",
            name="saga_id",
            field=models.UUIDField(),
        ),
        migrations.AddConstraint(
            model_name="webhookdelivery",
            constraint=models.UniqueConstraint(
                fields=("saga_id", "endpoint", "event_type", "event_id"),
                name="webhook_once_per_saga_endpoint_type",
            ),
        ),
    ]
