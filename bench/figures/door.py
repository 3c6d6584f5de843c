"""Figure 16: the door (issue 35; docs/door.md).

Measured in one run:

- check-in scans per second at ``CLIENTS`` closed-loop clients over HTTP
  (``POST /api/organizers/{slug}/events/{id}/checkin/``), each client a
  door member of the bench organizer with its own token and keep-alive
  connection, every scan a distinct valid code of an event of confirmed
  one-seat purchases written by SQL (figure 15's writer,
  ``cancellation.confirmed_event``), against pgbench at the same
  concurrency running the one statement that admits a ticket
  (bench/checkin.sql: door/services.py's statement, checked against what a
  real scan sends, ``check_script``) on distinct tickets of another such
  event. Goal: ratio ≥ ``GOAL``. The figure **fails** unless every code
  scanned was admitted exactly once: answered ``ok``, one check-in row per
  code (no duplicate), one ``ok`` scan row per check-in, a sample scanned
  again answered ``already_checked_in`` and writing nothing; and unless
  pgbench's event has one check-in per transaction;
- offline verification per code, no goal: ``door.codes.verify`` in this
  process over ``VERIFY_CODES`` codes, and the same codes verified in
  Chromium (Playwright) with WebCrypto's Ed25519, the steps of the
  scanner's offline judge (door/static/door/scanner.js: base64url, the
  payload's fields, ``crypto.subtle.verify``), one code after the other as
  a gate does, and all at once.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import statistics
import time
from typing import Any

from bench import wire
from bench.common import BENCH, BENCH_DB, Context, Figure, PhaseFailed, lat_summary, log, ratio
from bench.db import BENCH_ORGANIZER_SLUG, BenchDB, token
from bench.figures.cancellation import confirmed_event
from bench.load import ClosedLoop, _cpu_per_request, _measure, http_client
from door import codes

CHECKIN_SQL = BENCH / "checkin.sql"
CLIENTS = 16
GOAL = 0.25
# Sizes the HTTP run's event: scans per second no run will reach on the
# bench's machines (the run fails, "out of codes", if one does).
SCANS_PER_S_CEILING = 1200
# pgbench's first, short run (transactions per client) sizes the measured
# one (-t, so that it can never run out of tickets) to about --duration.
CALIBRATION_PER_CLIENT = 100
MAX_PGBENCH_TICKETS = 400_000
VERIFY_CODES = 2000
VERIFY_ROUNDS = 3
RESCANS = 100
GATE = "bench"
# The page the browser verifies codes in: any http://localhost page is a
# secure context, where WebCrypto exists; Playwright serves it, no server.
PAGE_URL = "http://localhost/door-bench"

FIGURE = Figure(
    phase="door",
    key="16_door",
    label="16 the door",
    timeout=lambda ctx: 600 + 4 * (ctx.warmup + ctx.dur),
)


# --- the fixtures ----------------------------------------------------------------------


def fixtures(db: BenchDB, scale: int) -> tuple[int, int, int]:
    """Figure 16's database fixture: an event of ``scale`` confirmed
    purchases of one seat each (``ticket_event``)."""
    return ticket_event(db, scale, "bench door fixtures")


def ticket_event(db: BenchDB, n: int, name: str) -> tuple[int, int, int]:
    """An event of ``n`` confirmed one-seat purchases (figure 15's writer,
    no processor rows): (event, idoff, toff), ticket k (1..n) being the seat
    link ``toff`` + k of the seat ``idoff`` + k, at version 0."""
    event = confirmed_event(db, None, n, name)
    seat0, link0, spread, count, versions = db.q1(
        "SELECT min(seat_id), min(id), max(id - seat_id) - min(id - seat_id), count(*),"
        " count(*) FILTER (WHERE ticket_version <> 0)"
        " FROM purchases_reservationseat WHERE event_id = %s",
        [event],
    )
    (seats,) = db.q1(
        "SELECT max(id) - min(id) + 1 FROM purchases_seat WHERE event_id = %s", [event]
    )
    if count != n or spread != 0 or seats != n or versions:
        raise PhaseFailed(
            f"door: event {event}'s {count} links are not {n} contiguous ids in the seats' order"
        )
    return event, seat0 - 1, link0 - 1


def event_key(event: int) -> tuple[int, bytes]:
    """The event's current key (made now if it has none): its version and
    its 32 public bytes, as the admitting statement compares them."""
    # Django is set up by run.py (setup), after the figures are imported.
    from django.db import connection

    # As above: door.keys reads the event's key with Django's ORM.
    from door import keys

    try:
        version, _ = keys.signing_key(event)
        return version, keys.public_key_bytes(event)[version]
    finally:
        connection.close()


def sign_codes(event: int, idoff: int, toff: int, n: int) -> list[str]:
    """The codes of tickets 1..n of ``ticket_event``'s event, signed with
    its current key (made now, as a ticket page would)."""
    # Django is set up by run.py (setup), after the figures are imported.
    from django.db import connection

    # As above: door.keys reads the event's key with Django's ORM.
    from door import keys

    try:
        key = keys.signing_key(event)
    finally:
        connection.close()
    return [
        codes.sign(key, event_id=event, seat_id=idoff + k, ticket_id=toff + k, ticket_version=0)
        for k in range(1, n + 1)
    ]


# --- the script against the product ----------------------------------------------------


def shape(sql: str) -> str:
    """A statement without its values: literals (with their casts), numbers,
    NULL, now() and pgbench's :variables are each ``?``; spaces around
    parentheses do not count."""
    s = re.sub(r"'(?:[^']|'')*'(?:::\w+)?", "?", sql)
    s = re.sub(r"\bnow\(\)|:\w+|\bNULL\b|\b\d+\b", "?", s)
    s = re.sub(r"\s*([()])\s*", r"\1", s)  # how a statement is wrapped is not its shape
    return " ".join(s.split()).rstrip(";").strip()


def script_statement() -> str:
    """bench/checkin.sql's one SQL statement (its comments and pgbench's
    meta-commands aside)."""
    lines = CHECKIN_SQL.read_text().splitlines()
    found = [ln for ln in lines if ln.strip() and not ln.startswith(("--", "\\"))]
    if len(found) != 1:
        raise PhaseFailed(f"{CHECKIN_SQL.name}: {len(found)} statements, not one")
    return found[0]


def _post_in_process(client, path: str, code: str, user: int) -> dict:
    """One scan through Django in this process (``client``: Django's test
    Client; Django is set up by run.py): the answer's JSON, or its status."""
    r = client.post(
        path,
        data=json.dumps({"code": code, "gate": GATE}),
        content_type="application/json",
        HTTP_HOST="127.0.0.1",
        HTTP_AUTHORIZATION=f"Token {token(user)}",
    )
    return r.json() if r.status_code == 200 else {"result": f"HTTP {r.status_code}"}


