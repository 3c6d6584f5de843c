"""Figure 11: end to end with 2 relays and 2 worker pools (two ``celery
worker`` processes of 4 on the same queue, two ``run_relay``) against 1 + 1,
on the same database, in the same run: the confirmed rate as figure 2
measures it (same purchases, same 8 clients, zero-latency gateway), the
drain after the requests, and the checks that scaling out broke nothing.
Measured in the order 1+1, 2+2, 2+2, 1+1 (the machine's drift weighs on
both sides alike), each run from a quiet stack, on a fresh event.

Checked after each run, on its event: every purchase confirmed exactly once
(one ``CONFIRMED`` saga per purchase, one history row into ``CONFIRMED``,
one ``purchase.confirmed`` row, one sold seat); every outbox row's consumers
ran once (a completed row's inbox entries are the consumers its topic routes
to, each once; a cancelled timer has none); no row left owed or dead; the
ledger has one charge per confirmed purchase and nothing else; the analytics
counted each confirmation once; no saga left non-terminal. The figure fails
on any of these, after its rows are in the table.
"""

from __future__ import annotations

import statistics

from bench.common import Context, Figure, PhaseFailed, log, ratio
from bench.db import BenchDB
from bench.figures import e2e, gateway_latency, webhooks

FIGURE = Figure(
    phase="scaleout",
    key="11_scale_out",
    label="11 e2e 2 relays + 2 pools vs 1 + 1",
    timeout=lambda ctx: 300 + 4 * (180 + e2e.purchases(ctx) / 5),
)
ORDER = ("1+1", "2+2", "2+2", "1+1")


def run(ctx: Context) -> None:
    total = e2e.purchases(ctx)
    runs: dict[str, list[dict]] = {"1+1": [], "2+2": []}
    fig = {"purchases_per_run": total, "clients": e2e.CLIENTS, "order": ORDER, "runs": runs}
    ctx.results["figures"][FIGURE.key] = fig
    if ctx.stack.latency_ms != 0:
        gateway_latency.restart_with(ctx, 0)  # figure 3 leaves the gateway at 300 ms
    app = ctx.broker.app
    try:
        for how in ORDER:
            if how == "2+2" and "worker2" not in ctx.stack.procs:
                log("   starting a second worker pool and a second relay")
                ctx.stack.scale_out(app)
            elif how == "1+1" and "worker2" in ctx.stack.procs:
                log("   stopping the second worker pool and the second relay")
                ctx.stack.scale_in()
            if not webhooks._quiet(ctx, 120):
                ctx.results["notes"].append(
                    f"scale-out ({how}): the stack was not quiet before the run"
                )
            ev = fixtures(ctx.db, total, how)
            m = e2e.measure(ctx, ev, total, f"e2e {how}")
            m["checks"] = checks(ctx, ev, total)
            runs[how].append(m)
            problems = m["checks"]["problems"]
            log(f"   e2e {how}: checks " + ("ok" if not problems else f"FAILED: {problems}"))
    finally:
        ctx.stack.scale_in()
    ctx.rows += rows(fig)
    problems = [p for rs in runs.values() for r in rs for p in r["checks"]["problems"]]
    if problems:
        raise PhaseFailed(f"scale-out: {len(problems)} problems: {problems[:5]}")


def fixtures(db: BenchDB, scale: int, how: str = "1+1") -> int:
    """Figure 11's database fixture, one per run: figure 2's, an event of
    ``scale`` seats, one per purchase."""
    return e2e.fixtures(db, scale, f"bench scale-out {how}")


