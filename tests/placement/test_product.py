"""The product strategy: fragmentation against the fleet's request mix, on small snapshots."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.mig import Instance, product_by_key, validate_layout
from fleet.mps import MpsDevice, MpsPolicy, MpsRequest, check_fit
from fleet.placement import rules
from fleet.placement.fit import STRATEGIES, Refusal, Target, check, rank
from fleet.placement.mix import RequestMix, RequestShape
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

H100 = "h100-sxm5-80gb"
MEM = 81559


def mix(*weighted: tuple[RequestShape, float]) -> RequestMix:
    return RequestMix.from_counts(dict(weighted), coverage=1.0)


def mps_gpu(gpu_id: int, host_id: int, *reserved: int) -> GpuState:
    return GpuState(
        gpu_id, host_id, H100, MEM, "mps", mps_reservations=tuple(MpsRequest(m) for m in reserved)
    )


def test_an_mps_share_goes_where_it_leaves_room_for_the_shares_that_come() -> None:
    # 30 GB free on GPU 1, 45 GB on GPU 2. The fleet asks for 20 GB and 40 GB shares: 20 GB on
    # GPU 1 strands 10 GB, on GPU 2 leaves 25 GB that a 20 GB share can still use.
    snapshot = FleetSnapshot(
        (HostState(1),), (mps_gpu(1, 1, MEM - 30000), mps_gpu(2, 1, MEM - 45000))
    )
    shares = mix((RequestShape("mps", memory_mib=20000), 1.0))

    best = rank(snapshot, MpsRequest(20000), mix=shares).best
    best_fit = rank(snapshot, MpsRequest(20000), strategy="best_fit").best

    assert best is not None and best_fit is not None
    assert (best.gpu_id, best_fit.gpu_id) == (2, 1)


def test_an_mps_share_packs_onto_a_used_gpu_and_keeps_idle_ones_whole() -> None:
    snapshot = FleetSnapshot((HostState(1),), (mps_gpu(1, 1), mps_gpu(2, 1, 20000)))

    ranking = rank(snapshot, MpsRequest(10000))

    assert [t.gpu_id for t in ranking.feasible] == [2, 1]


def test_a_small_mig_instance_keeps_the_large_profiles_placeable() -> None:
    snapshot = FleetSnapshot((HostState(1),), (GpuState(1, 1, H100, MEM, "mig"),))
    learned = mix(
        (RequestShape("mig", profile="1g.10gb"), 0.5), (RequestShape("mig", profile="4g.40gb"), 0.5)
    )

    for strategy_mix in (learned, None):
        best = rank(snapshot, MigRequest("1g.10gb"), mix=strategy_mix).best
        assert best is not None and best.new_instance is not None
        assert best.new_instance.start >= 4  # 4g.40gb only fits at slice 0


def test_a_mig_instance_fills_the_hole_the_mix_cannot_use_elsewhere() -> None:
    # GPU 1 holds a 4g at 0 (a 3g still fits at 4); GPU 2 holds a 2g at 0 (a 2g hole at 2-3).
    # With 3g and 1g requests coming, a 1g belongs in the hole, not in the 3g's place.
    product = product_by_key(H100)
    assert product is not None
    p4g, p2g = product.profile("4g.40gb"), product.profile("2g.20gb")
    assert p4g is not None and p2g is not None
    snapshot = FleetSnapshot(
        (HostState(1),),
        (
            GpuState(1, 1, H100, MEM, "mig", partitions=(MigPartition(1, p4g.id, 0, True),)),
            GpuState(2, 1, H100, MEM, "mig", partitions=(MigPartition(2, p2g.id, 0, True),)),
        ),
    )
    coming = mix(
        (RequestShape("mig", profile="3g.40gb"), 0.5), (RequestShape("mig", profile="1g.10gb"), 0.5)
    )

    best = rank(snapshot, MigRequest("1g.10gb"), mix=coming).best

    assert best is not None and best.new_instance is not None
    assert best.gpu_id == 2 and best.new_instance.start in (2, 3)


def test_a_single_gpu_keeps_whole_hosts_for_the_multi_gpu_requests_of_the_mix() -> None:
    hosts = (HostState(1), HostState(2))
    gpus = tuple(GpuState(g, 1, H100, MEM) for g in range(4)) + tuple(
        GpuState(10 + g, 2, H100, MEM, taken=g < 2) for g in range(4)
    )
    snapshot = FleetSnapshot(hosts, gpus)
    fleet_mix = mix(
        (RequestShape("gpu", gpu_count=1), 0.5), (RequestShape("gpu", gpu_count=4), 0.5)
    )

    best = rank(snapshot, WholeGpuRequest(1), mix=fleet_mix).best
    four = rank(snapshot, WholeGpuRequest(4), mix=fleet_mix).best

    assert best is not None and best.gpu_ids == (12,)
    assert four is not None and four.gpu_ids == (0, 1, 2, 3)


def test_host_cpu_and_memory_and_allowed_products_are_rules_for_every_strategy() -> None:
    hosts = (HostState(1, cpu_free_milli=1000, memory_free_mib=4096), HostState(2))
    gpus = (mps_gpu(1, 1), GpuState(2, 2, "a30-24gb", 24000, "mps"))
    snapshot = FleetSnapshot(hosts, gpus)
    demand = Demand(cpu_milli=2000, host_memory_mib=8192, products=(H100,))

    for strategy in STRATEGIES:
        ranking = rank(snapshot, MpsRequest(1000), strategy=strategy, demand=demand)
        assert ranking.feasible == ()
        one, two = ranking.verdict(1), ranking.verdict(2)
        assert isinstance(one, Refusal) and isinstance(two, Refusal)
        assert [v.code for v in one.violations] == ["placement.host_cpu", "placement.host_memory"]
        assert [v.code for v in two.violations] == ["placement.product_mismatch"]
    assert rank(snapshot, MpsRequest(1000)).best is not None  # the product sets no demand


def test_the_best_target_is_first_of_the_deferred_list_and_check_agrees() -> None:
    snapshot = FleetSnapshot(
        (HostState(1), HostState(2)),
        (mps_gpu(1, 1, 60000), mps_gpu(2, 1), mps_gpu(3, 2, 30000), GpuState(4, 2, H100, MEM)),
    )
    request = MpsRequest(15000)

    ranking = rank(snapshot, request)

    assert ranking.best == ranking.feasible[0]
    assert ranking.infeasible == rank(snapshot, request, strategy="first_fit").infeasible
    for target in ranking.feasible:
        verdict = check(snapshot, request, gpu_id=target.gpu_id, partition_id=target.partition_id)
        assert verdict == target


@st.composite
def fleets(draw: st.DrawFn) -> FleetSnapshot:
    product = product_by_key(H100)
    assert product is not None
    gpus = []
    for gpu_id in range(draw(st.integers(1, 6))):
        host = gpu_id // 3
        mode = draw(st.sampled_from(["mps", "mig", "dedicated"]))
        gpu = GpuState(gpu_id, host, H100, MEM, mode, cordoned=draw(st.booleans()) and gpu_id == 0)
        if mode == "mps":
            reserved = draw(st.lists(st.sampled_from([5000, 10000, 30000]), max_size=4))
            gpu = replace(gpu, mps_reservations=tuple(MpsRequest(m) for m in reserved))
        elif mode == "mig":
            instances: list[Instance] = []
            for profile_id, start in draw(
                st.lists(st.sampled_from([(19, 0), (19, 5), (14, 2), (9, 4), (5, 0)]), max_size=3)
            ):
                if not validate_layout(product, (*instances, Instance(profile_id, start))):
                    instances.append(Instance(profile_id, start))
            partitions = []
            for k, instance in enumerate(instances):
                share = None
                if draw(st.booleans()):
                    share = MpsShare(
                        MpsDevice(10000, 4), None, (MpsRequest(2000),) * draw(st.integers(0, 2))
                    )
                partitions.append(
                    MigPartition(
                        100 * gpu_id + k,
                        instance.profile_id,
                        instance.start,
                        draw(st.booleans()),
                        mps=share,
                    )
                )
            gpu = replace(gpu, partitions=tuple(partitions))
        else:
            gpu = replace(gpu, taken=draw(st.booleans()))
        gpus.append(gpu)
    hosts = tuple(HostState(h) for h in range(2))
    return FleetSnapshot(hosts, tuple(gpus))


requests = st.one_of(
    st.builds(MpsRequest, st.sampled_from([1000, 8000, 40000, 90000])),
    st.builds(MigRequest, st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"])),
    st.builds(WholeGpuRequest, st.integers(1, 3)),
)


@settings(max_examples=80, deadline=None)
@given(snapshot=fleets(), request=requests)
def test_every_strategy_finds_the_same_targets_and_refusals(snapshot, request) -> None:
    product = rank(snapshot, request)
    classic = rank(snapshot, request, strategy="first_fit")

    def where(targets: tuple[Target, ...]) -> set[tuple[int, int | None, tuple[int, ...]]]:
        return {(t.gpu_id, t.partition_id, t.gpu_ids) for t in targets if t.new_instance is None}

    assert where(product.feasible) == where(classic.feasible)
    assert {t.gpu_id for t in product.feasible} == {t.gpu_id for t in classic.feasible}
    assert product.infeasible == classic.infeasible
    assert product.best == (product.feasible[0] if product.feasible else None)


@settings(max_examples=40, deadline=None)
@given(snapshot=fleets(), request=requests, data=st.data())
def test_a_snapshot_changed_in_place_ranks_like_a_fresh_one(snapshot, request, data) -> None:
    rank(snapshot, request)  # fill the memos
    gpu = data.draw(st.sampled_from(snapshot.gpus))
    changed = replace(gpu, cordoned=not gpu.cordoned)

    carried = snapshot.with_changes(gpus=(changed,))
    fresh = FleetSnapshot(
        snapshot.hosts, tuple(changed if g.id == gpu.id else g for g in snapshot.gpus)
    )

    assert rank(carried, request) == rank(fresh, request)


@settings(max_examples=200, deadline=None)
@given(
    memory=st.integers(1, 40000),
    compute=st.one_of(st.none(), st.integers(1, 100)),
    reserved=st.lists(st.integers(1, 20000), max_size=5),
    clients=st.integers(1, 6),
    policy=st.one_of(
        st.none(),
        st.builds(
            MpsPolicy,
            st.integers(1, 100),
            st.one_of(st.none(), st.integers(1, 40000)),
            st.one_of(st.none(), st.integers(1, 6)),
        ),
    ),
    blocked=st.booleans(),
)
def test_the_fast_mps_rule_answers_like_check_fit(
    memory, compute, reserved, clients, policy, blocked
) -> None:
    share = MpsShare(
        MpsDevice(40000, clients), policy, tuple(MpsRequest(m) for m in reserved), blocked=blocked
    )
    request = MpsRequest(memory, compute)

    fast = rules.mps_takes(rules.share_state(share), memory, compute)

    assert fast == (
        not blocked and not check_fit(share.device, share.reservations, request, policy)
    )


@pytest.mark.parametrize("healthy", [True, False])
@pytest.mark.parametrize("cordoned", [True, False])
@pytest.mark.parametrize("cpu", [None, 500, 5000])
@pytest.mark.parametrize("products", [(), (H100,), ("a30-24gb",)])
@pytest.mark.parametrize("runtime", [None, "process", "docker"])
def test_the_fast_host_and_gpu_rules_answer_like_the_violations(
    healthy, cordoned, cpu, products, runtime
) -> None:
    host = HostState(1, healthy=healthy, cordoned=cordoned, cpu_free_milli=cpu, runtime=runtime)
    gpu = GpuState(1, 1, H100, MEM, "mps")
    snapshot = FleetSnapshot((host,), (gpu,))
    demand = Demand(cpu_milli=1000, products=products, runtimes=("docker",))

    fast = rules.host_takes(host, demand) and rules.gpu_takes(gpu, demand)

    assert fast == (not rules.blocked(snapshot, gpu, demand))


@settings(max_examples=30, deadline=None)
@given(
    snapshot=fleets(),
    copies=st.integers(2, 4),
    stream=st.lists(requests, min_size=1, max_size=6),
)
def test_hosts_in_equal_states_share_answers_without_changing_them(
    snapshot, copies, stream
) -> None:
    # The same hosts several times over: answers come from the first host of each state.
    hosts = tuple(HostState(10 * c + h.id) for c in range(copies) for h in snapshot.hosts)
    gpus = tuple(
        replace(
            g,
            id=1000 * c + g.id,
            host_id=10 * c + g.host_id,
            partitions=tuple(replace(p, id=1000 * c + p.id) for p in g.partitions),
        )
        for c in range(copies)
        for g in snapshot.gpus
    )
    fleet = FleetSnapshot(hosts, gpus)
    learned = RequestMix.of((r, 1.0) for r in stream)
    for request in stream:
        ranking = rank(fleet, request, mix=learned)
        assert ranking.best == (ranking.feasible[0] if ranking.feasible else None)
        if ranking.best is not None:
            gpu = fleet.gpu(ranking.best.gpu_id)
            assert gpu is not None
            fleet = fleet.with_changes(gpus=(replace(gpu, cordoned=True),))
