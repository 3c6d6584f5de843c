"""`make bench`: the benchmark harness (bench/run.py) and its Celery tasks."""
