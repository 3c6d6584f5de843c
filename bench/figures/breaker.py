"""Figure 17: the breaker on the processor (issue 36, part 3). Buyers arrive
at a steady pace while the fake processor stops answering, then heals: how
many purchases were accepted while the breaker was open and the processor
down (goal 0), how long the breaker took to open and how long purchases
took to start again once the processor healed.

The stack as it runs, with the breaker's defaults (``PAYMENT_BREAKER_*``:
10 failures in a row, 30 s reset, a trial every 5 s) and beat started for
the figure (the trial is beat's). ``RATE`` purchases a second, one seat
each, from ``CLIENTS`` paced clients (open loop: a slow answer does not
slow the arrivals), for ``HEALTHY_S`` with the processor up; then the fake
processor's gunicorn is stopped (SIGSTOP: its socket accepts, nothing
answers, each gateway call times out after ``PAYMENT_GATEWAY_TIMEOUT_SECONDS``)
for ``OUTAGE_S``, longer than the reset time so that one trial fails; then
continued (SIGCONT), and the load goes on until purchases are accepted again
(at most ``RECOVER_LIMIT_S``) and ``AFTER_S`` more.

Measured, by the time each request was sent: the 202s before the outage,
the 202s between the outage and the first 503 (the breaker still counting
its failures: what detection costs), the 202s after the first 503 and
before the processor healed (goal 0), the 503s' ``payments_paused`` code,
the time from the outage to the first 503 and from the heal to the first
202. The figure fails on an answer that is neither 202 nor 503
``payments_paused``, on any 202 accepted while open and down, or on a seat
sold twice.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import Context, Figure, PhaseFailed, log
from bench.db import BenchDB
from bench.figures import onsale
from bench.load import http_client, post_purchase
from devtools.processes import poll, signal_group

FIGURE = Figure(phase="breaker", key="17_breaker", label="17 breaker", timeout=lambda ctx: 420)
RATE = 10.0  # purchases a second
CLIENTS = 4
HEALTHY_S = 10.0
OUTAGE_S = 50.0
RECOVER_LIMIT_S = 90.0
AFTER_S = 5.0
SEATS = int(RATE * (HEALTHY_S + OUTAGE_S + RECOVER_LIMIT_S + AFTER_S)) + 100


def fixtures(db: BenchDB, scale: int = SEATS) -> int:
    """Figure 17's database fixture: an event of ``scale`` seats S1..S<scale>."""
    return db.make_event("bench breaker", scale)[0]


