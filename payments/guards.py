"""Enforce "no network I/O inside a transaction".

A gateway call made while the caller holds an atomic block would keep row
locks across a network round trip and, worse, could commit a charge whose
record then rolls back. Every adapter calls :func:`assert_no_transaction`
first. Blocks opened by Django's test machinery (``_from_testcase``) do not
count, so unit tests wrapped in a transaction still exercise the guard.
"""

from django.db import connections


class NetworkCallInTransaction(RuntimeError):
    pass


def assert_no_transaction(what: str) -> None:
    for conn in connections.all(initialized_only=True):
        own = [b for b in conn.atomic_blocks if not getattr(b, "_from_testcase", False)]
        if own:
            raise NetworkCallInTransaction(
                f"{what} called inside a transaction on database {conn.alias!r}"
            )
