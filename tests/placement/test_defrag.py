from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.mig import Instance, product_by_key, valid_layouts, validate_layout
from fleet.mps import MpsRequest
from fleet.placement.defrag import Move, plan_free_gpus, plan_moves
from fleet.placement.fit import eligibility, rank
from fleet.placement.snapshot import (
    FleetSnapshot,
    GpuState,
    HostState,
    MigPartition,
    MigRequest,
    WholeGpuRequest,
)

H100 = "h100-sxm5-80gb"
PRODUCT = product_by_key(H100)
assert PRODUCT is not None
MEM = 81559


def mig_gpu(
    gpu_id: int,
    *parts: tuple[int, int, bool],
    host: int = 1,
    healthy: bool = True,
    cordoned: bool = False,
) -> GpuState:
    partitions = tuple(
        MigPartition(gpu_id * 10 + k, pid, start, occupied, allocation_id=gpu_id * 100 + k)
        for k, (pid, start, occupied) in enumerate(parts)
    )
    return GpuState(
        gpu_id, host, H100, MEM, "mig", healthy=healthy, cordoned=cordoned, partitions=partitions
    )


def fleet(*gpus: GpuState, hosts: tuple[HostState, ...] = (HostState(1),)) -> FleetSnapshot:
    return FleetSnapshot(hosts, gpus)


# GPU 1: a 1g at slice 0 keeps a 4g (start 0 only) out; GPU 2: a 4g, slices 4-7 free.
BLOCKED = mig_gpu(1, (19, 0, True), (9, 4, True))
ROOMY = mig_gpu(2, (5, 0, True))


def test_a_request_that_fits_needs_no_moves() -> None:
    plan = plan_moves(fleet(ROOMY), MigRequest("1g.10gb"))

    assert plan.moves == ()
    assert plan.target is not None and plan.target.gpu_id == 2


def test_one_move_of_a_1g_lets_a_4g_in() -> None:
    snapshot = fleet(BLOCKED, ROOMY)
    assert rank(snapshot, MigRequest("4g.40gb")).best is None

    plan = plan_moves(snapshot, MigRequest("4g.40gb"))

    assert plan.moves == (Move("mig", 10, 1, 2, None, plan.moves[0].new_instance),)
    assert plan.target is not None and plan.target.gpu_id == 1
    assert rank(plan.snapshot, MigRequest("4g.40gb")).best == plan.target
    moved = next(p for g in plan.snapshot.gpus if g.id == 2 for p in g.partitions if p.id == 10)
    assert (moved.occupied, moved.allocation_id) == (True, 100)


def test_an_idle_partition_in_the_way_is_destroyed_not_moved() -> None:
    plan = plan_moves(fleet(mig_gpu(1, (19, 0, False), (9, 4, True))), MigRequest("4g.40gb"))

    assert plan.moves == (Move("mig", 10, 1, None, occupied=False),)
    assert plan.fits


def test_moves_never_land_on_cordoned_or_unhealthy_gpus() -> None:
    hosts = (HostState(1), HostState(2, healthy=False))
    cordoned = mig_gpu(2, (5, 0, True), cordoned=True)
    sick_host = mig_gpu(3, (5, 0, True), host=2)
    sick_gpu = mig_gpu(4, (5, 0, True), healthy=False)

    stuck = plan_moves(
        fleet(BLOCKED, cordoned, sick_host, sick_gpu, hosts=hosts), request := MigRequest("4g.40gb")
    )
    helped = plan_moves(fleet(BLOCKED, cordoned, sick_host, sick_gpu, ROOMY, hosts=hosts), request)

    assert not stuck.fits and stuck.moves == ()
    assert [m.to_gpu for m in helped.moves] == [ROOMY.id]


def test_the_fewest_moves_win() -> None:
    two_in_the_way = mig_gpu(1, (19, 0, True), (19, 1, True))
    one_in_the_way = mig_gpu(3, (19, 2, True))
    spare = mig_gpu(2, (5, 0, True))

    plan = plan_moves(fleet(two_in_the_way, spare, one_in_the_way), MigRequest("4g.40gb"))

    assert len(plan.moves) == 1 and plan.moves[0].from_gpu == 3


