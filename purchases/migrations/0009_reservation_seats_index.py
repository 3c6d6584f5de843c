# The seat links of a reservation found by one index on (reservation, event)
# instead of two ANDed by a planner without statistics (docs/performance.md,
# "Plans that do not depend on statistics").

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('purchases', '0008_citus_distribution'),
    ]

    operations = [
        migrations.AlterField(
            model_name='reservationseat',
            name='reservation',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='seat_links', to='purchases.reservation'),
        ),
        migrations.AddIndex(
            model_name='reservationseat',
            index=models.Index(fields=['reservation', 'event'], name='reservation_seats_idx'),
        ),
    ]
