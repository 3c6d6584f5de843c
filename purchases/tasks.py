"""Celery entry points for the saga and the sweeps: an id in, one service
call out.

Each service re-reads the saga under its lock and returns early if the state
has moved on, so a duplicate or late delivery is harmless.
"""

from celery import shared_task

from outbox.handover import delivered_here

from . import breaker, services
from .ops.audit import audit_run
from .ops.heartbeats import sweeps_stalled
from .ops.sweeps import sweep_chase, sweep_resume
from .saga.topics import CHARGE_TASK


@shared_task(
    name=CHARGE_TASK,
    bind=True,
    acks_late=True,
    autoretry_for=(Exception,),
    retry_backoff=2,
    retry_backoff_max=120,
    retry_jitter=True,
    max_retries=5,
)
def saga_charge_task(self, saga_id: str) -> str:
    # A failed run leaves the saga PENDING or CHARGING: the resumer drives it.
    # With others of its event PENDING, it charges them too, in bursts
    # (purchases/saga/burst.py).
    # What the charge announces on this queue (the confirmation's emails and
    # analytics) this task delivers itself, once each burst is done
    # (outbox/handover.py, "in place"; docs/performance.md).
    return services.saga_charge_burst(saga_id=saga_id, each_burst=delivered_here).state


# Periodic sweeps (Celery beat). Each run leaves a heartbeat; overlapping runs
# are harmless (sagas are claimed with SKIP LOCKED and re-checked).


@shared_task(name="purchases.resume_sagas", acks_late=True)
def resume_sagas_task() -> int:
    return len(sweep_resume().lines)


@shared_task(name="purchases.chase_compensations", acks_late=True)
def chase_compensations_task() -> int:
    lines = sweep_chase()
    sweeps_stalled()
    return len(lines)


@shared_task(name="purchases.audit_sagas", acks_late=True)
def audit_sagas_task() -> int:
    # audit_run leaves its own heartbeat ("audit_sagas").
    return len(audit_run().violations)


@shared_task(name="purchases.breaker_trial", ignore_result=True)
def breaker_trial_task() -> str | None:
    # Nothing to do unless the processor's breaker is open past its reset time.
    return breaker.breaker_trial()


@shared_task(name="purchases.waiting_rooms_tick", ignore_result=True)
def waiting_rooms_tick_task() -> int:
    # Every on-sale event's waiting room (purchases/admission.py): the draw,
    # the admissions, whether starts must be let in.
    return services.waiting_rooms_tick()
