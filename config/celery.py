"""The Celery app. JSON only, acks late, prefetch 1; see settings."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("boxoffice")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def _db_reuse(sender, **kwargs):
    # Celery's Django fix-up closes the connection around every task unless
    # this key is set (it reads the old upper-case name).
    from django.conf import settings

    sender.conf["CELERY_DB_REUSE_MAX"] = settings.CELERY_DB_REUSE_MAX
