"""``bench_rollout`` end to end with a tiny fleet: its own stack, a worker and beat, simulated
agents running real processes; two rollouts; JSON out. The reshape keeps every replica running
(make before break) and moves only those on the slices it destroys."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_bench_rollout_with_a_tiny_fleet(tmp_path):
    database_url = os.environ.get("FLEET_DATABASE_URL", "")
    if not database_url.startswith("postgres"):
        pytest.skip("bench_rollout needs PostgreSQL: set FLEET_DATABASE_URL")
    if not shutil.which("redis-server"):
        pytest.skip("bench_rollout starts its own Redis: redis-server is not installed")
    out = tmp_path / "bench.json"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "fleet.settings.test"}
    args = ["--gpus", "4", "--gpus-per-host", "2", "--replicas", "8", "--max-unavailable", "2"]
    result = subprocess.run(
        [sys.executable, "manage.py", "bench_rollout", *args, "--json", str(out),
         "--workdir", str(tmp_path / "work"), "--timeout", "120"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["gpus"] == 4
    assert report["cut_idle_gpus"]["gpus"] == 4 and report["cut_idle_gpus"]["replicas_moved"] == 0
    reshape = report["reshape_busy_gpus"]
    assert reshape["gpus"] == 4
    # Only the replicas on slices 4-6, which the new layout destroys, move (the engine packs
    # eight 1g replicas onto few GPUs, so at most three per GPU); the others stay.
    assert reshape["replicas_moved"] <= 6
    assert reshape["min_running"] == 8 and report["running_after"] == 8


def test_bench_rollout_refuses_bad_arguments():
    result = subprocess.run(
        [sys.executable, "manage.py", "bench_rollout", "--gpus", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "fleet.settings.test"},
    )  # fmt: skip
    assert result.returncode != 0 and "--gpus must be" in result.stderr
