"""One task advances every long-running operation by id, whatever its kind."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.tasks import advance_operation
from fleet.workflows.registry import BY_KIND, workflow_advance

pytestmark = pytest.mark.django_db


def test_an_operation_that_does_not_advance_or_is_gone_is_left_alone():
    placed = operation_record(
        kind=OperationKind.PLACE, summary="placed", status=OperationStatus.SUCCEEDED
    )
    assert workflow_advance(operation_id=placed.pk) is None
    assert workflow_advance(operation_id=placed.pk + 1000) is None
    assert Operation.objects.get(pk=placed.pk).status == OperationStatus.SUCCEEDED


def test_the_task_calls_the_advancer_of_the_operations_kind(monkeypatch):
    drain = operation_record(kind=OperationKind.DRAIN, summary="drain", payload={"step": "move"})
    seen = []
    entry = replace(BY_KIND[OperationKind.DRAIN], advance=lambda **kw: seen.append(kw) or "move")
    monkeypatch.setitem(BY_KIND, OperationKind.DRAIN, entry)
    assert advance_operation(drain.pk) == "move"
    assert seen == [{"operation_id": drain.pk}]
