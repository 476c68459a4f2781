"""Replica logs end to end: daphne, a Celery worker, Redis, PostgreSQL and a real ``fleet-agent``
(simulated GPUs, the docker runtime) running a process and a container that print a known line;
``GET /api/v1/allocations/{id}/logs`` returns it, fetched from the agent over its socket. An
agent on the REST transport cannot be asked: 409."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.stack import NOBODY, Agent, Stack, wait_until
from tests.e2e.test_workloads import (  # noqa: F401 (image: a fixture)
    allocation,
    deploy,
    docker,
    evict,
    image,
    place,
    wait_state,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def fleet(stack: Stack, image: str) -> tuple[Stack, Agent]:  # noqa: F811
    agent = stack.add_agent("logs-1", ["h100-sxm5-80gb", "h100-sxm5-80gb"], runtime="docker")
    return stack, agent


def logs(stack: Stack, allocation_id: int, tail: int = 50) -> tuple[int, Any]:
    return stack.request("GET", f"/api/v1/allocations/{allocation_id}/logs?tail={tail}")


def _run_and_read(stack: Stack, gpu_id: int, name: str, workload: dict[str, Any]) -> dict[str, Any]:
    """Run ``workload`` on the GPU until its logs show its line; return them (then evict it:
    workloads outlive the agent, and the stack's next run would find them)."""
    deployment_id = deploy(stack, name, {"kind": "gpu", "gpu_count": 1}, workload)
    placed = place(stack, deployment_id, gpu=gpu_id)
    try:
        wait_state(stack, placed["id"], "running")

        def printed() -> dict[str, Any] | None:
            status, body = logs(stack, placed["id"])
            assert status == 200, body
            return dict(body) if f"hello from {name}" in body["lines"] else None

        return wait_until(printed, 20, what=f"{name}'s line")  # type: ignore[no-any-return]
    finally:
        evict(stack, deployment_id)
        wait_until(lambda: allocation(stack, placed["id"]) is None, 15, what=f"{name} stopped")


def test_a_process_workloads_printed_line_is_in_its_logs(fleet):
    stack, agent = fleet
    body = _run_and_read(
        stack,
        stack.gpus(agent)[0]["id"],
        "printer",
        {
            "runtime": "process",
            "command": ["/bin/sh", "-c", "echo 'hello from printer'; exec sleep 3600"],
            "stop_grace_s": 2,
        },
    )
    # The agent's own notices in the log ("fleet: ...", e.g. memory not confined where cgroups
    # cannot be delegated) come first; then what the workload printed.
    printed = [line for line in body["lines"] if not line.startswith("fleet: ")]
    assert printed == ["hello from printer"]
    assert body["truncated"] is False and body["error"] is None


def test_a_container_workloads_printed_line_is_in_its_logs(fleet, image):  # noqa: F811
    stack, agent = fleet
    body = _run_and_read(
        stack,
        stack.gpus(agent)[1]["id"],
        "boxed",
        {
            "runtime": "container",
            "user": NOBODY,
            "image": image,
            "command": ["sh", "-c", "echo 'hello from boxed'; echo 'to stderr' >&2; sleep 3600"],
            "stop_grace_s": 1,
        },
    )
    assert "hello from boxed" in body["lines"] and body["error"] is None


def test_a_bad_tail_is_refused_and_a_rest_agent_is_unreachable(fleet):
    stack, _ = fleet
    status, body = logs(stack, 1, tail=0)  # refused before anything is looked up
    assert status == 400 and set(body) == {"code", "message", "details"}
    rest = stack.add_agent("logs-rest", ["a100-sxm4-40gb"], transport="rest", runtime="process")
    deployment_id = deploy(
        stack,
        "rested",
        {"kind": "gpu", "gpu_count": 1},
        {"runtime": "process", "command": ["/bin/sh", "-c", "exec sleep 3600"]},
    )
    [gpu] = stack.gpus(rest)
    placed = place(stack, deployment_id, gpu=gpu["id"])
    try:
        status, body = logs(stack, placed["id"])
        assert status == 409 and body["code"] == "logs.agent_unreachable", body
    finally:
        evict(stack, deployment_id)
        wait_until(lambda: allocation(stack, placed["id"]) is None, 15, what="rested stopped")
