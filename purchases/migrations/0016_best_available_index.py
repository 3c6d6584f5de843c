# Best available reads the available seats in row order, a chunk at a time
# (purchases/saga/start.py, ``_find_best_block``). The indexes are built
# CONCURRENTLY: a plain CREATE INDEX would block every seat's hold and sale
# for as long as it takes on a deployment with many seats.

import django.db.models.functions.comparison
import django.db.models.lookups
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("purchases", "0015_ticket_version"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="seat",
            index=models.Index(
                models.F("event"),
                django.db.models.functions.comparison.Collate(models.F("section"), "C"),
                django.db.models.functions.comparison.Collate(models.F("row"), "C"),
                models.F("number"),
                # The status compared byte by byte: see purchases/models.py.
                condition=models.Q(
                    django.db.models.lookups.Exact(
                        django.db.models.functions.comparison.Collate(models.F("status"), "C"),
                        "available",
                    )
                ),
                name="seat_available_in_row_order",
            ),
        ),
        AddIndexConcurrently(
            model_name="seat",
            index=models.Index(
                fields=["event", "section", "row", "number"], name="seat_in_row_order"
            ),
        ),
    ]
