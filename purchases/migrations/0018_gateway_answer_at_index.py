# The waiting room measures the charge rate from the last seconds' gateway
# answers (purchases/admission.py). Built CONCURRENTLY: a plain CREATE INDEX
# would block every charge's commit for as long as it takes on a deployment
# with many answers.

import django.contrib.postgres.indexes
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("purchases", "0017_waiting_room"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="gatewayanswer",
            index=django.contrib.postgres.indexes.BrinIndex(
                fields=["at"], name="gateway_answer_at_brin"
            ),
        ),
    ]