def check_script(ctx: Context, user: int) -> dict:
    """Scan two codes of a small event through the API in this process, the
    second under ``CaptureQueriesContext``: every statement a scan sends,
    and whether its admitting insert is the script's."""
    # Django is set up by run.py (setup), after the figures are imported.
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    event, idoff, toff = ticket_event(ctx.db, 2, "bench door capture")
    first, second = sign_codes(event, idoff, toff, 2)
    path = f"/api/organizers/{BENCH_ORGANIZER_SLUG}/events/{event}/checkin/"
    client = Client()
    try:
        # Once first, as the load's scans find things: the token and the
        # event's key cached, the connection just used.
        _post_in_process(client, path, first, user)
        with CaptureQueriesContext(connection) as captured:
            answer = _post_in_process(client, path, second, user)
    finally:
        connection.close()
    statements = [q["sql"] for q in captured.captured_queries]
    (ctx.logdir / "checkin-captured.sql").write_text(";\n".join(statements) + ";\n")
    inserts = [s for s in statements if re.search(r'INSERT INTO "?door_checkin\b', s)]
    same = len(inserts) == 1 and shape(inserts[0]) == shape(script_statement())
    out = {
        "answer": answer["result"],
        "statements": statements,
        "round_trips": len(statements),
        "script_matches_product": same,
    }
    if answer["result"] != "ok" or not same:
        raise PhaseFailed(
            f"bench/checkin.sql is not the API's admitting insert (answer {answer['result']},"
            f" {len(inserts)} check-in inserts): see {ctx.logdir.name}/checkin-captured.sql"
        )
    log(f"   checkin.sql matches the API's insert; a scan sends {len(statements)} statements")
    return out


