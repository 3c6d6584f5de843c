"""Figure 9: outgoing webhooks (docs/design.md, "The edges"). Two questions,
each against the same measurement without any endpoint, in the same run:

1. What one subscribed endpoint costs a purchase end to end: confirmed
   purchases/s as figure 2 measures it (same load, same clients, zero-latency
   gateway; 1,000 purchases per run, not figure 2's 300) with one enabled
   endpoint subscribed to the four types, whose receiver answers 204 at
   once, against no endpoint. Then, once the run has
   drained, how many deliveries were delivered and their lag
   (``delivered_at - created_at``); the figure fails if the receiver got
   fewer requests than purchases were confirmed with the endpoint.
2. That a receiver that hangs stays off the request path: reserve
   throughput, p50 and p99 at 4 clients with the worker consuming (charging,
   confirming, delivering) while every delivery hangs past
   ``WEBHOOK_TIMEOUT_SECONDS``, against the same with no endpoint; and how
   many attempts timed out.

The receiver is an HTTP server in the bench process on 127.0.0.1 (the stack
runs with ``WEBHOOK_ALLOW_LOCAL_URLS=true``, bench/run.py): ``/ok`` answers
204 at once, ``/hang`` reads the request and answers nothing for the timeout
plus 2 s. Endpoints are written and removed by SQL on the bench database.
Question 1 is measured in the order none, with, with, none, twice, so that
the machine's drift weighs on both sides alike, and every measurement starts
from a drained stack. Whatever happens, the figure ends with its endpoints
disabled, drained and deleted (with their deliveries, their attempts and
their outbox timers still armed) and the receiver stopped.
"""

from __future__ import annotations

import base64
import json
import secrets
import socketserver
import threading
import time

from bench.common import Context, Figure, PhaseFailed, log, mean_of, ratio
from bench.cpu import LABELS, per_purchase
from bench.db import BenchDB
from bench.figures import e2e, gateway_latency, reserve
from bench.load import closed_loop
from devtools.processes import poll

# Question 1's runs, in this order: the machine's drift weighs on both sides
# alike.
ORDER = ("none", "endpoint", "endpoint", "none") * 2

FIGURE = Figure(
    phase="webhooks",
    key="9_webhooks",
    label="9 webhooks",
    timeout=lambda ctx: (
        300
        + len(ORDER) * (60 + _purchases(ctx) / 5)
        + 4 * (ctx.warmup + ctx.dur + _drain_timeout(ctx))
    ),
)
EVENTS = ["purchase.confirmed", "purchase.failed", "purchase.refunded", "purchase.needs_attention"]
RESERVE_CLIENTS = 4
HANG_BEYOND_TIMEOUT_S = 2.0
TOPIC = "webhook.delivery"  # webhooks/topics.py
ATTEMPT_COUNTS = ("total", "timed_out", "delivered", "not_sent")


# A 300-purchase e2e run lasts 4-7 s on two shared cores, and its noise is
# larger than the cost measured here: this figure's own default is longer
# than figure 2's (docs/performance.md, "The webhooks' sweep").
PURCHASES = 1000


def _purchases(ctx: Context) -> int:
    """Purchases per e2e run: --e2e-purchases, else 1,000 (--full: 2,000)."""
    return ctx.args.e2e_purchases or (e2e.purchases(ctx) if ctx.full else PURCHASES)


def _drain_timeout(ctx: Context) -> float:
    # A reserve run with the worker consuming leaves about (warm-up +
    # duration) x (reserve rate - confirm rate) charges queued: several
    # seconds of draining per second measured on two cores.
    return 60 + 8 * (ctx.warmup + ctx.dur)


# --- the receiver ----------------------------------------------------------------------


