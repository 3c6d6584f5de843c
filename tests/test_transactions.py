"""Is a transaction of the code's own open? (config/transactions.py): Django's
public answer in production; in the tests, only the blocks opened inside the
harness's own count, at any depth."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from config.transactions import harness_blocks, in_transaction, open_transaction_alias
from payments.guards import NetworkCallInTransaction, assert_no_transaction


def _in_a_thread(probe: Callable[[], object]) -> object:
    """``probe()`` on a thread of its own: its own connection, no harness,
    as a production process sees it."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(probe())
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return out[0]


@pytest.fixture
def guarded_at_set_up(db):
    """A fixture that calls the gateway's guard as it sets up (after the
    test's block has opened)."""
    assert_no_transaction("charge")
    return in_transaction()


@pytest.mark.django_db
def test_the_tests_own_block_is_not_the_codes():
    assert connection.in_atomic_block  # pytest-django's
    assert not in_transaction() and open_transaction_alias() is None
    assert_no_transaction("charge")
    with transaction.atomic():
        assert in_transaction() and open_transaction_alias() == "default"
        with pytest.raises(NetworkCallInTransaction, match="'default'"):
            assert_no_transaction("charge")
    assert not in_transaction()


def test_a_fixture_on_the_db_fixture_sees_the_harness(guarded_at_set_up):
    assert guarded_at_set_up is False


@pytest.mark.django_db(transaction=True)
def test_blocks_count_at_any_depth_inside_the_harnesss():
    """Django's stack of nested blocks, as the harness reads it: a block
    with a savepoint and one without count alike."""
    with transaction.atomic():
        with harness_blocks():  # like a stateful example's savepoint
            assert not in_transaction()
            with transaction.atomic():
                assert in_transaction()
                with harness_blocks():
                    assert not in_transaction()
                    with transaction.atomic(savepoint=False):
                        assert in_transaction()
                    assert not in_transaction()
                assert in_transaction()
            assert not in_transaction()
        assert in_transaction()  # the outer harness is back: no block of its own
    assert not in_transaction()


@pytest.mark.django_db(transaction=True)
def test_without_a_harness_djangos_public_answer():
    def probe() -> list[bool]:
        seen = [in_transaction()]
        with transaction.atomic():
            seen.append(in_transaction())
        transaction.set_autocommit(False)  # a transaction begun by hand
        try:
            seen.append(in_transaction())
        finally:
            transaction.rollback()
            transaction.set_autocommit(True)
        seen.append(in_transaction())
        return seen

    assert _in_a_thread(probe) == [False, True, True, False]


@pytest.mark.django_db(transaction=True)
def test_without_a_harness_a_network_call_in_a_block_is_refused():
    def probe() -> str:
        with transaction.atomic():
            try:
                assert_no_transaction("charge")
            except NetworkCallInTransaction as refused:
                return str(refused)
        return "let through"

    assert _in_a_thread(probe) == "charge called inside a transaction on database 'default'"
