from __future__ import annotations

from fleet.placement.benchmarks.advisorbench import run_advisor
from fleet.placement.benchmarks.migbench import resolve_product
from fleet.placement.benchmarks.trace import TracePod

H100 = resolve_product("H100")


def pods():
    # Three 3g pods and a 7g pod alive together, on a fleet too small for all of them.
    return [
        TracePod("a", 1000, 1024, 1, 400, creation_time=0, deletion_time=10),
        TracePod("b", 1000, 1024, 1, 400, creation_time=1, deletion_time=10),
        TracePod("c", 1000, 1024, 1, 400, creation_time=2, deletion_time=10),
        TracePod("d", 1000, 1024, 1, 1000, creation_time=3, deletion_time=10),
        TracePod("multi", 1000, 1024, 4, 1000, creation_time=0, deletion_time=5),
    ]


def test_the_advisor_benchmark_reports_both_states_with_objective_bound_and_gap():
    runs = run_advisor(pods(), H100, gpu_count=2, time_limit_s=2.0)
    assert [r["scenario"] for r in runs] == ["reshape", "cold"]
    for run in runs:
        assert run["gpus"] == 2
        assert run["objective"] <= run["bound"]
        assert run["status"] == "optimal" and run["gap_percent"] == 0.0
    cold = runs[1]
    assert cold["waiting_replicas"] == 4  # the multi-GPU pod is not a replica
    assert cold["placed_replicas"] == 3  # 7g on one GPU, two 3g on the other
