"""An audit that could not reach the gateway is incomplete, not violated:
record what it could not verify, and where it asked."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("purchases", "0003_compensation_deadline"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditrun",
            name="unverified",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="auditrun",
            name="unverified_report",
            field=models.JSONField(default=list),
        ),
        migrations.AddField(
            model_name="auditrun",
            name="gateway_url",
            field=models.CharField(blank=True, default="", max_length=500),
        ),
    ]
