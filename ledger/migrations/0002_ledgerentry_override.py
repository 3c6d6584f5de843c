"""An entry an operator wrote while the gateway could not be asked."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="ledgerentry",
            name="override",
            field=models.BooleanField(default=False),
        ),
    ]
