"""Is the code running inside a transaction of its own?

Django's test machinery wraps each test in atomic blocks marked
``_from_testcase``; those do not count, so the guards below behave the same
in a unit test as in production.
"""

from django.db import connections


def open_atomic_blocks(alias: str = "default") -> list:
    conn = connections[alias]
    return [b for b in conn.atomic_blocks if not getattr(b, "_from_testcase", False)]


def in_transaction(alias: str = "default") -> bool:
    return bool(open_atomic_blocks(alias))
