"""Replicas placed one after another on a snapshot: what the tray counts as fitting now."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.mps import MpsDevice, MpsRequest
from fleet.placement.fit import Target, check, rank
from fleet.placement.simulate import apply_target, main_reasons, place_in_turn
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuState,
    HostState,
    MigPartition,
    MigRequest,
    MpsShare,
    WholeGpuRequest,
)
from tests.placement.test_product import fleets, requests

H100 = "h100-sxm5-80gb"
MEM = 81559
ONE_G = 19  # 1g.10gb on H100


def seven_small(gpu_id: int, host_id: int, busy: int) -> GpuState:
    """An H100 cut into seven 1g.10gb instances, the first ``busy`` of them in use."""
    partitions = tuple(
        MigPartition(10 * gpu_id + start, ONE_G, start, occupied=start < busy) for start in range(7)
    )
    return GpuState(gpu_id, host_id, H100, MEM, "mig", partitions=partitions)


def test_the_free_slices_are_counted_one_replica_at_a_time() -> None:
    snapshot = FleetSnapshot((HostState(1),), (seven_small(1, 1, busy=3),))

    turns = place_in_turn(snapshot, MigRequest("1g.10gb"), 6)

    assert [t.partition_id for t in turns.targets] == [13, 14, 15, 16]
    assert turns.first.best == turns.targets[0]
    assert turns.stopped is not None and turns.stopped.best is None
    assert rank(turns.snapshot, MigRequest("1g.10gb")).best is None


def test_it_stops_at_the_count_asked_for() -> None:
    snapshot = FleetSnapshot((HostState(1),), (seven_small(1, 1, busy=0),))

    turns = place_in_turn(snapshot, MigRequest("1g.10gb"), 2)

    assert len(turns.targets) == 2 and turns.stopped is None


def test_whole_gpus_and_mps_shares_are_taken_as_the_place_service_writes_them() -> None:
    dedicated = [GpuState(k, 1, H100, MEM, "dedicated") for k in range(3)]
    gpus = (*dedicated, GpuState(9, 2, H100, MEM, "mps"))
    snapshot = FleetSnapshot((HostState(1), HostState(2)), gpus)

    assert len(place_in_turn(snapshot, WholeGpuRequest(2), 5).targets) == 1
    assert len(place_in_turn(snapshot, MpsRequest(30000), 5).targets) == 2  # 81,559 MiB / 30,000


def test_a_runtime_demand_counts_only_the_hosts_that_run_the_workload() -> None:
    snapshot = FleetSnapshot(
        (HostState(1, runtime="process"), HostState(2, runtime="docker")),
        (seven_small(1, 1, busy=0), seven_small(2, 2, busy=5)),
    )
    container = Demand(runtimes=("docker",), workload="container")

    turns = place_in_turn(snapshot, MigRequest("1g.10gb"), 7, demand=container)

    assert {t.gpu_id for t in turns.targets} == {2} and len(turns.targets) == 2


def test_an_mps_client_in_a_mig_instance_keeps_the_reservation_ids_aligned() -> None:
    share = MpsShare(MpsDevice(10000, 4), None, (MpsRequest(2000),), (41,))
    gpu = GpuState(1, 1, H100, MEM, "mig", partitions=(MigPartition(7, 9, 4, True, mps=share),))
    snapshot = FleetSnapshot((HostState(1),), (gpu,))

    after = apply_target(snapshot, MpsRequest(2000), Target(1, 7, None, 0.0, (1,)))

    placed = after.gpu(1)
    assert placed is not None and placed.partitions[0].mps is not None
    assert placed.partitions[0].mps.reservations == (MpsRequest(2000),) * 2
    assert placed.partitions[0].mps.reservation_ids == (41, -2)


def test_the_main_reason_prefers_what_stops_the_candidates_over_other_modes() -> None:
    gpus = (
        GpuState(1, 1, H100, MEM, "mps"),
        GpuState(2, 1, H100, MEM, "mps"),
        seven_small(3, 1, busy=7),
    )
    ranking = rank(FleetSnapshot((HostState(1),), gpus), MigRequest("1g.10gb"))

    reasons = main_reasons(ranking)

    assert [(r.violation.code, r.refusals) for r in reasons] == [
        ("placement.no_free_space", 1),
        ("placement.mode_mismatch", 2),
    ]


@settings(max_examples=60, deadline=None)
@given(snapshot=fleets(), request=requests, count=st.integers(1, 5))
def test_every_replica_counted_is_one_the_place_service_would_commit(
    snapshot, request, count
) -> None:
    turns = place_in_turn(snapshot, request, count)

    current = snapshot
    for target in turns.targets:
        start = target.new_instance.start if target.new_instance is not None else None
        verdict = check(
            current,
            request,
            gpu_id=target.gpu_id,
            partition_id=target.partition_id,
            start=start,
        )
        assert isinstance(verdict, Target), verdict
        assert verdict.gpu_ids == target.gpu_ids
        current = apply_target(current, request, target)
    assert len(turns.targets) <= count
    if len(turns.targets) < count:
        assert rank(current, request).best is None
