"""PostgreSQL for `make bench`: the server (from DATABASE_URL), its
databases, and the bench database as the figures read and write it."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlparse

import psycopg

from bench.common import BENCH_DB, PhaseFailed
from config.distribution import NO_EVENT

USERS = 256


# The organizer of the bench's events, made by the first event that needs it;
# its id (a CTE's ``RETURNING id``, whether made now or before).
BENCH_ORGANIZER_SQL = (
    "INSERT INTO organizers_organizer (slug, name, created_at)"
    " VALUES ('bench', 'bench venue', now())"
    " ON CONFLICT (slug) DO UPDATE SET name = EXCLUDED.name RETURNING id"
)
# Its slug, in the URLs under /api/organizers/{slug}/ (figure 13).
BENCH_ORGANIZER_SLUG = "bench"

# A seat as ``copy_event`` writes it: (ref, section, row, number, category,
# x, y, accessible), the contract's seat-map fields
# (docs/api.md, "Events, seat maps and prices"); its price is its category's.
SeatRow = tuple[str, str, str, int, str, float, float, bool]
# A price category: (code, name, price in minor units).
CategoryRow = tuple[str, str, int]


class PG:
    """Where PostgreSQL is (from DATABASE_URL), and connections to our databases."""

    def __init__(self, url: str):
        u = urlparse(url)
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 5432
        self.user = unquote(u.username) if u.username else os.environ.get("USER", "postgres")
        self.password = unquote(u.password) if u.password else None

    def url(self, db: str) -> str:
        auth = self.user + (f":{self.password}" if self.password else "")
        return f"postgres://{auth}@{self.host}:{self.port}/{db}"

    def connect(self, db: str, autocommit: bool = True) -> psycopg.Connection:
        return psycopg.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=db,
            autocommit=autocommit,
            application_name="boxoffice-bench",
        )

    def recreate(self, db: str, template: str | None = None) -> None:
        with self.connect("postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            template_clause = f' TEMPLATE "{template}"' if template else ""
            conn.execute(f'CREATE DATABASE "{db}"{template_clause}')

    def drop(self, db: str) -> None:
        with self.connect("postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

    def pg_env(self) -> dict:
        env = dict(os.environ)
        if self.password:
            env["PGPASSWORD"] = self.password
        return env

    def pg_args(self) -> list[str]:
        return ["-h", self.host, "-p", str(self.port), "-U", self.user]


def token(user_id: int) -> str:
    """The API token ``seed`` gives the user."""
    return hashlib.md5(f"bench-token-{user_id}".encode()).hexdigest()


class BenchDB:
    """One autocommit connection to the bench database."""

    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        # Statements sent in autocommit, each a transaction of its own: the
        # bench's polling, which pg_stat_database counts with the product's
        # commits (figure 2 takes them out).
        self.autocommits = 0

    def close(self) -> None:
        self.conn.close()

    def q(self, sql: str, params=None) -> list[tuple]:
        if self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            self.autocommits += 1
        cur = self.conn.execute(sql, params)
        return cur.fetchall() if cur.description else []

    def q1(self, sql: str, params=None) -> Any:  # a row, or None: the caller knows its SQL
        rows = self.q(sql, params)
        return rows[0] if rows else None

    def seed(self, users: int = USERS) -> list[int]:
        """The bench users with their tokens; returns their ids (contiguous)."""
        with self.conn.transaction():
            rows = self.q(
                "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name,"
                " email, is_staff, is_active, date_joined)"
                " SELECT '!', false, 'bench-' || lpad(g::text, 4, '0'), '', '', '', false, true,"
                " now() FROM generate_series(1, %s) g ORDER BY g RETURNING id",
                [users],
            )
            ids = sorted(r[0] for r in rows)
            self.q(
                "INSERT INTO authtoken_token (key, created, user_id)"
                " SELECT md5('bench-token-' || id), now(), id FROM auth_user"
                " WHERE username LIKE 'bench-%%'"
            )
        if ids != list(range(ids[0], ids[0] + users)):
            raise PhaseFailed("user ids are not contiguous")
        return ids

    def ensure_users(self, n: int) -> list[int]:
        """At least ``n`` bench users with their tokens (``seed`` makes
        ``USERS``; the others are added as ``seed`` names them, bench-0257...);
        returns the ids of the first ``n`` by name."""
        if n > 9999:
            raise ValueError("bench user names have four digits")
        with self.conn.transaction():
            self.q(
                "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name,"
                " email, is_staff, is_active, date_joined)"
                " SELECT '!', false, name, '', '', '', false, true, now()"
                " FROM (SELECT g, 'bench-' || lpad(g::text, 4, '0') AS name"
                "       FROM generate_series(1, %s) g) n"
                " WHERE NOT EXISTS (SELECT 1 FROM auth_user u WHERE u.username = n.name)"
                " ORDER BY g",
                [n],
            )
            self.q(
                "INSERT INTO authtoken_token (key, created, user_id)"
                " SELECT md5('bench-token-' || id), now(), id FROM auth_user u"
                " WHERE username LIKE 'bench-%%'"
                " AND NOT EXISTS (SELECT 1 FROM authtoken_token t WHERE t.user_id = u.id)"
            )
        return [
            r[0]
            for r in self.q(
                "SELECT id FROM auth_user WHERE username LIKE 'bench-%%'"
                " ORDER BY username LIMIT %s",
                [n],
            )
        ]

    def make_event(
        self, name: str, nseats: int, prefix: str = "S", row_size: int | None = None
    ) -> tuple[int, int]:
        """An event with seats prefix1..prefixN (all in row ``prefix``), or
        with ``row_size``, in rows of that many seats labelled A, B, ... Z,
        AA, AB... (refs A1..A<row_size>, B1...; ``prefix`` unused), as best
        available needs them; inserted in one statement so that their ids are
        contiguous, row after row; returns (event id, id offset)."""
        if row_size is not None and -(-nseats // row_size) > 26 * 27:
            raise ValueError("at most 702 rows (A..ZZ)")
        with self.conn.transaction():
            (event_id,) = self.q1(
                # Every event is an organizer's (docs/api.md, "Organizers and roles"): the bench's.
                f"WITH o AS ({BENCH_ORGANIZER_SQL})"
                " INSERT INTO purchases_event (organizer_id, name, starts_at, status, currency,"
                " cancel_fee_percent) SELECT o.id, %s, now() + interval '30 days', 'on_sale',"
                " 'EUR', 0 FROM o RETURNING id",
                [name],
            )
            if row_size is None:
                self.q(
                    "INSERT INTO purchases_seat (event_id, ref, row, number, price_amount,"
                    " currency, status, section, category, x, y, accessible, block_reason)"
                    " SELECT %s, %s || g, %s, g, 5000, 'EUR', 'available', '', '', 0, 0, false, ''"
                    " FROM generate_series(1, %s) g ORDER BY g",
                    [event_id, prefix, prefix, nseats],
                )
            else:
                self.q(
                    "INSERT INTO purchases_seat (event_id, ref, row, number, price_amount,"
                    " currency, status, section, category, x, y, accessible, block_reason)"
                    " SELECT %s, label || num, label, num, 5000, 'EUR', 'available', '', '', 0, 0,"
                    " false, '' FROM (SELECT g, (g - 1) %% %s + 1 AS num,"
                    "   CASE WHEN r < 26 THEN chr(65 + r)"
                    "   ELSE chr(64 + r / 26) || chr(65 + r %% 26) END AS label"
                    "   FROM generate_series(1, %s) g, LATERAL (SELECT (g - 1) / %s AS r) x)"
                    " AS s ORDER BY g",
                    [event_id, row_size, nseats, row_size],
                )
        lo, hi, n = self.q1(
            "SELECT min(id), max(id), count(*) FROM purchases_seat WHERE event_id = %s", [event_id]
        )
        if hi - lo + 1 != n:
            raise PhaseFailed("seat ids are not contiguous")
        return event_id, lo - 1

    def ensure_member(self, user_id: int, role: str = "owner") -> str:
        """``user_id`` a member of the bench organizer with ``role`` (made,
        or its role changed); returns the organizer's slug."""
        self.q(
            f"WITH o AS ({BENCH_ORGANIZER_SQL})"
            " INSERT INTO organizers_membership (organizer_id, user_id, role, created_at)"
            " SELECT o.id, %s, %s, now() FROM o"
            " ON CONFLICT (organizer_id, user_id) DO UPDATE SET role = EXCLUDED.role",
            [user_id, role],
        )
        return BENCH_ORGANIZER_SLUG

    def copy_event(
        self,
        name: str,
        *,
        categories: Sequence[CategoryRow],
        seats: Sequence[SeatRow],
        status: str = "draft",
    ) -> int:
        """An event of the bench organizer in EUR with its price categories
        and ``seats`` (each priced by its category), in one transaction, the
        seats by ``COPY ... FROM STDIN`` (the fastest way PostgreSQL takes
        rows from a client: figure 13's baseline for the seller's API);
        ``status`` ``on_sale`` publishes it now. Returns the event's id."""
        prices = {code: price for code, _, price in categories}
        with self.conn.transaction():
            (event_id,) = self.q1(
                f"WITH o AS ({BENCH_ORGANIZER_SQL})"
                " INSERT INTO purchases_event (organizer_id, name, starts_at, status, currency,"
                " cancel_fee_percent, published_at) SELECT o.id, %s, now() + interval '30 days',"
                " %s, 'EUR', 0, CASE WHEN %s THEN now() END FROM o RETURNING id",
                [name, status, status == "on_sale"],
            )
            with self.conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO purchases_pricecategory (event_id, code, name, price_amount,"
                    " currency) VALUES (%s, %s, %s, %s, 'EUR')",
                    [(event_id, code, label, price) for code, label, price in categories],
                )
                with cur.copy(
                    "COPY purchases_seat (event_id, ref, section, row, number, category, x, y,"
                    " accessible, price_amount, currency, status, block_reason) FROM STDIN"
                ) as copy:
                    # The columns in SeatRow's order, then the price and the rest.
                    for seat in seats:
                        copy.write_row((event_id, *seat, prices[seat[4]], "EUR", "available", ""))
        return event_id

    def noop_rows(self, n: int, *, key_prefix: str | None, lead_s: float, window_s: float) -> None:
        """``n`` outbox rows of topic ``bench.noop`` (no consumer: a delivery
        only completes them), row g due at now + ``lead_s`` + g x
        ``window_s`` / ``n`` (``lead_s`` negative: already due), keyed
        ``key_prefix`` || g, or without a key. The one place the bench writes
        outbox rows of its own (figures 4 and 6), as ``outbox_publish`` writes
        them: ``due_at`` (what the relay claims on) = ``available_at``,
        created at now (or when due, if earlier), and ``event_id`` NO_EVENT,
        never NULL (config/distribution.py: the distribution column)."""
        self.q(
            "INSERT INTO outbox_outboxmessage (topic, payload, key, event_id, saga_id,"
            " created_at, available_at, due_at, deliveries)"
            " SELECT 'bench.noop', '{}'::jsonb, %s::text || g, %s, NULL,"
            " least(now(), t.at), t.at, t.at, 0"
            " FROM generate_series(1, %s) g,"
            " LATERAL (SELECT now() + make_interval(secs => %s + g * %s / %s) AS at) t",
            [key_prefix, NO_EVENT, n, lead_s, window_s, n],
        )

    def stats(self) -> dict:
        """Commits and rolled-back transactions of the bench database, and rows
        written per table, as PostgreSQL's statistics have them now."""
        self.q("SELECT pg_stat_clear_snapshot()")
        xc, xr = self.q1(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s", [BENCH_DB]
        )
        tables = {
            r[0]: {"ins": r[1], "upd": r[2], "hot_upd": r[3], "del": r[4]}
            for r in self.q(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del"
                " FROM pg_stat_user_tables"
            )
        }
        return {"t": time.monotonic(), "xact_commit": xc, "xact_rollback": xr, "tables": tables}
