from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.mps import MpsRequest
from fleet.placement.fit import STRATEGIES, Refusal, Target, rank
from fleet.placement.snapshot import (
    FleetSnapshot,
    GpuState,
    HostState,
    MigPartition,
    MigRequest,
    WholeGpuRequest,
)

H100 = "h100-sxm5-80gb"
MEM = 81559


def fleet(
    *gpus: GpuState, hosts: tuple[HostState, ...] = (HostState(1), HostState(2))
) -> FleetSnapshot:
    return FleetSnapshot(hosts, gpus)


def codes(ranking_entry: Target | Refusal | None) -> list[str]:
    assert isinstance(ranking_entry, Refusal)
    return [v.code for v in ranking_entry.violations]


@pytest.mark.parametrize(
    ("gpu", "request_", "code"),
    [
        (GpuState(1, 1, H100, MEM, "mps", cordoned=True), MpsRequest(1000), "placement.cordoned"),
        (GpuState(1, 1, H100, MEM, "mps", healthy=False), MpsRequest(1000), "placement.unhealthy"),
        (GpuState(1, 1, H100, MEM, "mig"), MpsRequest(1000), "placement.mode_mismatch"),
        (GpuState(1, 1, H100, MEM, "mps"), MpsRequest(MEM + 1), "placement.memory"),
        (GpuState(1, 1, H100, MEM, "mps"), MpsRequest(1000, 0), "placement.compute"),
        (GpuState(1, 1, H100, MEM, "mig"), MigRequest("9g.99gb"), "placement.profile_unavailable"),
        (GpuState(1, 1, None, MEM, "mig"), MigRequest("1g.10gb"), "placement.profile_unavailable"),
        (GpuState(1, 1, H100, MEM, "mps"), MigRequest("1g.10gb"), "placement.mode_mismatch"),
        (
            GpuState(1, 1, H100, MEM, "dedicated", taken=True),
            WholeGpuRequest(1),
            "placement.gpu_busy",
        ),
        (GpuState(1, 1, H100, MEM, "dedicated"), WholeGpuRequest(2), "placement.no_free_gpus"),
        (
            GpuState(1, 1, H100, MEM, "mig", partitions=(MigPartition(5, 0, 0, occupied=False),)),
            MigRequest("1g.10gb"),
            "placement.no_free_space",
        ),
    ],
)
def test_rank_says_why_a_gpu_cannot_take_the_request(gpu, request_, code) -> None:
    ranking = rank(fleet(gpu), request_)

    assert ranking.feasible == ()
    assert code in codes(ranking.verdict(1))


def test_a_cordoned_host_refuses_all_its_gpus() -> None:
    snapshot = fleet(GpuState(1, 2, H100, MEM, "mps"), hosts=(HostState(2, cordoned=True),))

    assert codes(rank(snapshot, MpsRequest(1000)).verdict(1)) == ["placement.cordoned"]


def test_a_free_partition_of_the_profile_comes_before_creating_an_instance() -> None:
    snapshot = fleet(
        GpuState(1, 1, H100, MEM, "mig"),
        GpuState(2, 1, H100, MEM, "mig", partitions=(MigPartition(7, 19, 3),)),
    )

    best = rank(snapshot, MigRequest("1g.10gb")).best

    assert best is not None
    assert (best.gpu_id, best.partition_id, best.new_instance) == (2, 7, None)


def test_fragmentation_aware_packs_mig_onto_a_used_gpu_and_keeps_empty_ones_whole() -> None:
    snapshot = fleet(
        GpuState(1, 1, H100, MEM, "mig"),
        GpuState(2, 1, H100, MEM, "mig", partitions=(MigPartition(7, 9, 0, occupied=True),)),
    )

    best = rank(snapshot, MigRequest("3g.40gb")).best

    assert best is not None
    assert best.gpu_id == 2
    assert best.new_instance is not None
    assert best.new_instance.start == 4


def test_whole_gpu_requests_take_n_gpus_on_one_host() -> None:
    snapshot = fleet(
        GpuState(1, 1, H100, MEM),
        GpuState(2, 2, H100, MEM),
        GpuState(3, 2, H100, MEM),
    )

    ranking = rank(snapshot, WholeGpuRequest(2))

    assert [t.gpu_ids for t in ranking.feasible] == [(2, 3)]
    assert codes(ranking.verdict(1)) == ["placement.no_free_gpus"]


def test_mps_packs_onto_the_gpu_that_already_has_clients() -> None:
    snapshot = fleet(
        GpuState(1, 1, H100, MEM, "mps"),
        GpuState(2, 1, H100, MEM, "mps", mps_reservations=(MpsRequest(20000),)),
    )

    assert [t.gpu_id for t in rank(snapshot, MpsRequest(20000)).feasible] == [2, 1]


def test_an_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown strategy"):
        rank(fleet(), MpsRequest(1), strategy="worst_fit")  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    reservations=st.lists(st.lists(st.integers(1, 40000), max_size=4), min_size=1, max_size=5),
    memory=st.integers(1, 90000),
    strategy=st.sampled_from(STRATEGIES),
)
def test_mps_targets_never_exceed_reserved_capacity(reservations, memory, strategy) -> None:
    gpus = tuple(
        GpuState(i, 1, H100, MEM, "mps", mps_reservations=tuple(MpsRequest(m) for m in r))
        for i, r in enumerate(reservations)
    )
    ranking = rank(fleet(*gpus), MpsRequest(memory), strategy=strategy)

    by_id = {g.id: g for g in gpus}
    for target in ranking.feasible:
        used = sum(r.memory_mib for r in by_id[target.gpu_id].mps_reservations)
        assert used + memory <= MEM
    assert len(ranking.feasible) + len(ranking.infeasible) == len(gpus)
    assert rank(fleet(*gpus), MpsRequest(memory), strategy=strategy) == ranking


@settings(max_examples=40, deadline=None)
@given(
    layout=st.lists(
        st.sampled_from([(19, 0), (19, 1), (14, 2), (9, 4), (5, 0), (15, 6)]), max_size=3
    ),
    profile=st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    strategy=st.sampled_from(STRATEGIES),
)
def test_new_mig_instances_always_make_a_valid_layout(layout, profile, strategy) -> None:
    from fleet.mig import Instance, product_by_key, validate_layout

    product = product_by_key(H100)
    assert product is not None
    instances: list[Instance] = []
    for profile_id, start in layout:
        if not validate_layout(product, (*instances, Instance(profile_id, start))):
            instances.append(Instance(profile_id, start))
    partitions = tuple(
        MigPartition(k, i.profile_id, i.start, occupied=True) for k, i in enumerate(instances)
    )
    ranking = rank(
        fleet(GpuState(1, 1, H100, MEM, "mig", partitions=partitions)),
        MigRequest(profile),
        strategy=strategy,
    )

    for target in ranking.feasible:
        assert target.new_instance is not None
        assert validate_layout(product, (*instances, target.new_instance)) == ()
