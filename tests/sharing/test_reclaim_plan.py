"""The pure reclaim plan: place without touching anyone, else move borrowed replicas out of the
way, only then stop borrowed ones (lowest priority, most recent first, never younger than the
minimum runtime), and touch nothing when even that would not place the claimant."""

from __future__ import annotations

from fleet.mps import MpsRequest
from fleet.placement.reclaim import Borrowed, reclaim_plan, stop_order
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
NOW = 10_000.0


def mps_gpu(gpu_id, host_id, clients):
    """An MPS GPU with ``clients``: ``(allocation id, memory MiB)``."""
    return GpuState(
        gpu_id,
        host_id,
        H100,
        MEM,
        "mps",
        mps_reservations=tuple(MpsRequest(mib) for _, mib in clients),
        mps_reservation_ids=tuple(i for i, _ in clients),
    )


def whole(gpu_id, host_id, taken=True):
    return GpuState(gpu_id, host_id, H100, MEM, taken=taken)


def plan(snapshot, request, borrowed=(), min_runtime_s=0.0):
    return reclaim_plan(
        snapshot, request, borrowed=borrowed, now_s=NOW, min_runtime_s=min_runtime_s
    )


def test_a_claimant_that_fits_is_placed_without_touching_anyone():
    snapshot = FleetSnapshot((HostState(1),), (whole(1, 1, taken=False),))
    borrowed = [Borrowed(("gpu", 1), 1, 100, 0.0)]
    found = plan(snapshot, WholeGpuRequest(), borrowed)
    assert (found.action, found.target.gpu_id, found.moves, found.stops) == ("place", 1, (), ())


def busy_mps_fleet():
    # GPU 1: a borrowed 30 GB client (101) and a guaranteed 20 GB one; GPU 2: 50 GB guaranteed.
    # A 40 GB claimant fits on neither; moving 101 to GPU 2 frees room on GPU 1.
    return FleetSnapshot(
        (HostState(1),),
        (mps_gpu(1, 1, [(101, 30_000), (102, 20_000)]), mps_gpu(2, 1, [(201, 50_000)])),
    )


def test_a_borrowed_replica_is_moved_out_of_the_way_before_anything_is_stopped():
    borrowed = [Borrowed(("mps", 101), 1, 100, 0.0)]
    found = plan(busy_mps_fleet(), MpsRequest(40_000), borrowed)
    assert found.action == "move" and found.stops == ()
    assert [(m.allocation_id, m.from_gpu, m.to_gpu) for m in found.moves] == [(101, 1, 2)]
    assert found.target.gpu_id == 1


def test_only_borrowed_replicas_move_and_with_none_nothing_is_touched():
    found = plan(busy_mps_fleet(), MpsRequest(40_000), borrowed=[])
    assert found.action == "none" and found.moves == () and found.stops == ()
    assert "No net gain" in found.reason


def test_with_nowhere_to_move_the_lowest_priority_borrowed_replica_is_stopped():
    snapshot = FleetSnapshot((HostState(1),), (whole(1, 1), whole(2, 1)))
    borrowed = [Borrowed(("gpu", 1), 1, 500, 0.0), Borrowed(("gpu", 2), 2, 100, 50.0)]
    found = plan(snapshot, WholeGpuRequest(), borrowed)
    assert found.action == "stop"
    assert [b.key for b in found.stops] == [("gpu", 2)] and found.target.gpu_id == 2


def test_within_a_priority_the_most_recently_started_stops_first():
    borrowed = [Borrowed(("gpu", 1), 1, 100, 10.0), Borrowed(("gpu", 2), 2, 100, 20.0)]
    assert [b.key for b in stop_order(borrowed, NOW, 0)] == [("gpu", 2), ("gpu", 1)]
    snapshot = FleetSnapshot((HostState(1),), (whole(1, 1), whole(2, 1)))
    assert [b.key for b in plan(snapshot, WholeGpuRequest(), borrowed).stops] == [("gpu", 2)]