# --- the scans over HTTP ---------------------------------------------------------------


def scan(client: wire.Client, path: str, code: str) -> tuple[int, float, str]:
    """One scan: (status, seconds, the result or the answer's head). A
    connection dropped by the server is retried once; that retry's
    ``already_checked_in`` is the first attempt's admission: ``ok_retried``."""
    started = time.perf_counter()
    for attempt in (1, 2):
        try:
            r = client.post(path, json={"code": code, "gate": GATE})
        except wire.TransportError as exc:
            if attempt == 2:
                return -1, time.perf_counter() - started, f"{type(exc).__name__}: {exc}"
            continue
        secs = time.perf_counter() - started
        if r.status_code != 200:
            return r.status_code, secs, r.text[:200]
        result = str(r.json().get("result"))
        if attempt == 2 and result == "already_checked_in":
            result = "ok_retried"
        return 200, secs, result
    raise AssertionError("unreachable")


class _Scanners(ClosedLoop):
    """One thread per door user, each its own connection, each scanning the
    next unscanned code of ``todo``. Records (sent, answered: monotonic;
    seconds; status; result; the code's index)."""

    def __init__(self, base_url: str, users: list[int], path: str, todo: list[str]):
        super().__init__(base_url, len(users), len(todo))
        self.users, self.path, self.todo = users, path, todo

    def client(self, k: int) -> wire.Client:
        return http_client(self.base_url, self.users[k])

    def send(self, client: wire.Client, k: int, i: int) -> None:
        t = time.monotonic()
        status, secs, result = scan(client, self.path, self.todo[i])
        self.records[k].append((t, time.monotonic(), secs, status, result, i))
        if not result.startswith("ok") and len(self.errors) < 5:
            self.errors.append(f"{status} {result}")


def http_scans(ctx: Context, users: list[int], event: int, todo: list[str]) -> dict:
    """``len(users)`` scanners for warm-up + ``--duration`` seconds: what
    answered within the measured window, summarized, and every record."""
    path = f"/api/organizers/{BENCH_ORGANIZER_SLUG}/events/{event}/checkin/"
    run = _Scanners(ctx.stack.base_url, users, path, todo)
    for th in run.threads:
        th.start()
    roots = {**{n: p.pid for n, p in ctx.stack.procs.items()}, "bench_client": os.getpid()}
    label = f"door c={len(users)}"
    try:
        start, cpu = _measure(run, roots, label, ctx.warmup, ctx.dur)
    finally:
        run.end()
    if run.exhausted.is_set():
        raise PhaseFailed(f"{label}: out of codes ({len(todo)}): raise SCANS_PER_S_CEILING")
    ctx.stack.check_alive()
    w0, w1 = start + ctx.warmup, start + ctx.warmup + ctx.dur
    records = [r for rs in run.records for r in rs]
    ok = [r[2] for r in records if w0 <= r[1] <= w1 and r[4].startswith("ok")]
    results: dict[str, int] = {}
    for r in records:
        results[r[4][:40]] = results.get(r[4][:40], 0) + 1
    return {
        "clients": len(users),
        "duration_s": ctx.dur,
        "warmup_s": ctx.warmup,
        "throughput_per_s": len(ok) / ctx.dur,
        "latency_ok": lat_summary(ok),
        "cpu_ms_per_scan": _cpu_per_request(cpu, len(ok), ctx.dur),
        "scans_total": len(records),
        "results": results,
        "errors_sample": run.errors,
        "scanned": sorted({r[5] for r in records}),
    }


