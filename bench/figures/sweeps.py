"""Figure 6: the statements the resumer, the chaser and the relay send,
captured from the product's own functions, with EXPLAIN (ANALYZE, BUFFERS) on
a database with 10,000 finished sagas and then 1,000,000 (``--sweeps-large``)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from psycopg import Connection, Rollback

from bench.common import SWEEPS_DB, Context, Figure, log, ratio
from bench.db import BENCH_ORGANIZER_SQL, BenchDB

FIGURE = Figure(
    phase="sweeps",
    key="6_sweeps",
    label="6 sweeps at scale",
    timeout=lambda ctx: 600 if not ctx.full else 1800,
)
SMALL = 10_000
# Adding more finished sagas than this at once drops the plain indexes first
# and rebuilds them after (add_finished).
REBUILD_ABOVE = 50_000


def capture_sweep_sql() -> dict[str, str]:
    """The exact statements the resumer, the chaser and the relay send,
    captured from the product's own functions (on the bench database)."""
    # After django.setup() (run.py: setup): the product's modules need the apps loaded.
    from django.conf import settings
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from outbox.relay import next_due_in, relay_claim
    from purchases.ops.sweeps import stale_sagas, sweep_chase

    now = timezone.now()
    out = {}
    # The statements run here for real, on the bench database the earlier
    # figures filled (tens of thousands of never-charged sagas): with the
    # bulk loads not yet analysed, the resumer's anti-join was planned as a
    # nested loop over every due timer and ran for ten minutes.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE purchases_purchasesaga")
        cursor.execute("ANALYZE outbox_outboxmessage")
    with CaptureQueriesContext(connection) as ctx:
        list(
            stale_sagas(older_than=settings.RESUME_AFTER_SECONDS, now=now).values_list(
                "pk", "state"
            )
        )
    out["resumer: stale_sagas"] = ctx.captured_queries[-1]["sql"]
    with CaptureQueriesContext(connection) as ctx:
        sweep_chase(now=now)
    chase = [
        q["sql"]
        for q in ctx.captured_queries
        if q["sql"].startswith("SELECT")
        and '"purchases_purchasesaga"' in q["sql"]
        and "FOR UPDATE" not in q["sql"]
    ]
    for i, sql in enumerate(chase, 1):
        out[f"chaser: query {i}"] = sql
    with CaptureQueriesContext(connection) as ctx:
        relay_claim(now=now, limit=settings.OUTBOX_BATCH_SIZE)
    out["relay: relay_claim"] = next(
        q["sql"] for q in ctx.captured_queries if q["sql"].startswith("SELECT")
    )
    with CaptureQueriesContext(connection) as ctx:
        next_due_in(now=now)
    out["relay: next_due_in"] = ctx.captured_queries[-1]["sql"]
    connection.close()
    return out


def _plan_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from _plan_nodes(child)


def explain(conn: Connection, sql: str, repeat: int = 7) -> dict:
    """EXPLAIN (ANALYZE, BUFFERS) ``repeat`` times, each rolled back (EXPLAIN
    ANALYZE of a SELECT ... FOR UPDATE takes row locks; nothing is kept);
    the median execution time without the first (warm-up) run."""
    times: list[float] = []
    plan: Any = None
    for _ in range(repeat):
        with conn.transaction():
            row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql).fetchone()
            assert row is not None  # EXPLAIN answers one row
            plan = row[0][0]
            times.append(plan["Execution Time"])
            raise Rollback()
    root = plan["Plan"]
    scans = sorted(
        {
            f"{n['Node Type']}:{n.get('Index Name') or n.get('Relation Name')}"
            for n in _plan_nodes(root)
            if "Scan" in n["Node Type"]
        }
    )
    return {
        "exec_ms_median": statistics.median(times[1:]),
        "exec_ms_all": times,
        "buffers": root.get("Shared Hit Blocks", 0) + root.get("Shared Read Blocks", 0),
        "rows": root.get("Actual Rows"),
        "scans": scans,
    }


