"""A whole ``desired_state`` message: observe, plan and apply every GPU it names, in two passes
around a MIG mode change, with the Ampere reset path; plus drift detection.

Two passes (review D2): R535-era drivers list a GPU's MIG profiles only once MIG is on, so the
mode change is applied first, the GPU observed again, and the instances planned against what
the driver lists then. On A100/A30 the change stays pending until a GPU reset (review D3): with
``allow_mutation`` the agent resets the GPU itself (``reset_gpu``) when no compute process or
MPS client runs on it, at most once per GPU and generation, and goes on with the second pass.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol, runtime_checkable

from hostagent.gpu.backend import BackendError, GpuBackend, InUse
from hostagent.gpu.simulated import RunningAllocation
from hostagent.mps import MpsLimits, MpsManager
from hostagent.protocol import MAX_PROCESSES, DesiredGpu, DesiredState, ItemResult
from hostagent.reconcile.actions import (
    Action,
    Blocked,
    DestroyComputeInstance,
    DestroyGpuInstance,
    Invalid,
    ObservedGpu,
    SetMigMode,
    StopMps,
)
from hostagent.reconcile.applying import (
    GpuApply,
    apply,
    apply_steps,
    item,
    merge_results,
)
from hostagent.reconcile.planning import mode_key, plan

# ------------------------------------------------------------------------------------------------
# Observing
# ------------------------------------------------------------------------------------------------


def observe(backend: GpuBackend, mps: MpsManager | None, gpu: str) -> ObservedGpu:
    """Read one GPU's current state for :func:`plan`: MIG, processes, and the MPS daemons the
    agent manages on the GPU and its instances (limits read back, servers, clients)."""
    device = next(d for d in backend.list_gpus() if d.uuid == gpu)
    capable = device.mig_capable
    instances = tuple(backend.mig_instances(gpu)) if capable else ()
    owned = {gpu} | {i.uuid for i in instances if i.uuid}
    limits: dict[str, MpsLimits] = {}
    servers: dict[str, tuple[int, ...]] = {}
    clients: dict[str, tuple[int, ...]] = {}
    if mps is not None:
        for target in mps.managed_targets():
            status = mps.status(target) if target in owned else None
            if status is not None:
                limits[target] = status.limits
                servers[target] = status.server_pids
                clients[target] = status.client_pids
    return ObservedGpu(
        uuid=gpu,
        mig_capable=capable,
        mig_mode_current=device.mig_mode_current,
        placements=tuple(backend.possible_placements(gpu)) if capable else (),
        instances=instances,
        processes=tuple(backend.processes(gpu)),
        mps=limits,
        mps_servers=servers,
        mps_clients=clients,
        mig_mode_pending=device.mig_mode_pending,
    )


# ------------------------------------------------------------------------------------------------
# Simulated workloads
# ------------------------------------------------------------------------------------------------


@runtime_checkable
class AllocationRunner(Protocol):
    """A backend that runs workloads itself (the simulator does; NVML does not)."""

    def sync_allocations(
        self, gpu: str, allocations: list[RunningAllocation], *, start: bool = True
    ) -> list[str]:
        """Make running workloads match ``allocations``; return keys that could not run."""


def _allocations(backend: GpuBackend, gpu: str, desired: DesiredGpu) -> list[RunningAllocation]:
    slots = {i["key"]: (i["profile_id"], i["start"]) for i in desired["instances"]}
    by_slot = {(i.profile_id, i.start): i for i in backend.mig_instances(gpu)}
    out = []
    for alloc in desired["allocations"]:
        gi_id: int | None = None
        memory = alloc["memory_mib"]
        if alloc["partition_key"] is not None:
            inst = by_slot.get(slots.get(alloc["partition_key"], (-1, -1)))
            gi_id = inst.gpu_instance_id if inst else -1
            if memory is None and inst is not None and inst.memory_mib is not None:
                memory = inst.memory_mib // 2
        out.append(
            RunningAllocation(
                key=alloc["key"],
                gpu_instance_id=gi_id,
                memory_mib=memory if memory is not None else 1024,
                compute_percent=alloc["max_compute_percent"] or 100,
            )
        )
    return out


def _sync_allocations(
    backend: GpuBackend, gpu: str, desired: DesiredGpu, final: bool
) -> list[ItemResult]:
    """Before the plan, end the workloads no longer wanted; after it, start the new ones (so
    they find their partition and their MPS daemon)."""
    if not isinstance(backend, AllocationRunner):
        return []
    allocations = _allocations(backend, gpu, desired)
    missing = backend.sync_allocations(gpu, allocations, start=final)
    if not final:
        return []
    return [item(key, gpu, "failed", "partition missing") for key in missing]


# ------------------------------------------------------------------------------------------------
# Real workloads (the agent's runtime)
# ------------------------------------------------------------------------------------------------


class WorkloadRunner(Protocol):
    """The agent's workload supervisor, as an apply drives it (``hostagent.runtime.sync``)."""

    def release(self, gpu: str, want: DesiredGpu) -> list[int]:
        """Stop the replicas of ``gpu`` that ``want`` no longer lists; return those running."""

    def wait_released(self, ids: list[int]) -> bool:
        """Wait (bounded by their grace periods) until ``ids`` have ended."""

    def place(self, mps: MpsManager | None, gpu: str, want: DesiredGpu) -> None:
        """Start (on its own threads) the replicas ``want`` lists, on what the apply made."""

    def settle(self, desired: DesiredState) -> None:
        """The whole desired state was applied: the control plane has spoken."""


