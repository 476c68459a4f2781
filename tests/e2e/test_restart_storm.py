"""A CI-sized restart storm: 200 hosts reporting through two ASGI servers, a Celery worker and
beat placing and watching replicas, and every server restarted at once in the middle. The fleet
must come back (99 % of hosts within 30 s, all within 60 s) with no replica moved and no honest
agent closed as abusive: ``bench_live --restart-at`` on real processes, its JSON checked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def test_every_server_restarted_at_once_the_fleet_comes_back_and_nothing_moves(tmp_path):
    database_url = os.environ.get("FLEET_DATABASE_URL", "")
    if not database_url.startswith("postgres"):
        pytest.skip("the restart storm needs PostgreSQL: set FLEET_DATABASE_URL")
    if not shutil.which("redis-server"):
        pytest.skip("the restart storm starts its own Redis: redis-server is not installed")
    out = tmp_path / "storm.json"
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "bench_live",
            "--hosts",
            "200",
            "--gpus-per-host",
            "4",
            "--seconds",
            "45",
            "--restart-at",
            "5",
            "--replicas",
            "20",
            "--browsers",
            "1",
            "--json",
            str(out),
            "--workdir",
            str(tmp_path),
            "--warmup-timeout",
            "90",
        ],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "fleet.settings.test"},
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    recovery = report["restart"]["recovery"]
    assert report["warmup_complete"], report
    assert report["replicas_placed"] == 20
    assert recovery["not_reporting"] == 0, recovery
    assert recovery["p99_s"] <= 30 and recovery["all_s"] <= 60, recovery
    assert report["replicas_moved"] == 0
    assert report["abusive_closes"] == 0
    assert report["restart"]["admitted_again"]["never"] == 0
    assert report["goal_met"], report["goals"]
