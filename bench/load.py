"""HTTP load: purchases over keep-alive connections, one user per client, and
the closed loop of figures 1 and 3."""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid

from bench import wire
from bench.common import PhaseFailed, lat_summary, log
from bench.db import token
from bench.machine import machine_busy_seconds, tree_cpu_seconds
from bench.stack import Stack


def http_client(base_url: str, user_id: int | None) -> wire.Client:
    """A client authenticated as the bench user ``user_id``, one keep-alive
    connection (``None``: anonymous; a request may still carry
    ``auth_headers``). A lean one: it shares the cores it loads
    (bench/wire.py)."""
    return wire.Client(base_url, headers=auth_headers(user_id) if user_id is not None else {})


def post_purchase(
    client: wire.Client, *, event_id: int, ref: str, headers: dict | None = None
) -> tuple[int, float, str]:
    """One purchase start (``headers``: e.g. another buyer's authorization
    than the client's own); (status, seconds, body head). A connection
    dropped by the server (keep-alive race) is retried once with the same
    Idempotency-Key, which is exactly what the key is for."""
    key = uuid.uuid4().hex
    body = {"event": event_id, "seats": [ref], "payment_method": "pm_card_visa"}
    started = time.perf_counter()
    for attempt in (1, 2):
        try:
            r = client.post(
                "/api/purchases/", json=body, headers={**(headers or {}), "Idempotency-Key": key}
            )
            head = "" if r.status_code in (202, 409) else r.text[:300]
            return r.status_code, time.perf_counter() - started, head
        except wire.TransportError as exc:
            if attempt == 2:
                return -1, time.perf_counter() - started, f"{type(exc).__name__}: {exc}"
    raise AssertionError("unreachable")


def auth_headers(user_id: int) -> dict[str, str]:
    return {"Authorization": f"Token {token(user_id)}"}


def start_purchase(
    client: wire.Client, body: dict, *, headers: dict | None = None
) -> tuple[int, float, dict]:
    """One purchase start with ``body`` (named ``seats`` or a ``quantity``);
    (status, seconds, the answer's JSON for a 202 or a 409, else
    ``{"head": ...}``). A dropped connection is retried once with the same
    Idempotency-Key, as in ``post_purchase``."""
    key = uuid.uuid4().hex
    started = time.perf_counter()
    for attempt in (1, 2):
        try:
            r = client.post(
                "/api/purchases/", json=body, headers={**(headers or {}), "Idempotency-Key": key}
            )
            secs = time.perf_counter() - started
            if r.status_code in (202, 409):
                return r.status_code, secs, r.json()
            return r.status_code, secs, {"head": r.text[:300]}
        except wire.TransportError as exc:
            if attempt == 2:
                return -1, time.perf_counter() - started, {"head": f"{type(exc).__name__}: {exc}"}
    raise AssertionError("unreachable")


class ClosedLoop:
    """``n`` threads, each its own connection, each sending the next request
    as soon as the previous one answered, until stopped or out of work
    (``total`` requests in all): what :func:`_measure` drives. A load says
    how a thread connects (``client``) and what its ``i``-th request is
    (``send``, which records it)."""

    def __init__(self, base_url: str, n: int, total: int):
        self.base_url, self.total = base_url, total
        self.stop = threading.Event()
        self.exhausted = threading.Event()
        self.counter = itertools.count()
        self.records: list[list[tuple]] = [[] for _ in range(n)]
        self.errors: list[str] = []
        self.barrier = threading.Barrier(n + 1, timeout=60)
        self.threads = [
            threading.Thread(target=self._loop, args=(k,), daemon=True) for k in range(n)
        ]

    def client(self, k: int) -> wire.Client:
        raise NotImplementedError

    def send(self, client: wire.Client, k: int, i: int) -> None:
        raise NotImplementedError

    def _loop(self, k: int) -> None:
        try:
            with self.client(k) as client:
                self.barrier.wait()
                while not self.stop.is_set():
                    i = next(self.counter)
                    if i >= self.total:
                        self.exhausted.set()
                        return
                    self.send(client, k, i)
        except threading.BrokenBarrierError:
            pass
        except Exception as exc:  # noqa: BLE001 - reported by the figure
            self.errors.append(f"client {k}: {type(exc).__name__}: {exc}")

    def done(self) -> int:
        return sum(len(r) for r in self.records)

    def end(self) -> None:
        self.stop.set()
        self.barrier.abort()
        for th in self.threads:
            th.join(60)