_RESHAPING = (Blocked, StopMps, DestroyComputeInstance, DestroyGpuInstance, SetMigMode)


def _release_workloads(
    workloads: WorkloadRunner,
    backend: GpuBackend,
    mps: MpsManager | None,
    gpu: str,
    want: DesiredGpu,
) -> None:
    """Stop the replicas no longer wanted; wait for them only when the plan would destroy or
    reshape a partition (or an MPS daemon) they may run on: a partition is never destroyed
    under its workload, and a plain eviction never holds the ack for a grace period."""
    stopping = workloads.release(gpu, want)
    if stopping and any(isinstance(a, _RESHAPING) for a in plan(want, observe(backend, mps, gpu))):
        workloads.wait_released(stopping)


# ------------------------------------------------------------------------------------------------
# The reset path (review D3)
# ------------------------------------------------------------------------------------------------


class ResetLedger:
    """At most one reset attempt per GPU and generation, per backend: a desired state sent
    again (the REST loop re-applies on drift) never resets a GPU in a loop."""

    def __init__(self) -> None:
        self._tried: weakref.WeakKeyDictionary[object, dict[str, int]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def claim(self, backend: GpuBackend, gpu: str, generation: int) -> bool:
        """True the first time for ``(backend, gpu, generation)``, False after."""
        with self._lock:
            tried = self._tried.setdefault(backend, {})
            if tried.get(gpu) == generation:
                return False
            tried[gpu] = generation
            return True


RESETS = ResetLedger()
"""The agent's ledger (one backend per agent process; tests pass their own)."""


def _reset(
    backend: GpuBackend, gpu: str, generation: int, resets: ResetLedger, st: GpuApply
) -> tuple[str, tuple[int, ...]]:
    """Reset the GPU so its pending MIG mode applies; return why not (and the PIDs that hold
    it), or ``("", ())`` after a reset."""
    busy = tuple(
        sorted(p.pid for p in backend.processes(gpu) if p.kind in ("compute", "mps_client"))
    )
    if busy:
        return f"{st.reset_message}; processes run on the GPU, so it is not reset", busy
    if not resets.claim(backend, gpu, generation):
        return f"{st.reset_message}; a GPU reset was already tried for generation {generation}", ()
    try:
        backend.reset_gpu(gpu)
    except InUse as exc:
        return f"{st.reset_message}; the GPU reset failed: {exc}", exc.pids
    except BackendError as exc:
        return f"{st.reset_message}; the GPU reset failed: {type(exc).__name__}: {exc}", ()
    st.needs_reset = False
    st.mode_changed = True
    return "", ()


def _mode_item(gpu: str, why: str, pids: tuple[int, ...]) -> ItemResult:
    """The mode item after a reset attempt: ``ok``, or ``needs_reset`` saying why not."""
    if not why:
        return item(mode_key(gpu), gpu, "ok", "MIG mode applied after a GPU reset (nvidia-smi -r)")
    entry = item(mode_key(gpu), gpu, "needs_reset", why)
    entry["pids"] = sorted(pids)[:MAX_PROCESSES]
    return entry


# ------------------------------------------------------------------------------------------------
# One GPU, every GPU
# ------------------------------------------------------------------------------------------------


def _split_at_mode_change(actions: tuple[Action, ...]) -> tuple[list[Action], list[Action]]:
    for i, action in enumerate(actions):
        if isinstance(action, SetMigMode):
            return list(actions[: i + 1]), list(actions[i + 1 :])
    return list(actions), []


def _apply_gpu(
    backend: GpuBackend,
    mps: MpsManager | None,
    gpu: str,
    want: DesiredGpu,
    *,
    allow_mutation: bool,
    generation: int,
    resets: ResetLedger,
) -> list[ItemResult]:
    head, tail = _split_at_mode_change(plan(want, observe(backend, mps, gpu)))
    states: dict[str, GpuApply] = {}
    results = apply_steps(backend, head, allow_mutation, mps, states)
    st = states.get(gpu, GpuApply())
    if st.needs_reset and allow_mutation:
        why, pids = _reset(backend, gpu, generation, resets, st)
        results = [_mode_item(gpu, why, pids) if r["key"] == mode_key(gpu) else r for r in results]
    if not st.mode_changed:
        return results + apply_steps(backend, tail, allow_mutation, mps, states)
    # The mode changed: observe again and plan the rest against what the driver lists now.
    return results + apply(backend, plan(want, observe(backend, mps, gpu)), allow_mutation, mps)


def apply_desired_state(
    backend: GpuBackend,
    desired: DesiredState,
    allow_mutation: bool,
    mps: MpsManager | None = None,
    *,
    resets: ResetLedger = RESETS,
    workloads: WorkloadRunner | None = None,
) -> list[ItemResult]:
    """Apply every GPU of a ``desired_state`` message; return merged item results.

    With ``workloads``, each GPU's replicas that must go are stopped before its plan and the
    new ones handed over after it, so they find their partition and MPS daemon.
    """
    results: list[ItemResult] = []
    known = {d.uuid: d for d in backend.list_gpus()}
    for gpu, want in sorted(desired["gpus"].items()):
        device = known.get(gpu)
        if device is None or device.status != "ok":
            status = "unknown" if device is None else device.status
            results.append(item(f"{gpu}:gpu", gpu, "failed", f"GPU is {status}"))
            if workloads is not None:
                workloads.release(gpu, want)
            continue
        try:
            if workloads is not None:
                _release_workloads(workloads, backend, mps, gpu, want)
            if allow_mutation:
                _sync_allocations(backend, gpu, want, final=False)
            results.extend(
                _apply_gpu(
                    backend,
                    mps,
                    gpu,
                    want,
                    allow_mutation=allow_mutation,
                    generation=desired["generation"],
                    resets=resets,
                )
            )
            if allow_mutation:
                results.extend(_sync_allocations(backend, gpu, want, final=True))
        except BackendError as exc:
            results.append(item(f"{gpu}:gpu", gpu, "failed", f"{type(exc).__name__}: {exc}"))
        if workloads is not None:
            workloads.place(mps, gpu, want)
    if workloads is not None:
        workloads.settle(desired)
    return merge_results(results)


def _awaiting_reset(observed: ObservedGpu, want: DesiredGpu) -> bool:
    """The MIG mode asked for is already pending: only a GPU reset changes anything now."""
    return (
        observed.mig_capable
        and bool(observed.mig_mode_current) != want["mig_enabled"]
        and observed.mig_mode_pending == want["mig_enabled"]
    )


def drifted(backend: GpuBackend, desired: DesiredState, mps: MpsManager | None = None) -> bool:
    """Whether applying ``desired`` again would change something: MIG instances lost in a
    reboot or a reset, an MPS daemon that died. Blocked or invalid items do not count (applying
    again would change nothing), nor a MIG mode pending a reset, nor GPUs that are missing or
    not ``ok``."""
    known = {d.uuid: d for d in backend.list_gpus()}
    for gpu, want in desired["gpus"].items():
        device = known.get(gpu)
        if device is None or device.status != "ok":
            continue
        try:
            observed = observe(backend, mps, gpu)
            actions = plan(want, observed)
        except BackendError:
            continue
        if _awaiting_reset(observed, want):
            continue
        if any(not isinstance(a, Blocked | Invalid) for a in actions):
            return True
    return False
