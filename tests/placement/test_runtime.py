"""Rule ``placement.runtime``: a replica goes only to a host whose agent runs its workload."""

from __future__ import annotations

import pytest

from fleet.mps import MpsRequest
from fleet.placement.fit import STRATEGIES, Refusal, Target, check, rank
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuState,
    HostState,
    MigRequest,
    PlacementRequest,
    WholeGpuRequest,
)

H100 = "h100-sxm5-80gb"
MEM = 81559
CONTAINER = Demand(runtimes=("docker",), workload="container")
PROCESS = Demand(runtimes=("docker", "process"), workload="process")


def two_hosts(mode: str, first: str | None, second: str | None) -> FleetSnapshot:
    """Two hosts alike but for their agents' runtimes, one GPU each, in the same state."""
    return FleetSnapshot(
        (HostState(1, runtime=first, name="gpu-a"), HostState(2, runtime=second, name="gpu-b")),
        (GpuState(1, 1, H100, MEM, mode), GpuState(2, 2, H100, MEM, mode)),  # type: ignore[arg-type]
    )


REQUESTS: list[tuple[str, PlacementRequest]] = [
    ("mig", MigRequest("1g.10gb")),
    ("mps", MpsRequest(4096)),
    ("dedicated", WholeGpuRequest(1)),
]


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_container_replica_is_refused_on_a_host_whose_agent_runs_processes(
    mode, request_, strategy
) -> None:
    snapshot = two_hosts(mode, "process", "docker")

    ranking = rank(snapshot, request_, strategy=strategy, demand=CONTAINER)

    assert {t.gpu_id for t in ranking.feasible} == {2}
    assert ranking.best is not None and ranking.best.gpu_id == 2
    refusal = ranking.verdict(1)
    assert isinstance(refusal, Refusal)
    (violation,) = refusal.violations
    assert violation.code == "placement.runtime"
    assert violation.message == (
        "gpu-a runs workloads with the process runtime; this deployment needs container."
    )
    assert violation.details == {
        "runtime": "process",
        "runtimes": ["docker"],
        "workload": "container",
    }


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
def test_check_refuses_the_commit_with_the_same_code(mode, request_) -> None:
    snapshot = two_hosts(mode, "none", "docker")

    refused = check(snapshot, request_, gpu_id=1, demand=CONTAINER)
    accepted = check(snapshot, request_, gpu_id=2, demand=CONTAINER)

    assert isinstance(refused, Refusal)
    assert [v.code for v in refused.violations] == ["placement.runtime"]
    assert isinstance(accepted, Target)


@pytest.mark.parametrize("runtime", ["docker", "process"])
def test_a_process_replica_runs_on_docker_and_process_agents(runtime) -> None:
    snapshot = two_hosts("mps", "none", runtime)

    ranking = rank(snapshot, MpsRequest(4096), demand=PROCESS)

    assert [t.gpu_id for t in ranking.feasible] == [2]


def test_without_runtimes_or_a_tracked_runtime_any_host_takes_the_replica() -> None:
    untracked = two_hosts("mps", None, None)
    mixed = two_hosts("mps", "none", "process")

    assert len(rank(untracked, MpsRequest(4096), demand=CONTAINER).feasible) == 2
    assert len(rank(mixed, MpsRequest(4096)).feasible) == 2
    assert len(rank(mixed, MpsRequest(4096), demand=Demand()).feasible) == 2


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
def test_the_engines_memo_keeps_answers_for_different_runtimes_apart(mode, request_) -> None:
    # Both hosts are in the same state: the product strategy shares answers between them and
    # memoises each host's answer per request and demand; a runtime must not leak across.
    snapshot = two_hosts(mode, "process", "docker")

    free = rank(snapshot, request_).best
    container = rank(snapshot, request_, demand=CONTAINER).best
    again = rank(snapshot, request_).best
    process = rank(snapshot, request_, demand=PROCESS).best

    assert free is not None and free.gpu_id == 1
    assert container is not None and container.gpu_id == 2
    assert again == free
    assert process == free


def test_nothing_fits_when_no_agent_runs_the_workload() -> None:
    snapshot = two_hosts("mig", "none", "process")

    ranking = rank(snapshot, MigRequest("1g.10gb"), demand=CONTAINER)

    assert ranking.best is None
    codes = {v.code for r in ranking.infeasible for v in r.violations}
    assert codes == {"placement.runtime"}


# Rule ``placement.process_runtime``: a process runs on the host itself, so only where the
# host's operator started the agent with --allow-process-runtime.
HOST_PROCESS = Demand(runtimes=("docker", "process"), workload="process", process_runtime=True)


def process_hosts(mode: str, first: bool | None, second: bool | None) -> FleetSnapshot:
    """Two docker hosts alike but for whether their agents run process workloads."""
    return FleetSnapshot(
        (
            HostState(1, runtime="docker", name="gpu-a", process_runtime=first),
            HostState(2, runtime="docker", name="gpu-b", process_runtime=second),
        ),
        (GpuState(1, 1, H100, MEM, mode), GpuState(2, 2, H100, MEM, mode)),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_process_replica_skips_hosts_whose_agent_does_not_allow_processes(
    mode, request_, strategy
) -> None:
    snapshot = process_hosts(mode, False, True)

    ranking = rank(snapshot, request_, strategy=strategy, demand=HOST_PROCESS)

    assert {t.gpu_id for t in ranking.feasible} == {2}
    refusal = ranking.verdict(1)
    assert isinstance(refusal, Refusal)
    (violation,) = refusal.violations
    assert violation.code == "placement.process_runtime"
    assert "--allow-process-runtime" in violation.message
    assert violation.details == {"host": 1}


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
def test_placing_a_process_by_hand_on_such_a_host_is_refused_with_the_same_code(
    mode, request_
) -> None:
    snapshot = process_hosts(mode, False, True)

    refused = check(snapshot, request_, gpu_id=1, demand=HOST_PROCESS)

    assert isinstance(refused, Refusal)
    assert [v.code for v in refused.violations] == ["placement.process_runtime"]
    assert isinstance(check(snapshot, request_, gpu_id=2, demand=HOST_PROCESS), Target)


def test_containers_go_to_hosts_without_the_process_runtime_and_untracked_hosts_take_all():
    without = process_hosts("mps", False, False)
    untracked = process_hosts("mps", None, None)

    assert len(rank(without, MpsRequest(4096), demand=CONTAINER).feasible) == 2
    assert rank(without, MpsRequest(4096), demand=HOST_PROCESS).best is None
    assert len(rank(untracked, MpsRequest(4096), demand=HOST_PROCESS).feasible) == 2


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
def test_the_engines_memo_keeps_process_and_container_answers_apart(mode, request_) -> None:
    snapshot = process_hosts(mode, False, True)

    container = rank(snapshot, request_, demand=CONTAINER).best
    process = rank(snapshot, request_, demand=HOST_PROCESS).best
    again = rank(snapshot, request_, demand=CONTAINER).best

    assert container is not None and container.gpu_id == 1
    assert process is not None and process.gpu_id == 2
    assert again == container
