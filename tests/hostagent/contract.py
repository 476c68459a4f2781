"""Backend fixtures shared by the contract suite (tests/hostagent) and the GPU checks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest

from hostagent.gpu import nvml as nvml_module
from hostagent.gpu.nvml import NvmlBackend
from hostagent.gpu.simulated import SimulatedBackend
from tests.hostagent import specs
from tests.hostagent.fake_pynvml import make_fake


@dataclass
class Harness:
    """A backend under test plus the simulator behind it (None for a real GPU)."""

    backend: Any
    sim: SimulatedBackend | None

    @property
    def mutable(self) -> bool:
        return self.sim is not None


def contract_specs():
    return [specs.h100(), specs.a100(), specs.l4()]


def real_gpu_available() -> bool:
    if os.environ.get("FLEET_TEST_GPU") != "1":
        return False
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def make_harness(kind: str, monkeypatch: pytest.MonkeyPatch) -> Harness:
    if kind == "simulated":
        sim = SimulatedBackend(contract_specs(), seed=7)
        sim.init()
        return Harness(sim, sim)
    if kind == "nvml-fake":
        sim = SimulatedBackend(contract_specs(), seed=7)
        sim.init()
        monkeypatch.setattr(nvml_module, "pynvml", make_fake(sim))
        backend = NvmlBackend()
        backend.init()
        return Harness(backend, sim)
    if not real_gpu_available():
        pytest.skip("needs a real NVIDIA GPU and FLEET_TEST_GPU=1")
    backend = NvmlBackend()
    backend.init()
    return Harness(backend, None)


BACKEND_KINDS = [
    "simulated",
    "nvml-fake",
    pytest.param("nvml-real", marks=pytest.mark.gpu),
]
