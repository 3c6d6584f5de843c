"""A picture of the Grafana dashboard for the docs (docs/images/dashboard.png),
made without Grafana: there is none here, and no network to fetch one.

It reads the dashboard's JSON model (deploy/monitoring/grafana/boxoffice.json),
asks a real Prometheus each panel's own queries, and draws the panels where
the model puts them (titles, units, legends, thresholds) as inline SVG in an
HTML page, which headless Chromium takes a picture of (devtools/screenshots.py).
So the picture shows what each panel plots, not Grafana's look; it says so
in its header.

The Prometheus is Debian's (``prometheus`` and ``promtool``, the package
scripts/ensure-promtool.sh installs), started on a scratch TSDB filled with
six hours of synthesized series: the code's metric names and label values,
steady sales with a gateway outage that leaves one saga UNKNOWN_EXPIRED, and a
webhook receiver that is down for a while. Nothing of the app runs.

From the repository's root::

    .venv/bin/python -m devtools.dashboard_preview
        # synthesized series -> docs/images/dashboard.png
    .venv/bin/python -m devtools.dashboard_preview --prometheus http://127.0.0.1:9090 \\
        --out /tmp/dashboard.png
        # the last six hours of a Prometheus of yours that scrapes boxoffice
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import html
import http.server
import json
import math
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx

from devtools.processes import ROOT, free_port, spawn, stop_group, wait_until
from devtools.screenshots import screenshot

DASHBOARD = ROOT / "deploy" / "monitoring" / "grafana" / "boxoffice.json"
OUT = ROOT / "docs" / "images" / "dashboard.png"
HOURS = 6
STEP = 60  # seconds between the points of a range query
RATE_INTERVAL = "4m"  # what Grafana's $__rate_interval is at a 15 s scrape
SCRAPE = 15  # seconds between synthesized samples

# Grafana's grid: 24 columns, 30 px a row unit, 8 px between panels.
WIDTH, UNIT, GAP = 1280, 30, 8
PALETTE = [
    "#73bf69",
    "#f2cc0c",
    "#8ab8ff",
    "#ff780a",
    "#f2495c",
    "#5794f2",
    "#b877d9",
    "#fade2a",
    "#ff9830",
    "#96d98d",
    "#ca95e5",
    "#ffb357",
]
THRESHOLD_COLOURS = {"green": "#37872d", "orange": "#fa6400", "red": "#c4162a"}


# --- synthesized series ------------------------------------------------------------------


class _Series:
    """Samples in OpenMetrics text, family by family, series by series."""

    def __init__(self, start: int):
        self.start = start
        self.families: dict[str, tuple[str, dict[str, list[str]]]] = {}

    def add(
        self, family: str, kind: str, name: str, labels: dict[str, str], t: float, value: float
    ) -> None:
        series = self.families.setdefault(family, (kind, {}))[1]
        key = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
        series.setdefault(key, []).append(f"{key} {value:.6g} {self.start + t:.0f}")

    def text(self) -> str:
        lines = []
        for family, (kind, series) in self.families.items():
            lines.append(f"# TYPE {family} {kind}")
            for samples in series.values():
                lines.extend(samples)
        return "\n".join(lines + ["# EOF", ""])


def _lognormal_cdf(x: float, median: float, sigma: float = 0.6) -> float:
    return 0.5 * (1 + math.erf(math.log(x / median) / (sigma * math.sqrt(2))))


def synthesize(end: int, seed: int = 16) -> str:
    """Six hours of what /metrics would have said, every 15 s, ending at ``end``
    (a Unix time): the code's names, labels and label values."""
    rnd = random.Random(seed)
    start = end - HOURS * 3600
    out = _Series(start)
    base = {"job": "boxoffice", "instance": "web:8000"}
    outage = (3.5 * 3600, 3.75 * 3600)  # the gateway times out
    receiver_down = (1.5 * 3600, 2.2 * 3600)  # a seller's webhook endpoint
    escalation = outage[1] + 63 * 60  # the reconcile schedule runs out for one saga
    latency_buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, math.inf)
    lag_buckets = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, math.inf)

    counters: dict[tuple, float] = {}
    hist: dict[tuple, float] = {}
    unknown_pool, webhook_pending = 0.0, 1.0
    confirmed, compensated = 18_240.0, 612.0

    def count(family: str, labels: dict, by: float) -> None:
        key = (family, tuple(labels.items()))
        counters[key] = counters.get(key, 0.0) + by

    def observe(family: str, labels: dict, buckets, n: float, median: float) -> None:
        for le in buckets:
            share = 1.0 if le == math.inf else _lognormal_cdf(le, median)
            key = (family, tuple(labels.items()), le)
            hist[key] = hist.get(key, 0.0) + n * share
        hist[(family, tuple(labels.items()), "sum")] = (
            hist.get((family, tuple(labels.items()), "sum"), 0.0) + n * median * 1.2
        )

    for step in range(HOURS * 3600 // SCRAPE + 1):
        t = step * SCRAPE
        down = outage[0] <= t < outage[1]
        rate = 0.45 + 0.25 * math.sin(2 * math.pi * t / (4 * 3600)) + rnd.uniform(-0.05, 0.05)
        charges = rate * SCRAPE
        succeeded, declined, unknown = (0.35, 0.03, 0.62) if down else (0.93, 0.05, 0.02)
        resolved = 0.0 if down else unknown_pool * SCRAPE / 90
        probes = unknown_pool * SCRAPE / (120 if down else 90)
        unknown_pool += charges * unknown - resolved
        confirmed += charges * succeeded + resolved * 0.8
        compensated += charges * (declined + 0.01)
        moves = {
            ("PENDING", "CHARGING"): charges + resolved * 0.2,
            ("CHARGING", "CONFIRMED"): charges * succeeded,
            ("CHARGING", "PAYMENT_FAILED"): charges * declined,
            ("CHARGING", "UNKNOWN"): charges * unknown,
            ("UNKNOWN", "CONFIRMED"): resolved * 0.8,
            ("UNKNOWN", "CHARGING"): resolved * 0.2,
            ("PAYMENT_FAILED", "COMPENSATING"): charges * declined,
            ("PENDING", "EXPIRED"): charges * 0.01,
            ("EXPIRED", "COMPENSATING"): charges * 0.01,
            ("COMPENSATING", "COMPENSATED"): charges * (declined + 0.01),
        }
        for (a, b), n in moves.items():
            count("boxoffice_saga_transitions", {"from_state": a, "to_state": b}, n)
        for outcome, share in (
            ("succeeded", succeeded),
            ("declined", declined),
            ("unknown", unknown),
        ):
            count(
                "boxoffice_gateway_requests",
                {"method": "charge", "outcome": outcome},
                charges * share,
            )
        answers = (
            {"unknown": probes}
            if down
            else {"succeeded": probes * 0.8, "requires_payment": probes * 0.2}
        )
        for answer, n in answers.items():
            count("boxoffice_gateway_requests", {"method": "retrieve", "outcome": answer}, n)
            count("boxoffice_reconcile_probes", {"answer": answer}, n)
        count(
            "boxoffice_gateway_requests",
            {"method": "refund", "outcome": "refunded"},
            charges * declined * 0.2,
        )
        count(
            "boxoffice_gateway_requests",
            {"method": "cancel", "outcome": "canceled"},
            charges * (declined * 0.8 + 0.01),
        )
        observe(
            "boxoffice_gateway_latency_seconds",
            {"method": "charge"},
            latency_buckets,
            charges,
            1.9 if down else 0.12 + rnd.uniform(0, 0.02),
        )
        observe(
            "boxoffice_gateway_latency_seconds",
            {"method": "retrieve"},
            latency_buckets,
            probes,
            1.9 if down else 0.05,
        )
        observe(
            "boxoffice_gateway_latency_seconds",
            {"method": "cancel"},
            latency_buckets,
            charges * 0.06,
            1.9 if down else 0.08,
        )
        observe(
            "boxoffice_timer_fire_lag_seconds",
            {},
            lag_buckets,
            charges * 3 + probes,
            0.04 + rnd.uniform(0, 0.02),
        )
        if t % 60 == 0:
            count("boxoffice_sweep_runs", {"sweep": "resume_sagas", "result": "succeeded"}, 1)
        if t % 300 == 0:
            count(
                "boxoffice_sweep_runs", {"sweep": "chase_compensations", "result": "succeeded"}, 1
            )
        escalated = t >= escalation
        count(
            "boxoffice_alerts",
            {"kind": "saga_needs_operator"},
            2 if step == 0 else (1 if t - SCRAPE < escalation <= t else 0),
        )
        receiving = not receiver_down[0] <= t < receiver_down[1]
        webhook_pending = (
            max(1.0, webhook_pending * 0.8) if receiving else webhook_pending + charges * 0.35
        )

        states = {
            "PENDING": rate * 2,
            "CHARGING": rate * (2.0 if down else 0.2),
            "UNKNOWN": unknown_pool,
            "UNKNOWN_EXPIRED": 1 if escalated else 0,
            "PAYMENT_FAILED": 0,
            "EXPIRED": 0,
            "COMPENSATING": rnd.choice((0, 0, 1)),
            "COMPENSATION_PENDING": 0,
            "CONFIRMED": confirmed,
            "COMPENSATED": compensated,
        }
        for state, n in states.items():
            out.add(
                "boxoffice_sagas",
                "gauge",
                "boxoffice_sagas",
                {**base, "state": state},
                t,
                round(n + (rnd.uniform(0, 1.5) if state == "PENDING" else 0)),
            )
        gauges = {
            "boxoffice_compensations_overdue": 0,
            "boxoffice_outbox_backlog": round(
                rate * 2 + probes / 4 + webhook_pending / 3 + rnd.uniform(0, 2)
            ),
            "boxoffice_outbox_oldest_due_age_seconds": rnd.uniform(0.2, 2.5)
            + (40 * rnd.random() if down or not receiving else 0),
            "boxoffice_outbox_dead_letters": 0,
            "boxoffice_audit_violations": 0,
            "boxoffice_audit_unverified_intents": 0,
            "boxoffice_audit_last_run_timestamp_seconds": start - 5 * 3600,
            "boxoffice_operator_alerts_raised": 4 if escalated else 3,
            "boxoffice_metrics_scrape_seconds": 0.012 + rnd.uniform(0, 0.008),
        }
        for name, value in gauges.items():
            out.add(name, "gauge", name, base, t, value)
        for status, n in (("pending", round(webhook_pending)), ("failed", 0)):
            out.add(
                "boxoffice_webhook_deliveries",
                "gauge",
                "boxoffice_webhook_deliveries",
                {**base, "status": status},
                t,
                n,
            )
        for sweep, every, offset in (
            ("resume_sagas", 60, 0),
            ("chase_compensations", 300, 0),
            ("audit_sagas", None, 5 * 3600),
        ):
            age = (t % every + rnd.uniform(0, 2)) if every else offset + t
            out.add(
                "boxoffice_sweep_last_success_age_seconds",
                "gauge",
                "boxoffice_sweep_last_success_age_seconds",
                {**base, "sweep": sweep},
                t,
                age,
            )
            out.add(
                "boxoffice_sweep_stalled",
                "gauge",
                "boxoffice_sweep_stalled",
                {**base, "sweep": sweep},
                t,
                0,
            )
        for (family, labels), value in counters.items():
            out.add(
                family, "counter", family + "_total", {**base, **dict(labels)}, t, round(value, 3)
            )
        for (family, labels, le), value in hist.items():
            if le == "sum":
                out.add(family, "histogram", family + "_sum", {**base, **dict(labels)}, t, value)
                continue
            bound = "+Inf" if le == math.inf else f"{le:g}"
            out.add(
                family,
                "histogram",
                family + "_bucket",
                {**base, **dict(labels), "le": bound},
                t,
                round(value, 3),
            )
            if le == math.inf:
                out.add(
                    family,
                    "histogram",
                    family + "_count",
                    {**base, **dict(labels)},
                    t,
                    round(value, 3),
                )
    return out.text()


@contextlib.contextmanager
def scratch_prometheus(openmetrics: str) -> Iterator[str]:
    """Debian's Prometheus on a TSDB backfilled from ``openmetrics`` (promtool),
    on a free local port; yields its URL."""
    for tool in ("promtool", "prometheus"):
        if shutil.which(tool) is None:
            raise SystemExit(
                f"no {tool}: install Debian's package prometheus (scripts/ensure-promtool.sh)"
            )
    with tempfile.TemporaryDirectory(prefix="boxoffice-dashboard-") as tmp:
        folder = Path(tmp)
        (folder / "series.om").write_text(openmetrics)
        subprocess.run(
            [
                "promtool",
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                str(folder / "series.om"),
                str(folder / "tsdb"),
            ],
            check=True,
            capture_output=True,
        )
        (folder / "prometheus.yml").write_text("global: {}\n")
        port = free_port()
        log = folder / "prometheus.log"
        server = spawn(
            [
                "prometheus",
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            log=log,
            cwd=folder,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(
                lambda: server.poll() is not None or _ready(url),
                "Prometheus",
                timeout=60,
                error=RuntimeError,
                detail=lambda: log.read_text()[-2000:],
            )
            if server.poll() is not None:
                raise RuntimeError(f"Prometheus exited:\n{log.read_text()[-2000:]}")
            yield url
        finally:
            stop_group(server)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# --- asking the panels' queries ----------------------------------------------------------


def _query(prometheus: str, expr: str, *, end: float, instant: bool) -> list[dict]:
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    if instant:
        answer = httpx.get(
            f"{prometheus}/api/v1/query", params={"query": expr, "time": end}, timeout=30
        )
    else:
        answer = httpx.get(
            f"{prometheus}/api/v1/query_range",
            timeout=30,
            params={"query": expr, "start": end - HOURS * 3600, "end": end, "step": STEP},
        )
    body = answer.json()
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {body.get('error')}")
    result = body["data"]["result"]
    for series in result:
        if "value" in series:
            series["values"] = [series["value"]]
    return result


def _legend(fmt: str, labels: dict[str, str]) -> str:
    if not fmt:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items() if k != "__name__") + "}"
    out = fmt
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


# --- drawing ------------------------------------------------------------------------------


def _number(value: float | None, unit: str) -> str:
    if value is None or not math.isfinite(value):  # (±inf: no unit is big enough)
        return "–"
    if unit == "s":
        for limit, scale, name in (
            (1e-3, 1e-6, "µs"),
            (1, 1e-3, "ms"),
            (60, 1, "s"),
            (3600, 60, "min"),
            (86400, 3600, "h"),
            (math.inf, 86400, "d"),
        ):
            if abs(value) < limit:
                shown = value / scale
                return f"{shown:.3g} {name}" if shown else "0"
    suffix = " ops/s" if unit == "ops" else ""
    scale, name = next(
        (scale, name)
        for limit, scale, name in ((1e3, 1, ""), (1e6, 1e3, "k"), (math.inf, 1e6, "M"))
        if abs(value) < limit
    )
    shown = value / scale
    text = f"{shown:.0f}" if shown == int(shown) and abs(shown) >= 1 else f"{shown:.3g}"
    return text + name + suffix


def _threshold_colour(value: float, steps: list[dict]) -> str:
    colour = steps[0]["color"]
    for step in steps[1:]:
        if value is not None and value >= step["value"]:
            colour = step["color"]
    return THRESHOLD_COLOURS.get(colour, colour)


def _stat(panel: dict, data: list[tuple[str, list[dict]]]) -> str:
    defaults = panel["fieldConfig"]["defaults"]
    series = data[0][1]
    value = float(series[0]["values"][-1][1]) if series else None
    colour = (
        _threshold_colour(value, defaults["thresholds"]["steps"]) if value is not None else "#444"
    )
    return (
        f'<div class="stat" style="background:{colour}">'
        f"{html.escape(_number(value, defaults.get('unit', 'short')))}</div>"
    )


def _bars(panel: dict, data: list[tuple[str, list[dict]]]) -> str:
    legend, series = data[0]
    rows = sorted(
        ((_legend(legend, s["metric"]), float(s["values"][-1][1])) for s in series),
        key=lambda r: -r[1],
    )
    top = max((v for _, v in rows), default=1) or 1
    return "".join(
        f'<div class="bar"><span class="name">{html.escape(name)}</span>'
        f'<span class="track"><span class="fill" style="width:{max(0.5, 100 * v / top):.1f}%">'
        f'</span></span><span class="value">{_number(v, "short")}</span></div>'
        for name, v in rows
    )


def _timeseries(
    panel: dict, data: list[tuple[str, list[dict]]], width: int, height: int, end: float
) -> str:
    defaults = panel["fieldConfig"]["defaults"]
    unit = defaults.get("unit", "short")
    log = defaults["custom"].get("scaleDistribution", {}).get("type") == "log"
    lines = []
    for legend, result in data:
        for series in result:
            points = [(float(t), float(v)) for t, v in series["values"] if v not in ("NaN",)]
            lines.append((_legend(legend, series["metric"]), points))
    threshold = None
    steps = defaults.get("thresholds", {}).get("steps", [])
    if defaults["custom"].get("thresholdsStyle", {}).get("mode") == "line" and len(steps) > 1:
        threshold = steps[1]["value"]
    values = [v for _, points in lines for _, v in points if not math.isnan(v)]
    top = max(values + ([threshold] if threshold else []) + [0])
    bottom = 0.0
    if log:
        positive = [v for v in values if v > 0] or [1]
        bottom, top = (
            10 ** math.floor(math.log10(min(positive))),
            10 ** math.ceil(math.log10(max(positive))),
        )
    top = top * 1.1 if not log and top > 0 else (top or 1)
    # Room on the left for the longest tick label (6 px a character).
    guess = [top * 1.1, top / 4, bottom or 1]
    left = 12 + 6 * max(len(_number(v, unit)) for v in guess)
    plot_w = width - left - 12
    # As many legend columns as the longest name leaves room for (6 px a character).
    longest = max((len(name) for name, _ in lines), default=1)
    columns = max(1, min(3, int(plot_w // (longest * 6 + 24))))
    legend_rows = max(1, math.ceil(len(lines) / columns))
    plot_h = height - 34 - 16 * legend_rows

    def y(v: float) -> float:
        if log:
            v = max(v, bottom)
            share = (math.log10(v) - math.log10(bottom)) / (math.log10(top) - math.log10(bottom))
        else:
            share = (v - bottom) / (top - bottom) if top > bottom else 0
        return 6 + plot_h * (1 - share)

    def x(t: float) -> float:
        return left + plot_w * (t - (end - HOURS * 3600)) / (HOURS * 3600)

    svg = [f'<svg width="{width}" height="{height}">']
    ticks = (
        [bottom * 10**i for i in range(int(math.log10(top / bottom)) + 1)]
        if log
        else [top / 1.1 * i / 4 for i in range(5)]
        if top > 0
        else [0]
    )
    for tick in ticks:
        svg.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(tick):.1f}" '
            f'y2="{y(tick):.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" class="axis" '
            f'text-anchor="end">{html.escape(_number(tick, unit))}</text>'
        )
    for hour in range(HOURS + 1):
        t = end - (HOURS - hour) * 3600
        label = datetime.fromtimestamp(t, UTC).strftime("%H:%M")
        svg.append(
            f'<text x="{x(t):.1f}" y="{plot_h + 20}" class="axis" '
            f'text-anchor="middle">{label}</text>'
        )
    if threshold is not None:
        svg.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(threshold):.1f}" '
            f'y2="{y(threshold):.1f}" class="threshold"/>'
        )
    for i, (_, points) in enumerate(lines):
        path, pen_down = [], False
        for t, v in points:
            if math.isnan(v):
                pen_down = False
                continue
            path.append(f"{'L' if pen_down else 'M'}{x(t):.1f},{y(v):.1f}")
            pen_down = True
        svg.append(
            f'<path d="{" ".join(path)}" stroke="{PALETTE[i % len(PALETTE)]}" class="line"/>'
        )
    for i, (name, _) in enumerate(lines):
        row, col = divmod(i, columns)
        lx, ly = left + col * plot_w / columns, plot_h + 38 + row * 16
        svg.append(
            f'<rect x="{lx:.0f}" y="{ly - 8}" width="12" height="4" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{lx + 16:.0f}" y="{ly - 3}" class="legend">'
            f"{html.escape(name)}</text>"
        )
    if not lines:
        svg.append(
            f'<text x="{width / 2}" y="{height / 2}" class="axis" '
            f'text-anchor="middle">No data</text>'
        )
    svg.append("</svg>")
    return "".join(svg)


def render(dashboard: dict, prometheus: str, *, end: float, source: str) -> str:
    column = (WIDTH - 2 * GAP) / 24
    blocks, bottom = [], 0
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        left = GAP + g["x"] * column
        top = 70 + g["y"] * (UNIT + GAP)
        width = g["w"] * column - GAP
        height = g["h"] * (UNIT + GAP) - GAP
        bottom = max(bottom, top + height)
        style = f"left:{left:.0f}px;top:{top}px;width:{width:.0f}px;height:{height}px"
        if panel["type"] == "row":
            blocks.append(f'<div class="row" style="{style}">{html.escape(panel["title"])}</div>')
            continue
        data = [
            (
                t.get("legendFormat", ""),
                _query(
                    prometheus,
                    t["expr"],
                    end=end,
                    instant=panel["type"] in ("stat", "bargauge") or t.get("instant", False),
                ),
            )
            for t in panel["targets"]
        ]
        if panel["type"] == "stat":
            body = _stat(panel, data)
        elif panel["type"] == "bargauge":
            body = _bars(panel, data)
        else:
            body = _timeseries(panel, data, int(width) - 16, height - 36, end)
        blocks.append(
            f'<div class="panel" style="{style}"><div class="title">'
            f"{html.escape(panel['title'])}</div>{body}</div>"
        )
    shown = datetime.fromtimestamp(end, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ margin:0; background:#111217; color:#ccccdc; font:12px "DejaVu Sans",sans-serif;
       position:relative; width:{WIDTH}px; height:{bottom + GAP}px; }}