def test_a_replica_younger_than_the_minimum_runtime_is_not_stopped():
    snapshot = FleetSnapshot((HostState(1),), (whole(1, 1), whole(2, 1)))
    old, young = Borrowed(("gpu", 1), 1, 100, 0.0), Borrowed(("gpu", 2), 2, 100, NOW - 60)
    found = plan(snapshot, WholeGpuRequest(), [old, young], min_runtime_s=600)
    assert [b.key for b in found.stops] == [("gpu", 1)]
    none = plan(snapshot, WholeGpuRequest(), [young], min_runtime_s=600)
    assert none.action == "none" and none.stops == ()


def test_no_replica_is_stopped_when_stopping_would_not_place_the_claimant():
    # Two GPUs on the host, one borrowed and one guaranteed: a 2-GPU claimant never fits there.
    snapshot = FleetSnapshot((HostState(1),), (whole(1, 1), whole(2, 1)))
    found = plan(snapshot, WholeGpuRequest(count=2), [Borrowed(("gpu", 1), 1, 100, 0.0)])
    assert found.action == "none" and found.stops == ()


def test_stops_are_taken_on_the_host_that_needs_the_fewest():
    snapshot = FleetSnapshot(
        (HostState(1), HostState(2)),
        (whole(1, 1), whole(2, 1), whole(3, 2), whole(4, 2)),
    )
    borrowed = [
        Borrowed(("gpu", 1), 1, 100, 0.0),
        Borrowed(("gpu", 3), 3, 100, 0.0),
        Borrowed(("gpu", 4), 4, 100, 5.0),
    ]
    found = plan(snapshot, WholeGpuRequest(count=2), borrowed)
    assert found.action == "stop"
    assert sorted(b.key for b in found.stops) == [("gpu", 3), ("gpu", 4)]


def test_where_moving_borrowed_replicas_makes_no_room_moving_others_does_before_any_stop():
    # GPU 1: guaranteed 30 GB (101) and 25 GB (103) clients and a borrowed 5 GB one (102),
    # 21.5 GB free; GPU 2: 46 GB guaranteed, 35.5 GB free. A 40 GB claimant fits on neither;
    # moving 102 to GPU 2 frees too little, moving a guaranteed client there makes room, and
    # nobody loses a running replica: nothing is stopped.
    snapshot = FleetSnapshot(
        (HostState(1),),
        (
            mps_gpu(1, 1, [(101, 30_000), (102, 5_000), (103, 25_000)]),
            mps_gpu(2, 1, [(201, 46_000)]),
        ),
    )
    found = plan(snapshot, MpsRequest(40_000), [Borrowed(("mps", 102), 1, 100, 0.0)])
    assert found.action == "move" and found.stops == ()
    assert len(found.moves) == 1 and found.moves[0].allocation_id in (101, 103)
    assert (found.moves[0].from_gpu, found.moves[0].to_gpu, found.target.gpu_id) == (1, 2, 1)


def mig_gpu(gpu_id, *parts):
    """An H100 in MIG mode with ``parts``: ``(partition id, profile id, start)``, all busy."""
    partitions = tuple(MigPartition(pid, profile, start, True) for pid, profile, start in parts)
    return GpuState(gpu_id, 1, H100, MEM, "mig", partitions=partitions)


def test_where_neither_moves_nor_stops_alone_do_a_gpu_is_cleared_by_both():
    # A 7g.80gb claimant. GPU 1: a borrowed 4g (10) and a guaranteed 1g (11); GPU 2: full of
    # guaranteed replicas; GPU 3: a guaranteed 4g, slices 4-6 free. Moves alone cannot clear a
    # GPU (no room for a 4g anywhere), stops alone leave GPU 1's 1g: stopping the borrowed 4g
    # and moving the 1g to GPU 3 clears GPU 1.
    snapshot = FleetSnapshot(
        (HostState(1),),
        (
            mig_gpu(1, (10, 5, 0), (11, 19, 4)),
            mig_gpu(2, (20, 5, 0), (21, 9, 4)),
            mig_gpu(3, (30, 5, 0)),
        ),
    )
    found = plan(snapshot, MigRequest(0), [Borrowed(("mig", 10), 1, 100, 0.0)])
    assert found.action == "stop" and [b.key for b in found.stops] == [("mig", 10)]
    assert [(m.allocation_id, m.from_gpu, m.to_gpu) for m in found.moves] == [(11, 1, 3)]
    assert found.target.gpu_id == 1
