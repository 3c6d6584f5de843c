"""The dashboard and the alerting rules of deploy/monitoring/ hold to the code
and the docs (docs/operations.md, "Dashboards and alert rules"):

- promtool accepts the rules, the example Prometheus config and every query
  of the dashboard, and the rules' unit tests pass (``alerts_test.yml``: for
  each alert a series that fires it and one that does not);
- every series a rule or a panel reads is one the code exports, with labels
  it has and label values it writes. The exported names are read from the
  code: the metric objects of ``config.metrics`` and a real ``/metrics`` on
  the test database, not from a list kept here;
- every alert kind the code raises, and every alert docs/operations.md
  names, has a rule; every rule's ``runbook_url`` is a heading of
  docs/operations.md, and the doc's table lists every rule;
- the two gauges added for the rules (overdue compensations, webhook
  deliveries by status) count what they say.

promtool comes from Debian's package ``prometheus`` (scripts/ensure-promtool.sh,
run by ``make test``); without it these tests fail, they are never skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Collection
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

import pytest
import yaml
from django.utils import timezone
from freezegun import freeze_time
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

import config.metrics
from purchases.models import AuditRun, SweepHeartbeat
from purchases.ops.metrics import OPEN_DELIVERIES
from purchases.ops.sweeps import sweep_chase
from purchases.saga.states import SagaState
from purchases.services import saga_compensate
from webhooks.models import WebhookDelivery, WebhookEndpoint

from .late_charge import charged_while_undone
from .test_docs import _anchors, _without_fences

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "deploy" / "monitoring"
PROMETHEUS_DIR = MONITORING / "prometheus"
RULES = PROMETHEUS_DIR / "alerts.yml"
DASHBOARD = MONITORING / "grafana" / "boxoffice.json"
OPERATIONS_DOC = ROOT / "docs" / "operations.md"
# The code that raises alerts and counts metrics (tests and migrations aside).
SOURCE_PACKAGES = (
    "config",
    "common",
    "ledger",
    "outbox",
    "payments",
    "purchases",
    "webhooks",
    "shop",
)

# Series Prometheus adds itself, and the labels it puts on every scraped one.
PROMETHEUS_SERIES = {"up": {"job", "instance"}}
TARGET_LABELS = {"job", "instance"}
# The series names prometheus-client writes for a metric of each type, and
# the label it adds.
SAMPLE_SUFFIXES: dict[str, dict[str, set[str]]] = {
    "counter": {"_total": set(), "_created": set()},
    "gauge": {"": set()},
    "histogram": {"_bucket": {"le"}, "_count": set(), "_sum": set(), "_created": set()},
}

METRIC = re.compile(r"\b((?:boxoffice_|up\b)[a-z0-9_]*)(?:\s*\{([^}]*)\})?")
MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
TEMPLATE_LABEL = re.compile(r"\$labels\.(\w+)")

ALERT_KIND_RAISED = (
    re.compile(r'ALERTS\.labels\(\s*kind\s*=\s*"([a-z_]+)"'),
    re.compile(r"""["']alert["']\s*:\s*["']([a-z_]+)["']"""),
    re.compile(r'\balert\s*=\s*"([a-z_]+)"'),
)
SWEEP_NAME = re.compile(r'\bheartbeat\(\s*"([a-z_]+)"')


# --- reading the files and the code ----------------------------------------------------


@cache
def _rules() -> tuple[dict, ...]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return tuple(rule for group in groups for rule in group["rules"])


@cache
def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels() -> list[dict]:
    """The dashboard's panels, those inside collapsed rows included (rows
    themselves aside)."""
    panels = []
    for panel in _dashboard()["panels"]:
        if panel.get("type") == "row":
            panels.extend(panel.get("panels", []))
        else:
            panels.append(panel)
    return panels


def _dashboard_queries() -> list[tuple[str, str, str]]:
    """(panel title, expr, legend) of every target."""
    return [
        (panel["title"], target["expr"], target.get("legendFormat", ""))
        for panel in _panels()
        for target in panel.get("targets", [])
    ]


def _source_text() -> list[tuple[str, str]]:
    files = []
    for package in SOURCE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                files.append((path.relative_to(ROOT).as_posix(), path.read_text()))
    return files


@cache
def _alert_kinds_raised() -> frozenset[str]:
    """Every ``alert=`` kind the code writes in a log line or counts in
    ``boxoffice_alerts_total``."""
    return frozenset(
        kind
        for _, text in _source_text()
        for pattern in ALERT_KIND_RAISED
        for kind in pattern.findall(text)
    )