def run(ctx: Context) -> None:
    large = ctx.args.sweeps_large or 1_000_000
    queries = capture_sweep_sql()
    (ctx.logdir / "sweeps-captured.sql").write_text(
        "\n\n".join(f"-- {k}\n{v};" for k, v in queries.items())
    )
    db = BenchDB(ctx.pg.connect(SWEEPS_DB))
    fig: dict[str, Any] = {"queries": queries, "sizes": {}}
    ctx.results["figures"][FIGURE.key] = fig
    try:
        made = 0
        for size in (SMALL, large):
            t = time.monotonic()
            log(f"   sweeps: generating {size - made:,} finished sagas (set-based)")
            made = fixtures(db, size, made=made)
            gen_s = time.monotonic() - t
            log(f"   sweeps: {size:,} finished sagas in place ({gen_s:.0f}s); EXPLAIN ANALYZE")
            fig["sizes"][str(size)] = {
                "generate_seconds": gen_s,
                "plans": {name: explain(db.conn, sql) for name, sql in queries.items()},
            }
    finally:
        db.close()
    label = f"{large // 1000}k" if large < 1_000_000 else f"{large / 1e6:g}M"
    for name in queries:
        a = fig["sizes"][str(SMALL)]["plans"][name]
        b = fig["sizes"][str(large)]["plans"][name]
        ctx.rows.append(row(name, label, small=a, large=b))
        log(
            f"   {name}: {a['exec_ms_median']:.3f} ms -> {b['exec_ms_median']:.3f} ms "
            f"({a['buffers']} -> {b['buffers']} buffers) {b['scans']}"
        )


def row(name: str, label: str, *, small: dict, large: dict) -> dict:
    seq = [
        s
        for s in large["scans"]
        if s.startswith("Seq Scan") and ("purchasesaga" in s or "outboxmessage" in s)
    ]
    return {
        "figure": f"6 {name} @{label} vs 10k",
        "measured": f"{large['exec_ms_median']:.3f} ms {large['buffers']} buf",
        "baseline": f"{small['exec_ms_median']:.3f} ms {small['buffers']} buf",
        "ratio": ratio(large["exec_ms_median"], small["exec_ms_median"]),
        "note": "SEQ SCAN " + ",".join(seq) if seq else "",
    }


# --- the data: set-based generation ----------------------------------------------------


def fixtures(db: BenchDB, scale: int, *, made: int = 0, rebuild_indexes: bool | None = None) -> int:
    """Figure 6's database at ``scale`` finished sagas: the live ones first
    (when ``made`` is 0), then the finished ones from ``made`` up to
    ``scale`` (``add_finished``; the plain indexes rebuilt around the insert
    if more than ``REBUILD_ABOVE`` are added, unless ``rebuild_indexes``
    says). Returns ``scale``, the next call's ``made``."""
    if made == 0:
        seed_live(db)
    count = scale - made
    add_finished(
        db,
        start=made,
        count=count,
        rebuild_indexes=count > REBUILD_ABOVE if rebuild_indexes is None else rebuild_indexes,
    )
    return scale


def seed_live(db: BenchDB) -> None:
    """A handful of live sagas and due outbox rows, so that every measured
    query finds something: 3 stale PENDING (one of them on a driving timer),
    1 COMPENSATION_PENDING past the deadline, 1 UNKNOWN_EXPIRED, 5 due rows."""
    conn = db.conn
    with conn.transaction():
        conn.execute(
            "INSERT INTO auth_user (password, is_superuser, username, first_name,"
            " last_name, email, is_staff, is_active, date_joined)"
            " VALUES ('!', false, 'sweeps', '', '', '', false, true, now())"
        )
        conn.execute(
            f"WITH o AS ({BENCH_ORGANIZER_SQL})"
            " INSERT INTO purchases_event (organizer_id, name, starts_at, status, currency,"
            " cancel_fee_percent)"
            " SELECT o.id, 'sweeps', now() + interval '30 days', 'on_sale', 'EUR', 0 FROM o"
        )
        conn.execute("""
            WITH r AS (
              INSERT INTO purchases_reservation (ref, event_id, buyer_id, status,
                  hold_expires_at, total_amount, currency, created_at)
              SELECT 'L' || g, (SELECT max(id) FROM purchases_event),
                     (SELECT max(id) FROM auth_user), 'HELD', now() + interval '1 hour', 100,
                     'EUR', now() - interval '3 days'
              FROM generate_series(1, 5) g RETURNING id, ref
            )
            INSERT INTO purchases_purchasesaga (id, reservation_id, event_id, buyer_id,
                intent_id, payment_method, amount, currency, state, version, attempts,
                created_at, updated_at)
            SELECT gen_random_uuid(), r.id, (SELECT max(id) FROM purchases_event),
                   (SELECT max(id) FROM auth_user), 'pi_' || r.ref, 'pm_card_visa', 100, 'EUR',
                   (ARRAY['PENDING', 'PENDING', 'PENDING', 'COMPENSATION_PENDING',
                          'UNKNOWN_EXPIRED'])[substr(r.ref, 2)::int],
                   2, 1, now() - interval '3 days', now() - interval '2 days'
            FROM r
        """)
        conn.execute("""
            INSERT INTO outbox_outboxmessage (topic, payload, key, event_id, saga_id, created_at,
                available_at, due_at, deliveries)
            SELECT 'purchase.reconcile', '{}', 'reconcile:' || s.id, s.event_id, s.id, now(),
                   now() + interval '10 minutes', now() + interval '10 minutes', 0
            FROM purchases_purchasesaga s WHERE s.intent_id = 'pi_L1'
        """)
        db.noop_rows(5, key_prefix=None, lead_s=-60.0, window_s=0.0)


