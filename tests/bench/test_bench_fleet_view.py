"""``bench_fleet_view`` end to end at a tiny size: its own scratch database, server and Chromium."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.e2e
@pytest.mark.browser
def test_bench_fleet_view_reports_each_figure_for_a_tiny_fleet(tmp_path):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    out = tmp_path / "view.json"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "fleet.settings.test"}
    env.pop("FLEET_DATABASE_URL", None)
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "bench_fleet_view",
            "--gpus",
            "50",
            "--repeat",
            "1",
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
    assert set(report) == {"definition", "gpus_per_host", "repeat", "runs"}
    (run,) = report["runs"]
    assert run["gpus"] == 56  # 7 hosts of 8
    assert run["cards_drawn"] == 56  # a small fleet is drawn whole
    assert run["html_bytes"] > 0
    for key in ("ttfb_ms", "first_useful_render_ms", "visible_cards_ms", "load_ms"):
        assert isinstance(run[key], int | float) and run[key] > 0, key
    assert run["ttfb_ms"] <= run["first_useful_render_ms"] <= run["visible_cards_ms"]
