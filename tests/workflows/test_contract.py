"""Every workflow in the registry that runs on the engine goes through the same paces: start,
step, deadline, failure, compensation and resume after a restart (the operation re-read from
the database half-way, by a fresh workflow object). What the engine promises, it promises for
every kind: one terminal write (operation_finish, so an alert), one log, one vocabulary."""

from __future__ import annotations

import pytest

from fleet.core import alerts
from fleet.core.errors import Conflict
from fleet.core.models import AlertDelivery, Operation, OperationStatus
from fleet.core.operations import RUNNING
from fleet.workflows.engine import FAILED, WAIT, Workflow, workflow_run
from fleet.workflows.registry import REGISTRY
from tests.factories import webhook
from tests.workflows.scenarios import SCENARIOS

pytestmark = pytest.mark.django_db

ON_ENGINE = list(REGISTRY)


def test_every_workflow_on_the_engine_has_a_scenario_for_the_contract():
    assert ON_ENGINE, "no workflow runs on the engine"
    assert sorted(entry.kind for entry in ON_ENGINE) == sorted(SCENARIOS)


@pytest.fixture(params=[entry.kind for entry in ON_ENGINE])
def case(request, django_capture_on_commit_callbacks):
    entry = next(e for e in REGISTRY if e.kind == request.param)
    world = SCENARIOS[request.param](django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=False):  # started, not yet advanced
        operation = world.start()
    return entry.workflow, operation, world


def _reloaded(operation: Operation) -> Operation:
    return Operation.objects.get(pk=operation.pk)


def _run_to_the_end(workflow: Workflow, operation: Operation, world) -> Operation:
    for _ in range(12):
        workflow_run(type(workflow)(), operation.pk)  # a fresh object: the state is in the row
        world.sync()
        operation = _reloaded(operation)
        if operation.status not in RUNNING:
            break
    return operation


def test_a_started_workflow_is_running_with_a_step_and_a_log(case):
    workflow, operation, _ = case
    operation = _reloaded(operation)
    assert operation.kind == workflow.kind and operation.status in RUNNING
    assert {"step", "log"} <= set(operation.payload)
    assert operation.payload["step"] in workflow.steps  # the UI has a label for it
    # Only an operation that waits for an agent's ack carries a generation; beat's expiry
    # (fleet.partitioning.delivery.operations_expire) leaves a workflow to its own deadline.
    assert operation.generation is None


def test_each_step_is_saved_its_children_point_at_it_and_the_run_ends_succeeded(case):
    workflow, operation, world = case
    assert workflow_run(workflow, operation.pk) == WAIT
    first = _reloaded(operation)
    assert first.payload != operation.payload  # saved: a restart resumes from here
    finished = _run_to_the_end(workflow, first, world)
    assert finished.status == OperationStatus.SUCCEEDED, finished.payload
    assert finished.children.exists() == world.adopts  # its moves and layout changes
    assert finished.payload["step"] == "done"
    assert finished.payload["log"][-1]["note"] == finished.reason
    assert finished.finished_at is not None


def test_a_workflow_past_its_deadline_fails_compensated_and_alerts(case, monkeypatch):
    workflow, operation, world = case
    webhook("https://hooks.example/", [alerts.OPERATION_FAILED])
    Operation.objects.filter(pk=operation.pk).update(
        payload={**operation.payload, "deadline": "2000-01-01T00:00:00+00:00"}
    )
    compensated: list[str] = []
    timed_out: list[str] = []
    cls = type(workflow)
    compensate, timeout_reason = cls.compensate, cls.timeout_reason
    monkeypatch.setattr(
        cls,
        "compensate",
        lambda self, run, reason: compensated.append(reason) or compensate(self, run, reason),
    )
    monkeypatch.setattr(
        cls,
        "timeout_reason",
        lambda self, run: timed_out.append(timeout_reason(self, run)) or timed_out[-1],
    )
    if workflow_run(workflow, operation.pk) == WAIT:  # undoing takes steps (a rollback)
        assert _reloaded(operation).status in RUNNING
        _run_to_the_end(workflow, operation, world)
    failed = _reloaded(operation)
    assert failed.status == OperationStatus.FAILED and failed.payload["step"] == "failed"
    assert compensated[0] == timed_out[0] and len(timed_out) == 1
    assert failed.reason.startswith(compensated[0])
    events = AlertDelivery.objects.filter(event=alerts.OPERATION_FAILED)
    assert [d.payload["subject"]["operation"]["id"] for d in events] == [operation.pk]


def test_a_refusal_from_a_step_fails_the_operation_instead_of_escaping(case, monkeypatch):
    workflow, operation, _ = case

    def refuse(self, run):
        raise Conflict("test.refused", "the fleet changed under it")

    monkeypatch.setattr(type(workflow), "advance", refuse)
    outcome = workflow_run(workflow, operation.pk)
    if outcome == WAIT:  # undoing takes steps of its own, and they are refused too
        assert _reloaded(operation).status in RUNNING
        outcome = workflow_run(workflow, operation.pk)
    assert outcome == FAILED
    failed = _reloaded(operation)
    assert failed.status == OperationStatus.FAILED
    assert failed.reason.startswith("the fleet changed under it")
    assert failed.payload["log"][-1]["note"] == failed.reason


def test_compensation_says_how_the_operation_ends(case, monkeypatch):
    workflow, operation, _ = case
    monkeypatch.setattr(type(workflow), "advance", lambda self, run: run.fail("step 1 broke"))
    monkeypatch.setattr(
        type(workflow), "compensate", lambda self, run, reason: f"{reason}; rolled back"
    )
    assert workflow_run(workflow, operation.pk) == FAILED
    assert _reloaded(operation).reason == "step 1 broke; rolled back"


def test_a_workflow_resumes_after_a_restart_from_what_its_row_holds(case):
    workflow, operation, world = case
    assert workflow_run(workflow, operation.pk) == WAIT
    world.sync()
    # A restart: nothing survives but the database; a new engine run picks it up.
    finished = _run_to_the_end(workflow, _reloaded(operation), world)
    assert finished.status == OperationStatus.SUCCEEDED, finished.payload


def test_an_ended_operation_or_one_of_another_kind_is_left_alone(case):
    workflow, operation, _ = case
    Operation.objects.filter(pk=operation.pk).update(status=OperationStatus.SUCCEEDED)
    before = _reloaded(operation).payload
    assert workflow_run(workflow, operation.pk) == "done"
    assert _reloaded(operation).payload == before


def test_a_refused_compensation_ends_the_run_with_both_reasons(case, monkeypatch):
    workflow, operation, _ = case

    def refuse(self, run, reason):
        raise Conflict("test.refused", "the old layout no longer fits")

    monkeypatch.setattr(type(workflow), "advance", lambda self, run: run.fail("step 1 broke"))
    monkeypatch.setattr(type(workflow), "compensate", refuse)
    assert workflow_run(workflow, operation.pk) == FAILED
    failed = _reloaded(operation)
    assert failed.reason == "step 1 broke; undoing it failed too: the old layout no longer fits"
