"""Statements and commits per step, counted inside the stack's processes
(figure 2's count run).

``pg_stat_statements`` would say it from the server, but it needs
``shared_preload_libraries`` (a server restart), which the bench does not
touch. Instead the processes the bench starts for the count run use the
settings module ``bench.sqlcount.settings`` (the product's settings plus
the app ``bench.sqlcount``), whose ``hooks`` install, on every new database
connection (``connection_created``), a Django ``execute_wrapper`` and
counters around the connection's commit, rollback and health check. The
step is the Celery task's name, the web view's URL name (``web POST
purchase-list``), or the process's role (``relay``, ``gateway``). Each
process writes its counts to ``<dir>/<role>-<pid>.json`` twice a second
and at exit; the bench sums the files.

This package's top level is what the bench process imports (no Django):
the environment that turns counting on, and the reading of the files.
"""

from __future__ import annotations

import json
from pathlib import Path

SETTINGS = "bench.sqlcount.settings"
# Per step: statements sent through Django's cursors (SAVEPOINTs included),
# of them those run in autocommit (each its own transaction) and those that
# failed there; health checks (Django's ``SELECT 1`` on a reused
# connection, sent past the cursors); transactions committed and rolled
# back that sent at least one statement; new connections (each commits at
# the server as its session starts, and Django sets the session's time zone
# in a commit of its own when the server's differs: not a purchase's cost on
# a warm stack, so apart).
FIELDS = (
    "statements",
    "autocommit",
    "autocommit_errors",
    "health_checks",
    "transactions",
    "txn_rollbacks",
    "connects",
)
# Which stack process counts as what (figure 11's second worker and relay too).
ROLES = {
    "web": "web",
    "worker": "worker",
    "worker2": "worker",
    "webhooks": "webhooks",
    "relay": "relay",
    "relay2": "relay",
    "gateway": "gateway",
}


def env(directory: Path, name: str) -> dict[str, str]:
    """The environment that makes the stack process ``name`` count."""
    return {
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "BENCH_SQLCOUNT_DIR": str(directory),
        "BENCH_SQLCOUNT_ROLE": ROLES.get(name, name),
    }


def read(directory: Path) -> dict[str, dict[str, int]]:
    """Every process's counts so far, summed per step."""
    out: dict[str, dict[str, int]] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            steps = json.loads(path.read_text())["steps"]
        except (OSError, ValueError, KeyError):
            continue  # being replaced: os.replace makes that rare; next read
        for step, counts in steps.items():
            acc = out.setdefault(step, dict.fromkeys(FIELDS, 0))
            for k in FIELDS:
                acc[k] += counts.get(k, 0)
    return out


def minus(a: dict, b: dict, scale: float = 1.0) -> dict[str, dict[str, float]]:
    """``a - scale * b``, per step and field."""
    out = {}
    for step in set(a) | set(b):
        ca, cb = a.get(step, {}), b.get(step, {})
        out[step] = {k: ca.get(k, 0) - scale * cb.get(k, 0) for k in FIELDS}
    return out


def summary(counts: dict[str, float]) -> dict[str, float]:
    """Statements (health checks included), commits and round trips of one
    step's counts: each autocommit statement and health check is a commit;
    psycopg sends a transaction's BEGIN and its COMMIT or ROLLBACK as round
    trips of their own."""
    c = counts
    return {
        "statements": c["statements"] + c["health_checks"],
        "commits": c["autocommit"]
        - c["autocommit_errors"]
        + c["health_checks"]
        + c["transactions"],
        "round_trips": c["statements"]
        + c["health_checks"]
        + 2 * (c["transactions"] + c["txn_rollbacks"]),
        **c,
    }
