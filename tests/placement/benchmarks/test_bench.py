from __future__ import annotations

from pathlib import Path

import pytest

from fleet.placement.benchmarks.bench import published_means, run_one, summarize
from fleet.placement.benchmarks.trace import parse_nodes, parse_pods

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "alibaba-gpu-v2023"


def test_published_means_average_the_seeds_and_use_our_names() -> None:
    rows = [
        {"workload": "w", "sc_policy": "06-FGD", "130": "95.0"},
        {"workload": "w", "sc_policy": "06-FGD", "130": "96.0"},
        {"workload": "x", "sc_policy": "06-FGD", "130": "10.0"},
        {"workload": "w", "sc_policy": "04-GpuPacking", "130": "92.0"},
    ]

    assert published_means(rows, "w") == {"fgd": 95.5, "GpuPacking": 92.0}


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is absent")
def test_a_slice_of_the_real_trace_replays_under_every_policy() -> None:
    import csv

    with (DATA / "csv" / "openb_node_list_gpu_node.csv").open() as handle:
        nodes = parse_nodes(list(csv.DictReader(handle))[:40])
    with (DATA / "csv" / "openb_pod_list_default.csv").open() as handle:
        pods = parse_pods(list(csv.DictReader(handle))[:250])

    names = ("product", "fgd+", "fgd", "bestfit", "random")
    results = [run_one(nodes, pods, name, 42) for name in names]

    assert [r["policy"] for r in results] == list(names)
    assert all(len(r["alloc_ratio"]) == 131 for r in results)
    assert [s["uses_trace_mix"] for s in summarize(results)] == [False, False, True, False, False]
