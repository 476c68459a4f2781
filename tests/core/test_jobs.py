"""Background work by name: capacity freed kicks the queue's placement on a worker, at most once
a second fleet-wide, after the transaction commits; the embedded mode leaves it to its
scheduler."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from fleet.celery import app
from fleet.core.jobs import PLACE_QUEUE, PLACE_QUEUE_KICK_KEY, place_queue_after_commit

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker(monkeypatch):
    """A real broker's path (not eager), its sends recorded instead of delivered."""
    sent: list[str] = []
    monkeypatch.setitem(app.conf, "task_always_eager", False)
    monkeypatch.setattr(app, "send_task", lambda name, args=None: sent.append(name))
    cache.delete(PLACE_QUEUE_KICK_KEY)
    yield sent
    cache.delete(PLACE_QUEUE_KICK_KEY)


def test_freed_capacity_kicks_the_queue_once_the_transaction_commits(
    broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as pending:
        place_queue_after_commit()
    assert broker == []  # nothing before the commit
    for callback in pending:
        callback()
    assert broker == [PLACE_QUEUE]


def test_kicks_within_a_second_are_one(broker, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        place_queue_after_commit()
        place_queue_after_commit()
    with django_capture_on_commit_callbacks(execute=True):
        place_queue_after_commit()
    assert broker == [PLACE_QUEUE]


def test_the_embedded_mode_leaves_it_to_its_scheduler(
    monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setitem(app.conf, "task_always_eager", True)
    with django_capture_on_commit_callbacks(execute=False) as pending:
        place_queue_after_commit()
    assert pending == []
