"""``bench_live`` end to end with a tiny fleet: its own stack, agents, browsers, JSON out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.bench.browsers import Browser, measure

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "manage.py", "bench_live"]


def test_measure_counts_superseded_samples_as_delivered_and_late_ones_as_dropped():
    browser = Browser(url="http://x", session_key="k")
    # GPU 1: samples at 10 and 11 sent; only 11 arrived (0.3 s later): 10 was superseded.
    # GPU 2: sample at 10 arrived 2.5 s later: dropped (and late); 11 never arrived: dropped.
    browser.received = {1: {11_000: 11.3}, 2: {10_000: 12.5}}
    result = measure(
        browsers=[browser], sent={7: [10.0, 11.0]}, gpus_by_host={7: [1, 2]}, t0=10.0, t1=12.0
    )
    assert result["dropped"] == 2
    assert result["received"] == 2 and result["expected"] == 4
    assert result["latency_ms"]["p50"] == 300.0 and result["late"] == 1


@pytest.mark.e2e
def test_bench_live_with_a_tiny_fleet(tmp_path):
    database_url = os.environ.get("FLEET_DATABASE_URL", "")
    if not database_url.startswith("postgres"):
        pytest.skip("bench_live needs PostgreSQL: set FLEET_DATABASE_URL")
    if not shutil.which("redis-server"):
        pytest.skip("bench_live starts its own Redis: redis-server is not installed")
    out = tmp_path / "bench.json"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "fleet.settings.test"}
    result = subprocess.run(
        [
            *COMMAND,
            "--hosts",
            "2",
            "--gpus-per-host",
            "2",
            "--seconds",
            "3",
            "--browsers",
            "1",
            "--json",
            str(out),
            "--workdir",
            str(tmp_path),
            "--warmup-timeout",
            "30",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["hosts"] == 2 and report["gpus"] == 4 and report["gpus_reporting"] == 4
    assert report["warmup_complete"] and report["dropped"] == 0
    assert report["samples_per_s"] > 0 and report["latency_ms"]["p99"] < 5000
    assert report["server_cpu_percent"] is not None
    assert json.loads(result.stdout)["hosts"] == 2
