"""Celery entry points for the saga: an id in, one service call out.

Each service re-reads the saga under its lock and returns early if the state
has moved on, so a duplicate or late delivery is harmless.
"""

from celery import shared_task

from . import services

_RETRY = {
    "bind": True,
    "acks_late": True,
    "autoretry_for": (Exception,),
    "retry_backoff": 2,
    "retry_backoff_max": 120,
    "retry_jitter": True,
    "max_retries": 5,
}


@shared_task(name="purchases.charge", **_RETRY)
def saga_charge_task(self, saga_id: str) -> str:
    # A failed run leaves the saga PENDING or CHARGING: the resumer drives it.
    return services.saga_charge(saga_id=saga_id).state
