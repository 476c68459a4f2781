"""Between a desired state and the supervisor: which replicas run where, with which device and
environment, and which process belongs to which replica.

:class:`WorkloadSync` is what :func:`hostagent.reconcile.apply_desired_state` calls for each
GPU: :meth:`~WorkloadSync.release` before the GPU's plan (the replicas no longer listed stop,
and the apply waits for them only when the plan reshapes the GPU: a partition is never destroyed
under its workload), :meth:`~WorkloadSync.place` after it (the new replicas start on the
partitions just made, their device UUIDs read from the driver), :meth:`~WorkloadSync.settle`
once the whole state is applied (the control plane has spoken: orphans may go).
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol, runtime_checkable

from hostagent.gpu.backend import BackendError, GpuBackend, MigInstance
from hostagent.mps import MpsManager
from hostagent.protocol import (
    DesiredAllocation,
    DesiredGpu,
    DesiredInstance,
    DesiredState,
    Logs,
    LogsRequest,
    bound_log_lines,
    clip,
    workload_environment,
)
from hostagent.runtime.base import ReplicaSpec
from hostagent.runtime.output import NoOutput, Output
from hostagent.runtime.supervisor import Supervisor

logger = logging.getLogger(__name__)

STOP_WAIT_MARGIN_S = 10.0
"""Beyond the longest grace period, how long an apply waits for the workloads to end."""


@runtime_checkable
class KeyedProcesses(Protocol):
    """A backend whose fake processes carry their allocation key (the simulator)."""

    def process_keys(self, gpu: str) -> dict[str, int]:
        """Allocation key → PID."""


def _mig_instances(
    backend: GpuBackend, gpu: str, want: DesiredGpu
) -> dict[tuple[int, int], MigInstance]:
    if not want["instances"]:
        return {}
    try:
        return {(i.profile_id, i.start): i for i in backend.mig_instances(gpu)}
    except BackendError as exc:
        logger.warning("cannot read the MIG instances of %s: %s", gpu, exc)
        return {}


def _mps_target(
    want: DesiredGpu, instance: DesiredInstance | None, device: str | None
) -> str | None:
    """The MPS daemon the replica is a client of (the planner's rule: an instance's own MPS
    setting, else the GPU's when MIG is on; the GPU's daemon when MIG is off)."""
    if device is None:
        return None
    if want["mig_enabled"] and instance is not None:
        setting = instance.get("mps") or want["mps"]
        return device if setting["enabled"] else None
    if not want["mig_enabled"] and want["mps"]["enabled"]:
        return device
    return None


def replica_specs(
    backend: GpuBackend, mps: MpsManager | None, gpu: str, want: DesiredGpu, *, gpu_request: bool
) -> list[ReplicaSpec]:
    """The replicas of ``want`` that run something, resolved on this host (call after the
    GPU's partitions and MPS daemons were made). A replica of several whole GPUs runs once, from
    its first GPU's allocation, seeing every GPU in ``devices``."""
    slots = {i["key"]: i for i in want["instances"]}
    instances = _mig_instances(backend, gpu, want)
    specs = []
    for alloc in want["allocations"]:
        workload, allocation_id = alloc.get("workload"), alloc.get("allocation_id")
        if workload is None or allocation_id is None or workload["runtime"] == "none":
            continue
        instance = None if alloc["partition_key"] is None else slots.get(alloc["partition_key"])
        device: str | None = gpu
        devices = alloc.get("devices")
        if devices and alloc["partition_key"] is None:  # one workload on all its GPUs
            device = ",".join(devices)
        if alloc["partition_key"] is not None:
            mig = instances.get((instance["profile_id"], instance["start"])) if instance else None
            device = mig.uuid if mig is not None else None
        target = _mps_target(want, instance, device)
        pipe = str(mps.daemon(target).pipe_directory) if target and mps else None
        specs.append(_spec(alloc, allocation_id, gpu, device, pipe, gpu_request))
    return specs


def _spec(
    alloc: DesiredAllocation,
    allocation_id: int,
    gpu: str,
    device: str | None,
    pipe: str | None,
    gpu_request: bool,
) -> ReplicaSpec:
    workload = alloc["workload"]
    deployment, replica = alloc.get("deployment", ""), alloc.get("replica", 0)
    environment = (
        workload_environment(
            device_uuid=device,
            allocation_id=allocation_id,
            deployment=deployment,
            replica=replica,
            mps_pipe_directory=pipe,
            mps_memory_mib=alloc["memory_mib"] if pipe else None,
            mps_compute_percent=alloc["max_compute_percent"] if pipe else None,
        )
        if device is not None
        else {}
    )
    return ReplicaSpec(
        allocation_id=allocation_id,
        key=alloc["key"],
        gpu_uuid=gpu,
        deployment=deployment,
        replica=replica,
        workload=workload,
        device_uuid=device,
        environment=environment,
        mps_pipe_directory=pipe,
        gpu_request=gpu_request,
        security=alloc.get("security"),
        secret_env=tuple(alloc.get("secret_env", ())),
        drain_s=alloc.get("drain_s", 0),
    )


class WorkloadSync:
    """The supervisor as the apply sees it (see the module docstring), and the process
    attribution the collector asks for."""

    def __init__(self, supervisor: Supervisor, backend: GpuBackend, *, gpu_request: bool) -> None:
        self.supervisor = supervisor
        self.backend = backend
        self.gpu_request = gpu_request
        self._keys: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    @property
    def needs_authority(self) -> bool:
        """Workloads run here and no desired state came since the agent started."""
        return bool(self.supervisor.runtimes) and not self.supervisor.authoritative

    def release(self, gpu: str, want: DesiredGpu) -> list[int]:
        """Stop the replicas of ``gpu`` that ``want`` does not list; return those running."""
        keep = [
            a["allocation_id"]
            for a in want["allocations"]
            if "allocation_id" in a and a.get("workload", {}).get("runtime", "none") != "none"
        ]
        with self._lock:
            self._keys[gpu] = {
                a["key"]: a["allocation_id"] for a in want["allocations"] if "allocation_id" in a
            }
        try:
            return self.supervisor.release(gpu, keep)
        except Exception:  # a bug here must not cost the GPU its layout, nor the ack (D1)
            logger.exception("releasing the replicas of %s failed", gpu)
            return []

    def wait_released(self, ids: list[int]) -> bool:
        """Wait for ``ids`` to end: their grace period, SIGKILL, and a margin."""
        timeout = self.supervisor.stop_grace_s(ids) + STOP_WAIT_MARGIN_S
        stopped = self.supervisor.wait_stopped(ids, timeout)
        if not stopped:
            logger.warning("allocations %s still run after %.0f s", ids, timeout)
        return stopped

    def place(self, mps: MpsManager | None, gpu: str, want: DesiredGpu) -> None:
        """Hand ``gpu``'s replicas to the supervisor (it starts them on its own threads)."""
        try:
            specs = replica_specs(self.backend, mps, gpu, want, gpu_request=self.gpu_request)
            self.supervisor.place(gpu, specs)
        except Exception:  # a bug here must not cost the applied layout its ack (D1)
            logger.exception("placing the replicas of %s failed", gpu)

    def settle(self, desired: DesiredState) -> None:
        """The whole desired state is applied: it is the control plane's word."""
        self.supervisor.authorize(desired["gpus"])

    def settle_empty(self) -> None:
        """The control plane has no desired state for this host: nothing is wanted on any GPU
        (workloads found on unknown GPUs included)."""
        try:
            gpus = [d.uuid for d in self.backend.list_gpus()]
        except BackendError:
            gpus = []
        self.supervisor.authorize(gpus)

    def owners(self, gpu: str, pids: list[int]) -> dict[int, int]:
        """Allocation ID of the processes NVML lists on ``gpu`` that belong to a replica: the
        simulator's fake processes by their allocation key, real ones by session or PID
        namespace (a fake PID may equal a real one: the two are never mixed)."""
        if self.backend.kind == "simulated":
            with self._lock:
                keys = self._keys.get(gpu)
            if not keys or not isinstance(self.backend, KeyedProcesses):
                return {}
            wanted = set(pids)
            return {
                pid: keys[key]
                for key, pid in self.backend.process_keys(gpu).items()
                if key in keys and pid in wanted
            }
        return self.supervisor.owners(pids)

    def logs(self, request: LogsRequest) -> Logs:
        """The answer to a ``logs_request``: the replica's newest lines (older than its
        ``before``, containing its ``q``) within the protocol's bounds, with their stamps and
        cursors, or none and the reason. Blocks (see :meth:`Supervisor.logs`)."""
        try:
            output = self.supervisor.logs(
                request["allocation_id"],
                request["tail"],
                before=request.get("before"),
                q=request.get("q"),
            )
        except NoOutput as exc:
            return logs_answer(request, [], False, clip(str(exc)))
        except Exception as exc:  # a bug reading one replica's output costs only this answer
            logger.exception("reading the output of allocation %s", request["allocation_id"])
            error = clip(f"the agent could not read the output: {type(exc).__name__}: {exc}")
            return logs_answer(request, [], False, error)
        return logs_answer_of(request, output)


def logs_answer_of(request: LogsRequest, output: Output) -> Logs:
    """A ``logs`` message answering ``request`` with ``output`` within the protocol's bounds
    (the newest lines kept), each line's stamp and, where it has them, cursor."""
    lines, truncated = bound_log_lines(output.lines, request["tail"], truncated=output.truncated)
    answer = logs_answer(request, lines, truncated, None)
    kept = len(lines)  # the newest: bound_log_lines keeps the end
    answer["stamps"] = [] if not kept else list((output.stamps or [None] * kept)[-kept:])
    if output.seqs is not None:
        answer["seqs"] = list(output.seqs[-kept:]) if kept else []
        answer["gone"] = output.gone and kept == len(output.lines)
    return answer


def logs_answer(request: LogsRequest, lines: list[str], truncated: bool, error: str | None) -> Logs:
    """A ``logs`` message answering ``request``."""
    return {
        "type": "logs",
        "request_id": request["request_id"],
        "allocation_id": request["allocation_id"],
        "lines": lines,
        "truncated": truncated,
        "error": error,
    }
