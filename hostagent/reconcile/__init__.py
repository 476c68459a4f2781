"""Turn a desired GPU configuration into an ordered, idempotent list of actions, and apply it.

:func:`plan` is pure: ``(DesiredGpu, ObservedGpu) -> tuple[Action, ...]``. The order follows the
driver's rules (MIG user guide, ``nvml.h``): stop MPS daemons that must go, destroy compute
instances, destroy GPU instances, change MIG mode, create GPU instances in placement order with
explicit placements, create their compute instances, start MPS daemons. Instances are identified
by ``(profile_id, start)``, never by the driver's GI id. A partition with processes is never
destroyed: the plan holds a :class:`Blocked` item (reported ``in_use`` with the PIDs) and nothing
that depends on it (an overlapping new instance, the MIG mode change) is touched. The MPS server
of the agent's own daemon is not such a process; MPS clients are (review D5, D15).

:func:`apply` executes a plan against a backend; :func:`apply_desired_state` runs a whole
``desired_state`` message (observe, plan, apply in two passes around a MIG mode change, the
Ampere reset path, simulated workloads) for every GPU it names.
"""

from __future__ import annotations

from hostagent.reconcile.actions import (
    Action,
    Blocked,
    CreateComputeInstance,
    CreateGpuInstance,
    Deferred,
    DestroyComputeInstance,
    DestroyGpuInstance,
    EnsureMps,
    Invalid,
    ObservedGpu,
    SetMigMode,
    Slot,
    StopMps,
)
from hostagent.reconcile.applying import MUTATION_DISABLED, apply, merge_results
from hostagent.reconcile.desired import (
    RESETS,
    AllocationRunner,
    ResetLedger,
    WorkloadRunner,
    apply_desired_state,
    drifted,
    observe,
)
from hostagent.reconcile.planning import plan

__all__ = [
    "MUTATION_DISABLED",
    "RESETS",
    "Action",
    "AllocationRunner",
    "Blocked",
    "CreateComputeInstance",
    "CreateGpuInstance",
    "Deferred",
    "DestroyComputeInstance",
    "DestroyGpuInstance",
    "EnsureMps",
    "Invalid",
    "ObservedGpu",
    "ResetLedger",
    "SetMigMode",
    "Slot",
    "StopMps",
    "WorkloadRunner",
    "apply",
    "apply_desired_state",
    "drifted",
    "merge_results",
    "observe",
    "plan",
]