class Receiver:
    """The seller's side: POST ``/ok`` answers 204 at once; POST ``/hang``
    reads the request and answers only after ``hang_s`` (or when stopped).
    Counts the requests per path, and the connections.

    Keep-alive HTTP/1.1, as a receiver behind any ordinary web server (the
    webhook pool keeps a connection per receiver), read and answered on the
    raw socket: the seller's system runs on the two cores it measures, and
    ``http.server``'s request parsing cost 0.25 ms of CPU per delivery, a
    tenth of what the product's delivery costs (``bench/wire.py`` says the
    same of the load generator)."""

    def __init__(self, hang_s: float):
        self.hang_s = hang_s
        self.counts = {"ok": 0, "hang": 0}
        self.connections = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        receiver = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with receiver.lock:
                    receiver.connections += 1
                while (path := _read_request(self.request, self)) is not None:
                    kind = "hang" if path.startswith(b"/hang") else "ok"
                    with receiver.lock:
                        receiver.counts[kind] += 1
                    if kind == "hang":
                        receiver.release.wait(receiver.hang_s)
                    try:
                        self.request.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
                    except OSError:
                        return  # the worker gave up waiting: that is the point

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 64

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
        )
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{path}"

    def count(self, kind: str) -> int:
        with self.lock:
            return self.counts[kind]

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def _read_request(sock, state) -> bytes | None:
    """The next request on a keep-alive connection: its path, its head and
    body read (by Content-Length); None when the client closed. What was
    read past it stays in ``state.pending``."""
    pending = getattr(state, "pending", b"")
    while b"\r\n\r\n" not in pending:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        pending += chunk
    head, _, pending = pending.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(pending) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        pending += chunk
    state.pending = pending[length:]
    return lines[0].split(b" ")[1]


# --- endpoints, by SQL -----------------------------------------------------------------


def fixtures(db: BenchDB, scale: int) -> tuple[int, int]:
    """Figure 9's database fixtures: an endpoint (``create_endpoint``; the
    receiver's address, here one nothing answers on) and an event of
    ``scale`` seats for an e2e run (the reserve's event is figure 1's);
    (endpoint id, event id)."""
    endpoint = create_endpoint(db, "http://127.0.0.1:9/ok", "bench fixtures")
    return endpoint, e2e.fixtures(db, scale, "bench webhooks e2e endpoint")


def create_endpoint(db: BenchDB, url: str, description: str) -> int:
    """An enabled endpoint subscribed to every type, with a valid secret (as
    webhooks.endpoints.new_secret makes them: 32 random bytes)."""
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")
    (endpoint_id,) = db.q1(
        "INSERT INTO webhooks_webhookendpoint (url, events, description, enabled, secret,"
        " created_at, updated_at) VALUES (%s, %s::jsonb, %s, true, %s, now(), now())"
        " RETURNING id",
        [url, json.dumps(EVENTS), description, secret],
    )
    log(f"   webhook endpoint {endpoint_id}: {url}")
    return endpoint_id


def _set_enabled(ctx: Context, endpoint_id: int, enabled: bool) -> None:
    ctx.db.q(
        "UPDATE webhooks_webhookendpoint SET enabled = %s, updated_at = now() WHERE id = %s",
        [enabled, endpoint_id],
    )


def _delete_endpoints(ctx: Context, ids: list[int]) -> None:
    """The endpoints with their deliveries and attempts (Django's CASCADE is
    not the database's), and the attempts' timers still armed."""
    with ctx.db.conn.transaction():
        (cancelled,) = ctx.db.q1(
            "WITH c AS (UPDATE outbox_outboxmessage SET cancelled_at = now(), due_at = NULL"
            " WHERE topic = %s AND fired_at IS NULL AND cancelled_at IS NULL"
            " AND completed_at IS NULL AND (payload->>'delivery_id')::bigint IN"
            " (SELECT id FROM webhooks_webhookdelivery WHERE endpoint_id = ANY(%s))"
            " RETURNING 1) SELECT count(*) FROM c",
            [TOPIC, ids],
        )
        ctx.db.q(
            "DELETE FROM webhooks_webhookattempt WHERE delivery_id IN"
            " (SELECT id FROM webhooks_webhookdelivery WHERE endpoint_id = ANY(%s))",
            [ids],
        )
        ctx.db.q("DELETE FROM webhooks_webhookdelivery WHERE endpoint_id = ANY(%s)", [ids])
        ctx.db.q("DELETE FROM webhooks_webhookendpoint WHERE id = ANY(%s)", [ids])
    log(f"   webhook endpoints {ids} deleted ({cancelled} armed attempts cancelled)")


