# Every event belongs to an organizer (docs/api.md, "Organizers and roles").
# The events that exist go to the default organizer, the demo's ("demo",
# "Demo venue"), made here if there are any; 0011 then makes the column NOT
# NULL (in a migration of its own: PostgreSQL refuses to alter a table whose
# rows this transaction changed while their deferred foreign keys are pending).

import django.db.models.deletion
from django.db import migrations, models
from django.utils import timezone

DEFAULT_SLUG, DEFAULT_NAME = "demo", "Demo venue"


def to_the_default_organizer(apps, schema_editor):
    Event = apps.get_model("purchases", "Event")
    Organizer = apps.get_model("organizers", "Organizer")
    events = Event.objects.filter(organizer__isnull=True)
    if not events.exists():
        return
    default, _ = Organizer.objects.get_or_create(
        slug=DEFAULT_SLUG, defaults={"name": DEFAULT_NAME, "created_at": timezone.now()}
    )
    events.update(organizer=default)


class Migration(migrations.Migration):

    dependencies = [
        ('organizers', '0001_initial'),
        ('purchases', '0009_reservation_seats_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='event',
            name='organizer',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='events', to='organizers.organizer'),
        ),
        migrations.RunPython(to_the_default_organizer, migrations.RunPython.noop),
    ]
