"""One task advances every long-running operation by id, whatever its kind."""

from __future__ import annotations

import pytest

from fleet.allocations.advance import ADVANCERS, operation_advance
from fleet.core.models import Operation, OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.tasks import advance_operation

pytestmark = pytest.mark.django_db


def test_an_operation_that_does_not_advance_or_is_gone_is_left_alone():
    placed = operation_record(
        kind=OperationKind.PLACE, summary="placed", status=OperationStatus.SUCCEEDED
    )
    assert operation_advance(operation_id=placed.pk) is None
    assert operation_advance(operation_id=placed.pk + 1000) is None
    assert Operation.objects.get(pk=placed.pk).status == OperationStatus.SUCCEEDED


def test_the_task_calls_the_advancer_of_the_operations_kind(monkeypatch):
    drain = operation_record(kind=OperationKind.DRAIN, summary="drain", payload={"step": "move"})
    seen = []
    monkeypatch.setitem(ADVANCERS, OperationKind.DRAIN, lambda **kw: seen.append(kw) or "move")
    assert advance_operation(drain.pk) == "move"
    assert seen == [{"operation_id": drain.pk}]
