"""The embedded broker's exchanges, declared before ``make run`` starts its
processes (scripts/run.sh: ``python -m devtools.embedded_broker``).

With no ``CELERY_BROKER_URL`` the broker is kombu's filesystem transport, as
kombu ships it (config/settings.py): each exchange's bindings are a file in
``var/broker/control``. A process that binds a queue to an exchange whose
file does not exist yet creates it (``open("wb")``, empty) and only then locks
and writes it: another that opens it in between reads an empty table and
fails (``JSONDecodeError``), and two that both create it keep one binding.
Once the file exists, every process opens it, locks it, and only then reads
and writes (tests/test_embedded_broker.py). So this runs alone, before the
processes that bind at once: every queue a worker of the Procfile consumes
(the default queue and the webhooks' queue), declared as Celery declares it.
Workers' remote control, whose fanout exchange each worker would bind at its
start, is off on this broker (config/settings.py).
"""

from __future__ import annotations

import sys

from django.conf import settings

from config.celery import app


def queues() -> list[str]:
    """The queues of make run's workers (the Procfile's ``--queues``)."""
    return [
        settings.CELERY_TASK_DEFAULT_QUEUE,
        settings.CELERY_WEBHOOK_QUEUE,
        settings.CELERY_REFUND_QUEUE,
        settings.CELERY_ADMISSION_QUEUE,
    ]


def declare() -> list[str]:
    """Declare each queue, its exchange and its binding; the queues' names."""
    names = queues()
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        for name in names:
            # Celery's own Queue for the name (created as a worker's
            # --queues creates it: a direct exchange of the same name).
            app.amqp.queues[name](channel).declare()
    return names


if __name__ == "__main__":
    if settings.CELERY_BROKER_URL != "filesystem://":
        sys.exit(0)  # a broker server declares what each process asks for, atomically
    print(f"broker: declared {', '.join(declare())}", file=sys.stderr)
