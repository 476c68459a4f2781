"""Turn a desired GPU configuration into an ordered, idempotent list of actions, and apply it.

:func:`plan` is pure: ``(DesiredGpu, ObservedGpu) -> tuple[Action, ...]``. The order follows the
driver's rules (MIG user guide, ``nvml.h``): stop MPS daemons that must go, destroy compute
instances, destroy GPU instances, change MIG mode, create GPU instances in placement order with
explicit placements, create their compute instances, start MPS daemons. Instances are identified
by ``(profile_id, start)``, never by the driver's GI id. A partition with processes is never
destroyed: the plan holds a :class:`Blocked` item (reported ``in_use`` with the PIDs) and nothing
that depends on it (an overlapping new instance, the MIG mode change) is touched.

:func:`apply` executes a plan against a backend; :func:`apply_desired_state` runs a whole
``desired_state`` message (observe, plan, apply, simulated workloads) for every GPU it names.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from hostagent.gpu.backend import (
    BackendError,
    GpuBackend,
    InUse,
    MigInstance,
    ProcessSample,
    ProfilePlacements,
)
from hostagent.gpu.simulated import RunningAllocation
from hostagent.mps import MpsError, MpsLimits, MpsManager
from hostagent.protocol import DesiredGpu, DesiredMps, DesiredState, ItemResult, ItemStatus

logger = logging.getLogger(__name__)

MUTATION_DISABLED = "mutation_disabled"

Slot = tuple[int, int]
"""An instance identity on one GPU: ``(profile_id, start)``."""


# ------------------------------------------------------------------------------------------------
# Observed state and actions
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObservedGpu:
    """What the agent sees on one GPU; ``mps`` maps running daemon targets to their limits."""

    uuid: str
    mig_capable: bool
    mig_mode_current: bool | None
    placements: tuple[ProfilePlacements, ...] = ()
    instances: tuple[MigInstance, ...] = ()
    processes: tuple[ProcessSample, ...] = ()
    mps: dict[str, MpsLimits] = field(default_factory=dict)


@dataclass(frozen=True)
class Action:
    """Base of every planned step; ``key`` names the item in the ack."""

    gpu_uuid: str
    key: str


@dataclass(frozen=True)
class Blocked(Action):
    """Not done because processes run where it would act (reported ``in_use``)."""

    pids: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class Invalid(Action):
    """The desired item cannot exist on this GPU (reported ``failed``)."""

    reason: str


@dataclass(frozen=True)
class StopMps(Action):
    """``echo quit | nvidia-cuda-mps-control`` for one daemon."""

    target_uuid: str


@dataclass(frozen=True)
class DestroyComputeInstance(Action):
    """``nvmlComputeInstanceDestroy`` (``nvidia-smi mig -dci``)."""

    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True)
class DestroyGpuInstance(Action):
    """``nvmlGpuInstanceDestroy`` (``nvidia-smi mig -dgi``)."""

    gpu_instance_id: int


@dataclass(frozen=True)
class SetMigMode(Action):
    """``nvmlDeviceSetMigMode`` (``nvidia-smi -mig 0|1``)."""

    enabled: bool


@dataclass(frozen=True)
class CreateGpuInstance(Action):
    """``nvmlDeviceCreateGpuInstanceWithPlacement`` (``nvidia-smi mig -cgi ID:START``)."""

    profile_id: int
    start: int


@dataclass(frozen=True)
class CreateComputeInstance(Action):
    """Default compute instance in the GI at ``(profile_id, start)`` (``mig -cci``)."""

    profile_id: int
    start: int


@dataclass(frozen=True)
class EnsureMps(Action):
    """Start an MPS daemon (GPU-wide when ``slot`` is None) and apply its default limits."""

    slot: Slot | None
    limits: MpsLimits


# ------------------------------------------------------------------------------------------------
# Planning (pure)
# ------------------------------------------------------------------------------------------------


def _gi_key(gpu_uuid: str, slot: Slot) -> str:
    return f"{gpu_uuid}:gi:{slot[0]}@{slot[1]}"


def _overlaps(a: Slot, b: Slot, sizes: dict[int, int]) -> bool:
    a_end = a[1] + sizes.get(a[0], 1)
    b_end = b[1] + sizes.get(b[0], 1)
    return a[1] < b_end and b[1] < a_end


@dataclass
class _Plan:
    desired: DesiredGpu
    observed: ObservedGpu
    sizes: dict[int, int]
    blocked: list[Blocked] = field(default_factory=list)
    invalid: list[Invalid] = field(default_factory=list)
    stops: list[Action] = field(default_factory=list)
    destroy_ci: list[Action] = field(default_factory=list)
    destroy_gi: list[Action] = field(default_factory=list)
    mode: list[Action] = field(default_factory=list)
    create_gi: list[CreateGpuInstance] = field(default_factory=list)
    create_ci: list[CreateComputeInstance] = field(default_factory=list)
    ensure: list[Action] = field(default_factory=list)


def _valid_desired(p: _Plan) -> dict[Slot, str]:
    """Desired instances that are placeable, by slot; the rest become :class:`Invalid`."""
    uuid = p.observed.uuid
    allowed = {pp.profile_id: {s for s, _ in pp.placements} for pp in p.observed.placements}
    out: dict[Slot, str] = {}
    for inst in sorted(p.desired["instances"], key=lambda i: (i["start"], i["profile_id"])):
        slot = (inst["profile_id"], inst["start"])
        if slot[1] not in allowed.get(slot[0], set()):
            p.invalid.append(Invalid(uuid, inst["key"], "placement not allowed by the driver"))
        elif any(_overlaps(slot, other, p.sizes) for other in out):
            p.invalid.append(Invalid(uuid, inst["key"], "overlaps another desired instance"))
        else:
            out[slot] = inst["key"]
    return out


def _plan_removals(p: _Plan, wanted: dict[Slot, str]) -> set[Slot]:
    """Destroy observed instances not wanted; return the slots still occupied afterwards."""
    uuid = p.observed.uuid
    by_gi: dict[int, list[MigInstance]] = {}
    for inst in p.observed.instances:
        by_gi.setdefault(inst.gpu_instance_id, []).append(inst)
    kept: set[Slot] = set()
    occupied: set[Slot] = set()
    for gi_id, parts in sorted(by_gi.items(), key=lambda kv: kv[1][0].start):
        slot = (parts[0].profile_id, parts[0].start)
        if slot in wanted and slot not in kept:
            kept.add(slot)
            occupied.add(slot)
            if all(part.compute_instance_id is None for part in parts):
                p.create_ci.append(CreateComputeInstance(uuid, wanted[slot], *slot))
            continue
        key = _gi_key(uuid, slot)
        pids = tuple(sorted(pr.pid for pr in p.observed.processes if pr.gpu_instance_id == gi_id))
        if pids:
            p.blocked.append(Blocked(uuid, key, pids, "processes run on this partition"))
            occupied.add(slot)
            continue
        for part in parts:
            if part.compute_instance_id is not None:
                p.destroy_ci.append(
                    DestroyComputeInstance(uuid, key, gi_id, part.compute_instance_id)
                )
        p.destroy_gi.append(DestroyGpuInstance(uuid, key, gi_id))
    return occupied


def _plan_mig(p: _Plan) -> None:
    obs, uuid = p.observed, p.observed.uuid
    want_mig = p.desired["mig_enabled"]
    if want_mig and not obs.mig_capable:
        p.invalid.append(Invalid(uuid, f"{uuid}:mig_mode", "GPU is not MIG capable"))
        return
    wanted = _valid_desired(p) if want_mig else {}
    occupied = _plan_removals(p, wanted)
    blocked_pids = tuple(sorted({pid for b in p.blocked for pid in b.pids}))
    mode_change = obs.mig_capable and bool(obs.mig_mode_current) != want_mig
    mode_busy: tuple[int, ...] = ()
    if mode_change:
        mode_busy = blocked_pids or tuple(sorted({pr.pid for pr in obs.processes}))
        if mode_busy:
            p.blocked.append(Blocked(uuid, f"{uuid}:mig_mode", mode_busy, "GPU is busy"))
        else:
            p.mode.append(SetMigMode(uuid, f"{uuid}:mig_mode", want_mig))
    for slot, key in sorted(wanted.items(), key=lambda kv: kv[0][1]):
        if slot in occupied:
            continue
        if mode_busy:
            p.blocked.append(Blocked(uuid, key, mode_busy, "MIG mode cannot change yet"))
            continue
        if any(_overlaps(slot, o, p.sizes) for o in occupied):
            p.blocked.append(Blocked(uuid, key, blocked_pids, "its slices are still in use"))
            continue
        p.create_gi.append(CreateGpuInstance(uuid, key, *slot))
        p.create_ci.append(CreateComputeInstance(uuid, key, *slot))
    p.create_ci.sort(key=lambda a: a.start)


def _limits(mps: DesiredMps) -> MpsLimits:
    return MpsLimits(mps["default_active_thread_percentage"], mps["default_pinned_mem_limit_mib"])


def _plan_mps(p: _Plan) -> None:
    obs, uuid, mps = p.observed, p.observed.uuid, p.desired["mps"]
    uuid_of_slot = {(i.profile_id, i.start): i.uuid for i in obs.instances if i.uuid is not None}
    targets: dict[str, tuple[Slot | None, MpsLimits]] = {}
    pending: list[tuple[Slot, MpsLimits]] = []
    if p.desired["mig_enabled"]:
        for inst in p.desired["instances"]:
            # An instance's own MPS setting wins; otherwise the GPU's applies to every instance.
            own = inst.get("mps")
            wanted = own if own is not None else mps
            if not wanted["enabled"]:
                continue
            slot = (inst["profile_id"], inst["start"])
            target = uuid_of_slot.get(slot)
            if target is None:
                pending.append((slot, _limits(wanted)))
            else:
                targets[target] = (slot, _limits(wanted))
    elif mps["enabled"]:
        targets[uuid] = (None, _limits(mps))
    for target in sorted(set(obs.mps) - set(targets)):
        p.stops.append(StopMps(uuid, f"{target}:mps", target))
    for target, (target_slot, limits) in sorted(targets.items()):
        if obs.mps.get(target) != limits:
            p.ensure.append(EnsureMps(uuid, f"{target}:mps", target_slot, limits))
    for new_slot, limits in pending:
        if any(a.profile_id == new_slot[0] and a.start == new_slot[1] for a in p.create_gi):
            p.ensure.append(EnsureMps(uuid, _gi_key(uuid, new_slot) + ":mps", new_slot, limits))


def plan(desired: DesiredGpu, observed: ObservedGpu) -> tuple[Action, ...]:
    """Plan the steps that take ``observed`` to ``desired`` on one GPU.

    Returns ``()`` when nothing is to be done, so applying a plan and planning again on the
    new observation yields ``()`` (idempotence), unless an item is blocked or invalid.
    """
    sizes = {pp.profile_id: pp.memory_slices for pp in observed.placements}
    sizes.update({i.profile_id: i.size for i in observed.instances})
    p = _Plan(desired, observed, sizes)
    _plan_mig(p)
    _plan_mps(p)
    return (
        *p.invalid,
        *p.blocked,
        *p.stops,
        *p.destroy_ci,
        *p.destroy_gi,
        *p.mode,
        *p.create_gi,
        *p.create_ci,
        *p.ensure,
    )


# ------------------------------------------------------------------------------------------------
# Applying
# ------------------------------------------------------------------------------------------------


def _item(key: str, gpu: str, status: ItemStatus, message: str) -> ItemResult:
    return {"key": key, "gpu_uuid": gpu, "status": status, "message": message, "pids": []}


def _result(
    action: Action, status: ItemStatus, message: str = "", pids: Iterable[int] = ()
) -> ItemResult:
    return {
        "key": action.key,
        "gpu_uuid": action.gpu_uuid,
        "status": status,
        "message": message,
        "pids": sorted(pids),
    }


@dataclass
class _GpuApply:
    needs_reset: bool = False
    failed_destroy: bool = False
    failed_slots: set[str] = field(default_factory=set)


def _find_gi(backend: GpuBackend, gpu: str, profile_id: int, start: int) -> MigInstance | None:
    for inst in backend.mig_instances(gpu):
        if inst.profile_id == profile_id and inst.start == start:
            return inst
    return None


def _execute(
    backend: GpuBackend, mps: MpsManager | None, action: Action, st: _GpuApply
) -> ItemResult:
    gpu = action.gpu_uuid
    if isinstance(action, Blocked):
        return _result(action, "in_use", action.reason, action.pids)
    if isinstance(action, Invalid):
        return _result(action, "failed", action.reason)
    if isinstance(action, StopMps):
        if mps is not None:
            mps.stop(action.target_uuid)
        return _result(action, "ok")
    if isinstance(action, DestroyComputeInstance):
        backend.destroy_compute_instance(gpu, action.gpu_instance_id, action.compute_instance_id)
        return _result(action, "ok")
    if isinstance(action, DestroyGpuInstance):
        backend.destroy_gpu_instance(gpu, action.gpu_instance_id)
        return _result(action, "ok")
    if isinstance(action, SetMigMode):
        if st.failed_destroy:
            return _result(action, "failed", "an instance could not be destroyed")
        outcome = backend.set_mig_mode(gpu, action.enabled)
        if outcome.needs_reset:
            st.needs_reset = True
            return _result(action, "needs_reset", "MIG mode is pending a GPU reset")
        return _result(action, "ok")
    if st.needs_reset:
        return _result(action, "needs_reset", "waiting for the GPU reset")
    if isinstance(action, CreateGpuInstance):
        if st.failed_destroy:
            return _result(action, "failed", "an instance could not be destroyed")
        backend.create_gpu_instance(gpu, action.profile_id, action.start)
        return _result(action, "ok")
    if isinstance(action, CreateComputeInstance):
        gi = _find_gi(backend, gpu, action.profile_id, action.start)
        if gi is None:
            return _result(action, "failed", "the GPU instance does not exist")
        backend.create_compute_instance(gpu, gi.gpu_instance_id)
        return _result(action, "ok")
    if isinstance(action, EnsureMps):
        return _ensure_mps(backend, mps, action)
    raise TypeError(f"unknown action {action!r}")


def _ensure_mps(backend: GpuBackend, mps: MpsManager | None, action: EnsureMps) -> ItemResult:
    if mps is None:
        return _result(action, "failed", "MPS is not available on this agent")
    target: str | None = action.gpu_uuid
    if action.slot is not None:
        gi = _find_gi(backend, action.gpu_uuid, *action.slot)
        target = gi.uuid if gi else None
    if target is None:
        return _result(action, "failed", "the MIG instance does not exist")
    mps.ensure(target, action.limits)
    return _result(action, "ok")


def apply(
    backend: GpuBackend,
    actions: Iterable[Action],
    allow_mutation: bool,
    mps: MpsManager | None = None,
) -> list[ItemResult]:
    """Execute ``actions`` in order; one result per action (merged per key by the caller).

    Without ``allow_mutation`` nothing is changed and every mutation is ``refused`` with the
    message ``mutation_disabled``. A failed destroy stops the mode change and creations on
    that GPU; a MIG mode change pending a reset turns the later steps into ``needs_reset``.
    """
    results: list[ItemResult] = []
    states: dict[str, _GpuApply] = {}
    for action in actions:
        st = states.setdefault(action.gpu_uuid, _GpuApply())
        if not allow_mutation and not isinstance(action, Blocked | Invalid):
            results.append(_result(action, "refused", MUTATION_DISABLED))
            continue
        try:
            results.append(_execute(backend, mps, action, st))
        except InUse as exc:
            st.failed_destroy = True
            results.append(_result(action, "in_use", str(exc), exc.pids))
        except (BackendError, MpsError) as exc:
            if isinstance(action, DestroyComputeInstance | DestroyGpuInstance):
                st.failed_destroy = True
            logger.warning("%s failed: %s", action, exc)
            results.append(_result(action, "failed", f"{type(exc).__name__}: {exc}"))
    return results


_SEVERITY: dict[ItemStatus, int] = {
    "ok": 0,
    "refused": 1,
    "needs_reset": 2,
    "in_use": 3,
    "failed": 4,
}


def merge_results(results: Iterable[ItemResult]) -> list[ItemResult]:
    """One result per key: the most severe status wins, PIDs are united."""
    merged: dict[str, ItemResult] = {}
    for item in results:
        prev = merged.get(item["key"])
        if prev is None:
            merged[item["key"]] = {**item, "pids": list(item["pids"])}
            continue
        pids = sorted(set(prev["pids"]) | set(item["pids"]))
        if _SEVERITY[item["status"]] > _SEVERITY[prev["status"]]:
            merged[item["key"]] = {**item, "pids": pids}
        else:
            prev["pids"] = pids
    return list(merged.values())


# ------------------------------------------------------------------------------------------------
# Whole desired state
# ------------------------------------------------------------------------------------------------


@runtime_checkable
class AllocationRunner(Protocol):
    """A backend that runs workloads itself (the simulator does; NVML does not)."""

    def sync_allocations(self, gpu: str, allocations: list[RunningAllocation]) -> list[str]:
        """Make running workloads match ``allocations``; return keys that could not run."""


def observe(backend: GpuBackend, mps: MpsManager | None, gpu: str) -> ObservedGpu:
    """Read one GPU's current state for :func:`plan`."""
    device = next(d for d in backend.list_gpus() if d.uuid == gpu)
    capable = device.mig_capable
    running: dict[str, MpsLimits] = {}
    if mps is not None:
        for target in mps.managed_targets():
            limits = mps.limits(target)
            if limits is not None and mps.healthy(target):
                running[target] = limits
    instances = tuple(backend.mig_instances(gpu)) if capable else ()
    owned = {gpu} | {i.uuid for i in instances if i.uuid}
    return ObservedGpu(
        uuid=gpu,
        mig_capable=capable,
        mig_mode_current=device.mig_mode_current,
        placements=tuple(backend.possible_placements(gpu)) if capable else (),
        instances=instances,
        processes=tuple(backend.processes(gpu)),
        mps={t: lim for t, lim in running.items() if t in owned},
    )


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
    if not isinstance(backend, AllocationRunner):
        return []
    allocations = _allocations(backend, gpu, desired)
    missing = backend.sync_allocations(gpu, allocations)
    if not final:
        return []
    return [
        {
            "key": key,
            "gpu_uuid": gpu,
            "status": "failed",
            "message": "partition missing",
            "pids": [],
        }
        for key in missing
    ]


