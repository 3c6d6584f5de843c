"""The door on real concurrent connections (docs/door.md, "Check-in"):
eight gates scanning one code at once let it in once and keep every scan;
a reissue racing a scan of the same ticket ends one way or the other, never
both; two processes making an event's first key at once end with one."""

from __future__ import annotations

import time

import pytest

from door import keys
from door.errors import TicketRefused
from door.models import CheckIn, EventKey, Scan
from door.services import checkin, ticket_reissue

from .conftest import race
from .factories import EventFactory, UserFactory
from .test_door_codes import code_of, confirmed, link_of

GATES = 8
RUNS = 5


@pytest.mark.django_db(transaction=True)
def test_eight_gates_scanning_one_code_at_once_let_it_in_once(gateway):
    staff = [UserFactory(username=f"gate{i}") for i in range(GATES)]
    for run in range(RUNS):
        event = EventFactory(seats=["A1"])
        saga = confirmed(event)
        code = code_of(saga)

        def attempt(i, event=event, code=code):
            return checkin(event.pk, code, f"gate-{i}", staff[i])

        results = race(GATES, attempt)

        verdicts = sorted(r["result"] for r in results)
        assert verdicts == ["already_checked_in"] * (GATES - 1) + ["ok"], f"run {run}: {results}"
        admitted = next(r for r in results if r["result"] == "ok")
        # every later answer names the one admission
        assert {(r["checked_in_at"], r["gate"]) for r in results} == {
            (admitted["checked_in_at"], admitted["gate"])
        }
        assert CheckIn.objects.filter(event_id=event.pk).count() == 1
        assert Scan.objects.filter(event_id=event.pk).count() == GATES  # every scan kept


@pytest.mark.django_db(transaction=True)
def test_a_reissue_racing_a_scan_of_the_same_ticket_ends_one_way(gateway):
    door = UserFactory(username="door")
    outcomes: dict[str, int] = {}
    for run in range(RUNS * 2):
        event = EventFactory(seats=["A1"])
        saga = confirmed(event)
        code = code_of(saga)

        def attempt(i, saga=saga, event=event, code=code, run=run):
            time.sleep(0.001 * ((i + run) % 2))  # each order gets its turn
            if i == 0:
                return checkin(event.pk, code, "north", door)["result"]
            try:
                return ticket_reissue(saga_id=saga.pk, seat_ref="A1", user=saga.buyer)
            except TicketRefused as exc:
                return exc.code

        scanned, reissued = race(2, attempt)

        link = link_of(saga)
        if scanned == "ok":  # in first: the reissue is refused
            assert reissued == "ticket_checked_in", f"run {run}"
            assert link.ticket_version == 0
        else:  # replaced first: the old code no longer admits
            assert scanned == "revoked", f"run {run}: {scanned}, {reissued}"
            assert link.ticket_version == 1 and reissued == code_of(saga)
            assert not CheckIn.objects.filter(event_id=event.pk).exists()
        outcomes[scanned] = outcomes.get(scanned, 0) + 1
    print(outcomes)


@pytest.mark.django_db(transaction=True)
def test_processes_making_an_events_first_key_at_once_make_one():
    event = EventFactory(seats=["A1"])

    versions = race(4, lambda i: keys.signing_key(event.pk)[0])

    assert versions == [1, 1, 1, 1]
    assert EventKey.objects.filter(event_id=event.pk).count() == 1