@cache
def _sweep_names() -> frozenset[str]:
    return frozenset(name for _, text in _source_text() for name in SWEEP_NAME.findall(text))


def _known_label_values() -> dict[str, set[str]]:
    """Labels whose every value the code fixes: a matcher on one of them
    must name a value the code writes."""
    return {
        "state": {state.value for state in SagaState},
        "status": {status.value for status in OPEN_DELIVERIES},
        "kind": set(_alert_kinds_raised()),
        "sweep": set(_sweep_names()),
    }


def _operations_section(heading: str) -> str:
    text = _without_fences(OPERATIONS_DOC.read_text())
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


@pytest.fixture
def exported(db, client) -> dict[str, set[str]]:
    """Every series name the code can expose -> its label names.

    The event metrics from their objects in ``config.metrics`` (a counter
    nobody has counted yet is on no page); the state metrics and the page's
    own from a real ``/metrics`` on the test database, with a heartbeat and an
    audit run so that every family has a sample."""
    series: dict[str, set[str]] = {}
    for metric in vars(config.metrics).values():
        if isinstance(metric, MetricWrapperBase):
            # Its label names: prometheus-client keeps them in _labelnames
            # only (describe() names the family, not its labels).
            for family in metric.describe():
                for suffix, added in SAMPLE_SUFFIXES[family.type].items():
                    series[family.name + suffix] = set(metric._labelnames) | added
    now = timezone.now()
    SweepHeartbeat.objects.create(
        name="resume_sagas", interval_seconds=60, last_started_at=now, last_succeeded_at=now
    )
    AuditRun.objects.create(started_at=now, finished_at=now)
    page = client.get("/metrics")
    assert page.status_code == 200
    for family in text_string_to_metric_families(page.content.decode()):
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return {name: labels for name, labels in series.items() if name.startswith("boxoffice_")}


def _problems_in_query(
    expr: str, exported: dict[str, set[str]], *, legend_or_templates: Collection[str] = frozenset()
) -> list[str]:
    """What in one PromQL expression names a series, a label or a label value
    the code does not export."""
    problems = []
    known = {**exported, **PROMETHEUS_SERIES}
    known_values = _known_label_values()
    labels_here = set(TARGET_LABELS)
    names = METRIC.findall(expr)
    if not names:
        problems.append(f"reads no boxoffice series: {expr}")
    for name, matchers in names:
        if name not in known:
            problems.append(f"{name} is not exported")
            continue
        labels_here |= known[name]
        for label, _, value in MATCHER.findall(matchers):
            if label not in known[name] | TARGET_LABELS:
                problems.append(f"{name} has no label {label!r}")
            elif label in known_values:
                for alternative in value.split("|"):
                    if alternative not in known_values[label]:
                        problems.append(f"{name}{{{label}}} is never {alternative!r}")
    for group in GROUPING.findall(expr):
        for label in filter(None, (g.strip() for g in group.split(","))):
            if label not in labels_here:
                problems.append(f"groups by {label!r}, a label of none of its series")
    for label in legend_or_templates:
        if label not in labels_here:
            problems.append(f"names {label!r}, a label of none of its series")
    return problems


def _promtool(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which(os.environ.get("PROMTOOL", "promtool"))
    if exe is None:
        pytest.fail(
            "no promtool: install Debian's package prometheus "
            "(apt-get install prometheus; make test runs scripts/ensure-promtool.sh)"
        )
    return subprocess.run(
        [exe, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=120
    )


# --- promtool --------------------------------------------------------------------------


def test_promtool_accepts_the_rules():
    run = _promtool("check", "rules", RULES.name)

    assert run.returncode == 0, run.stdout + run.stderr


def test_every_alert_fires_on_its_series_and_not_on_the_others():
    run = _promtool("test", "rules", "alerts_test.yml")

    assert run.returncode == 0, run.stdout + run.stderr


def test_the_unit_tests_cover_every_alert_firing_and_silent():
    tests = yaml.safe_load((PROMETHEUS_DIR / "alerts_test.yml").read_text())["tests"]
    fired: set[str] = set()
    silent: set[str] = set()
    for test in tests:
        for case in test.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else silent).add(case["alertname"])
    alerts = {rule["alert"] for rule in _rules()}

    assert alerts - fired == set(), "alerts never seen firing in alerts_test.yml"
    assert alerts - silent == set(), "alerts never seen silent in alerts_test.yml"


def test_promtool_accepts_the_example_prometheus_config():
    run = _promtool("check", "config", "prometheus.yml")

    assert run.returncode == 0, run.stdout + run.stderr


def test_promtool_accepts_every_query_of_the_dashboard(tmp_path):
    # Each query as a recording rule: promtool parses its PromQL.
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr.replace("$__rate_interval", "5m")}
        for i, (_, expr, _) in enumerate(_dashboard_queries())
    ]
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))

    run = _promtool("check", "rules", str(path))

    assert rules and run.returncode == 0, run.stdout + run.stderr


