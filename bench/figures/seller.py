"""Figure 13: the seller's box office (issue 32), three measurements, each
beside its baseline in the same run:

- creating a 20,000-seat event (4 sections, 3 price categories) through
  ``POST /api/organizers/{slug}/events/`` against ``COPY`` of the same rows
  (the event, its categories and its seats in one transaction, timed from
  the client), 5 of each alternated after one unmeasured pair, medians;
- ``GET /api/events/{id}/seats/`` of a 20,000-seat event on sale at 1 and
  4 clients, served from the catalog cache against the database read
  (gunicorn restarted with ``AVAILABILITY_CACHE`` on, then off, as figure 8
  does at 2,000 seats);
- the reserve at 4 clients as figure 1 measures it (the worker's consumer
  paused) on an event with a buyer limit that never refuses (the lock and
  the count run) and a sales window open, against an event with neither, in
  the order with, without, without, with, each client buying in turn as 64
  buyers; and the statements of one reserve
  of each, captured in this process, to show the rules were checked.

They run in the order reserve, seat map, create. A part that fails leaves
the others' rows in the table, then fails the figure.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import time
from collections.abc import Callable

from bench import wire
from bench.common import Context, Figure, PhaseFailed, log, mean_of, ratio
from bench.db import BenchDB, CategoryRow, SeatRow
from bench.figures import catalog, reserve
from bench.load import auth_headers, closed_loop

FIGURE = Figure(
    phase="seller",
    key="13_seller",
    label="13 seller's box office",
    # 9 loads (5 reserves, 4 seat-map runs), 3 restarts, 12 creations.
    timeout=lambda ctx: 300 + 9 * (ctx.warmup + ctx.dur + 15),
)
SEATS = 20_000
REPETITIONS = 5
CLIENTS = 4
# The seat map's readers: one (each read's own cost), and 4 as issue 32's
# goal has it (readers that find the entry expired rebuild it together).
MAP_CLIENTS = (1, 4)
SECTIONS = ("Stalls", "Circle", "Upper circle", "Balcony")
SECTION_ROWS = 50
ROW_SEATS = 100
# By row, front to back, each a third of a section's rows.
CATEGORIES: tuple[CategoryRow, ...] = (
    ("front", "Front", 9000),
    ("middle", "Middle", 6500),
    ("back", "Back", 4000),
)
# A buyer limit no run reaches: the reserve takes the buyer's lock and
# counts the buyer's seats, and is never refused.
UNLIMITED = 1_000_000
# Each reserve client buys in turn as this many buyers (4 x 64 = the bench's
# 256 users), on both sides: a buyer's count reads that buyer's live seats,
# which a real limit keeps to a handful; one buyer per client would make
# every count read hundreds of held seats by the end of a run, a buyer no
# limit would have let in.
BUYERS_PER_CLIENT = 64


# --- the fixtures ----------------------------------------------------------------------


def _row_label(r: int) -> str:
    return chr(65 + r) if r < 26 else chr(64 + r // 26) + chr(65 + r % 26)


def seat_rows(n: int) -> list[SeatRow]:
    """``n`` seats in sections of ``SECTION_ROWS`` rows of ``ROW_SEATS``
    (20,000: the 4 ``SECTIONS``), refs ``<section>-<row><number>``, a
    category by row band, the first row's 4 first seats accessible."""
    per_section = SECTION_ROWS * ROW_SEATS
    out: list[SeatRow] = []
    for i in range(n):
        s, r, k = i // per_section, i % per_section // ROW_SEATS, i % ROW_SEATS + 1
        section = SECTIONS[s] if s < len(SECTIONS) else f"Section {s + 1}"
        label = _row_label(r)
        category = CATEGORIES[r * len(CATEGORIES) // SECTION_ROWS][0]
        y = float(r + s * (SECTION_ROWS + 5))
        out.append(
            (f"{s + 1}-{label}{k}", section, label, k, category, float(k), y, r == 0 and k <= 4)
        )
    return out


def api_body(name: str, seats: list[SeatRow]) -> dict:
    """The contract's body for ``POST /api/organizers/{slug}/events/``
    (docs/api.md, "Events, seat maps and prices") with these seats."""
    sections: dict[str, dict[str, list[dict]]] = {}
    for ref, section, row, number, category, x, y, accessible in seats:
        sections.setdefault(section, {}).setdefault(row, []).append(
            {
                "ref": ref,
                "number": number,
                "category": category,
                "x": x,
                "y": y,
                "accessible": accessible,
            }
        )
    starts_at = dt.datetime.now(dt.UTC) + dt.timedelta(days=30)
    return {
        "name": name,
        "starts_at": starts_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "currency": "EUR",
        "price_categories": [
            {"code": code, "name": label, "price": {"amount": price, "currency": "EUR"}}
            for code, label, price in CATEGORIES
        ],
        "seat_map": {
            "sections": [
                {"name": name, "rows": [{"label": lb, "seats": s} for lb, s in rows.items()]}
                for name, rows in sections.items()
            ]
        },
    }


def rules_event(db: BenchDB, nseats: int, name: str, *, rules: bool) -> int:
    """An event on sale of ``nseats`` seats S1..S<nseats> (figure 1's); with
    ``rules``, the buyer limit ``UNLIMITED`` and a sales window open since a
    day, until the day before the event."""
    event_id, _ = db.make_event(name, nseats)
    if rules:
        db.q(
            "UPDATE purchases_event SET max_seats_per_buyer = %s,"
            " sales_start = now() - interval '1 day', sales_end = now() + interval '29 days'"
            " WHERE id = %s",
            [UNLIMITED, event_id],
        )
    return event_id


def fixtures(db: BenchDB, scale: int = SEATS) -> dict[str, int]:
    """Figure 13's database fixtures at ``scale`` seats: the owner of the
    bench organizer (the API's caller), an event written by ``COPY`` (the
    baseline; on sale, the seat map read), the reserve's events with and
    without the rules. The API's events are the product's to write."""
    owner = db.ensure_users(1)[0]
    db.ensure_member(owner, "owner")
    seats = seat_rows(scale)
    return {
        "owner": owner,
        "copied": db.copy_event("bench seller copy", categories=CATEGORIES, seats=seats),
        "seat_map": db.copy_event(
            "bench seller seat map", categories=CATEGORIES, seats=seats, status="on_sale"
        ),
        "rules": rules_event(db, scale, "bench seller reserve rules", rules=True),
        "none": rules_event(db, scale, "bench seller reserve none", rules=False),
    }


# --- the figure ------------------------------------------------------------------------


def run(ctx: Context) -> None:
    fig: dict = {"seats": SEATS, "repetitions": REPETITIONS, "clients": CLIENTS, "errors": []}
    ctx.results["figures"][FIGURE.key] = fig
    # The creation last: its 240,000 seats written leave PostgreSQL busy
    # (autovacuum, the checkpointer) for a while after, which would weigh on
    # whichever reserve ran first.
    parts: tuple[tuple[str, Callable[[Context], dict]], ...] = (
        ("reserve", _reserves),
        ("seat_map", _seat_map),
        ("create", _create),
    )
    for key, measure in parts:
        try:
            fig[key] = measure(ctx)
        except (PhaseFailed, wire.TransportError) as exc:
            log(f"!! 13 {key}: {exc}")
            fig["errors"].append(f"{key}: {type(exc).__name__}: {exc}")
    ctx.rows += rows(fig)
    if fig["errors"]:
        raise PhaseFailed("; ".join(fig["errors"]))


# --- creating an event: the API against COPY -------------------------------------------


def _create(ctx: Context) -> dict:
    owner = ctx.db.ensure_users(1)[0]
    slug = ctx.db.ensure_member(owner, "owner")
    seats = seat_rows(SEATS)
    out: dict = {"api_s": [], "copy_s": [], "warmup": {}, "events": {"api": [], "copy": []}}
    with wire.Client(ctx.stack.base_url, headers=auth_headers(owner), timeout=300) as client:
        # The first pair warms gunicorn's workers and PostgreSQL's caches; then
        # the order alternates, so that the machine's drift weighs on both.
        for i in range(REPETITIONS + 1):
            for how in ("api", "copy") if i % 2 == 0 else ("copy", "api"):
                name = f"bench seller {how} {i}"
                if how == "api":
                    secs, event_id, size = _by_api(ctx, client, slug, name, seats)
                    out["body_bytes"] = size
                else:
                    secs, event_id = _by_copy(ctx.db, name, seats)
                if i == 0:
                    out["warmup"][f"{how}_s"] = secs
                else:
                    out[f"{how}_s"].append(secs)
                    out["events"][how].append(event_id)
                log(f"   create {how} #{i}: {secs:.3f} s{' (warm-up)' if i == 0 else ''}")
    out["api_median_s"] = statistics.median(out["api_s"])
    out["copy_median_s"] = statistics.median(out["copy_s"])
    return out


def _by_api(
    ctx: Context, client: wire.Client, slug: str, name: str, seats: list[SeatRow]
) -> tuple[float, int, int]:
    """One event created through the API; (seconds from the request's first
    byte sent to the answer's last read, event id, body bytes)."""
    body = json.dumps(api_body(name, seats)).encode()
    started = time.perf_counter()
    reply = client.request(
        "POST",
        f"/api/organizers/{slug}/events/",
        body=body,
        headers={"Content-Type": "application/json"},
    )
    secs = time.perf_counter() - started
    if reply.status_code != 201:
        raise PhaseFailed(
            f"POST /api/organizers/{slug}/events/ ({len(body):,} bytes) answered "
            f"{reply.status_code}: {reply.text[:300]}"
        )
    event_id = int(reply.json()["id"])
    (written,) = ctx.db.q1("SELECT count(*) FROM purchases_seat WHERE event_id = %s", [event_id])
    if written != len(seats):
        raise PhaseFailed(f"the API's event {event_id} has {written} seats, not {len(seats)}")
    return secs, event_id, len(body)


def _by_copy(db: BenchDB, name: str, seats: list[SeatRow]) -> tuple[float, int]:
    started = time.perf_counter()
    event_id = db.copy_event(name, categories=CATEGORIES, seats=seats)
    return time.perf_counter() - started, event_id


# --- the reserve with the seller's rules against without -------------------------------


def _reserves(ctx: Context) -> dict:
    out: dict = {"with_rules": [], "without": [], "statements": _statements(ctx)}
    # One unmeasured run first: on a stack just started (``--phases seller``)
    # the first run is the slowest, whichever side it is.
    out["warmup"] = _reserve(ctx, False, 0)
    # with, without, without, with: the machine's drift weighs on both sides alike.
    for k, rules in enumerate((True, False, False, True), start=1):
        out["with_rules" if rules else "without"].append(_reserve(ctx, rules, k))
    return out


def _reserve(ctx: Context, rules: bool, k: int) -> dict:
    how = "with rules" if rules else "without"
    nseats = int(1000 * (ctx.warmup + ctx.dur)) + 1000
    event = rules_event(ctx.db, nseats, f"bench seller reserve {how} {k}", rules=rules)
    paused = ctx.broker.pause_consumer()
    try:
        ctx.broker.purge()
        m = closed_loop(
            ctx.stack,
            ctx.users,
            label=f"reserve {how} c={CLIENTS}",
            clients=CLIENTS,
            warmup=ctx.warmup,
            duration=ctx.dur,
            event_id=event,
            nseats=nseats,
            buyers_per_client=BUYERS_PER_CLIENT,
        )
    finally:
        ctx.broker.purge()
        if paused:
            ctx.broker.resume_consumer()
    log(
        f"   reserve {how} c={CLIENTS}: {m['throughput_per_s']:.1f} req/s, "
        f"p50 {m['latency_202']['p50_ms']:.1f} ms, p99 {m['latency_202']['p99_ms']:.1f} ms"
    )
    return {**m, "event": event}


def _statements(ctx: Context) -> dict:
    """The statements of one reserve on an event with the rules and on one
    without, sent through Django in this process (as figure 1 checks its
    script): the rules' lock and count must show."""
    # Django is set up by run.py before any figure runs, after this is imported.
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    out: dict = {}
    client, user = Client(), ctx.users[-1]
    for rules in (True, False):
        event = rules_event(ctx.db, 2, f"bench seller capture {rules}", rules=rules)
        # The first warms the token and the connection, as the load finds them.
        reserve.post_in_process(client, user=user, event_id=event, seat="S1", key=f"sf-w-{event}")
        with CaptureQueriesContext(connection) as captured:
            answer = reserve.post_in_process(
                client, user=user, event_id=event, seat="S2", key=f"sf-c-{event}"
            )
        if answer.status_code != 202:
            raise PhaseFailed(f"capture on event {event} answered {answer.status_code}")
        out["with_rules" if rules else "without"] = [q["sql"] for q in captured.captured_queries]
    connection.close()
    return out


# --- the seat map of 20,000: cached against the database -------------------------------


def _seat_map(ctx: Context) -> dict:
    event = ctx.db.copy_event(
        "bench seller seat map", categories=CATEGORIES, seats=seat_rows(SEATS), status="on_sale"
    )
    path = f"/api/events/{event}/seats/"
    out: dict = {"event": event}
    try:
        for side, cache in (("cached", "on"), ("database", "off")):
            catalog._restart_web(ctx, AVAILABILITY_CACHE=cache)
            for c in MAP_CLIENTS:
                out[f"{side}_c{c}"] = catalog._gets(
                    ctx, path, c, label=f"seats of {SEATS:,} {side} c={c}"
                )
    finally:
        catalog._restart_web(ctx)
        catalog._forget_cache(ctx)
    return out


# --- the table -------------------------------------------------------------------------


def rows(fig: dict) -> list[dict]:
    out: list[dict] = []
    if "create" in fig:
        out += _create_rows(fig["create"])
    if "seat_map" in fig:
        out += _seat_map_rows(fig["seat_map"])
    if "reserve" in fig:
        out += _reserve_rows(fig["reserve"])
    return out


def _create_rows(c: dict) -> list[dict]:
    api, copy = c["api_median_s"], c["copy_median_s"]
    return [
        {
            "figure": f"13 create an event of {SEATS:,} seats, API vs COPY (median of "
            f"{len(c['api_s'])})",
            "measured": f"{api:.2f} s ({SEATS / api:,.0f} seats/s)",
            "baseline": f"{copy:.2f} s COPY ({SEATS / copy:,.0f} seats/s)",
            "ratio": ratio(api, copy),
            "note": "goal <= 3",
        }
    ]


def _seat_map_rows(s: dict) -> list[dict]:
    out = []
    for c in MAP_CLIENTS:
        cached, database = s[f"cached_c{c}"], s[f"database_c{c}"]
        out += [
            {
                "figure": f"13 seats of {SEATS:,} c={c} throughput, cached vs database",
                "measured": f"{cached['throughput_per_s']:.1f} req/s",
                "baseline": f"{database['throughput_per_s']:.1f} req/s",
                "ratio": ratio(cached["throughput_per_s"], database["throughput_per_s"]),
                "note": "goal >= 5",
            },
            {
                "figure": f"13 seats of {SEATS:,} c={c} p50 / p99, cached vs database",
                "measured": f"{cached['latency']['p50_ms']:.1f} / "
                f"{cached['latency']['p99_ms']:.1f} ms",
                "baseline": f"{database['latency']['p50_ms']:.1f} / "
                f"{database['latency']['p99_ms']:.1f} ms",
                "ratio": ratio(cached["latency"]["p50_ms"], database["latency"]["p50_ms"]),
            },
        ]
    return out


def _reserve_rows(r: dict) -> list[dict]:
    on, off = r["with_rules"], r["without"]

    def each(runs: list[dict]) -> str:
        return ", ".join(f"{m['throughput_per_s']:.0f}" for m in runs)

    def tput(runs: list[dict]) -> float:
        return mean_of(runs, lambda m: m["throughput_per_s"])

    def p99(runs: list[dict]) -> float:
        return mean_of(runs, lambda m: m["latency_202"]["p99_ms"])

    def web_cpu(runs: list[dict]) -> float | None:
        if not all(m["cpu_ms_per_202"].get("web") for m in runs):
            return None
        return mean_of(runs, lambda m: m["cpu_ms_per_202"]["web"])

    with_n, without_n = len(r["statements"]["with_rules"]), len(r["statements"]["without"])
    return [
        {
            "figure": f"13 reserve c={CLIENTS} throughput, buyer limit + sales window vs none",
            "measured": f"{tput(on):.1f} req/s ({each(on)})",
            "baseline": f"{tput(off):.1f} req/s ({each(off)})",
            "ratio": ratio(tput(on), tput(off)),
            "note": "goal >= 0.9",
        },
        {
            "figure": f"13 reserve c={CLIENTS} p99, buyer limit + sales window vs none",
            "measured": f"{p99(on):.1f} ms",
            "baseline": f"{p99(off):.1f} ms",
            "ratio": ratio(p99(on), p99(off)),
        },
        {
            "figure": f"13 reserve c={CLIENTS} web CPU per request, buyer limit + sales window "
            "vs none",
            "measured": _ms(web_cpu(on)),
            "baseline": _ms(web_cpu(off)),
            "ratio": ratio(web_cpu(on), web_cpu(off)),
        },
        {
            "figure": "13 reserve statements, buyer limit + sales window vs none",
            "measured": with_n,
            "baseline": without_n,
            "ratio": ratio(with_n, without_n),
            "note": "" if with_n > without_n else "NO RULE CHECKED",
        },
    ]


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"
