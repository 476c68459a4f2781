"""Read-only NVML check on a real GPU: discovery, placements and one telemetry sample.

Skipped unless ``pynvml.nvmlInit()`` succeeds and ``FLEET_TEST_GPU=1``. Never mutates.
Run: ``FLEET_TEST_GPU=1 pytest tests/gpu -p no:django -m gpu -s``.
"""

from __future__ import annotations

import json
import time

import pytest

from hostagent import protocol
from hostagent.collector import Collector
from hostagent.gpu.nvml import NvmlBackend
from tests.hostagent.contract import real_gpu_available

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
            if gpu["mig_capable"]:
                assert gpu["possible_placements"], "MIG-capable GPU without placements"
        for sample in telemetry["gpus"]:
            assert sample["memory_total_mib"]
    finally:
        backend.shutdown()