# --- what the rules and the dashboard read is exported -------------------------------------


def test_the_exported_names_are_read_from_the_code(exported):
    # A guard for the tests below: an empty or partial reading must not make
    # them pass by accident.
    assert {
        "boxoffice_sagas",
        "boxoffice_alerts_total",
        "boxoffice_gateway_latency_seconds_bucket",
        "boxoffice_audit_violations",
        "boxoffice_metrics_scrape_seconds",
        "boxoffice_webhook_deliveries",
        "boxoffice_compensations_overdue",
    } <= set(exported)
    assert exported["boxoffice_sagas"] == {"state"}
    assert exported["boxoffice_gateway_latency_seconds_bucket"] == {"method", "le"}


def test_every_rule_reads_exported_series_and_labels(exported):
    problems = []
    for rule in _rules():
        templates = {
            label for text in rule["annotations"].values() for label in TEMPLATE_LABEL.findall(text)
        }
        problems += [
            f"{rule['alert']}: {p}"
            for p in _problems_in_query(rule["expr"], exported, legend_or_templates=templates)
        ]

    assert not problems, problems


def test_every_dashboard_query_reads_exported_series_and_labels(exported):
    problems = []
    for title, expr, legend in _dashboard_queries():
        legend_labels = set(LEGEND_LABEL.findall(legend))
        problems += [
            f"{title}: {p}"
            for p in _problems_in_query(expr, exported, legend_or_templates=legend_labels)
        ]

    assert not problems, problems


def test_the_query_check_finds_what_is_not_exported(exported):
    problems = _problems_in_query(
        'sum by (colour) (boxoffice_nothing) + boxoffice_sagas{state="SOLD", shape="x"}', exported
    )

    assert problems == [
        "boxoffice_nothing is not exported",
        "boxoffice_sagas{state} is never 'SOLD'",
        "boxoffice_sagas has no label 'shape'",
        "groups by 'colour', a label of none of its series",
    ]


def test_the_dashboard_shows_every_series_the_brief_names():
    read = " ".join(expr for _, expr, _ in _dashboard_queries())

    for name in (
        "boxoffice_sagas",
        "boxoffice_saga_transitions_total",
        "boxoffice_gateway_requests_total",
        "boxoffice_gateway_latency_seconds_bucket",
        "boxoffice_reconcile_probes_total",
        "boxoffice_timer_fire_lag_seconds_bucket",
        "boxoffice_outbox_backlog",
        "boxoffice_outbox_oldest_due_age_seconds",
        "boxoffice_outbox_dead_letters",
        "boxoffice_webhook_deliveries",
        "boxoffice_sweep_last_success_age_seconds",
        "boxoffice_sweep_stalled",
        "boxoffice_audit_violations",
        "boxoffice_audit_unverified_intents",
        "boxoffice_audit_last_run_timestamp_seconds",
    ):
        assert name in read, name


def test_every_panel_reads_the_templated_datasource():
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    wanted = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for panel in _panels():
        assert panel["datasource"] == wanted, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == wanted, panel["title"]


