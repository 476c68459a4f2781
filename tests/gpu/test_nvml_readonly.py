"""Read-only NVML checks on a real GPU: discovery, placements, one telemetry sample, the probe.

Skipped unless ``pynvml.nvmlInit()`` succeeds and ``FLEET_TEST_GPU=1``. Never mutates.
Run: ``FLEET_TEST_GPU=1 pytest tests/gpu -p no:django -m gpu -s``; with
``FLEET_PROBE_OUT=path.json`` the probe record is also written there, ready to be kept in
``tests/hostagent/fixtures/`` (see its README).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hostagent import protocol
from hostagent.collector import Collector
from hostagent.gpu.nvml import NvmlBackend
from tests.hostagent.contract import nvml_on, real_gpu_available
from tests.hostagent.fake_gpu import FakeHardware
from tests.hostagent.probe_replay import catalog_mismatches

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not real_gpu_available(), reason="needs a real GPU and FLEET_TEST_GPU=1"),
]


def test_nvml_discovery_placements_and_one_sample_on_a_real_gpu():
    backend = NvmlBackend()
    backend.init()
    try:
        collector = Collector(backend, hostname="gpu-check")
        hello = collector.hello(applied_generation=0)
        collector.telemetry()
        time.sleep(0.15)  # a second sample so GPM (Hopper+) has two samples > 100 ms apart
        telemetry = collector.telemetry()
        events = collector.events(100)
        protocol.validate_message(hello)
        protocol.validate_message(telemetry)
        print(json.dumps({"hello": hello, "telemetry": telemetry, "events": events}, indent=2))
        assert hello["gpus"], "NVML initialised but reported no GPU"
        for gpu in hello["gpus"]:
            assert gpu["status"] == "ok"
            assert gpu["pci_device_id"] & 0xFFFF == 0x10DE
            if gpu["mig_capable"] and gpu["mig_mode_current"]:
                assert gpu["possible_placements"], "MIG-enabled GPU without placements"
        for sample in telemetry["gpus"]:
            assert sample["memory_total_mib"]
    finally:
        backend.shutdown()


def _state(backend: NvmlBackend) -> list[object]:
    gpus = backend.list_gpus()
    return [(g, backend.mig_instances(g.uuid) if g.mig_capable else []) for g in gpus]


def test_the_probe_on_a_real_gpu_changes_nothing_and_matches_the_catalog():
    backend = NvmlBackend()
    backend.init()
    try:
        before = _state(backend)
        record = backend.probe()
        after = _state(backend)
    finally:
        backend.shutdown()
    text = json.dumps(record, indent=2)
    print(text)
    if os.environ.get("FLEET_PROBE_OUT"):
        Path(os.environ["FLEET_PROBE_OUT"]).write_text(text + "\n")
    assert after == before
    assert record["available"] and record["gpus"]
    assert record["driver_branch"] is not None, record["driver_version"]
    for gpu in record["gpus"]:
        assert gpu["status"] == "ok", gpu
        assert set(gpu["processes"]) == {"compute", "mps"}
        if isinstance(gpu["mig_mode"], dict) and gpu["mig_mode"]["current"]:
            assert gpu["gpu_instance_profiles"]["answered"], "MIG on but no profile answered"
    assert catalog_mismatches(record) == []
    replay = nvml_on(FakeHardware.from_probe(json.loads(text))).probe()
    assert {**replay, "euid": record["euid"]} == record
