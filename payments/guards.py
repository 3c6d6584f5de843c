"""Enforce "no network I/O inside a transaction".

A gateway call made while the caller holds an atomic block would keep row
locks across a network round trip and, worse, could commit a charge whose
record then rolls back. Every adapter calls :func:`assert_no_transaction`
first. Whether a transaction of the code's own is open is
``config/transactions.py``'s answer: the block a test runs in does not
count, so unit tests wrapped in a transaction still exercise the guard.
"""

from config.transactions import open_transaction_alias


class NetworkCallInTransaction(RuntimeError):
    pass


def assert_no_transaction(what: str) -> None:
    alias = open_transaction_alias()
    if alias is not None:
        raise NetworkCallInTransaction(f"{what} called inside a transaction on database {alias!r}")