def admitted_once(ctx: Context, user: int, event: int, todo: list[str], http: dict) -> dict:
    """Every code scanned admitted exactly once (see the module's
    docstring); ``problems`` says what is not."""
    scanned = http.pop("scanned")
    checkins, duplicates, ok_rows = ctx.db.q1(
        "SELECT (SELECT count(*) FROM door_checkin WHERE event_id = %(ev)s),"
        " (SELECT count(*) FROM (SELECT ticket_id FROM door_checkin WHERE event_id = %(ev)s"
        "   GROUP BY ticket_id HAVING count(*) > 1) d),"
        " (SELECT count(*) FROM door_scan WHERE event_id = %(ev)s AND result = 'ok')",
        {"ev": event},
    )
    path = f"/api/organizers/{BENCH_ORGANIZER_SLUG}/events/{event}/checkin/"
    with http_client(ctx.stack.base_url, user) as client:
        again = [scan(client, path, todo[n])[2] for n in scanned[:RESCANS]]
    (after,) = ctx.db.q1("SELECT count(*) FROM door_checkin WHERE event_id = %s", [event])
    not_ok = {k: v for k, v in http["results"].items() if not k.startswith("ok")}
    out: dict[str, Any] = {
        "codes_scanned": len(scanned),
        "checkins": checkins,
        "duplicate_checkins": duplicates,
        "ok_scan_rows": ok_rows,
        "first_scans_not_ok": not_ok,
        "rescanned": len(again),
        "rescans_already_checked_in": again.count("already_checked_in"),
        "checkins_after_rescans": after,
    }
    want = {
        "check-ins": checkins,
        "ok scan rows": ok_rows,
        "check-ins after the rescans": after,
        "scans answered ok": len(scanned) - sum(not_ok.values()),
    }
    out["problems"] = [
        f"{w}: {got} of {len(scanned)}" for w, got in want.items() if got != len(scanned)
    ]
    if duplicates:
        out["problems"].append(f"{duplicates} tickets checked in more than once")
    if again.count("already_checked_in") != len(again):
        out["problems"].append(f"rescans: {again.count('already_checked_in')} of {len(again)}")
    return out


def http_part(ctx: Context, users: list[int]) -> tuple[dict, dict, list[str]]:
    """The HTTP run on a fresh event: (its summary, the checks, its codes)."""
    n = int(SCANS_PER_S_CEILING * (ctx.warmup + ctx.dur)) + VERIFY_CODES
    t = time.monotonic()
    event, idoff, toff = ticket_event(ctx.db, n, f"bench door http c{len(users)}")
    todo = sign_codes(event, idoff, toff, n)
    log(f"   door: {n} tickets written and their codes signed in {time.monotonic() - t:.1f}s")
    log(f"   door c={len(users)}: HTTP for {ctx.warmup:.0f}+{ctx.dur:.0f}s")
    http = http_scans(ctx, users, event, todo)
    checks = admitted_once(ctx, users[0], event, todo, http)
    lat = http["latency_ok"]
    log(
        f"   door c={len(users)}: {http['throughput_per_s']:.1f} scans/s, p50"
        f" {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms; {checks['checkins']} check-ins"
        f" for {checks['codes_scanned']} codes, problems: {checks['problems'] or 'none'}"
    )
    return {"event": event, "tickets": n, **http}, checks, todo


# --- pgbench ---------------------------------------------------------------------------


