"""Every figure of `make bench` builds its database fixtures, at a tiny scale,
on the test database: a schema change that breaks what a figure writes fails
`make test`, not the next bench (figures 4 and 6 wrote outbox rows without
the event id for as long as nobody ran them: issue 30).

The figures are the modules of bench/figures/, each the runner's phase; each
exposes ``fixtures(db, scale)``, built from the functions its ``run`` uses
(bench/README.md, "Where the code is"), or says in ``NO_FIXTURES`` why it
writes nothing. Figure 1's pgbench script (bench/reserve.sql) writes the
product's tables too: one transaction of it runs here as well. Everything
runs in the test's transaction, through the bench's own ``BenchDB`` on
Django's connection, and is rolled back."""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest
from django.db import connection

import bench.figures
from bench.db import BenchDB
from bench.figures import WITH_STACK, WITHOUT_STACK, reserve, sweeps
from bench.figures import seller as figure_13
from bench.figures import stripe as figure_14
from seller.seat_maps import event_from_json

TINY = 3
MODULES = sorted(m.name for m in pkgutil.iter_modules(bench.figures.__path__))


@pytest.fixture
def bench_db(db) -> BenchDB:
    """The bench's database handle on the test database, the bench users
    seeded. A statement first, so that the builders' ``transaction()`` blocks
    are savepoints inside the test's transaction (on an idle connection
    psycopg would commit the outermost one)."""
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    handle = BenchDB(connection.connection)
    handle.seed(users=TINY)
    return handle


def _rows_written(handle: BenchDB) -> int:
    """Rows inserted, updated or deleted so far by this transaction."""
    (n,) = handle.q1(
        "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_xact_user_tables"
    )
    return int(n)


def test_every_module_of_bench_figures_is_a_phase_of_the_runner():
    modules = {importlib.import_module(f"bench.figures.{name}") for name in MODULES}
    assert len(MODULES) >= 12
    assert modules == set(WITH_STACK) | set(WITHOUT_STACK)


@pytest.mark.parametrize("name", MODULES)
def test_figure_builds_its_fixtures_on_the_current_schema(name, bench_db):
    module = importlib.import_module(f"bench.figures.{name}")
    build = getattr(module, "fixtures", None)
    if build is None:
        reason = getattr(module, "NO_FIXTURES", None)
        assert isinstance(reason, str) and reason.strip(), (
            f"bench/figures/{name}.py exposes no fixtures(db, scale) and no NO_FIXTURES reason"
        )
        return
    before = _rows_written(bench_db)
    build(bench_db, TINY)
    assert _rows_written(bench_db) > before, f"{name}.fixtures wrote no row"


def test_sweeps_fixtures_with_the_indexes_rebuilt(bench_db):
    """Figure 6's large batch (1M) drops the plain indexes and rebuilds them
    from their definitions around the insert."""

    def indexes() -> list[tuple]:
        # Not pg_indexes' text: a partial index's predicate recreated from it
        # is deparsed with other casts, the same condition.
        return bench_db.q(
            "SELECT c.relname, i.indrelid::regclass::text, i.indkey::text, i.indisunique,"
            " i.indpred IS NOT NULL, i.indisvalid FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid::regclass::text = ANY(%s) ORDER BY 1",
            [list(sweeps.TABLES)],
        )

    before = indexes()
    made = sweeps.fixtures(bench_db, TINY)
    # The bench commits the live sagas before; here they share the test's
    # transaction, and PostgreSQL will not rebuild an index of a table with
    # deferred foreign-key checks pending: run them now.
    bench_db.q("SET CONSTRAINTS ALL IMMEDIATE")
    sweeps.fixtures(bench_db, 2 * TINY, made=made, rebuild_indexes=True)
    assert indexes() == before
    (finished,) = bench_db.q1(
        "SELECT count(*) FROM purchases_purchasesaga WHERE state IN ('CONFIRMED', 'COMPENSATED')"
    )
    assert finished == 2 * TINY


