"""Executing a plan against a backend and an MPS manager; one item result per action."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from hostagent.gpu.backend import BackendError, GpuBackend, InUse, MigInstance, NotSupported
from hostagent.mps import MpsBusy, MpsError, MpsManager
from hostagent.protocol import MAX_PROCESSES, ItemResult, ItemStatus, clip
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
    SetMigMode,
    StopMps,
)

logger = logging.getLogger(__name__)

MUTATION_DISABLED = "mutation_disabled"
PENDING_RESET = "MIG mode is pending a GPU reset"


def item(key: str, gpu: str, status: ItemStatus, message: str) -> ItemResult:
    """An item result without PIDs."""
    return {"key": key, "gpu_uuid": gpu, "status": status, "message": clip(message), "pids": []}


def result(
    action: Action, status: ItemStatus, message: str = "", pids: Iterable[int] = ()
) -> ItemResult:
    """The item result of one action."""
    return {
        "key": action.key,
        "gpu_uuid": action.gpu_uuid,
        "status": status,
        "message": clip(message),
        "pids": sorted(pids)[:MAX_PROCESSES],
    }


@dataclass
class GpuApply:
    """What the steps applied so far on one GPU mean for the next ones."""

    needs_reset: bool = False
    reset_message: str = ""
    mode_changed: bool = False
    failed_destroy: bool = False


def _find_gi(backend: GpuBackend, gpu: str, profile_id: int, start: int) -> MigInstance | None:
    for inst in backend.mig_instances(gpu):
        if inst.profile_id == profile_id and inst.start == start:
            return inst
    return None


def _set_mig_mode(backend: GpuBackend, action: SetMigMode, st: GpuApply) -> ItemResult:
    if st.failed_destroy:
        return result(action, "failed", "an instance could not be destroyed")
    outcome = backend.set_mig_mode(action.gpu_uuid, action.enabled)
    if outcome.needs_reset:
        # Say what holds the GPU (the backend's message), not "in use" without PIDs (review D3).
        st.needs_reset = True
        st.reset_message = outcome.message or PENDING_RESET
        return result(action, "needs_reset", st.reset_message)
    st.mode_changed = True
    return result(action, "ok")


def _execute(
    backend: GpuBackend, mps: MpsManager | None, action: Action, st: GpuApply
) -> ItemResult:
    gpu = action.gpu_uuid
    if isinstance(action, Blocked):
        return result(action, "in_use", action.reason, action.pids)
    if isinstance(action, Invalid):
        return result(action, "failed", action.reason)
    if isinstance(action, StopMps):
        return _stop_mps(backend, mps, action)
    if isinstance(action, DestroyComputeInstance):
        backend.destroy_compute_instance(gpu, action.gpu_instance_id, action.compute_instance_id)
        return result(action, "ok")
    if isinstance(action, DestroyGpuInstance):
        backend.destroy_gpu_instance(gpu, action.gpu_instance_id)
        return result(action, "ok")
    if isinstance(action, SetMigMode):
        return _set_mig_mode(backend, action, st)
    if st.needs_reset:
        return result(action, "needs_reset", "waiting for the GPU reset")
    if isinstance(action, Deferred):
        why = "planned once MIG is on" if st.mode_changed else "the MIG mode did not change"
        return result(action, "failed", why)
    if isinstance(action, CreateGpuInstance):
        if st.failed_destroy:
            return result(action, "failed", "an instance could not be destroyed")
        backend.create_gpu_instance(gpu, action.profile_id, action.start)
        return result(action, "ok")
    if isinstance(action, CreateComputeInstance):
        gi = _find_gi(backend, gpu, action.profile_id, action.start)
        if gi is None:
            return result(action, "failed", "the GPU instance does not exist")
        backend.create_compute_instance(gpu, gi.gpu_instance_id)
        return result(action, "ok")
    if isinstance(action, EnsureMps):
        return _ensure_mps(backend, mps, action)
    raise TypeError(f"unknown action {action!r}")


def _compute_mode(backend: GpuBackend, gpu: str, exclusive: bool) -> str:
    """``EXCLUSIVE_PROCESS`` while whole-GPU MPS runs, ``DEFAULT`` after: NVIDIA's MPS
    recommendation, as the k8s device plugin does (review D19); a note if it cannot be set."""
    try:
        backend.set_compute_mode(gpu, exclusive)
    except NotSupported as exc:
        logger.warning("compute mode of %s not changed: %s", gpu, exc)
        return f"compute mode not changed: {exc}"
    return ""


def _stop_mps(backend: GpuBackend, mps: MpsManager | None, action: StopMps) -> ItemResult:
    if mps is not None:
        mps.stop(action.target_uuid)
    note = ""
    if action.target_uuid == action.gpu_uuid:
        note = _compute_mode(backend, action.gpu_uuid, exclusive=False)
    return result(action, "ok", note)


def _ensure_mps(backend: GpuBackend, mps: MpsManager | None, action: EnsureMps) -> ItemResult:
    if mps is None:
        return result(action, "failed", "MPS is not available on this agent")
    target: str | None = action.gpu_uuid
    if action.slot is not None:
        gi = _find_gi(backend, action.gpu_uuid, *action.slot)
        target = gi.uuid if gi else None
    if target is None:
        return result(action, "failed", "the MIG instance does not exist")
    notes = []
    if action.slot is None:  # never under MIG: "not supported when the GPU is in MIG mode"
        notes.append(_compute_mode(backend, target, exclusive=True))
    notes.append(mps.ensure(target, action.limits))
    notes.append(action.note)
    return result(action, "ok", "; ".join(n for n in notes if n))


def _apply_one(
    backend: GpuBackend, mps: MpsManager | None, action: Action, st: GpuApply
) -> ItemResult:
    try:
        return _execute(backend, mps, action, st)
    except InUse as exc:
        st.failed_destroy = True
        return result(action, "in_use", str(exc), exc.pids)
    except MpsBusy as exc:
        return result(action, "in_use", str(exc), exc.pids)
    except (BackendError, MpsError) as exc:
        if isinstance(action, DestroyComputeInstance | DestroyGpuInstance):
            st.failed_destroy = True
        logger.warning("%s failed: %s", action, exc)
        return result(action, "failed", f"{type(exc).__name__}: {exc}")


def apply_steps(
    backend: GpuBackend,
    actions: Iterable[Action],
    allow_mutation: bool,
    mps: MpsManager | None,
    states: dict[str, GpuApply],
) -> list[ItemResult]:
    """:func:`apply` with the per-GPU state passed in, so one apply can run in passes."""
    results: list[ItemResult] = []
    for action in actions:
        st = states.setdefault(action.gpu_uuid, GpuApply())
        if not allow_mutation and not isinstance(action, Blocked | Invalid):
            results.append(result(action, "refused", MUTATION_DISABLED))
            continue
        results.append(_apply_one(backend, mps, action, st))
    return results


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
    return apply_steps(backend, actions, allow_mutation, mps, {})


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
    for entry in results:
        prev = merged.get(entry["key"])
        if prev is None:
            merged[entry["key"]] = {**entry, "pids": list(entry["pids"])}
            continue
        pids = sorted(set(prev["pids"]) | set(entry["pids"]))
        if _SEVERITY[entry["status"]] > _SEVERITY[prev["status"]]:
            merged[entry["key"]] = {**entry, "pids": pids}
        else:
            prev["pids"] = pids
    return list(merged.values())
