"""ReconciliationProbe stored every answer of the gateway (charges, cancels,
refunds), not only reconciliation look-ups: it is GatewayAnswer now."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("purchases", "0004_audit_unverified"),
    ]

    operations = [
        migrations.RenameModel(old_name="ReconciliationProbe", new_name="GatewayAnswer"),
        migrations.AlterField(
            model_name="gatewayanswer",
            name="saga",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="gateway_answers",
                to="purchases.purchasesaga",
            ),
        ),
    ]
