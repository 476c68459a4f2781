from __future__ import annotations

import itertools

from fleet.mps import MpsRequest
from fleet.placement.benchmarks.decisions import (
    apply_target,
    decision_times,
    synthetic_fleet,
    synthetic_requests,
)
from fleet.placement.fit import rank
from fleet.placement.snapshot import WholeGpuRequest


def test_the_synthetic_fleet_is_seeded_and_sized() -> None:
    fleet = synthetic_fleet(40, 7)

    assert len(fleet.gpus) == 40 and len(fleet.hosts) == 5
    assert fleet == synthetic_fleet(40, 7)
    assert {g.mode for g in fleet.gpus} == {"mig", "mps", "dedicated"}


def test_applying_a_target_writes_what_the_place_service_would() -> None:
    snapshot = synthetic_fleet(40, 3)
    for request in synthetic_requests(30, 3):
        best = rank(snapshot, request).best
        if best is None:
            continue
        after = apply_target(snapshot, request, best)
        for gpu_id in best.gpu_ids:
            before, now = snapshot.gpu(gpu_id), after.gpu(gpu_id)
            assert before is not None and now is not None
            if isinstance(request, WholeGpuRequest):
                assert now.taken and not before.taken
            elif isinstance(request, MpsRequest) and now.mode == "mps":
                assert now.mps_reservations == (*before.mps_reservations, request)
            elif best.new_instance is not None:
                assert {(p.start, p.occupied) for p in now.partitions} - {
                    (p.start, p.occupied) for p in before.partitions
                } == {(best.new_instance.start, True)}
            else:
                assert next(p for p in now.partitions if p.id == best.partition_id).occupied
        snapshot = after


def test_the_report_times_live_and_cold_rankings() -> None:
    ticks = itertools.count()

    report = decision_times(lambda: next(ticks) / 1000.0, gpu_count=24, decisions=5)

    assert (report["gpus"], report["decisions"]) == (24, 5)
    assert report["live_best_ms"]["p50"] > 0 and report["cold_lists_ms"]["p99"] > 0