def _pgbench(ctx: Context, uid: int, per_client: int, tag: str) -> dict:
    """``bench/checkin.sql`` at ``CLIENTS`` clients, ``per_client``
    transactions each, on a fresh event of exactly that many tickets; checks
    one check-in per transaction."""
    tickets = per_client * CLIENTS
    event, idoff, toff = ticket_event(ctx.db, tickets, f"bench door pgbench {tag}")
    log(f"   door pgbench ({tag}): -M {ctx.pgbench.mode} -c {CLIENTS} -t {per_client}")
    kv, public = event_key(event)
    # As a variable stands in the statement: in its text for -M simple (a
    # quoted literal), a parameter for -M prepared (bench/checkin.sql).
    pk = f"'\\x{public.hex()}'" if ctx.pgbench.mode == "simple" else f"\\x{public.hex()}"
    variables: dict[str, int | str] = {
        "ev": event,
        "idoff": idoff,
        "toff": toff,
        "nclients": CLIENTS,
        "uid": uid,
        "kv": kv,
        "pk": pk,
    }
    defines = [
        a for k, v in {**variables, "version": 0, "i": 0}.items() for a in ("-D", f"{k}={v}")
    ]
    pgb = ctx.pgbench.run(
        args=[
            *("-M", ctx.pgbench.mode, "-c", str(CLIENTS), "-j", str(CLIENTS)),
            *("-t", str(per_client), "-f", str(CHECKIN_SQL), "-r", *defines),
        ],
        db=BENCH_DB,
        timeout=ctx.dur * 10 + 120,
        tag=f"door-{tag}",
    )
    checkins, duplicates, scans = ctx.db.q1(
        "SELECT count(*), count(*) - count(DISTINCT ticket_id),"
        " (SELECT count(*) FROM door_scan WHERE event_id = %s AND result = 'ok')"
        " FROM door_checkin WHERE event_id = %s",
        [event, event],
    )
    pgb.update(event=event, tickets=tickets, checkins=checkins, duplicate_checkins=duplicates)
    if checkins != pgb["transactions"] or checkins != tickets or duplicates or scans != checkins:
        raise PhaseFailed(
            f"door pgbench ({tag}): {checkins} check-ins ({duplicates} duplicates, {scans} scan"
            f" rows) for {pgb['transactions']} transactions on {tickets} tickets"
        )
    log(
        f"   door pgbench ({tag}): {pgb['tps']:.1f} tps, p50 {pgb['latency']['p50_ms']:.2f} ms,"
        f" p99 {pgb['latency']['p99_ms']:.2f} ms"
    )
    return pgb


