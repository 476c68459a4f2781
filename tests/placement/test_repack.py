from __future__ import annotations

from collections import Counter
from dataclasses import replace
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.mig import Instance, product_by_key, valid_layouts, validate_layout
from fleet.mps import MpsRequest
from fleet.placement.defrag import plan_free_gpus
from fleet.placement.fit import eligibility
from fleet.placement.repack import solver as repack_solver
from fleet.placement.repack.solver import plan_repack
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuState,
    HostState,
    MigPartition,
    MigRequest,
)

H100 = "h100-sxm5-80gb"
A100 = "a100-sxm4-80gb"
PRODUCT = product_by_key(H100)
assert PRODUCT is not None
MEM = 81559


def mig_gpu(
    gpu_id: int,
    *parts: tuple[int, int, bool],
    host: int = 1,
    healthy: bool = True,
    cordoned: bool = False,
    product: str = H100,
) -> GpuState:
    partitions = tuple(
        MigPartition(gpu_id * 10 + k, pid, start, occupied, allocation_id=gpu_id * 100 + k)
        for k, (pid, start, occupied) in enumerate(parts)
    )
    return GpuState(
        gpu_id, host, product, MEM, "mig", healthy=healthy, cordoned=cordoned, partitions=partitions
    )


def mps_gpu(gpu_id: int, *clients: int, host: int = 1) -> GpuState:
    return GpuState(
        gpu_id,
        host,
        H100,
        MEM,
        "mps",
        mps_reservations=tuple(MpsRequest(m) for m in clients),
        mps_reservation_ids=tuple(gpu_id * 100 + k for k in range(len(clients))),
        whole_partition_id=gpu_id * 1000,
    )


def whole_gpu(gpu_id: int, *, taken: bool, product: str = H100, host: int = 1) -> GpuState:
    return GpuState(
        gpu_id, host, product, MEM, "dedicated", taken=taken, whole_partition_id=gpu_id * 1000
    )


def fleet(*gpus: GpuState, hosts: tuple[HostState, ...] = (HostState(1),)) -> FleetSnapshot:
    return FleetSnapshot(hosts, gpus)


def test_cp_sat_empties_the_gpus_that_move_fewest_replicas() -> None:
    # GPU 1 holds three 1g, GPU 3 a 4g and a 1g, GPU 2 one 3g: emptying GPU 2 moves one
    # replica, into GPU 1's slices 4-7 (the only 3g placement left).
    snapshot = fleet(
        mig_gpu(1, (19, 0, True), (19, 1, True), (19, 2, True)),
        mig_gpu(2, (9, 4, True)),
        mig_gpu(3, (5, 0, True), (19, 4, True)),
    )

    plan = plan_repack(snapshot, H100, 1)

    assert plan.feasible and plan.method == "cp-sat" and plan.status == "optimal"
    assert plan.freed == (2,) and plan.cost == 1 and plan.bound == 1
    assert [(m.from_gpu, m.to_gpu) for m in plan.moves] == [(2, 1)]
    assert plan.moves[0].new_instance == Instance(9, 4)


def test_several_replicas_share_a_target_as_the_mig_rules_allow() -> None:
    # Two 3g on GPUs 1 and 2, a 1g beside one of them: GPU 3 (a 4g) takes one 3g, GPU 4 (a 2g
    # and a 1g) the other and the 1g; no single GPU takes both 3g.
    snapshot = fleet(
        mig_gpu(1, (9, 4, True)),
        mig_gpu(2, (9, 4, True), (19, 0, True)),
        mig_gpu(3, (5, 0, True)),
        mig_gpu(4, (14, 0, True), (19, 2, True)),
    )

    plan = plan_repack(snapshot, H100, 2)
    greedy = plan_free_gpus(snapshot, 2)

    assert plan.feasible and plan.method == "cp-sat" and plan.freed == (1, 2)
    assert plan.cost == plan.bound == 3 <= sum(1 for m in greedy.moves if m.occupied)
    assert sorted(m.to_gpu or 0 for m in plan.moves) == [3, 4, 4]


def test_whole_gpu_replicas_move_to_a_free_gpu_of_another_product() -> None:
    snapshot = fleet(
        whole_gpu(1, taken=True),
        whole_gpu(2, taken=False, product=A100),
    )

    plan = plan_repack(snapshot, H100, 1)

    assert plan.feasible and plan.freed == (1,)
    assert [(m.kind, m.allocation_id, m.to_gpu) for m in plan.moves] == [("gpu", 1000, 2)]


def test_a_replica_limited_to_its_product_stays_and_the_answer_says_why() -> None:
    snapshot = fleet(whole_gpu(1, taken=True), whole_gpu(2, taken=False, product=A100))

    plan = plan_repack(snapshot, H100, 1, demands={("gpu", 1000): Demand(products=(H100,))})

    assert not plan.feasible and plan.moves == ()
    assert "fit on the GPUs left" in plan.reason


def test_gpus_with_multi_gpu_replicas_are_not_emptiable() -> None:
    snapshot = fleet(whole_gpu(1, taken=True), whole_gpu(2, taken=False, product=A100))

    plan = plan_repack(snapshot, H100, 1, pinned={1: "runs a replica of 2 GPUs"})

    assert not plan.feasible and plan.status == "no_candidates"
    assert plan.unmovable and plan.unmovable[0][0] == 1
    assert "cannot move" in plan.reason


