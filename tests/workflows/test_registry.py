"""The registry is the one list of long-running kinds: the task, the beat sweep and the wake-ups
after acks and reports all read it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleet.core import operations
from fleet.core.models import OperationKind, OperationStatus
from fleet.core.operations import operation_finish, operation_record
from fleet.tasks import advance_workflows
from fleet.workflows import registry

pytestmark = pytest.mark.django_db


def _recording(monkeypatch) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []

    def recorder(kind: str):
        return lambda *, operation_id: seen.append((kind, operation_id)) or "wait"

    entries = tuple(replace(e, advance=recorder(e.kind)) for e in registry.REGISTRY)
    monkeypatch.setattr(registry, "REGISTRY", entries)
    return seen


def test_every_long_running_kind_is_an_operation_kind_and_registered_once():
    kinds = [entry.kind for entry in registry.REGISTRY]
    assert len(kinds) == len(set(kinds))
    assert set(kinds) <= set(OperationKind.values)
    assert {
        "move",
        "drain",
        "rollout",
        "defrag",
        "repack",
        "drain_host",
        "layout_rollout",
        "reclaim",
    } == set(kinds)


def test_the_beat_sweep_advances_every_running_operation_of_every_kind(monkeypatch):
    seen = _recording(monkeypatch)
    running = {e.kind: operation_record(kind=e.kind, summary=e.kind) for e in registry.REGISTRY}
    operation_record(kind=OperationKind.MOVE, summary="ended", status=OperationStatus.SUCCEEDED)
    assert advance_workflows() == len(running)
    assert sorted(seen) == sorted((kind, op.pk) for kind, op in running.items())


def test_an_ack_wakes_the_kinds_that_wait_for_acks_on_that_host_only_where_scoped(monkeypatch):
    from tests.factories import HostFactory

    seen = _recording(monkeypatch)
    here, there = HostFactory(), HostFactory()
    mine = operation_record(kind=OperationKind.DRAIN, summary="drain here", host=here)
    operation_record(kind=OperationKind.DRAIN, summary="drain there", host=there)
    defrag = operation_record(kind=OperationKind.DEFRAG, summary="defrag")
    operation_record(kind=OperationKind.MOVE, summary="a move waits for reports, not acks")
    registry.workflows_wake("ack", here.pk)
    assert seen == [("drain", mine.pk), ("defrag", defrag.pk)]


def test_a_child_that_ends_wakes_its_parent(monkeypatch):
    woken: list[int] = []
    monkeypatch.setattr(operations, "advance_after_commit", woken.append)
    parent = operation_record(kind=OperationKind.DEFRAG, summary="defrag")
    child = operation_record(kind=OperationKind.MOVE, summary="move")
    child.parent = parent
    child.save(update_fields=["parent"])
    operation_finish(child, OperationStatus.SUCCEEDED, "moved")
    assert woken == [parent.pk]


def test_the_ui_words_the_steps_of_a_kind_from_its_workflow():
    assert registry.step_labels(OperationKind.DEFRAG)["moving"] == "Moving a replica"
    assert registry.step_labels(OperationKind.PLACE) == {}
