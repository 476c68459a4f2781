from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.mig import validate_layout
from fleet.placement.benchmarks.migbench import (
    MigJob,
    churn,
    mig_jobs,
    pack_online,
    peak_lower_bound,
    profile_for_milli,
    resolve_product,
    run_mig,
)
from fleet.placement.benchmarks.migfleet import MigFleet, strategy_scorer
from fleet.placement.benchmarks.repack import lower_bound
from fleet.placement.benchmarks.trace import TracePod, parse_pods

H100 = resolve_product("h100-sxm5-80gb")
DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "alibaba-gpu-v2023"
STRATEGIES = ("fragmentation_aware", "best_fit", "first_fit")


@pytest.mark.parametrize(
    ("gpu_milli", "profile"),
    [
        (1, "1g.10gb"),
        (142, "1g.10gb"),
        (143, "2g.20gb"),
        (285, "2g.20gb"),
        (286, "3g.40gb"),
        (428, "3g.40gb"),
        (429, "4g.40gb"),
        (571, "4g.40gb"),
        (572, "7g.80gb"),
        (810, "7g.80gb"),
        (1000, "7g.80gb"),
    ],
)
def test_a_sharing_pod_takes_the_smallest_profile_whose_compute_covers_it(
    gpu_milli: int, profile: str
) -> None:
    assert profile_for_milli(H100, gpu_milli).name == profile


def test_a30_maps_onto_its_quarter_slices() -> None:
    a30 = resolve_product("a30-24gb")

    assert [profile_for_milli(a30, m).compute_slices for m in (250, 251, 500, 501)] == [1, 2, 2, 4]


@pytest.mark.parametrize(
    "ref", ["H100", "h100-sxm5-80gb", "NVIDIA H100 80GB HBM3", " h100-SXM5-80GB "]
)
def test_h100_names_resolve_to_the_sxm5_80gb(ref: str) -> None:
    assert resolve_product(ref).key == "h100-sxm5-80gb"


@pytest.mark.parametrize("ref", ["T4", "t4-16gb", "no-such-gpu"])
def test_unknown_or_non_mig_products_are_refused(ref: str) -> None:
    with pytest.raises(ValueError, match="no MIG product"):
        resolve_product(ref)


def test_multi_gpu_pods_take_whole_gpus_and_cpu_pods_are_skipped() -> None:
    pods = (
        TracePod("cpu", 1000, 1024, 0, 0),
        TracePod("multi", 1000, 1024, 4, 1000, creation_time=0, deletion_time=5),
        TracePod("share", 1000, 1024, 1, 300),
    )

    jobs = mig_jobs(pods, H100)

    assert jobs == (MigJob("multi", (0, 0, 0, 0), 0, 5), MigJob("share", (9,)))


def test_two_3g_and_a_1g_need_two_gpus_because_3g_takes_four_memory_slices() -> None:
    jobs = [MigJob("a", (9,)), MigJob("b", (9,)), MigJob("c", (19,))]

    used, _ = pack_online(jobs, H100, "fragmentation_aware", 42)

    assert used == 2


def test_churn_rejects_what_does_not_fit_and_reuses_what_departed() -> None:
    jobs = [
        MigJob("a", (5,), 0, 10),
        MigJob("b", (5,), 5, 20),  # 4g only starts at slice 0: no room while a runs
        MigJob("c", (5,), 10, 20),  # a left at 10 (departures first)
        MigJob("d", (0, 0), 30, 40),  # two whole GPUs on a one-GPU fleet
    ]

    result, _ = churn(jobs, H100, 1, "fragmentation_aware")

    assert (result["arrived"], result["accepted"]) == (4, 2)


ids = st.sampled_from([0, 5, 9, 14, 15, 19, 20])
jobs_strategy = st.lists(
    st.tuples(st.lists(ids, min_size=1, max_size=2), st.integers(0, 50), st.integers(1, 30)).map(
        lambda t: MigJob("j", tuple(t[0]), t[1], t[1] + t[2])
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None)
@given(jobs=jobs_strategy, strategy=st.sampled_from(STRATEGIES), seed=st.integers(0, 5))
def test_online_packing_is_valid_deterministic_and_never_beats_the_lower_bound(
    jobs: list[MigJob], strategy: str, seed: int
) -> None:
    profiles = [H100.profile(pid) for job in jobs for pid in job.profile_ids]

    used, _ = pack_online(jobs, H100, strategy, seed)

    assert used >= lower_bound(H100, [p for p in profiles if p is not None])
    assert pack_online(jobs, H100, strategy, seed)[0] == used


@settings(max_examples=40, deadline=None)
@given(jobs=jobs_strategy, strategy=st.sampled_from(STRATEGIES), gpus=st.integers(1, 4))
def test_churn_never_exceeds_the_fleet_and_agrees_with_rank(
    jobs: list[MigJob], strategy: str, gpus: int
) -> None:
    result, _ = churn(jobs, H100, gpus, strategy, rank_every=1)

    assert result["rank_mismatches"] == 0
    assert result["rank_checks"] > 0 or all(len(j.profile_ids) > 1 for j in jobs)
    assert result["accepted"] <= result["arrived"] == len(jobs)
    assert churn(jobs, H100, gpus, strategy)[0]["accepted"] == result["accepted"]


@settings(max_examples=40, deadline=None)
@given(profiles=st.lists(ids, max_size=25), gpus=st.integers(1, 3))
def test_a_fixed_fleet_only_holds_valid_layouts(profiles: list[int], gpus: int) -> None:
    fleet = MigFleet(H100, strategy_scorer("fragmentation_aware"), gpus)
    for pid in profiles:
        profile = H100.profile(pid)
        assert profile is not None
        fleet.place(profile)

    assert len(fleet.layouts) == gpus
    assert all(validate_layout(H100, layout) == () for layout in fleet.layouts)


def test_with_everything_alive_at_once_the_peak_bound_is_the_packing_bound() -> None:
    jobs = [MigJob("a", (9,), 0, 9), MigJob("b", (9,), 1, 9), MigJob("c", (19,), 2, 9)]

    assert peak_lower_bound(jobs, H100) == 2


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is absent")
def test_a_slice_of_the_real_trace_runs_the_mig_variant() -> None:
    with (DATA / "csv" / "openb_pod_list_default.csv").open() as handle:
        pods = parse_pods(list(csv.DictReader(handle))[:600])

    report = run_mig(pods, H100, seeds=(42,), time_limit_s=5.0)

    assert report["jobs"] > 0
    assert report["offline"]["lower_bound"] <= report["offline"]["gpus_used"]
    assert [r["strategy"] for r in report["results"]] == list(STRATEGIES)
    assert all(r["gpus_used"] >= report["lower_bound"] for r in report["results"])
    assert all(c["rank_mismatches"] == 0 for r in report["results"] for c in r["churn"])
    assert report["churn_fleets"][0] >= report["churn_fleets"][1]
