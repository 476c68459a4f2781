"""Scale-in chooses where (issue 24): the replica whose removal frees a whole GPU, else the one
whose removal leaves its host least fragmented (a larger MIG profile restored), else the newest."""

from __future__ import annotations

from fleet.mps import MpsRequest
from fleet.placement.release import Candidate, idle, rank_releases, without
from fleet.placement.snapshot import GpuState, HostState
from tests.placement.test_defrag import H100, MEM, fleet, mig_gpu

ONE_G, THREE_G = 19, 9  # 1g.10gb, 3g.40gb on the H100


def test_the_replica_alone_on_its_gpu_goes_first_even_when_it_is_the_oldest() -> None:
    shared = mig_gpu(1, (ONE_G, 0, True), (THREE_G, 4, True))  # replica 1 beside another
    alone = mig_gpu(2, (ONE_G, 0, True))  # replica 0, nothing else
    snapshot = fleet(shared, alone)
    ranked = rank_releases(snapshot, [Candidate(0, ((2, 200),)), Candidate(1, ((1, 100),))])
    assert [r.replica for r in ranked] == [0, 1]
    assert ranked[0].frees_gpus == 1 and ranked[1].frees_gpus == 0


def test_freeing_the_slice_that_blocks_a_larger_profile_beats_freeing_a_stray_one() -> None:
    # GPU 1: replica 0's 1g at slice 0 is all that keeps slices 0-3 (a 4g.40gb) from being free.
    # GPU 2: replica 1's 1g at slice 1 sits beside another 1g at slice 0: freeing it restores
    # nothing larger than a 1g.
    restores = mig_gpu(1, (ONE_G, 0, True), (THREE_G, 4, True))
    stray = mig_gpu(2, (ONE_G, 0, True), (ONE_G, 1, True), (THREE_G, 4, True))
    snapshot = fleet(restores, stray)
    ranked = rank_releases(snapshot, [Candidate(0, ((1, 100),)), Candidate(1, ((2, 201),))])
    assert [r.replica for r in ranked] == [0, 1], ranked
    assert ranked[0].delta_milli < ranked[1].delta_milli


def test_ties_go_to_the_newest_replica_and_unknown_gpus_rank_last() -> None:
    a = mig_gpu(1, (ONE_G, 0, True), (THREE_G, 4, True))
    b = mig_gpu(2, (ONE_G, 0, True), (THREE_G, 4, True), host=1)
    snapshot = fleet(a, b)
    ranked = rank_releases(
        snapshot,
        [Candidate(0, ((1, 100),)), Candidate(1, ((2, 200),)), Candidate(2, ((99, 1),))],
    )
    assert [r.replica for r in ranked] == [1, 0, 2]


def test_an_mps_client_and_a_whole_gpu_come_off_their_gpus() -> None:
    mps = GpuState(
        1,
        1,
        H100,
        MEM,
        "mps",
        mps_reservations=(MpsRequest(4096), MpsRequest(8192)),
        mps_reservation_ids=(7, 8),
    )
    left = without(mps, 7)
    assert left.mps_reservation_ids == (8,) and left.mps_reservations == (MpsRequest(8192),)
    assert idle(without(left, 8))
    whole = GpuState(2, 1, H100, MEM, "dedicated", taken=True)
    assert idle(without(whole, 5))
    snapshot = fleet(mps, whole, hosts=(HostState(1),))
    ranked = rank_releases(snapshot, [Candidate(0, ((1, 7),)), Candidate(1, ((2, 5),))])
    assert ranked[0].replica == 1 and ranked[0].frees_gpus == 1