FINISHED_SAGAS = """
            WITH r AS (
              INSERT INTO purchases_reservation (ref, event_id, buyer_id, status,
                  hold_expires_at, total_amount, currency, created_at)
              SELECT 'X' || g, (SELECT max(id) FROM purchases_event),
                     (SELECT max(id) FROM auth_user),
                     CASE WHEN g %% 2 = 0 THEN 'CONFIRMED' ELSE 'CANCELLED' END,
                     now() - interval '1 day', 100, 'EUR', now() - interval '1 day'
              FROM generate_series(%s::bigint, %s::bigint) g RETURNING id, ref, status
            )
            INSERT INTO purchases_purchasesaga (id, reservation_id, event_id, buyer_id,
                intent_id, payment_method, amount, currency, state, version, attempts,
                created_at, updated_at)
            SELECT gen_random_uuid(), r.id, (SELECT max(id) FROM purchases_event),
                   (SELECT max(id) FROM auth_user), 'pi_' || r.ref, 'pm_card_visa', 100, 'EUR',
                   CASE WHEN r.status = 'CONFIRMED' THEN 'CONFIRMED' ELSE 'COMPENSATED' END,
                   4, 1, now() - interval '1 day', now() - interval '1 day'
            FROM r
        """
FINISHED_OUTBOX = """
            INSERT INTO outbox_outboxmessage (topic, payload, key, event_id, saga_id, created_at,
                available_at, fired_at, handed_over_at, cancelled_at, completed_at, deliveries)
            SELECT 'purchase.hold_expired', '{}'::jsonb, 'hold:' || s.id, s.event_id, s.id,
                   s.created_at, s.created_at + interval '15 minutes',
                   CASE WHEN s.state = 'COMPENSATED' THEN s.updated_at END,
                   CASE WHEN s.state = 'COMPENSATED' THEN s.updated_at END,
                   CASE WHEN s.state = 'CONFIRMED' THEN s.updated_at END,
                   CASE WHEN s.state = 'COMPENSATED' THEN s.updated_at END,
                   CASE WHEN s.state = 'COMPENSATED' THEN 1 ELSE 0 END
            FROM purchases_purchasesaga s JOIN purchases_reservation r ON r.id = s.reservation_id
            WHERE r.ref LIKE 'X%%' AND substr(r.ref, 2)::bigint BETWEEN %s AND %s
            UNION ALL
            SELECT CASE WHEN s.state = 'CONFIRMED' THEN 'purchase.confirmed'
                        ELSE 'purchase.cancelled' END,
                   '{}'::jsonb, NULL, s.event_id, s.id,
                   s.updated_at, s.updated_at, s.updated_at, s.updated_at,  -- created..handed
                   NULL, s.updated_at, 1
            FROM purchases_purchasesaga s JOIN purchases_reservation r ON r.id = s.reservation_id
            WHERE r.ref LIKE 'X%%' AND substr(r.ref, 2)::bigint BETWEEN %s AND %s
        """
TABLES = ("purchases_reservation", "purchases_purchasesaga", "outbox_outboxmessage")


def add_finished(db: BenchDB, *, start: int, count: int, rebuild_indexes: bool) -> None:
    """``count`` finished sagas, half CONFIRMED and half COMPENSATED, each with
    its reservation and its two finished outbox rows (the hold timer,
    cancelled or fired; the purchase.confirmed / purchase.cancelled event,
    completed). Set-based; for big counts the plain (non-constraint) indexes
    are dropped and rebuilt with their exact definitions, and FK triggers are
    skipped (the rows reference an event and a user that exist)."""
    conn = db.conn
    saved = []
    conn.execute("SET maintenance_work_mem = '256MB'")
    with conn.transaction():
        if rebuild_indexes:
            saved = conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes i WHERE tablename = ANY(%s)"
                " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)",
                [list(TABLES)],
            ).fetchall()
            for name, _ in saved:
                conn.execute(f'DROP INDEX "{name}"')
        found = conn.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert found is not None  # the current user has a role
        (superuser,) = found
        if superuser:
            conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(FINISHED_SAGAS, [start + 1, start + count])
        conn.execute(FINISHED_OUTBOX, [start + 1, start + count, start + 1, start + count])
        for _, definition in saved:
            conn.execute(definition)
    # VACUUM also sets the visibility map the measured index-only scans
    # read; it cannot run inside a transaction, where a caller (the tests:
    # tests/test_bench_fixtures.py) gets the planner's statistics alone.
    analyze = "VACUUM ANALYZE" if conn.autocommit else "ANALYZE"
    for table in TABLES:
        conn.execute(f"{analyze} {table}")
