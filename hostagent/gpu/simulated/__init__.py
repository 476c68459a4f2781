"""Simulated GPUs that follow the driver's MIG rules, run fake workloads and inject faults.

Built from :class:`~hostagent.protocol.SimulatedGpuSpec` values that the control plane
generates from its MIG catalog (the agent carries no catalog of its own). Everything is
deterministic from ``seed``: UUIDs, PIDs and the synthetic load of each tick.

Rules enforced like the driver (``nvml.h``, MIG user guide):

* a GPU instance needs MIG mode on; its ``start`` must be one of the profile's placements
  (else ``InvalidPlacement``, NVML INVALID_ARGUMENT); overlapping memory slices, too many
  instances of a profile, or more compute slices than the GPU has → ``InsufficientResources``;
* destroying a compute instance with processes, or a GPU instance with processes or compute
  instances → ``InUse`` with the PIDs; changing MIG mode on a busy GPU → ``InUse``;
* utilisation is ``None`` on a MIG-enabled GPU; per-instance utilisation is ``None`` on Ampere
  (A100/A30) and a GPM-like value on Hopper and later;
* a workload started where an MPS daemon runs is an MPS client (``mps_client``), served by an
  ``nvidia-cuda-mps-server`` process (``mps_server``) that the driver counts as a process of
  the GPU or MIG instance until the daemon quits (review D5);
* ``reset_gpu`` is refused while processes run; compute mode cannot change in MIG mode.

Real drivers differ in ways the control plane must survive; :class:`DriverQuirks` turns them on:
MIG toggles pending a reset on A100/A30 (D3) and profiles hidden while MIG is off (D2).
Events of a GPU whose registration failed are lost until it registers again (D7).
"""

from __future__ import annotations

from hostagent.gpu.simulated.backend import SimulatedBackend
from hostagent.gpu.simulated.model import (
    AMPERE_MARKERS,
    BASELINE_MEMORY_MIB,
    DriverQuirks,
    RunningAllocation,
    is_ampere,
)
from hostagent.gpu.simulated.mps import SimulatedMpsControl

__all__ = [
    "AMPERE_MARKERS",
    "BASELINE_MEMORY_MIB",
    "DriverQuirks",
    "RunningAllocation",
    "SimulatedBackend",
    "SimulatedMpsControl",
    "is_ampere",
]