def pgbench_part(ctx: Context, uid: int) -> dict:
    """A short run sizes the measured one to about ``--duration``."""
    calibration = _pgbench(ctx, uid, CALIBRATION_PER_CLIENT, "calibration")
    per_client = math.ceil(calibration["tps"] * ctx.dur / CLIENTS)
    per_client = max(CALIBRATION_PER_CLIENT, min(per_client, MAX_PGBENCH_TICKETS // CLIENTS))
    measured = _pgbench(ctx, uid, per_client, "run")
    return {**measured, "calibration_tps": calibration["tps"]}


# --- offline verification --------------------------------------------------------------


def _tampered(code: str) -> str:
    """``code`` with one character of its signature changed."""
    at = 60
    return code[:at] + ("B" if code[at] == "A" else "A") + code[at + 1 :]


def python_verify(event: int, sample: list[str]) -> dict:
    """``door.codes.verify`` over ``sample``, ``VERIFY_ROUNDS`` times; and
    ``codes.parse`` alone (the format, no signature)."""
    # Django is set up by run.py (setup), after the figures are imported.
    from django.db import connection

    # As above: door.keys reads the event's keys with Django's ORM.
    from door import keys

    try:
        public = keys.public_keys(event)
    finally:
        connection.close()
    rounds, parse_rounds = [], []
    for _ in range(VERIFY_ROUNDS):
        t = time.perf_counter()
        good = sum(1 for c in sample if codes.verify(c, public) is not None)
        rounds.append(time.perf_counter() - t)
        t = time.perf_counter()
        parsed = sum(1 for c in sample if codes.parse(c) is not None)
        parse_rounds.append(time.perf_counter() - t)
    if good != len(sample) or parsed != len(sample):
        raise PhaseFailed(f"door.codes.verify: {good} of {len(sample)} codes verified")
    if codes.verify(_tampered(sample[0]), public) is not None:
        raise PhaseFailed("door.codes.verify accepted a code with a changed signature")
    per = [s * 1e6 / len(sample) for s in rounds]
    return {
        "codes": len(sample),
        "us_per_code_rounds": per,
        "us_per_code": statistics.median(per),
        "parse_us_per_code": statistics.median(s * 1e6 / len(sample) for s in parse_rounds),
    }


# The scanner's offline judge (door/static/door/scanner.js), its steps
# timed: base64url to bytes, the payload's fields read, the Ed25519
# signature verified with WebCrypto; one code after the other (a gate
# awaits each), then all at once.
_BROWSER_JS = """
async ({key, codes, rounds, tampered}) => {
  const bytesOf = (b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const decode = (code) => {
    let b64 = code.replace(/-/g, "+").replace(/_/g, "/");
    while (b64.length % 4) b64 += "=";
    const bytes = bytesOf(b64);
    const view = new DataView(bytes.buffer);
    if (bytes[0] !== 1) return null;
    view.getUint16(1); view.getUint32(3); view.getBigUint64(7); view.getBigUint64(15);
    view.getUint16(23);
    return [bytes.slice(0, 25), bytes.slice(25)];
  };
  const cryptoKey = await crypto.subtle.importKey(
    "raw", bytesOf(key), {name: "Ed25519"}, false, ["verify"]);
  const one = (code) => {
    const parts = decode(code);
    return crypto.subtle.verify({name: "Ed25519"}, cryptoKey, parts[1], parts[0]);
  };
  const sequentialMs = [];
  let good = 0;
  for (let r = 0; r < rounds; r++) {
    const t0 = performance.now();
    good = 0;
    for (const code of codes) if (await one(code)) good++;
    sequentialMs.push(performance.now() - t0);
  }
  const t1 = performance.now();
  const all = await Promise.all(codes.map(one));
  const parallelMs = performance.now() - t1;
  return {sequentialMs, parallelMs, good, goodParallel: all.filter(Boolean).length,
          tamperedAccepted: await one(tampered), secure: window.isSecureContext,
          userAgent: navigator.userAgent};
}
"""


def browser_verify(event: int, sample: list[str]) -> dict:
    """``sample`` verified in headless Chromium (``_BROWSER_JS``) on a page
    Playwright serves itself; ``{"skipped": why}`` without Playwright or
    Chromium."""
    # Django is set up by run.py (setup), after the figures are imported.
    from django.db import connection

    # As above: door.keys reads the event's keys with Django's ORM.
    from door import keys

    try:
        public = keys.public_key_bytes(event)
    finally:
        connection.close()
    try:
        # Only this part of the bench needs a browser (the dev extras' Playwright).
        from playwright.sync_api import sync_playwright

        # Imported with Playwright, which it imports: the tests' Chromium and its flags.
        from devtools.screenshots import CHROMIUM, CHROMIUM_ARGS
    except ImportError as exc:
        return {"skipped": f"no Playwright: {exc}"}
    if not os.access(CHROMIUM, os.X_OK):
        return {"skipped": f"no {CHROMIUM}"}
    arg = {
        "key": _b64(public[max(public)]),
        "codes": sample,
        "rounds": VERIFY_ROUNDS,
        "tampered": _tampered(sample[0]),
    }
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = chromium.new_page()
            page.route(PAGE_URL, lambda route: route.fulfill(body=_PAGE, content_type="text/html"))
            page.goto(PAGE_URL)
            got = page.evaluate(_BROWSER_JS, arg)
        finally:
            chromium.close()
    if got["good"] != len(sample) or got["goodParallel"] != len(sample) or got["tamperedAccepted"]:
        raise PhaseFailed(f"Chromium's verification: {got}")
    per = [ms * 1000 / len(sample) for ms in got["sequentialMs"]]
    return {
        "codes": len(sample),
        "browser": got["userAgent"],
        "secure_context": got["secure"],
        "us_per_code_rounds": per,
        "us_per_code": statistics.median(per),
        "parallel_us_per_code": got["parallelMs"] * 1000 / len(sample),
    }


_PAGE = "<!doctype html><title>door bench</title><p>figure 16: codes verified here</p>"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


# --- the figure ------------------------------------------------------------------------


def door_users(ctx: Context) -> list[int]:
    """``CLIENTS`` bench users made door staff of the bench organizer: the
    ones before the last (figure 15's owner), whose roles no figure sets."""
    users = ctx.users[-1 - CLIENTS : -1]
    for user in users:
        ctx.db.ensure_member(user, "door")
    return users


def run(ctx: Context) -> None:
    fig: dict[str, Any] = {"clients": CLIENTS, "goal": GOAL}
    ctx.results["figures"][FIGURE.key] = fig
    users = door_users(ctx)
    fig["script"] = check_script(ctx, users[0])
    fig["http"], fig["checks"], todo = http_part(ctx, users)
    fig["pgbench"] = pgbench_part(ctx, users[0])
    sample = todo[-VERIFY_CODES:]  # signed, never scanned: verification reads no row
    event = fig["http"]["event"]
    fig["verify_python"] = python_verify(event, sample)
    log(f"   door: door.codes.verify {fig['verify_python']['us_per_code']:.1f} µs/code")
    fig["verify_browser"] = browser_verify(event, sample)
    browser = fig["verify_browser"]
    shown = f"{browser['us_per_code']:.1f} µs/code" if "us_per_code" in browser else browser
    log(f"   door: Chromium WebCrypto {shown}")
    ctx.rows += rows(fig)
    if fig["checks"]["problems"]:
        raise PhaseFailed(f"door: codes not admitted exactly once: {fig['checks']['problems']}")


def rows(fig: dict) -> list[dict]:
    h, p, c = fig["http"], fig["pgbench"], fig["checks"]
    lat, plat = h["latency_ok"], p["latency"]
    out = [
        {
            "figure": f"16 door check-in c={CLIENTS} throughput",
            "note": f"goal >= {GOAL:g}; baseline: the one admitting statement alone; a scan sends"
            f" {fig['script']['round_trips']} statements",
            "measured": f"{h['throughput_per_s']:.1f} scans/s",
            "baseline": f"{p['tps']:.1f} tps pgbench",
            "ratio": ratio(h["throughput_per_s"], p["tps"]),
        },
    ]
    for q in ("p50", "p99"):
        out.append(
            {
                "figure": f"16 door check-in c={CLIENTS} {q}",
                "measured": f"{lat[f'{q}_ms']:.1f} ms",
                "baseline": f"{plat[f'{q}_ms']:.2f} ms",
                "ratio": ratio(lat[f"{q}_ms"], plat[f"{q}_ms"]),
            }
        )
    cpu = h.get("cpu_ms_per_scan") or {}
    if cpu and p.get("machine_cpu_ms_per_txn"):
        out.append(
            {
                "figure": f"16 door check-in c={CLIENTS} machine CPU per scan",
                "measured": f"{cpu['machine_all_processes']:.2f} ms ({cpu['web']:.2f} web)",
                "baseline": f"{p['machine_cpu_ms_per_txn']:.2f} ms pgbench",
                "ratio": ratio(cpu["machine_all_processes"], p["machine_cpu_ms_per_txn"]),
            }
        )
    out.append(
        {
            "figure": "16 door: codes admitted exactly once (must be all)",
            "measured": f"{c['checkins']} check-ins",
            "baseline": f"{c['codes_scanned']} codes",
            "ratio": ratio(c["checkins"], c["codes_scanned"]),
            "note": "; ".join(c["problems"])
            or f"{c['duplicate_checkins']} duplicates; {c['rescanned']} rescans refused",
        }
    )
    return out + _verify_rows(fig)


def _verify_rows(fig: dict) -> list[dict]:
    py, br = fig["verify_python"], fig["verify_browser"]
    return [
        {
            "figure": "16 door: offline verify per code, Python (door.codes.verify)",
            "measured": f"{py['us_per_code']:.1f} µs",
            "baseline": f"{py['parse_us_per_code']:.1f} µs parse alone",
            "ratio": None,
            "note": f"{py['codes']} codes",
        },
        {
            "figure": "16 door: offline verify per code, Chromium WebCrypto",
            "measured": f"{br['us_per_code']:.1f} µs" if "us_per_code" in br else "n/a",
            "baseline": f"{br['parallel_us_per_code']:.1f} µs all at once"
            if "us_per_code" in br
            else "",
            "ratio": None,
            "note": br.get("skipped") or f"{br['codes']} codes, one after the other",
        },
    ]
