from __future__ import annotations

import json
from pathlib import Path

import pytest

django = pytest.importorskip("django")


def _call(*args: str) -> None:
    from django.conf import settings

    if not settings.configured:
        pytest.skip("needs Django settings (run without -p no:django)")
    from django.core.management import call_command

    call_command("bench_placement", *args)


def _write(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_the_command_writes_the_results_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = _write(
        tmp_path / "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model",
        ["n0,32000,65536,2,T4", "n1,32000,65536,2,T4"],
    )
    pods = _write(
        tmp_path / "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli",
        ["p0,4000,1024,1,500", "p1,4000,1024,1,1000"],
    )
    out = tmp_path / "out.json"

    _call(
        "--nodes",
        str(nodes),
        "--pods",
        str(pods),
        "--policy",
        "fgd+,fgd",
        "--seeds",
        "1,2",
        "--json",
        str(out),
    )

    payload = json.loads(out.read_text())
    assert (payload["nodes"], payload["gpus"]) == (2, 4)
    assert [(r["policy"], r["seed"]) for r in payload["results"]] == [
        ("fgd+", 1),
        ("fgd+", 2),
        ("fgd", 1),
        ("fgd", 2),
    ]
    assert "fgd+" in capsys.readouterr().out


def test_a_missing_file_exits_with_status_2(tmp_path: Path) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError) as raised:
        _call("--pods", str(tmp_path / "absent.csv"))
    assert raised.value.returncode == 2


def test_the_mig_variant_writes_a_mig_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = _write(
        tmp_path / "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time",
        ["p0,4000,1024,1,400,0,10", "p1,4000,1024,1,500,5,20", "p2,4000,1024,2,1000,8,30"],
    )
    out = tmp_path / "mig.json"

    _call("--pods", str(pods), "--mig", "H100", "--policy", "first_fit", "--json", str(out))

    mig = json.loads(out.read_text())["mig"]
    assert (mig["product"], mig["jobs"], mig["lower_bound"]) == ("h100-sxm5-80gb", 3, 3)
    assert [r["strategy"] for r in mig["results"]] == ["first_fit"]
    assert "gap %" in capsys.readouterr().out


def test_an_unknown_mig_product_exits_with_status_2(tmp_path: Path) -> None:
    from django.core.management.base import CommandError

    pods = _write(tmp_path / "pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli", [])
    with pytest.raises(CommandError) as raised:
        _call("--pods", str(pods), "--mig", "T4")
    assert raised.value.returncode == 2


def test_the_product_engine_replays_through_rank_beside_fgd(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = _write(
        tmp_path / "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model",
        ["n0,32000,65536,2,T4", "n1,32000,65536,2,T4"],
    )
    pods = _write(
        tmp_path / "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli",
        ["p0,4000,1024,1,500", "p1,4000,1024,1,1000", "p2,4000,1024,0,0"],
    )
    out = tmp_path / "out.json"

    _call(
        "--nodes", str(nodes), "--pods", str(pods), "--policy", "product,fgd+", "--json", str(out)
    )

    results = json.loads(out.read_text())["results"]
    assert [(r["policy"], r["uses_trace_mix"]) for r in results] == [
        ("product", False),
        ("fgd+", False),
    ]
    assert "min-max" in capsys.readouterr().out


def test_the_decision_time_mode_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    _call("--decision-time", "--gpus", "16", "--decisions", "3")

    (report,) = json.loads(capsys.readouterr().out)
    assert (report["gpus"], report["strategy"]) == (16, "product")
    assert set(report) >= {"live_best_ms", "cold_best_ms", "cold_lists_ms"}


def test_the_repack_mode_prints_cp_sat_against_its_bound_and_greedy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _call("--repack", "--repack-gpus", "16", "--repack-free", "2", "--seeds", "1")

    report = json.loads(capsys.readouterr().out)
    assert report["benchmark"] == "repack_free" and len(report["runs"]) == 2  # sparse, dense
    for run in report["runs"]:
        solved, greedy = run["cp_sat"], run["greedy"]
        assert solved["feasible"] >= greedy["feasible"]
        if solved["feasible"]:
            assert solved["bound"] <= solved["cost"]
        if greedy["feasible"]:
            assert solved["cost"] <= greedy["cost"]


def test_the_mig_churn_scenario_reports_every_strategy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = _write(
        tmp_path / "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time",
        ["p0,4000,1024,1,400,0,10", "p1,4000,1024,1,500,5,20", "p2,4000,1024,1,500,8,30"],
    )
    out = tmp_path / "churn.json"

    _call("--pods", str(pods), "--mig", "H100", "--churn", "--mig-gpus", "1", "--json", str(out))

    (report,) = json.loads(out.read_text())["mig_churn"]
    assert report["gpus"] == 1
    assert [r["strategy"] for r in report["runs"]] == ["product", "best_fit", "first_fit"]
    assert "fluid ceiling" in capsys.readouterr().out
