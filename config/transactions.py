"""Is the code running inside a transaction of its own?

One answer for product code: a ledger entry, an outbox row and a saga's
transition belong inside a transaction (:func:`in_transaction`); a network
call never does (:func:`open_transaction_alias`, read by
``payments/guards.py``).

In production that is Django's public answer: an ``atomic`` block is open
(``connection.in_atomic_block``), or a transaction was begun by hand
(``not transaction.get_autocommit()``).

In the tests, pytest-django wraps each ``db`` test in an atomic block of its
own. With Django's answer alone, every gateway call of such a test would be
"inside a transaction", and a ledger write outside any would pass. So the
test harness says which blocks are its own (:func:`harness_blocks`: the
tests' ``conftest.py`` around every test, a stateful example around its
savepoint), and only the blocks opened deeper than those count, as sentry's
``in_test_assert_no_transaction`` measures against its "transaction
watermark". Production never enters :func:`harness_blocks`, and a thread
started by a test has its own connection and no harness: both read Django's
public answer only.

How deep the open blocks go has no public name in Django: the harness's
answer reads ``connection.savepoint_ids`` (Django's stack of one entry per
``atomic`` block nested in the outermost, kept by ``django.db.transaction.
Atomic``; no underscore, not documented). Only here, only while a harness
is entered, never in production; no Django release or ticket offers a
public depth, and tests/test_transactions.py fails if Django stops keeping
that stack.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections, transaction


class _Harness(threading.local):
    """The depth of the test harness's own blocks, per database alias, on
    this thread's connections; None: no harness (production)."""

    depths: dict[str, int] | None = None


_harness = _Harness()


def in_transaction(alias: str = "default") -> bool:
    """Whether a transaction of the code's own is open on ``alias``."""
    connection = connections[alias]
    if _harness.depths is not None:
        return _depth(connection) > _harness.depths.get(alias, 0)
    return connection.in_atomic_block or not transaction.get_autocommit(alias)


def open_transaction_alias() -> str | None:
    """A database on which the code holds a transaction of its own open
    (one of this thread's connections), or None."""
    for connection in connections.all(initialized_only=True):
        if in_transaction(connection.alias):
            return connection.alias
    return None


@contextmanager
def harness_blocks() -> Iterator[None]:
    """Test harness only: the blocks open now on this thread's connections
    are the harness's, not the code's, until the block ends (nested, the
    outer harness's depths come back). Reads no database."""
    before = _harness.depths
    _harness.depths = {
        connection.alias: _depth(connection)
        for connection in connections.all(initialized_only=True)
    }
    try:
        yield
    finally:
        _harness.depths = before


def _depth(connection) -> int:
    """How many atomic blocks are open on ``connection`` (see the module's
    docstring: the harness's reading only)."""
    return len(connection.savepoint_ids) + connection.in_atomic_block
