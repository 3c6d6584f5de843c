"""The transition table: every allowed move works, every other one raises and
writes nothing; a stale read is a verdict, not a retry."""

import itertools

import pytest

from purchases.errors import IllegalTransition, StaleSaga
from purchases.models import PurchaseSaga, SagaHistory
from purchases.saga.states import TRANSITIONS, SagaState
from purchases.saga.transition import move
from purchases.services import By, saga_transition

from .conftest import start_purchase

PAIRS = list(itertools.product(SagaState, SagaState))
ALLOWED = [(a, b) for a, b in PAIRS if b in TRANSITIONS[a]]
FORBIDDEN = [(a, b) for a, b in PAIRS if b not in TRANSITIONS[a]]


def _saga_in(state, alice, event):
    saga = start_purchase(alice, event)
    PurchaseSaga.objects.filter(pk=saga.pk).update(state=state)
    return saga.pk


def test_every_state_has_a_row_in_the_table():
    assert set(TRANSITIONS) == set(SagaState)
    assert TRANSITIONS[SagaState.COMPENSATED] == frozenset()


@pytest.mark.parametrize(("source", "target"), ALLOWED, ids=[f"{a}->{b}" for a, b in ALLOWED])
def test_allowed_move(source, target, alice, event):
    saga_id = _saga_in(source, alice, event)

    saga = saga_transition(saga_id=saga_id, to=target, reason="test", by=By.operator("carol"))

    stored = PurchaseSaga.objects.get(pk=saga_id)
    assert (stored.state, stored.version) == (target, 2)
    assert saga.version == 2
    last = SagaHistory.objects.filter(saga_id=saga_id).latest("id")
    assert (last.from_state, last.to_state, last.actor, last.actor_name) == (
        source,
        target,
        "operator",
        "carol",
    )


@pytest.mark.parametrize(("source", "target"), FORBIDDEN, ids=[f"{a}->{b}" for a, b in FORBIDDEN])
def test_forbidden_move_raises_and_writes_nothing(source, target, alice, event):
    saga_id = _saga_in(source, alice, event)
    history_before = SagaHistory.objects.filter(saga_id=saga_id).count()

    with pytest.raises(IllegalTransition):
        saga_transition(saga_id=saga_id, to=target, reason="test")

    stored = PurchaseSaga.objects.get(pk=saga_id)
    assert (stored.state, stored.version) == (source, 1)
    assert SagaHistory.objects.filter(saga_id=saga_id).count() == history_before


def test_a_stale_copy_loses_and_writes_nothing(alice, event, django_db_blocker):
    from django.db import transaction
    from django.utils import timezone

    saga = start_purchase(alice, event)
    stale = PurchaseSaga.objects.get(pk=saga.pk)
    saga_transition(saga_id=saga.pk, to=SagaState.CHARGING, reason="first")

    with pytest.raises(StaleSaga), transaction.atomic():
        move(stale, SagaState.EXPIRED, reason="second", at=timezone.now())

    stored = PurchaseSaga.objects.get(pk=saga.pk)
    assert stored.state == SagaState.CHARGING
    assert list(SagaHistory.objects.filter(saga=saga).values_list("to_state", flat=True)) == [
        "PENDING",
        "CHARGING",
    ]
