# The version of a seat's ticket (docs/door.md, "A ticket"): 0 for every
# ticket sold so far. Written by hand; the database default fills the
# existing rows without rewriting the table (PostgreSQL 11+), and keeps the
# reserve's raw INSERTs valid.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("purchases", "0014_refunds"),
    ]

    operations = [
        migrations.AddField(
            model_name="reservationseat",
            name="ticket_version",
            field=models.PositiveSmallIntegerField(db_default=0, default=0),
        ),
    ]