def _quiet(ctx: Context, timeout: float) -> bool:
    """No task queued or running and no outbox row the relay owes a
    hand-over now (``due_at``). Unlike ``Broker.quiesce`` it does not wait
    for rows handed over earlier whose tasks an earlier figure purged: they
    are due again only minutes later (``OUTBOX_REDELIVER_SECONDS``)."""
    deadline = time.monotonic() + timeout

    def quiet() -> bool:
        if not ctx.broker.wait_drained(max(1.0, deadline - time.monotonic()), "the queue to drain"):
            return False
        (due,) = ctx.db.q1("SELECT count(*) FROM outbox_outboxmessage WHERE due_at <= now()")
        return due == 0

    return poll(quiet, timeout=timeout, every=0.5)


def _drain(ctx: Context, what: str, endpoint_id: int | None = None, *, strict: bool = True) -> None:
    """Until the stack is quiet (``_quiet``); with ``endpoint_id``, also
    until none of its deliveries owes an attempt within the next minute (a
    disabled endpoint's fail at once; later retries are cancelled with the
    endpoint). Not quiet in time: the figure fails (``strict``), or a note."""
    timeout = _drain_timeout(ctx)
    deadline = time.monotonic() + timeout

    def owed() -> int:
        (n,) = ctx.db.q1(
            "SELECT count(*) FROM webhooks_webhookdelivery WHERE endpoint_id = %s"
            " AND status = 'pending' AND next_attempt_at < now() + interval '60 s'",
            [endpoint_id],
        )
        return n

    quiet = _quiet(ctx, timeout)
    if quiet and endpoint_id is not None:
        quiet = poll(
            lambda: owed() == 0,
            timeout=max(1.0, deadline - time.monotonic()),
            every=0.5,
            progress=lambda: log(f"   {what}: {owed()} deliveries owed"),
        )
        quiet = quiet and _quiet(ctx, max(1.0, deadline - time.monotonic()))
    if quiet:
        return
    msg = (
        f"webhooks: the stack did not drain {what} within {timeout:.0f}s "
        f"(queue {ctx.broker.depth()})"
    )
    if strict:
        raise PhaseFailed(msg)
    log("!! " + msg)
    ctx.results["notes"].append(msg)


# --- the figure ------------------------------------------------------------------------


def _webhook_timeout() -> float:
    # Django is set up in this process by run.py (setup) from the stack's
    # environment: this is the worker's value.
    from django.conf import settings

    return float(settings.WEBHOOK_TIMEOUT_SECONDS)


def run(ctx: Context) -> None:
    timeout_s = _webhook_timeout()
    fig: dict = {
        "purchases_per_e2e_run": _purchases(ctx),
        "e2e_clients": e2e.CLIENTS,
        "reserve_clients": RESERVE_CLIENTS,
        "webhook_timeout_s": timeout_s,
        "receiver_hang_s": timeout_s + HANG_BEYOND_TIMEOUT_S,
    }
    ctx.results["figures"][FIGURE.key] = fig
    if ctx.stack.latency_ms != 0:
        # Figure 3 leaves the gateway at 300 ms; figure 2's load is at 0 ms.
        gateway_latency.restart_with(ctx, 0)
    receiver = Receiver(hang_s=timeout_s + HANG_BEYOND_TIMEOUT_S)
    endpoints: list[int] = []
    try:
        _flowing(ctx, fig, receiver, endpoints)
        _hanging(ctx, fig, receiver, endpoints)
    finally:
        _clean_up(ctx, receiver, endpoints)
    ctx.rows += rows(fig, poll_s=ctx.results.get("config", {}).get("relay_poll_seconds"))


