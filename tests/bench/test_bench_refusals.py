"""``bench_refusals`` end to end with few requests: its own scratch database and daphne; every
hostile request gets the refusal it names. How fast is the benchmark's figure, not asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.bench.refusals import cases

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_bench_refusals_gets_each_refusal_it_names(tmp_path):
    out = tmp_path / "refusals.json"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "fleet.settings.test"}
    env.pop("FLEET_DATABASE_URL", None)
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "bench_refusals",
            "--repeat",
            "2",
            "--json",
            str(out),
            "--workdir",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(result.stdout) == report
    assert set(report["cases"]) == {case.name for case in cases(1)}
    for name, case in report["cases"].items():
        assert case["answers"] == {case["expected"]: 2}, name
        assert 0 < case["p50_ms"] <= case["max_ms"], name
    assert report["all_as_expected"] is True
    assert report["max_ms"] == max(c["max_ms"] for c in report["cases"].values())


def test_bench_refusals_refuses_a_repeat_out_of_range():
    result = subprocess.run(
        [sys.executable, "manage.py", "bench_refusals", "--repeat", "0"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "fleet.settings.test"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "--repeat must be between 1 and 1000" in result.stderr