def test_mps_clients_move_to_make_memory_room() -> None:
    a = GpuState(
        1,
        1,
        H100,
        MEM,
        "mps",
        mps_reservations=(MpsRequest(40000), MpsRequest(30000)),
        mps_reservation_ids=(7, 8),
    )
    b = GpuState(2, 1, H100, MEM, "mps", mps_reservations=(MpsRequest(45000),))

    plan = plan_moves(fleet(a, b), MpsRequest(40000))  # only the 30000 client fits on b

    assert [(m.kind, m.allocation_id, m.from_gpu, m.to_gpu) for m in plan.moves] == [
        ("mps", 8, 1, 2)
    ]
    assert plan.target is not None and plan.target.gpu_id == 1


def test_whole_gpu_requests_are_not_planned_for() -> None:
    assert not plan_moves(fleet(BLOCKED, ROOMY), WholeGpuRequest(1)).fits


def test_plan_free_gpus_empties_the_lightest_gpus_onto_busy_ones() -> None:
    light = mig_gpu(1, (19, 0, True))
    half = mig_gpu(2, (5, 0, True))
    other = mig_gpu(3, (14, 0, True))
    empty = mig_gpu(4)

    plan = plan_free_gpus(fleet(light, half, other, empty), 2)

    assert plan.freed == (1, 3)
    assert [m.to_gpu for m in plan.moves] == [2, 2]
    assert all(not g.partitions for g in plan.snapshot.gpus if g.id in plan.freed)


def test_plan_free_gpus_frees_fewer_when_no_more_fit_elsewhere() -> None:
    # 4g + 3g fill the 4g's GPU: the 1g then has nowhere to go but the empty GPU.
    light = mig_gpu(1, (19, 0, True))
    half = mig_gpu(2, (5, 0, True))
    other = mig_gpu(3, (9, 4, True))

    plan = plan_free_gpus(fleet(light, half, other, mig_gpu(4)), 2)

    assert len(plan.freed) == 1 and len(plan.moves) == 1


LAYOUTS = [layout for layout in valid_layouts(PRODUCT, [0, 5, 9, 14, 19]) if len(layout) <= 4]


@st.composite
def snapshots(draw: st.DrawFn) -> FleetSnapshot:
    hosts = (HostState(1), HostState(2, cordoned=draw(st.booleans())))
    gpus = []
    for gpu_id in range(1, draw(st.integers(2, 5)) + 1):
        layout: tuple[Instance, ...] = draw(st.sampled_from(LAYOUTS))
        parts = tuple((i.profile_id, i.start, draw(st.booleans())) for i in layout)
        gpus.append(
            mig_gpu(
                gpu_id,
                *parts,
                host=draw(st.sampled_from([1, 2])),
                healthy=draw(st.booleans()) or gpu_id == 1,
                cordoned=draw(st.booleans()),
            )
        )
    return FleetSnapshot(hosts, tuple(gpus))


@settings(max_examples=60, deadline=None)
@given(snapshot=snapshots(), profile=st.sampled_from(["7g.80gb", "4g.40gb", "3g.40gb", "2g.20gb"]))
def test_plans_make_the_request_fit_with_valid_layouts_on_eligible_targets(
    snapshot: FleetSnapshot, profile: str
) -> None:
    request = MigRequest(profile)

    plan = plan_moves(snapshot, request, max_moves=2)

    blocked = {g.id for g in snapshot.gpus if eligibility(snapshot, g)}
    assert all(m.to_gpu not in blocked for m in plan.moves)
    assert len(plan.moves) <= 2
    if plan.fits:
        assert rank(plan.snapshot, request).best == plan.target
    for gpu in plan.snapshot.gpus:
        layout = [Instance(p.profile_id, p.start) for p in gpu.partitions]
        assert validate_layout(PRODUCT, layout) == ()
    assert plan_moves(snapshot, request, max_moves=2) == plan