class _Clients(ClosedLoop):
    """One thread per list of ``buyers``, each its own connection; every
    request a new Idempotency-Key, the next free seat (S1, S2...) of the
    event, and the client's next buyer in turn. Records (sent, answered,
    secs, status)."""

    def __init__(self, base_url: str, buyers: list[list[int]], event_id: int, nseats: int):
        super().__init__(base_url, len(buyers), nseats)
        self.buyers, self.event_id = buyers, event_id
        self.turns = [
            itertools.cycle([auth_headers(u) for u in mine] if len(mine) > 1 else [{}])
            for mine in buyers
        ]

    def client(self, k: int) -> wire.Client:
        return http_client(self.base_url, self.buyers[k][0])

    def send(self, client: wire.Client, k: int, i: int) -> None:
        t = time.monotonic()
        status, secs, head = post_purchase(
            client, event_id=self.event_id, ref=f"S{i + 1}", headers=next(self.turns[k])
        )
        self.records[k].append((t, time.monotonic(), secs, status))
        if status != 202 and len(self.errors) < 5:
            self.errors.append(f"{status} {head}")


def _measure(
    run: ClosedLoop, roots: dict[str, int], label: str, warmup: float, duration: float
) -> tuple[float, dict]:
    """Release the clients, sample the CPU after the warm-up and at the end;
    returns (start, {"before": ..., "after": ...})."""
    cpu = {}
    run.barrier.wait()
    start = time.monotonic()
    warm_done = False
    end = start + warmup + duration
    last = start
    while time.monotonic() < end and not run.exhausted.is_set():
        time.sleep(0.2)
        if not warm_done and time.monotonic() >= start + warmup:
            warm_done = True
            cpu["before"] = (tree_cpu_seconds(roots), machine_busy_seconds())
        if time.monotonic() - last >= 5:
            log(f"   {label}: {run.done()} requests, {time.monotonic() - start:.0f}s")
            last = time.monotonic()
    cpu["after"] = (tree_cpu_seconds(roots), machine_busy_seconds())
    return start, cpu


def _cpu_per_request(cpu: dict, ok: int, duration: float) -> dict:
    if "before" not in cpu or not ok:
        return {}
    (b, mb), (a, ma) = cpu["before"], cpu["after"]
    used = {n: a[n] - b[n] for n in a}
    # The stack's processes are the bench's children: the client's own
    # share is its tree minus theirs.
    used["bench_client"] -= sum(v for n, v in used.items() if n != "bench_client")
    cpu_ms = {n: round(v * 1000 / ok, 2) for n, v in used.items()}
    cpu_ms["machine_all_processes"] = round((ma - mb) * 1000 / ok, 2)
    cpu_ms["machine_busy_percent"] = round((ma - mb) / duration / (os.cpu_count() or 1) * 100, 1)
    return cpu_ms


def closed_loop(
    stack: Stack,
    users: list[int],
    *,
    label: str,
    clients: int,
    warmup: float,
    duration: float,
    event_id: int,
    nseats: int,
    buyers_per_client: int = 1,
) -> dict:
    """``clients`` closed-loop clients for ``warmup`` + ``duration`` seconds,
    each buying in turn as ``buyers_per_client`` users of ``users``; what
    answered within the measured window, summarized."""
    b = buyers_per_client
    if len(users) < clients * b:
        raise ValueError(f"{clients} clients of {b} buyers need {clients * b} users")
    run = _Clients(
        stack.base_url, [users[k * b : (k + 1) * b] for k in range(clients)], event_id, nseats
    )
    for th in run.threads:
        th.start()
    roots = {**{n: p.pid for n, p in stack.procs.items()}, "bench_client": os.getpid()}
    try:
        start, cpu = _measure(run, roots, label, warmup, duration)
    finally:
        run.end()
    if run.exhausted.is_set():
        raise PhaseFailed(f"{label}: the event ran out of seats ({nseats})")
    stack.check_alive()
    w0, w1 = start + warmup, start + warmup + duration
    window = [r for rs in run.records for r in rs if w0 <= r[1] <= w1]
    statuses: dict[str, int] = {}
    for r in window:
        statuses[str(r[3])] = statuses.get(str(r[3]), 0) + 1
    ok = [r[2] for r in window if r[3] == 202]
    bad = len(window) - len(ok)
    out = {
        "clients": clients,
        "duration_s": duration,
        "warmup_s": warmup,
        "cpu_ms_per_202": _cpu_per_request(cpu, len(ok), duration),
        "requests": len(window),
        "statuses": statuses,
        "throughput_per_s": len(ok) / duration,
        "latency_202": lat_summary(ok),
        "errors_sample": run.errors,
        "started_total": run.done(),
        "buyers_per_client": b,
    }
    if bad > max(1, 0.01 * len(window)):
        raise PhaseFailed(f"{label}: {bad} of {len(window)} requests were not 202: {run.errors}")
    return out
