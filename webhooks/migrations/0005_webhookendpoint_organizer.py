# An endpoint may belong to an organizer, and is then sent that organizer's
# events only; without one it is a platform-wide endpoint, sent every event's
# (docs/api.md, "Organizers and roles"). The endpoints that exist were the
# seller's, and every event goes to the default organizer (purchases 0010):
# they go to it too, made here if it is not there yet.

import django.db.models.deletion
from django.db import migrations, models
from django.utils import timezone

DEFAULT_SLUG, DEFAULT_NAME = "demo", "Demo venue"


def to_the_default_organizer(apps, schema_editor):
    Endpoint = apps.get_model("webhooks", "WebhookEndpoint")
    Organizer = apps.get_model("organizers", "Organizer")
    endpoints = Endpoint.objects.filter(organizer__isnull=True)
    if not endpoints.exists():
        return
    default, _ = Organizer.objects.get_or_create(
        slug=DEFAULT_SLUG, defaults={"name": DEFAULT_NAME, "created_at": timezone.now()}
    )
    endpoints.update(organizer=default)


class Migration(migrations.Migration):

    dependencies = [
        ('organizers', '0001_initial'),
        ('webhooks', '0004_fewer_indexes'),
    ]

    operations = [
        migrations.AddField(
            model_name='webhookendpoint',
            name='organizer',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='webhook_endpoints', to='organizers.organizer'),
        ),
        migrations.RunPython(to_the_default_organizer, migrations.RunPython.noop),
    ]