@settings(max_examples=40, deadline=None)
@given(snapshot=snapshots(), count=st.integers(1, 3))
def test_free_gpu_plans_empty_gpus_without_touching_blocked_targets(
    snapshot: FleetSnapshot, count: int
) -> None:
    plan = plan_free_gpus(snapshot, count)

    blocked = {g.id for g in snapshot.gpus if eligibility(snapshot, g)}
    assert len(plan.freed) <= count
    assert all(m.to_gpu not in blocked and m.to_gpu not in plan.freed for m in plan.moves)
    for gpu in plan.snapshot.gpus:
        layout = [Instance(p.profile_id, p.start) for p in gpu.partitions]
        assert validate_layout(PRODUCT, layout) == ()
        assert gpu.id not in plan.freed or not gpu.partitions


def test_a_replica_moved_out_of_the_way_keeps_its_profile_name_across_products() -> None:
    # Profile id 19 is 1g.10gb on an H100 and 1g.18gb on an H200: by id alone the 1g would move
    # to the H200 into a profile its deployment never asked for.
    blocked = mig_gpu(1, (19, 0, True))
    h200 = GpuState(2, 1, "h200-sxm-141gb", 143771, "mig")
    snapshot = fleet(blocked, h200)

    assert [m.to_gpu for m in plan_moves(snapshot, MigRequest("4g.40gb")).moves] == [2]
    by_name = plan_moves(
        snapshot, MigRequest("4g.40gb"), requests={("mig", 10): MigRequest("1g.10gb")}
    )
    assert not by_name.fits and by_name.moves == ()


@st.composite
def changed_snapshots(draw: st.DrawFn) -> tuple[FleetSnapshot, FleetSnapshot, set[int]]:
    """A fleet of up to four hosts, and the same fleet with a few of its GPUs' layouts changed
    (as a planned move changes them), and the hosts that changed."""
    hosts = tuple(HostState(h) for h in range(1, 5))
    gpus = []
    for gpu_id in range(1, draw(st.integers(2, 10)) + 1):
        layout = draw(st.sampled_from(LAYOUTS))
        parts = tuple((i.profile_id, i.start, draw(st.booleans())) for i in layout)
        gpus.append(
            mig_gpu(gpu_id, *parts, host=draw(st.integers(1, 4)), cordoned=draw(st.booleans()))
        )
    base = FleetSnapshot(hosts, tuple(gpus))
    rank(base, MigRequest("1g.10gb"))  # the groups and their memos exist, as in a plan
    changed: list[GpuState] = []
    for gpu in draw(st.lists(st.sampled_from(gpus), max_size=3, unique_by=lambda g: g.id)):
        layout = draw(st.sampled_from(LAYOUTS))
        parts = tuple((i.profile_id, i.start, draw(st.booleans())) for i in layout)
        changed.append(mig_gpu(gpu.id, *parts, host=gpu.host_id, cordoned=gpu.cordoned))
    return base, base.with_changes(gpus=changed), {g.host_id for g in changed}


@settings(max_examples=80, deadline=None)
@given(
    fleets=changed_snapshots(),
    profile=st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    keep_out=st.sets(st.integers(1, 10), max_size=3),
)
def test_the_planners_ranking_of_a_changed_snapshot_is_the_full_rankings(
    fleets: tuple[FleetSnapshot, FleetSnapshot, set[int]], profile: str, keep_out: set[int]
) -> None:
    # The move search ranks only the hosts its planned moves changed and reads the others from
    # the unchanged snapshot's ranking: the answer is the full ranking's, exactly.
    from fleet.placement.defrag import _Ranker

    base, current, hosts = fleets
    request = MigRequest(profile)
    full = rank(current, request).feasible
    expected = next((t for t in full if t.gpu_id not in keep_out), None)
    kept_out = {*keep_out, *(g.id for g in current.gpus if g.host_id in hosts and not keep_out)}
    assert _Ranker(base, "product").first(current, hosts, request, None, keep_out) == expected
    other = next((t for t in full if t.gpu_id not in kept_out), None)
    assert _Ranker(base, "product").first(current, hosts, request, None, kept_out) == other