def test_mps_clients_respect_the_memory_left_on_their_targets() -> None:
    # 30 + 30 GiB clients: one fits beside each 45 GiB, not both on one.
    snapshot = fleet(mps_gpu(1, 30000, 30000), mps_gpu(2, 45000), mps_gpu(3, 45000))

    plan = plan_repack(snapshot, H100, 1)

    assert plan.feasible and plan.freed == (1,)
    assert sorted(m.to_gpu for m in plan.moves if m.to_gpu) == [2, 3]


def test_without_ortools_the_greedy_plan_answers_and_says_so() -> None:
    snapshot = fleet(mig_gpu(1, (19, 0, True)), mig_gpu(2, (5, 0, True)))

    with mock.patch.object(repack_solver, "load_cp_model", return_value=None):
        plan = plan_repack(snapshot, H100, 1)

    assert plan.feasible and plan.method == "greedy" and plan.status == "not_installed"
    assert plan.freed == (1,) and plan.cost == 1 and plan.bound == 1


def test_a_model_too_big_falls_back_to_the_greedy_plan() -> None:
    snapshot = fleet(mig_gpu(1, (19, 0, True)), mig_gpu(2, (5, 0, True)))

    plan = plan_repack(snapshot, H100, 1, max_pairs=0)

    assert plan.method == "greedy" and plan.status == "too_big" and plan.freed == (1,)


def test_idle_gpus_of_the_product_are_counted_and_never_filled() -> None:
    snapshot = fleet(mig_gpu(1, (19, 0, True)), mig_gpu(2))

    plan = plan_repack(snapshot, H100, 1)

    assert not plan.feasible and plan.already_free == 1


LAYOUTS = [layout for layout in valid_layouts(PRODUCT, [0, 5, 9, 14, 19]) if len(layout) <= 4]


@st.composite
def snapshots(draw: st.DrawFn) -> FleetSnapshot:
    hosts = (HostState(1), HostState(2, cordoned=draw(st.booleans())))
    gpus: list[GpuState] = []
    for gpu_id in range(1, draw(st.integers(2, 7)) + 1):
        host = draw(st.sampled_from([1, 2]))
        kind = draw(st.sampled_from(["mig", "mig", "mps", "whole"]))
        if kind == "mig":
            layout: tuple[Instance, ...] = draw(st.sampled_from(LAYOUTS))
            parts = tuple((i.profile_id, i.start, draw(st.booleans())) for i in layout)
            gpus.append(
                mig_gpu(
                    gpu_id,
                    *parts,
                    host=host,
                    healthy=draw(st.booleans()) or gpu_id == 1,
                    cordoned=draw(st.booleans()),
                    product=draw(st.sampled_from([H100, H100, A100])),
                )
            )
        elif kind == "mps":
            clients = draw(
                st.lists(st.sampled_from([5000, 10000, 20000, 40000]), max_size=4).filter(
                    lambda c: sum(c) <= MEM
                )
            )
            gpus.append(mps_gpu(gpu_id, *clients, host=host))
        else:
            product = draw(st.sampled_from([H100, A100]))
            gpus.append(whole_gpu(gpu_id, taken=draw(st.booleans()), product=product, host=host))
    return FleetSnapshot(hosts, tuple(gpus))


def _rules_hold(before: FleetSnapshot, after: FleetSnapshot) -> None:
    for gpu in after.gpus:
        product = product_by_key(gpu.product_key or "")
        assert product is not None
        layout = [Instance(p.profile_id, p.start) for p in gpu.partitions]
        assert validate_layout(product, layout) == ()
        if gpu.mode == "mps":
            assert sum(r.memory_mib for r in gpu.mps_reservations) <= gpu.memory_mib
    assert Counter(g.mode for g in before.gpus) == Counter(g.mode for g in after.gpus)


@settings(max_examples=60, deadline=None)
@given(snapshot=snapshots(), count=st.integers(1, 3))
def test_cp_sat_plans_are_within_their_bound_never_worse_than_greedy_and_keep_every_rule(
    snapshot: FleetSnapshot, count: int
) -> None:
    plan = plan_repack(snapshot, H100, count, time_limit_s=5)
    greedy = plan_repack(snapshot, H100, count, use_solver=False)

    if greedy.feasible:
        assert plan.feasible and plan.cost <= greedy.cost
    if not plan.feasible:
        assert plan.moves == () and plan.reason
        return
    assert plan.bound <= plan.cost
    assert len(plan.freed) == count == len(set(plan.freed))
    blocked = {g.id for g in snapshot.gpus if eligibility(snapshot, g)}
    for move in plan.moves:
        assert move.from_gpu in plan.freed
        assert move.to_gpu not in plan.freed and move.to_gpu not in blocked
    for gpu_id in plan.freed:
        freed = plan.snapshot.gpu(gpu_id)
        assert freed is not None and freed.product_key == H100
        assert not freed.partitions and not freed.mps_reservations and not freed.taken
    _rules_hold(snapshot, plan.snapshot)


def test_a_mig_replica_moves_by_its_profile_name_never_by_an_id_another_product_reuses() -> None:
    # Profile id 9 is 3g.40gb on an H100 and 3g.71gb on an H200: by id alone the H100's replica
    # would land on the H200 in an instance its deployment never asked for.
    h200 = replace(mig_gpu(2, (19, 0, True)), product_key="h200-sxm-141gb", memory_mib=143771)
    snapshot = fleet(mig_gpu(1, (9, 4, True)), h200)
    asked = {("mig", 10): MigRequest("3g.40gb")}

    assert plan_repack(snapshot, H100, 1).feasible
    assert plan_repack(snapshot, H100, 1, use_solver=False).feasible
    for use_solver in (True, False):
        plan = plan_repack(snapshot, H100, 1, requests=asked, use_solver=use_solver)
        assert not plan.feasible and plan.moves == ()
