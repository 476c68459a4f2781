"""``fleet.mig`` is pure: importing it never loads Django."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_importing_fleet_mig_loads_no_framework():
    code = (
        "import sys, fleet.mig; "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'django', 'rest_framework', 'channels', 'celery'}); "
        "assert not loaded, loaded"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
