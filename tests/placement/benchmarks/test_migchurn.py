from __future__ import annotations

from fleet.mig import Instance, product_by_key
from fleet.placement.benchmarks.migchurn import (
    ChurnJob,
    MigChurnFleet,
    fleet_for_first_fit,
    fluid_acceptance,
    peak_gpus,
    run_churn,
    run_mig_churn,
    sharing_jobs,
)
from fleet.placement.benchmarks.trace import TracePod
from fleet.placement.fit import Target

H100 = product_by_key("h100-sxm5-80gb")
assert H100 is not None
P1G, P3G, P4G = (H100.profile(n) for n in ("1g.10gb", "3g.40gb", "4g.40gb"))
assert P1G is not None and P3G is not None and P4G is not None


def test_only_the_timed_sharing_pods_become_jobs_of_the_covering_profile() -> None:
    pods = (
        TracePod("s", 1000, 1, 1, 400, (), 5, 9),
        TracePod("w", 1000, 1, 1, 1000, (), 5, 9),
        TracePod("u", 1000, 1, 1, 100),
    )

    assert sharing_jobs(pods, H100) == (ChurnJob("s", P3G.id, 5, 9),)


def test_a_departure_leaves_its_partition_idle_and_an_idle_gpu_is_laid_out_anew() -> None:
    fleet = MigChurnFleet(H100, 1)
    one = fleet.place(Target(0, None, Instance(P3G.id, 0), 0.0, (0,)), P3G.id)
    two = fleet.place(Target(0, None, Instance(P3G.id, 4), 0.0, (0,)), P3G.id)

    fleet.release(*one)
    gpu = fleet.snapshot.gpus[0]
    assert [(p.start, p.occupied) for p in gpu.partitions] == [(0, False), (4, True)]

    fleet.release(*two)
    assert fleet.snapshot.gpus[0].partitions == ()


def test_a_rejected_job_is_not_retried_and_departures_make_room() -> None:
    jobs = (
        ChurnJob("a", P4G.id, 0, 10),
        ChurnJob("b", P4G.id, 1, 5),  # the one GPU's 4g slot is taken: rejected
        ChurnJob("c", P3G.id, 2, 20),  # a 3g fits beside the 4g
        ChurnJob("d", P4G.id, 11, 30),  # a left at 10: room again
    )

    for strategy in ("first_fit", "best_fit", "product"):
        run = run_churn(jobs, H100, 1, strategy)  # type: ignore[arg-type]
        assert (run["arrived"], run["accepted"]) == (4, 3)
    assert fluid_acceptance(jobs, H100, 1) == 75.0
    assert peak_gpus(jobs, H100) == 2


def test_the_fleet_is_the_largest_on_which_first_fit_accepts_under_90_percent() -> None:
    jobs = tuple(ChurnJob(f"j{k}", P4G.id, k, k + 3) for k in range(20))

    size = fleet_for_first_fit(jobs, H100)

    assert run_churn(jobs, H100, size, "first_fit")["acceptance_percent"] < 90
    assert run_churn(jobs, H100, size + 1, "first_fit")["acceptance_percent"] >= 90


def test_the_report_runs_every_strategy_on_the_sized_fleet() -> None:
    pods = tuple(TracePod(f"p{k}", 1, 1, 1, 300 + 20 * k, (), k, k + 4) for k in range(12))

    report = run_mig_churn(pods, H100, gpu_count=1)

    assert report["gpus"] == 1 and report["jobs"] == 12
    assert [r["strategy"] for r in report["runs"]] == ["product", "best_fit", "first_fit"]
    assert all(r["arrived"] == 12 for r in report["runs"])
