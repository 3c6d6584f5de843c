"""Prometheus metrics.

Two kinds:

* **Events** counted where they happen (transitions, gateway calls, probes,
  timer fire lag, alerts). Web, worker and relay are separate processes; with
  ``PROMETHEUS_MULTIPROC_DIR`` set (``make run`` and the compose file set it)
  prometheus-client keeps them in files that ``/metrics`` adds up.
* **State** read from PostgreSQL at scrape time (sagas by state, outbox
  backlog and the age of its oldest due row, sweep heartbeats, the auditor's
  last result): the table is the truth, whichever process is alive. That
  collector and the ``/metrics`` view are the operators'
  (``purchases/ops/metrics.py``); this module imports nothing of ours, so
  every layer can count. Without the database the view still serves the
  event counters, with ``boxoffice_database_up 0`` in place of the state.
"""

from __future__ import annotations

from prometheus_client import (
    Counter,
    Histogram,
)

TRANSITIONS = Counter(
    "boxoffice_saga_transitions_total", "Committed saga transitions", ["from_state", "to_state"]
)
GATEWAY_REQUESTS = Counter(
    "boxoffice_gateway_requests_total",
    "Calls to the payment gateway by outcome",
    ["method", "outcome"],
)
GATEWAY_LATENCY = Histogram(
    "boxoffice_gateway_latency_seconds",
    "Payment gateway call latency",
    ["method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_PROBES = Counter(
    "boxoffice_reconcile_probes_total", "Look-ups of UNKNOWN intents by answer", ["answer"]
)
TIMER_FIRE_LAG = Histogram(
    "boxoffice_timer_fire_lag_seconds",
    "Outbox row first hand-off minus its due time",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
REFUNDS = Counter(
    "boxoffice_refunds_total", "Refunds settled, by who asked and how", ["source", "status"]
)
ALERTS = Counter("boxoffice_alerts_total", "Alerts raised for operators", ["kind"])
# Every kind a counter is raised for, created at 0: a series that first
# appears at 1 is a rise that PromQL's increase() cannot see, and an alert
# rule over it would miss the first alert (deploy/monitoring/prometheus).
ALERT_KINDS = (
    "saga_needs_operator",
    "sweep_stalled",
    "outbox_dead_letter",
    "webhook_failed",
    "payments_paused",
)
for _kind in ALERT_KINDS:
    ALERTS.labels(kind=_kind)
SWEEP_RUNS = Counter("boxoffice_sweep_runs_total", "Sweep runs by result", ["sweep", "result"])