def checks(ctx: Context, ev: int, total: int) -> dict:
    """What must hold on the event's rows once the run has drained."""
    from django.conf import settings  # Django is set up by run.py, from the stack's env

    q1 = ctx.db.q1
    sagas, confirmed, live = q1(
        "SELECT count(*), count(*) FILTER (WHERE state = 'CONFIRMED'),"
        " count(*) FILTER (WHERE state NOT IN ('CONFIRMED', 'COMPENSATED'))"
        " FROM purchases_purchasesaga WHERE event_id = %s",
        [ev],
    )
    (not_once,) = q1(
        "SELECT count(*) FROM (SELECT s.id FROM purchases_purchasesaga s"
        " LEFT JOIN purchases_sagahistory h ON h.saga_id = s.id AND h.to_state = 'CONFIRMED'"
        " WHERE s.event_id = %s AND s.state = 'CONFIRMED' GROUP BY s.id"
        " HAVING count(h.id) <> 1) x",
        [ev],
    )
    (sold,) = q1(
        "SELECT count(*) FROM purchases_seat WHERE event_id = %s AND status = 'sold'", [ev]
    )
    ledger, ledger_sagas, charges = q1(
        "SELECT count(*), count(DISTINCT saga_id), count(*) FILTER (WHERE kind = 'charge')"
        " FROM ledger_ledgerentry WHERE event_id = %s",
        [ev],
    )
    (analytics,) = q1(
        "SELECT coalesce(sum(confirmed_count), 0) FROM purchases_dailysales WHERE event_id = %s",
        [ev],
    )
    messages = ctx.db.q(
        "SELECT m.id, m.topic, m.only_consumers, m.completed_at IS NOT NULL,"
        " m.cancelled_at IS NOT NULL, m.dead_at IS NOT NULL, m.available_at <= now(),"
        " m.deliveries, m.saga_id, i.n, coalesce(i.consumers, '{}')"
        " FROM outbox_outboxmessage m, LATERAL (SELECT count(*) AS n,"
        "  array_agg(consumer) AS consumers FROM outbox_inboxentry"
        "  WHERE message_id = m.id) i"
        " WHERE m.event_id = %s",
        [ev],
    )
    confirmed_rows = [m for m in messages if m[1] == "purchase.confirmed"]
    wrong_consumers, duplicates, owed, dead, handed_twice = 0, 0, 0, 0, 0
    for (
        _id,
        topic,
        only,
        completed,
        cancelled,
        is_dead,
        due,
        deliveries,
        _saga,
        n,
        consumers,
    ) in messages:
        routed = [c for c in settings.OUTBOX_CONSUMERS.get(topic, []) if only is None or c in only]
        duplicates += n != len(set(consumers))
        if completed:
            wrong_consumers += sorted(set(consumers)) != sorted(routed)
        elif cancelled:
            wrong_consumers += bool(consumers)
        elif is_dead:
            dead += 1
        elif due:
            owed += 1
        handed_twice += (deliveries or 0) > 1
    out = {
        "sagas": sagas,
        "confirmed": confirmed,
        "non_terminal": live,
        "confirmed_not_exactly_once_in_history": not_once,
        "seats_sold": sold,
        "confirmed_events": len(confirmed_rows),
        "confirmed_events_sagas": len({m[8] for m in confirmed_rows}),
        "ledger_entries": ledger,
        "ledger_sagas": ledger_sagas,
        "ledger_charges": charges,
        "analytics_confirmed": analytics,
        "outbox_rows": len(messages),
        "rows_with_wrong_consumers": wrong_consumers,
        "rows_with_duplicate_inbox": duplicates,
        "rows_owed": owed,
        "rows_dead": dead,
        "rows_handed_over_more_than_once": handed_twice,
    }
    expect = {
        "sagas": total,
        "confirmed": total,
        "non_terminal": 0,
        "confirmed_not_exactly_once_in_history": 0,
        "seats_sold": total,
        "confirmed_events": total,
        "confirmed_events_sagas": total,
        "ledger_entries": total,
        "ledger_sagas": total,
        "ledger_charges": total,
        "analytics_confirmed": total,
        "rows_with_wrong_consumers": 0,
        "rows_with_duplicate_inbox": 0,
        "rows_owed": 0,
        "rows_dead": 0,
    }
    out["problems"] = [f"{k} {out[k]} (want {v})" for k, v in expect.items() if out[k] != v]
    return out


# --- the table ---------------------------------------------------------------------------


def _mean(runs: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in runs)


def rows(fig: dict) -> list[dict]:
    runs = fig["runs"]
    if not (runs["1+1"] and runs["2+2"]):
        return []
    one, two = runs["1+1"], runs["2+2"]
    all_runs = one + two
    problems = sum(len(r["checks"]["problems"]) for r in all_runs)
    twice = sum(r["checks"]["rows_handed_over_more_than_once"] for r in all_runs)
    c = fig["clients"]
    return [
        {
            "figure": f"11 e2e confirmed/s (c={c}), 2 relays + 2 worker pools vs 1 + 1",
            "measured": f"{_mean(two, 'confirmed_per_s'):.1f} /s",
            "baseline": f"{_mean(one, 'confirmed_per_s'):.1f} /s",
            "ratio": ratio(_mean(two, "confirmed_per_s"), _mean(one, "confirmed_per_s")),
        },
        {
            "figure": "11 e2e drain after the last request, 2 + 2 vs 1 + 1",
            "measured": f"{_mean(two, 'drain_seconds'):.1f} s",
            "baseline": f"{_mean(one, 'drain_seconds'):.1f} s",
            "ratio": ratio(_mean(two, "drain_seconds"), _mean(one, "drain_seconds")),
        },
        {
            "figure": f"11 checks ({len(all_runs)} runs): confirmed once, consumers once, "
            "ledger, terminal",
            "measured": f"{problems} problems",
            "baseline": "0",
            "ratio": "ok" if not problems else "FAILED",
            "note": f"{twice} rows handed over twice",
        },
    ]