def _flowing(ctx: Context, fig: dict, receiver: Receiver, endpoints: list[int]) -> None:
    """Question 1: e2e without endpoint, with one, with one, without, twice
    over (ORDER): two runs a side were within the noise of each other's
    difference (docs/performance.md, "The webhooks' sweep")."""
    _drain(ctx, "before the first e2e run", strict=False)
    runs: dict[str, list[dict]] = {"none": [], "endpoint": []}
    fig["e2e"] = runs
    endpoint = None
    for at, how in enumerate(ORDER):
        if how == "endpoint" and endpoint is None:
            endpoint = create_endpoint(ctx.db, receiver.url("ok"), "bench figure 9: answers 204")
            endpoints.append(endpoint)
        elif endpoint is not None:
            # Disabled, it is read and skipped as no endpoint would be.
            _set_enabled(ctx, endpoint, how == "endpoint")
        # CPU by process from the first request until the run's webhooks
        # are delivered too: what one endpoint costs a purchase, and where.
        window = e2e.cpu_window(ctx)
        window.start()
        try:
            run = _e2e(ctx, how)
            _drain(ctx, f"after the e2e run ({how})", endpoint if how == "endpoint" else None)
        finally:
            cpu = window.stop()
        run["cpu_ms_per_purchase"] = per_purchase(cpu, run["purchases"])
        runs[how].append(run)
        if how == "endpoint" and "endpoint" not in ORDER[at + 1 :]:
            assert endpoint is not None  # created by the first "endpoint" run
            fig["deliveries"] = _deliveries(ctx, endpoint)
            fig["deliveries"]["receiver_requests"] = receiver.count("ok")
            _set_enabled(ctx, endpoint, False)
    confirmed = sum(r["purchases"] for r in runs["endpoint"])
    got = fig["deliveries"]["receiver_requests"]
    log(
        f"   webhooks: {got} requests received for {confirmed} purchases confirmed, "
        f"{fig['deliveries']['delivered']} delivered, lag p50 "
        f"{fig['deliveries']['lag_p50_ms']:.0f} ms, p99 {fig['deliveries']['lag_p99_ms']:.0f} ms"
    )
    if got < confirmed:
        raise PhaseFailed(
            f"webhooks: the receiver got {got} requests for {confirmed} "
            "purchases confirmed with the endpoint"
        )


def _e2e(ctx: Context, how: str) -> dict:
    """Figure 2's measurement: first request to last CONFIRMED."""
    total = _purchases(ctx)
    ev = e2e.fixtures(ctx.db, total, f"bench webhooks e2e {how}")
    log(f"   e2e ({how}): {total} purchases at {e2e.CLIENTS} clients")
    t_first = time.time()
    statuses, errors = e2e._purchase(ctx, ev, total)
    t_sent = time.time()
    if statuses.get(202, 0) != total:
        raise PhaseFailed(f"webhooks e2e ({how}): statuses {statuses}: {errors}")
    seconds = float(e2e._wait_confirmed(ctx, ev, total)) - t_first
    log(f"   e2e ({how}): {total} confirmed in {seconds:.1f}s = {total / seconds:.1f}/s")
    return {
        "event": ev,
        "purchases": total,
        "seconds": seconds,
        "confirmed_per_s": total / seconds,
        "request_phase_seconds": t_sent - t_first,
    }


def _deliveries(ctx: Context, endpoint_id: int) -> dict:
    row = ctx.db.q1(
        "SELECT count(*) FILTER (WHERE status = 'delivered'),"
        " count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'failed'),"
        " count(*) FILTER (WHERE event_type = 'purchase.confirmed'),"
        " 1000 * percentile_cont(0.5) WITHIN GROUP"
        "  (ORDER BY extract(epoch FROM delivered_at - created_at)::float8),"
        " 1000 * percentile_cont(0.99) WITHIN GROUP"
        "  (ORDER BY extract(epoch FROM delivered_at - created_at)::float8),"
        " 1000 * max(extract(epoch FROM delivered_at - created_at)::float8)"
        " FROM webhooks_webhookdelivery WHERE endpoint_id = %s",
        [endpoint_id],
    )
    attempts, post_p50, post_p99 = ctx.db.q1(
        "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY a.latency_ms),"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY a.latency_ms)"
        " FROM webhooks_webhookattempt a JOIN webhooks_webhookdelivery d ON d.id = a.delivery_id"
        " WHERE d.endpoint_id = %s",
        [endpoint_id],
    )
    keys = (
        "delivered",
        "pending",
        "failed",
        "confirmed_type",
        "lag_p50_ms",
        "lag_p99_ms",
        "lag_max_ms",
    )
    out = dict(zip(keys, row, strict=True))
    out.update(attempts=attempts, post_p50_ms=post_p50, post_p99_ms=post_p99)
    return out