def test_the_dashboard_panels_do_not_overlap():
    ids = [panel["id"] for panel in _dashboard()["panels"]]
    cells: dict[tuple[int, int], str] = {}
    for panel in _dashboard()["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]

    assert len(ids) == len(set(ids))


# --- every alert has a rule, every rule its runbook entry --------------------------------


def test_the_alert_kind_scan_finds_the_kinds():
    assert {
        "saga_needs_operator",
        "sweep_stalled",
        "outbox_dead_letter",
        "webhook_failed",
        "audit_violation",
    } <= _alert_kinds_raised()
    assert {"resume_sagas", "chase_compensations", "audit_sagas"} <= _sweep_names()


def test_every_alert_kind_the_code_raises_has_a_rule():
    covered = {rule.get("labels", {}).get("kind") for rule in _rules()}

    assert _alert_kinds_raised() - covered == set()


def test_every_alert_the_docs_name_has_a_rule():
    section = _operations_section("Alerts")
    expressions = " ".join(rule["expr"] for rule in _rules())
    kinds = {rule.get("labels", {}).get("kind") for rule in _rules()}

    series = set(re.findall(r"\bboxoffice_[a-z0-9_]+", section))
    named_kinds = set(re.findall(r"\balert=([a-z_]+)", section))

    assert series and named_kinds
    assert {name for name in series if name not in expressions} == set()
    assert named_kinds - kinds == set()


def test_every_rule_has_a_summary_a_description_a_severity_and_a_runbook_entry():
    anchors = _anchors("docs/operations.md")
    problems = []
    for rule in _rules():
        annotations = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not annotations.get(key):
                problems.append(f"{rule['alert']}: no {key}")
        if rule.get("labels", {}).get("severity") not in {"critical", "warning"}:
            problems.append(f"{rule['alert']}: severity is not critical or warning")
        doc, _, anchor = annotations.get("runbook_url", "").partition("#")
        if doc != "docs/operations.md" or anchor not in anchors:
            problems.append(
                f"{rule['alert']}: {annotations.get('runbook_url')} is not a "
                f"heading of docs/operations.md"
            )

    assert not problems, problems


def test_the_docs_table_maps_every_rule_to_its_runbook_entry():
    section = _operations_section("Dashboards and alert rules")
    rows = {}
    for line in section.splitlines():
        if m := re.match(r"\|\s*`(Boxoffice\w+)`\s*\|.*\]\(#([\w-]+)\)", line):
            rows[m.group(1)] = m.group(2)

    assert rows == {
        rule["alert"]: rule["annotations"]["runbook_url"].partition("#")[2] for rule in _rules()
    }


# --- the gauges added for the rules ---------------------------------------------------------


T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _gauge(client, name: str, **labels) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").content.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"{name}{labels} not exposed")


@pytest.mark.django_db
def test_compensations_overdue_counts_what_the_chaser_escalates(
    alice, bob, event, faulty_gateway, client, settings
):
    settings.COMPENSATION_DEADLINE_SECONDS = 86400
    # Compensations that owe a refund: charges that landed on purchases being
    # undone (a confirmed purchase's refunds are rows of their own).
    with freeze_time(T0) as clock:
        old = charged_while_undone(alice, event, seats=["A1"])
        faulty_gateway.down("refund")
        assert saga_compensate(saga_id=old.pk).state == "COMPENSATION_PENDING"
        before = _gauge(client, "boxoffice_compensations_overdue")
        clock.tick(86400 + 1)
        young = charged_while_undone(bob, event, seats=["A2"])
        assert saga_compensate(saga_id=young.pk).state == "COMPENSATION_PENDING"

        overdue = _gauge(client, "boxoffice_compensations_overdue")
        chased = sweep_chase()

    assert before == 0
    assert overdue == 1
    assert [line.saga_id for line in chased] == [str(old.pk)]


@pytest.mark.django_db
def test_open_webhook_deliveries_are_counted_by_status(client):
    def gauges():
        return {
            s: _gauge(client, "boxoffice_webhook_deliveries", status=s)
            for s in ("pending", "failed")
        }

    assert gauges() == {"pending": 0, "failed": 0}  # exposed before the first delivery
    for n, url in enumerate(("https://a.example.com/hook", "https://b.example.com/hook")):
        endpoint = WebhookEndpoint.objects.create(
            url=url,
            events=["purchase.confirmed"],
            secret="whsec_test",
            created_at=T0,
            updated_at=T0,
        )
        for status, count in (("delivered", 3), ("pending", 2 + n), ("failed", 1)):
            for _ in range(count):
                WebhookDelivery.objects.create(
                    endpoint=endpoint,
                    message_id=f"msg_{uuid.uuid4().hex}",
                    event_type="purchase.confirmed",
                    saga_id=uuid.uuid4(),
                    body="{}",
                    status=status,
                    created_at=T0,
                )

    assert gauges() == {"pending": 5, "failed": 2}
    with pytest.raises(AssertionError, match="not exposed"):
        _gauge(client, "boxoffice_webhook_deliveries", status="delivered")  # a scan: not counted