class Arrivals:
    """``CLIENTS`` threads sending one purchase each ``CLIENTS / RATE``
    seconds, every one at its own slot, until stopped; each answer kept as
    (sent at, status, code)."""

    def __init__(self, ctx: Context, event_id: int):
        self.ctx, self.event_id = ctx, event_id
        self.answers: list[tuple[float, int, str]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.next_seat = 0
        self.started = time.monotonic()
        self.threads = [
            threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(CLIENTS)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def since(self, at: float) -> list[tuple[float, int, str]]:
        with self.lock:
            return [a for a in self.answers if a[0] >= at]

    def _client(self, n: int) -> None:
        client = http_client(self.ctx.stack.base_url, self.ctx.users[n])
        every = CLIENTS / RATE
        slot = self.started + n * every / CLIENTS
        while not self.stopping.is_set():
            slot += every
            time.sleep(max(0.0, slot - time.monotonic()))
            with self.lock:
                self.next_seat += 1
                seat = self.next_seat
            sent = time.monotonic()
            status, _, head = post_purchase(client, event_id=self.event_id, ref=f"S{seat}")
            code = _code(head) if status == 503 else ""
            with self.lock:
                self.answers.append((sent, status, code))
        client.close()


def _code(head: str) -> str:
    try:
        return json.loads(head).get("code", "")
    except ValueError:
        return head[:60]


def run(ctx: Context) -> None:
    fig: dict[str, Any] = {"rate": RATE, "clients": CLIENTS, "outage_s": OUTAGE_S}
    ctx.results["figures"][FIGURE.key] = fig
    event_id = fixtures(ctx.db)
    ctx.stack.start_beat(Path(ctx.logdir) / "celerybeat-schedule")
    gateway = ctx.stack.procs["gateway"]
    arrivals = Arrivals(ctx, event_id)
    try:
        arrivals.start()
        time.sleep(HEALTHY_S)
        down = time.monotonic()
        log(f"   stopping the fake processor (SIGSTOP) for {OUTAGE_S:.0f}s")
        signal_group(gateway, signal.SIGSTOP)
        try:
            time.sleep(OUTAGE_S)
        finally:
            signal_group(gateway, signal.SIGCONT)
        healed = time.monotonic()
        log("   the fake processor continues (SIGCONT): waiting for a purchase accepted")
        recovered = poll(
            lambda: any(s == 202 for _, s, _ in arrivals.since(healed)),
            timeout=RECOVER_LIMIT_S,
            every=0.1,
        )
        time.sleep(AFTER_S)
    finally:
        arrivals.stop()
        ctx.stack.stop("beat")
    fig.update(_measure(arrivals.answers, down=down, healed=healed, recovered=recovered))
    fig["double_sales"] = sum(onsale.double_sales(ctx.db, event_id))
    fig["sagas_by_state"] = dict(
        ctx.db.q(
            "SELECT state, count(*) FROM purchases_purchasesaga WHERE event_id = %s GROUP BY 1",
            [event_id],
        )
    )
    log(f"   breaker: {json.dumps({k: v for k, v in fig.items() if k != 'sagas_by_state'})}")
    ctx.rows += rows(fig)
    _judge(fig)


def _measure(
    answers: list[tuple[float, int, str]], *, down: float, healed: float, recovered: bool
) -> dict:
    first_503 = min((t for t, s, _ in answers if s == 503 and t >= down), default=None)
    opened = first_503 if first_503 is not None else healed
    back = min((t for t, s, _ in answers if s == 202 and t >= healed), default=None)
    between = [(t, s, c) for t, s, c in answers if opened <= t < healed]
    return {
        "requests": len(answers),
        "accepted_before_outage": sum(1 for t, s, _ in answers if s == 202 and t < down),
        "accepted_before_open": sum(1 for t, s, _ in answers if s == 202 and down <= t < opened),
        "accepted_while_open_and_down": sum(1 for _, s, _ in between if s == 202),
        "refused_while_open_and_down": sum(1 for _, s, _ in between if s == 503),
        "accepted_after_heal": sum(1 for t, s, _ in answers if s == 202 and t >= healed),
        "statuses": dict(Counter(f"{s} {c}".strip() for _, s, c in answers)),
        "seconds_to_open": round(first_503 - down, 2) if first_503 is not None else None,
        "seconds_to_recover": round(back - healed, 2) if back is not None and recovered else None,
    }


def rows(fig: dict) -> list[dict]:
    return [
        {
            "figure": "17 breaker: purchases accepted while open and the processor down",
            "measured": str(fig["accepted_while_open_and_down"]),
            "baseline": f"{fig['refused_while_open_and_down']} refused (goal 0 accepted)",
            "ratio": "",
        },
        {
            "figure": "17 breaker: seconds from the outage to the first 503",
            "measured": f"{fig['seconds_to_open']}",
            "baseline": f"{fig['accepted_before_open']} accepted meanwhile",
            "ratio": "",
        },
        {
            "figure": "17 breaker: seconds from the heal to the first 202",
            "measured": f"{fig['seconds_to_recover']}",
            "baseline": "reset 30 s + trial 5 s at most",
            "ratio": "",
        },
    ]


def _judge(fig: dict) -> None:
    unexpected = {
        k: v for k, v in fig["statuses"].items() if k not in ("202", "503 payments_paused")
    }
    problems = []
    if unexpected:
        problems.append(f"unexpected answers {unexpected}")
    if fig["accepted_while_open_and_down"]:
        problems.append(f"{fig['accepted_while_open_and_down']} accepted while open and down")
    if fig["seconds_to_open"] is None:
        problems.append("the breaker never opened")
    if fig["seconds_to_recover"] is None:
        problems.append(f"no purchase accepted within {RECOVER_LIMIT_S:.0f}s of the heal")
    if fig["double_sales"]:
        problems.append(f"{fig['double_sales']} seats sold twice")
    if problems:
        raise PhaseFailed("; ".join(problems))