def _hanging(ctx: Context, fig: dict, receiver: Receiver, endpoints: list[int]) -> None:
    """Question 2: reserve with the worker consuming, no endpoint / a
    receiver that hangs / the same / no endpoint."""
    runs: dict[str, list[dict]] = {"none": [], "hanging": []}
    fig["reserve"] = runs
    endpoint = None
    for how in ("none", "hanging", "hanging", "none"):
        if how == "hanging":
            if endpoint is None:
                endpoint = create_endpoint(
                    ctx.db, receiver.url("hang"), "bench figure 9: hangs past the timeout"
                )
                endpoints.append(endpoint)
            else:
                _set_enabled(ctx, endpoint, True)
        before = _attempts(ctx, endpoint) if endpoint else None
        hang_before = receiver.count("hang")
        m = _reserve(ctx, how)
        if how == "hanging":
            assert endpoint is not None  # created above
            # Its deliveries fail at once from now on: the backlog drains.
            _set_enabled(ctx, endpoint, False)
        _drain(ctx, f"after the reserve run ({how})", endpoint if how == "hanging" else None)
        if how == "hanging":
            assert endpoint is not None and before is not None  # read above
            after = _attempts(ctx, endpoint)
            m["attempts"] = {k: after[k] - before[k] for k in ATTEMPT_COUNTS}
            m["receiver_requests"] = receiver.count("hang") - hang_before
            m["timed_out_max_ms"] = after["timed_out_max_ms"]
            log(
                f"   reserve (hanging): {m['attempts']['timed_out']} attempts timed out, "
                f"{m['receiver_requests']} requests received"
            )
        runs[how].append(m)


def _reserve(ctx: Context, how: str) -> dict:
    nseats = int(1000 * (ctx.warmup + ctx.dur)) + 1000
    ev, _ = reserve.fixtures(ctx.db, nseats, f"bench webhooks reserve {how}")
    m = closed_loop(
        ctx.stack,
        ctx.users,
        label=f"reserve {how} c={RESERVE_CLIENTS}",
        clients=RESERVE_CLIENTS,
        warmup=ctx.warmup,
        duration=ctx.dur,
        event_id=ev,
        nseats=nseats,
    )
    (confirmed,) = ctx.db.q1(
        "SELECT count(*) FROM purchases_purchasesaga WHERE event_id = %s AND state = 'CONFIRMED'",
        [ev],
    )
    m["confirmed_during_run"] = confirmed
    log(
        f"   reserve ({how}) c={RESERVE_CLIENTS}: {m['throughput_per_s']:.1f} req/s, "
        f"p50 {m['latency_202']['p50_ms']:.1f} ms, p99 {m['latency_202']['p99_ms']:.1f} ms, "
        f"{confirmed} confirmed meanwhile"
    )
    return m


def _attempts(ctx: Context, endpoint_id: int) -> dict:
    total, timed_out, delivered, unsent, slowest = ctx.db.q1(
        "SELECT count(*), count(*) FILTER (WHERE a.error LIKE 'timeout%%'),"
        " count(*) FILTER (WHERE a.status_code BETWEEN 200 AND 299),"
        " count(*) FILTER (WHERE a.latency_ms IS NULL),"
        " coalesce(max(a.latency_ms) FILTER (WHERE a.error LIKE 'timeout%%'), 0)"
        " FROM webhooks_webhookattempt a JOIN webhooks_webhookdelivery d ON d.id = a.delivery_id"
        " WHERE d.endpoint_id = %s",
        [endpoint_id],
    )
    return {
        "total": total,
        "timed_out": timed_out,
        "delivered": delivered,
        "not_sent": unsent,
        "timed_out_max_ms": slowest,
    }


def _clean_up(ctx: Context, receiver: Receiver, endpoints: list[int]) -> None:
    """Endpoints disabled, the stack drained, endpoints deleted, receiver
    stopped: whether the figure succeeded or not."""
    try:
        for endpoint in endpoints:
            _set_enabled(ctx, endpoint, False)
        receiver.release.set()  # the attempts still waiting end now
        if not _quiet(ctx, 120):
            log("!! webhooks: the stack did not drain; purging the queue")
            ctx.results["notes"].append("webhooks: the stack was not quiet after the figure")
            ctx.broker.purge()
        if endpoints:
            _delete_endpoints(ctx, endpoints)
    finally:
        receiver.stop()


# --- the table -------------------------------------------------------------------------