def apply_desired_state(
    backend: GpuBackend,
    desired: DesiredState,
    allow_mutation: bool,
    mps: MpsManager | None = None,
) -> list[ItemResult]:
    """Apply every GPU of a ``desired_state`` message; return merged item results."""
    results: list[ItemResult] = []
    known = {d.uuid: d for d in backend.list_gpus()}
    for gpu, want in sorted(desired["gpus"].items()):
        device = known.get(gpu)
        if device is None or device.status != "ok":
            status = "unknown" if device is None else device.status
            results.append(_item(f"{gpu}:gpu", gpu, "failed", f"GPU is {status}"))
            continue
        try:
            if allow_mutation:
                _sync_allocations(backend, gpu, want, final=False)
            actions = plan(want, observe(backend, mps, gpu))
            results.extend(apply(backend, actions, allow_mutation, mps))
            if allow_mutation:
                results.extend(_sync_allocations(backend, gpu, want, final=True))
        except BackendError as exc:
            results.append(_item(f"{gpu}:gpu", gpu, "failed", f"{type(exc).__name__}: {exc}"))
    return merge_results(results)


def drifted(backend: GpuBackend, desired: DesiredState, mps: MpsManager | None = None) -> bool:
    """Whether applying ``desired`` again would change something: MIG instances lost in a
    reboot or a reset, an MPS daemon that died. Blocked or invalid items do not count (applying
    again would change nothing), nor GPUs that are missing or not ``ok``."""
    known = {d.uuid: d for d in backend.list_gpus()}
    for gpu, want in desired["gpus"].items():
        device = known.get(gpu)
        if device is None or device.status != "ok":
            continue
        try:
            actions = plan(want, observe(backend, mps, gpu))
        except BackendError:
            continue
        if any(not isinstance(a, Blocked | Invalid) for a in actions):
            return True
    return False
