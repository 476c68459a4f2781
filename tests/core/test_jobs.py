"""Background work by name: capacity freed kicks the queue's placement on a worker, and a replica
left waiting kicks the reclaim sweep, each at once at most once a second fleet-wide (a kick held
back runs once the second is over), after the transaction commits; the embedded mode leaves
both to its scheduler."""

from __future__ import annotations

import pytest

from fleet.celery import app
from fleet.core.jobs import PLACE_QUEUE, RECLAIM, place_queue_after_commit, reclaim_after_commit

pytestmark = pytest.mark.django_db


def test_freed_capacity_kicks_the_queue_once_the_transaction_commits(
    broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as pending:
        place_queue_after_commit()
    assert broker == []  # nothing before the commit
    for callback in pending:
        callback()
    assert broker == [PLACE_QUEUE]


def test_kicks_within_a_second_run_once_now_and_once_when_it_is_over(
    broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        place_queue_after_commit()
        place_queue_after_commit()
    with django_capture_on_commit_callbacks(execute=True):
        place_queue_after_commit()
    # The kicks after the first are not lost: one deferred run covers them all.
    assert broker == [PLACE_QUEUE, f"{PLACE_QUEUE} (in 1 s)"]


@pytest.mark.parametrize("kick", [place_queue_after_commit, reclaim_after_commit])
def test_the_embedded_mode_leaves_both_to_its_scheduler(
    kick, monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setitem(app.conf, "task_always_eager", True)
    with django_capture_on_commit_callbacks(execute=False) as pending:
        kick()
    assert pending == []


def test_a_replica_left_waiting_kicks_the_reclaim_sweep_once_a_second(
    broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as pending:
        reclaim_after_commit()
    assert broker == []  # nothing before the commit (a rollback sends nothing)
    for callback in pending:
        callback()
    with django_capture_on_commit_callbacks(execute=True):
        reclaim_after_commit()
        place_queue_after_commit()  # its own key: not held back by the reclaim's
    assert broker == [RECLAIM, f"{RECLAIM} (in 1 s)", PLACE_QUEUE]
