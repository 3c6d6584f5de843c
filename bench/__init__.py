"""`make bench`: the runner (bench/run.py), one module per figure (bench/figures/) and
the Celery tasks of figure 7 (bench/tasks.py)."""