def _cpu_rows(runs: dict[str, list[dict]]) -> list[dict]:
    """CPU per purchase with the endpoint vs without (its webhook's delivery
    included), in total and for each process that used 0.5 ms more."""

    def cpu(how: str, key: str) -> float:
        return mean_of(runs[how], lambda r: r["cpu_ms_per_purchase"].get(key) or 0.0)

    out = [
        {
            "figure": "9 e2e CPU per purchase (webhook delivered), 1 endpoint vs none",
            "measured": f"{cpu('endpoint', 'total'):.1f} ms",
            "baseline": f"{cpu('none', 'total'):.1f} ms",
            "ratio": ratio(cpu("endpoint", "total"), cpu("none", "total")),
        }
    ]
    for key, label in LABELS.items():
        more = cpu("endpoint", key) - cpu("none", key)
        if more >= 0.5:
            out.append(
                {
                    "figure": f"9 e2e CPU per purchase, 1 endpoint vs none: {label}",
                    "measured": f"{cpu('endpoint', key):.2f} ms (+{more:.2f})",
                    "baseline": f"{cpu('none', key):.2f} ms",
                    "ratio": ratio(cpu("endpoint", key), cpu("none", key)),
                }
            )
    return out


def rows(fig: dict, *, poll_s: float | None) -> list[dict]:
    e2e_runs, d = fig["e2e"], fig["deliveries"]
    with_rate = mean_of(e2e_runs["endpoint"], lambda r: r["confirmed_per_s"])
    none_rate = mean_of(e2e_runs["none"], lambda r: r["confirmed_per_s"])
    confirmed = sum(r["purchases"] for r in e2e_runs["endpoint"])
    poll_ms = 1000 * poll_s if poll_s else None
    res = fig["reserve"]
    hang, none = res["hanging"], res["none"]

    def lat(runs: list[dict], p: str) -> float:
        return mean_of(runs, lambda r: r["latency_202"][f"{p}_ms"])

    timed_out = sum(m["attempts"]["timed_out"] for m in hang)
    received = sum(m["receiver_requests"] for m in hang)
    slowest = max(m["timed_out_max_ms"] for m in hang)
    c, timeout_s = fig["reserve_clients"], fig["webhook_timeout_s"]
    return [
        {
            "figure": f"9 e2e confirmed purchases/s (c={fig['e2e_clients']}), "
            "1 webhook endpoint vs none",
            "measured": f"{with_rate:.1f} /s",
            "baseline": f"{none_rate:.1f} /s",
            "ratio": ratio(with_rate, none_rate),
        },
        *_cpu_rows(e2e_runs),
        {
            "figure": f"9 webhook delivery lag p50 / p99 ({d['delivered']} of {confirmed} "
            f"delivered, {d['receiver_requests']} received)",
            "measured": f"{d['lag_p50_ms']:.0f} / {d['lag_p99_ms']:.0f} ms "
            f"(POST p50 {d['post_p50_ms']:.0f} ms)",
            "baseline": f"{poll_ms:.0f} ms relay poll" if poll_ms else "n/a",
            "ratio": ratio(d["lag_p99_ms"], poll_ms),
        },
        {
            "figure": f"9 reserve c={c} throughput, receiver hanging vs no endpoint",
            "measured": f"{mean_of(hang, lambda r: r['throughput_per_s']):.1f} req/s "
            f"({mean_of(hang, lambda r: r['confirmed_during_run']):.0f} confirmed)",
            "baseline": f"{mean_of(none, lambda r: r['throughput_per_s']):.1f} req/s "
            f"({mean_of(none, lambda r: r['confirmed_during_run']):.0f} confirmed)",
            "ratio": ratio(
                mean_of(hang, lambda r: r["throughput_per_s"]),
                mean_of(none, lambda r: r["throughput_per_s"]),
            ),
        },
        {
            "figure": f"9 reserve c={c} p50 / p99, receiver hanging vs no endpoint (p99 ratio)",
            "measured": f"{lat(hang, 'p50'):.1f} / {lat(hang, 'p99'):.1f} ms",
            "baseline": f"{lat(none, 'p50'):.1f} / {lat(none, 'p99'):.1f} ms",
            "ratio": ratio(lat(hang, "p99"), lat(none, "p99")),
        },
        {
            "figure": f"9 webhook attempts timed out ({timeout_s:g} s) of requests to the "
            "hanging receiver",
            "measured": f"{timed_out} (slowest {slowest / 1000:.1f} s)",
            "baseline": f"{received} received",
            "ratio": ratio(timed_out, received),
        },
    ]
