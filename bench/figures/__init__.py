"""The figures of `make bench`, one module each, numbered as in
bench/README.md. Each module has:

- ``FIGURE`` (bench.common.Figure): its name for ``--phases``, its key in
  the JSON, its label, its timeout;
- ``run(ctx)``: measures, writes ``ctx.results["figures"][FIGURE.key]`` and
  appends its rows to ``ctx.rows`` (``ctx``: bench.common.Context);
- ``fixtures(db, scale)``: what it writes to the database before it loads
  (db: bench.db.BenchDB), built by the same functions ``run`` uses, at
  ``scale`` (the figure's main count: seats, timers, finished sagas...;
  ``run`` passes its own). ``make test`` builds every figure's at a tiny
  scale on the test database (tests/test_bench_fixtures.py), so that a
  schema change cannot break the bench unnoticed. A figure that writes
  nothing says why in ``NO_FIXTURES`` instead.

``WITH_STACK`` are run in this order with the stack up, then the stack is
stopped and ``WITHOUT_STACK`` are run.
"""

from bench.figures import (
    breaker,
    cancellation,
    catalog,
    celery_baseline,
    door,
    e2e,
    gateway_latency,
    hot_seat,
    onsale,
    reserve,
    scale_out,
    seller,
    stripe,
    sweeps,
    timers,
    tracing,
    waiting_room,
    webhooks,
)

WITH_STACK = (
    reserve,
    celery_baseline,
    e2e,
    timers,
    hot_seat,
    gateway_latency,
    catalog,
    tracing,
    webhooks,
    onsale,
    scale_out,
    seller,
    stripe,
    cancellation,
    door,
    breaker,
    waiting_room,
)
WITHOUT_STACK = (sweeps,)
