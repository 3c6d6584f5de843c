"""The ledger: one entry per (intent, kind), refused by the database itself.

``ledger_one_entry_per_kind`` is what keeps a charge (or a refund) from being
recorded twice for one intent, whichever code path tries: two deliveries of
one answer, two workers confirming the same saga. These tests go around every
state check of the saga and ask ``ledger_record`` directly, one after the
other and from two connections at once.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import Sum
from django.utils import timezone

from ledger.models import EntryKind, LedgerEntry
from ledger.services import ledger_net, ledger_record

AMOUNT = {EntryKind.CHARGE: 2500, EntryKind.REFUND: -2500}


def _record(intent_id: str, kind: EntryKind, *, note: str = "") -> LedgerEntry:
    # ledger_record belongs inside the transition's transaction.
    with transaction.atomic():
        return ledger_record(
            intent_id=intent_id,
            kind=kind,
            amount=AMOUNT[kind],
            currency="EUR",
            saga_id=uuid.uuid4(),
            event_id=1,
            now=timezone.now(),
            note=note,
        )


def _entries(intent_id: str, kind: EntryKind | None = None):
    entries = LedgerEntry.objects.filter(intent_id=intent_id)
    return entries if kind is None else entries.filter(kind=kind)


@pytest.mark.django_db
@pytest.mark.parametrize("kind", [EntryKind.CHARGE, EntryKind.REFUND])
def test_a_second_entry_of_one_kind_for_one_intent_is_refused(kind):
    _record("pi_seq", kind, note="first")

    with pytest.raises(IntegrityError, match="ledger_one_entry_per_kind"):
        _record("pi_seq", kind, note="second")

    assert list(_entries("pi_seq", kind).values_list("note", flat=True)) == ["first"]


@pytest.mark.django_db
def test_a_charge_and_its_refund_are_two_kinds_and_net_zero():
    # The constraint is per (intent, kind), not per intent: the refund of a
    # charge is a second entry, and another intent is not concerned.
    _record("pi_one", EntryKind.CHARGE)
    _record("pi_one", EntryKind.REFUND)
    _record("pi_other", EntryKind.CHARGE)

    assert _entries("pi_one").count() == 2
    assert ledger_net(intent_id="pi_one") == 0
    assert ledger_net(intent_id="pi_other") == 2500


def _until(predicate, *, timeout: float, what: str) -> None:
    # A lock wait is visible only in pg_stat_activity, not on an event of ours.
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _blocked_by(pid: int) -> set[int]:
    """Backends waiting on a lock held by ``pid``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [pid]
        )
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", [EntryKind.CHARGE, EntryKind.REFUND])
def test_two_connections_recording_one_entry_at_once_commit_exactly_one(kind):
    # Two workers record the same entry of one intent, each in its own
    # transaction. Whoever inserts first keeps its transaction open until the
    # other one's insert is in flight too: blocked on the first one's index
    # entry (the constraint at work) or, without the constraint, done as
    # well. Then both try to commit.
    intent_id = f"pi_{kind}_race"
    start = threading.Barrier(2)
    release = threading.Event()
    lock = threading.Lock()
    pids: dict[int, int] = {}
    inserted: list[int] = []
    outcome: dict[int, str] = {}

    def worker(n: int) -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    pids[n] = cursor.fetchone()[0]
                start.wait(timeout=10)  # both transactions open, both about to insert
                ledger_record(
                    intent_id=intent_id,
                    kind=kind,
                    amount=AMOUNT[kind],
                    currency="EUR",
                    saga_id=uuid.uuid4(),
                    event_id=1,
                    now=timezone.now(),
                    note=f"worker {n}",
                )
                with lock:
                    inserted.append(n)
                if not release.wait(timeout=30):
                    raise AssertionError("never released")
            outcome[n] = "committed"
        except IntegrityError as exc:
            outcome[n] = f"IntegrityError: {exc}"
        except Exception as exc:  # pragma: no cover - reported by the assertions below
            outcome[n] = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    try:
        _until(lambda: bool(inserted), timeout=10, what="a first insert")
        first = inserted[0]
        other = 1 - first
        _until(
            lambda: len(inserted) == 2 or pids[other] in _blocked_by(pids[first]),
            timeout=10,
            what="the second insert to be in flight",
        )
    finally:
        release.set()
        for t in threads:
            t.join(timeout=30)
    assert not [t for t in threads if t.is_alive()], "a worker hung"

    committed = [n for n, verdict in outcome.items() if verdict == "committed"]
    refused = [n for n, verdict in outcome.items() if verdict.startswith("IntegrityError")]
    assert len(committed) == 1 and len(refused) == 1, outcome
    assert "ledger_one_entry_per_kind" in outcome[refused[0]]
    assert list(_entries(intent_id).values_list("kind", "note")) == [
        (kind.value, f"worker {committed[0]}")
    ]
    assert (
        LedgerEntry.objects.filter(intent_id=intent_id).aggregate(n=Sum("amount"))["n"]
        == AMOUNT[kind]
    )
