"""The compensation's start (the chaser's deadline runs from it) and the
operator's hold on a saga the gateway contradicted (docs: the runbook)."""

from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def backfill_compensation_started_at(apps, schema_editor):
    PurchaseSaga = apps.get_model("purchases", "PurchaseSaga")
    SagaHistory = apps.get_model("purchases", "SagaHistory")
    first_move = (
        SagaHistory.objects.filter(saga_id=OuterRef("pk"), to_state="COMPENSATING")
        .exclude(from_state="COMPENSATING")
        .order_by("at", "id")
        .values("at")[:1]
    )
    PurchaseSaga.objects.filter(
        state__in=["COMPENSATING", "COMPENSATION_PENDING", "COMPENSATED"]
    ).update(compensation_started_at=Subquery(first_move))


class Migration(migrations.Migration):

    dependencies = [
        ("purchases", "0002_operations"),
    ]

    operations = [
        migrations.AddField(
            model_name="purchasesaga",
            name="compensation_started_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="purchasesaga",
            name="awaiting_operator_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(backfill_compensation_started_at, migrations.RunPython.noop),
    ]