def test_reserve_script_runs_on_the_current_schema(bench_db):
    """Figure 1's baseline, bench/reserve.sql, writes the product's tables
    too: one transaction of it, with the variables pgbench would give client
    0's first run (its BEGIN and COMMIT left to the test's transaction)."""
    users = bench_db.q("SELECT id FROM auth_user WHERE username LIKE 'bench-%%' ORDER BY id")
    event, idoff = reserve.fixtures(bench_db, TINY)
    values = {"ev": event, "idoff": idoff, "ubase": users[0][0], "run": 1, "hold": 7200}
    values.update(i=1, client_id=0, n=1, seat=idoff + 1, uid=users[0][0])
    for statement in reserve.script_statements():
        if statement.rstrip(";") in ("BEGIN", "COMMIT"):
            continue
        sql, gset = statement.split("\\gset")[0], "\\gset" in statement
        sql = re.sub(r"(?<!:):(\w+)", lambda m: str(values[m.group(1)]), sql)
        rows = bench_db.q(sql)
        if gset:
            values["res_id"] = rows[0][0]
    assert bench_db.q1(
        "SELECT (SELECT status FROM purchases_seat WHERE id = %(seat)s),"
        " (SELECT state FROM purchases_purchasesaga WHERE event_id = %(ev)s),"
        " (SELECT topic FROM outbox_outboxmessage WHERE event_id = %(ev)s)",
        {"seat": idoff + 1, "ev": event},
    ) == ("held", "PENDING", "purchase.hold_expired")


def test_figure_13s_api_body_is_the_seat_map_it_copies():
    """Figure 13 times the seller's API against COPY of the same rows: the
    body it posts, read by the product's own reader, must be exactly the
    seats and categories its baseline copies (here across a section's end
    and every price band)."""
    seats = figure_13.seat_rows(figure_13.SECTION_ROWS * figure_13.ROW_SEATS + 3)
    spec = event_from_json(figure_13.api_body("bench seller", seats))
    assert [
        (s.ref, s.section, s.row, s.number, s.category, s.x, s.y, s.accessible) for s in spec.seats
    ] == seats
    assert [(c.code, c.name, c.price_amount) for c in spec.categories] == list(figure_13.CATEGORIES)
    assert {s[1] for s in seats} == set(figure_13.SECTIONS[:2])
    assert {s[4] for s in seats} == {code for code, _, _ in figure_13.CATEGORIES}


def test_figure_12s_web_without_tracing_starts():
    # Its baseline web refuses to start once anything imports the
    # OpenTelemetry SDK at start-up; redis-py does (redis.observability), so
    # a module that imports redis at the top (purchases/cache_outage.py did)
    # broke figure 12 with nothing in make test to say so.
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "SECRET_KEY": "x", "DJANGO_SETTINGS_MODULE": "config.settings"}
    started = subprocess.run(
        [sys.executable, "-c", "import bench.wsgi_without_tracing"],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr[-2000:]


def test_figure_14_never_counts_the_processor_as_ours():
    # Figure 14 compares the product's CPU per purchase with Stripe's SDK
    # against the fake's HTTP adapter; the processor (localstripe, or the
    # fake gateway and its database) is reported apart, and neither it nor
    # the bench's own load and connections may land in "ours".
    per_purchase_ms = {
        "web": 2.0,
        "worker": 3.0,
        "webhooks": 0.25,
        "relay": 0.25,
        "pg_product": 1.0,
        "redis": 0.5,
        "gateway": 4.0,
        "pg_gateway": 1.0,
        "localstripe": 20.0,
        "load_generator": 0.5,
        "pg_bench": 0.3,
        "total": 33.0,
    }

    shown = figure_14.summary(per_purchase_ms)

    assert shown["ours"] == 7.0
    assert shown["processor"] == 25.0
    assert (shown["worker"], shown["web"], shown["pg_product"]) == (3.0, 2.0, 1.0)