header {{ position:absolute; left:{GAP}px; top:8px; right:{GAP}px; }}
header b {{ font-size:18px; color:#fff; }} header p {{ margin:4px 0 0; color:#8e8ea0; }}
.panel {{ position:absolute; box-sizing:border-box; background:#181b1f;
          border:1px solid #2c3235; border-radius:2px; padding:6px 8px; overflow:hidden; }}
.title {{ font-weight:bold; color:#d8d9da; margin-bottom:4px; white-space:nowrap; }}
.row {{ position:absolute; font-size:14px; font-weight:bold; color:#fff; padding-top:6px; }}
.stat {{ position:absolute; left:8px; right:8px; top:26px; bottom:8px; display:flex;
         align-items:center; justify-content:center; font-size:30px; color:#fff; }}
.bar {{ display:flex; align-items:center; margin:5px 0; }}
.bar .name {{ width:160px; }} .bar .value {{ width:60px; text-align:right; }}
.track {{ flex:1; background:#22252b; height:14px; }}
.fill {{ display:block; height:14px; background:linear-gradient(90deg,#5794f2,#f2cc0c,#f2495c); }}
.grid {{ stroke:#2c3235; }} .axis {{ fill:#8e8ea0; font-size:10px; }}
.legend {{ fill:#ccccdc; font-size:10px; }}
.line {{ fill:none; stroke-width:1.6; }}
.threshold {{ stroke:#f2495c; stroke-dasharray:4 3; }}
</style></head><body>
<header><b>boxoffice</b> · last {HOURS} hours to {shown}
<p>A rendering of deploy/monitoring/grafana/boxoffice.json, not Grafana: each panel's own
queries, answered by Prometheus; drawn as SVG. Data: {html.escape(source)}.</p></header>
{"".join(blocks)}
</body></html>"""


def _serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/dashboard.html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.dashboard_preview", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--prometheus",
        help="a Prometheus of yours to ask (default: start one on synthesized series)",
    )
    parser.add_argument("--out", type=Path, default=OUT, help=f"the PNG (default: {OUT})")
    args = parser.parse_args(argv)
    dashboard = json.loads(DASHBOARD.read_text())
    end = float(int(time.time()) // 60 * 60)

    with contextlib.ExitStack() as stack:
        if args.prometheus:
            prometheus, source = args.prometheus, args.prometheus
        else:
            prometheus = stack.enter_context(scratch_prometheus(synthesize(int(end))))
            source = (
                "six hours of synthesized series (steady sales; the gateway times out "
                "for 15 minutes and one saga ends UNKNOWN_EXPIRED an hour later; a "
                "seller's webhook endpoint is down for 40 minutes)"
            )
        page = render(dashboard, prometheus, end=end, source=source)
    with tempfile.TemporaryDirectory(prefix="boxoffice-dashboard-page-") as tmp:
        (Path(tmp) / "dashboard.html").write_text(page)
        server, url = _serve(Path(tmp))
        try:
            blocked = screenshot(url, args.out)
        finally:
            server.shutdown()
    print(f"{args.out}" + (f" (blocked: {', '.join(blocked)})" if blocked else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
