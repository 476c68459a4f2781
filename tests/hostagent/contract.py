"""Backend fixtures shared by the contract suite (tests/hostagent) and the GPU checks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest

from hostagent.gpu.nvml import NvmlBackend
from hostagent.gpu.simulated import SimulatedBackend
from tests.hostagent import specs
from tests.hostagent.fake_gpu import FakeHardware
from tests.hostagent.fake_pynvml import make_fake


@dataclass
class Harness:
    """A backend under test plus what drives its hardware: the simulator, or the fake
    hardware behind the fake pynvml (both answer ``run_process``, ``kill_process``,
    ``lose_gpu``, ``restore_gpu``, ``inject_xid``); ``None`` for a real GPU."""

    backend: Any
    sim: Any

    @property
    def mutable(self) -> bool:
        return self.sim is not None

    def before_reset(self, uuid: str) -> None:
        """The operator frees the GPU of other NVML clients (fake hardware only has them)."""
        if isinstance(self.sim, FakeHardware):
            self.sim.release_holders(uuid)


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


def nvml_on(hw: FakeHardware) -> NvmlBackend:
    """An initialised NVML backend over fake hardware (``nvidia-smi`` included)."""
    backend = NvmlBackend(library=make_fake(hw), run=hw.nvidia_smi)
    backend.init()
    return backend


def make_harness(kind: str, *, needs_reset: bool = False) -> Harness:
    """``needs_reset``: MIG toggles on Ampere stay pending until a GPU reset (simulator flag;
    the fake's ``ampere`` profile, where nvidia-persistenced holds the GPU)."""
    if kind == "simulated":
        sim = SimulatedBackend(contract_specs(), seed=7, mig_change_needs_reset=needs_reset)
        sim.init()
        return Harness(sim, sim)
    if kind == "nvml-fake":
        hw = FakeHardware("ampere" if needs_reset else "r570", contract_specs())
        return Harness(nvml_on(hw), hw)
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
