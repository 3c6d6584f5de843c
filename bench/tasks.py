"""Benchmark-only Celery tasks (figure 7 of `make bench`).

The bench's own worker imports them (``celery -A config worker --include
bench.tasks``); nothing in the product routes to them. They measure the
transport and the worker pool on their own: a task that does nothing, and a
task that does one small transaction (lock a row, update it, insert a row),
which is the smallest unit of work a saga step is made of.

Their tables (``bench_counter``, ``bench_log``) are made by figure 7 before
it sends them (bench/figures/celery_baseline.py: ``fixtures``) in the bench's
own database, not by a migration.
"""

from celery import shared_task
from django.db import connection, transaction

from bench.common import COUNTER_ROWS


@shared_task(name="bench.noop")
def noop() -> None:
    return None


@shared_task(name="bench.small_txn")
def small_txn(n: int) -> None:
    row = n % COUNTER_ROWS + 1
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute("SELECT n FROM bench_counter WHERE id = %s FOR UPDATE", [row])
        cursor.execute("UPDATE bench_counter SET n = n + 1 WHERE id = %s", [row])
        cursor.execute("INSERT INTO bench_log (counter_id, task_no) VALUES (%s, %s)", [row, n])
