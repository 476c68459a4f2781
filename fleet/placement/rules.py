"""The per-GPU placement rules every strategy shares: who may take a request at all.

Strategies only order what these rules let through, so the preview (:func:`fleet.placement.rank`)
and the commit (:func:`fleet.placement.check`) refuse with the same codes whatever the strategy.
The ``*_takes`` predicates are the fast form of the ``*_problems`` functions (no violation is
built): they answer ``True`` exactly when the matching function returns no violation.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.domain import Violation
from fleet.mps import (
    MpsDevice,
    MpsPolicy,
    MpsRequest,
    check_fit,
    free_memory_mib,
    max_clients,
    validate_request,
)
from fleet.placement.ranking import Refusal
from fleet.placement.snapshot import Demand, FleetSnapshot, GpuState, HostState, MpsShare

_MPS_CODES = {
    "mps.memory_invalid": "placement.memory",
    "mps.memory_exceeds_device": "placement.memory",
    "mps.memory_overcommit": "placement.memory",
    "mps.too_many_clients": "placement.clients",
    "mps.compute_percent_out_of_range": "placement.compute",
    "mps.exceeds_policy_limit": "placement.compute",
}


def eligibility(snapshot: FleetSnapshot, gpu: GpuState) -> tuple[Violation, ...]:
    """Health and cordon violations of a GPU and its host."""
    violations: list[Violation] = []
    host = snapshot.host(gpu.host_id)
    if host is None or not host.healthy or not gpu.healthy:
        violations.append(
            Violation("placement.unhealthy", f"GPU {gpu.id} or its host is unhealthy.")
        )
    if (host is not None and host.cordoned) or gpu.cordoned:
        violations.append(Violation("placement.cordoned", f"GPU {gpu.id} or its host is cordoned."))
    return tuple(violations)


def demand_problems(
    host: HostState | None, gpu: GpuState, demand: Demand | None
) -> tuple[Violation, ...]:
    """What the replica needs beside its GPU share and this GPU's host cannot give."""
    if demand is None:
        return ()
    violations: list[Violation] = []
    if host is not None and not _cpu_ok(host, demand):
        violations.append(
            Violation(
                "placement.host_cpu",
                f"Host {host.id} has {host.cpu_free_milli} milli-CPU free; "
                f"the replica needs {demand.cpu_milli}.",
                {"free_milli": host.cpu_free_milli, "requested_milli": demand.cpu_milli},
            )
        )
    if host is not None and not _memory_ok(host, demand):
        violations.append(
            Violation(
                "placement.host_memory",
                f"Host {host.id} has {host.memory_free_mib} MiB free; "
                f"the replica needs {demand.host_memory_mib}.",
                {"free_mib": host.memory_free_mib, "requested_mib": demand.host_memory_mib},
            )
        )
    if host is not None and not _runtime_ok(host, demand):
        violations.append(runtime_violation(host, demand))
    elif host is not None and not _process_ok(host, demand):
        violations.append(process_runtime_violation(host))
    if host is not None and not _labels_ok(host, demand):
        violations.append(labels_violation(host, demand))
    if host is not None and not _reservation_ok(host, demand):
        violations.append(reserved_violation(host, demand))
    if host is not None and host.id in demand.avoid_hosts:
        violations.append(port_violation(host, demand))
    if demand.products and gpu.product_key not in demand.products:
        violations.append(
            Violation(
                "placement.product_mismatch",
                f"GPU {gpu.id} is a {gpu.product_key or 'unknown product'}; the replica runs on "
                f"{', '.join(demand.products)}.",
                {"product": gpu.product_key, "products": list(demand.products)},
            )
        )
    return tuple(violations)


def runtime_violation(host: HostState, demand: Demand) -> Violation:
    """The host's agent cannot run the replica's workload (``placement.runtime``)."""
    label = host.name or f"Host {host.id}"
    wanted = demand.workload or " or ".join(demand.runtimes)
    return Violation(
        "placement.runtime",
        f"{label} runs workloads with the {host.runtime} runtime; this deployment needs {wanted}.",
        {"runtime": host.runtime, "runtimes": list(demand.runtimes), "workload": demand.workload},
    )


def process_runtime_violation(host: HostState) -> Violation:
    """The host's agent does not run process workloads (``placement.process_runtime``)."""
    label = host.name or f"Host {host.id}"
    return Violation(
        "placement.process_runtime",
        f"{label} does not run process workloads: its agent was not started with "
        "--allow-process-runtime.",
        {"host": host.id},
    )


def labels_violation(host: HostState, demand: Demand) -> Violation:
    """The host lacks a label the replica requires (``placement.host_labels``)."""
    label = host.name or f"Host {host.id}"
    have = dict(host.labels)
    missing = {key: value for key, value in demand.host_labels if have.get(key) != value}
    wanted = ", ".join(f"{key}={value}" for key, value in sorted(missing.items()))
    return Violation(
        "placement.host_labels",
        f"{label} does not carry the label(s) this deployment requires: {wanted}.",
        {"missing": missing, "required": dict(demand.host_labels), "labels": have},
    )


def reserved_violation(host: HostState, demand: Demand) -> Violation:
    """The host is reserved for other teams than the replica's (``placement.host_reserved``)."""
    label = host.name or f"Host {host.id}"
    teams = [slug for _, slug in host.reserved_for]
    return Violation(
        "placement.host_reserved",
        f"{label} is reserved for team(s) {', '.join(teams)}: it takes only their "
        "deployments' replicas.",
        {"host": host.id, "reserved_for": teams, "team": demand.team},
    )


def port_violation(host: HostState, demand: Demand) -> Violation:
    """The host already runs a copy of the workload, which binds its port in the host's network
    (``placement.port_in_use``)."""
    label = host.name or f"Host {host.id}"
    return Violation(
        "placement.port_in_use",
        f"{label} already runs a replica of this deployment, listening on port {demand.port} "
        "of the host's network: a second copy there could not bind it.",
        {"port": demand.port, "host": host.id},
    )


def avoided(host: HostState | None, demand: Demand | None) -> bool:
    """Whether the replica must not go to ``host`` (a copy there holds its port). Not part of
    the memo key of a demand: callers check it before any memoised answer of the host."""
    return demand is not None and host is not None and host.id in demand.avoid_hosts


def blocked(snapshot: FleetSnapshot, gpu: GpuState, demand: Demand | None) -> tuple[Violation, ...]:
    """Everything that keeps ``gpu`` from taking any request with ``demand``."""
    return eligibility(snapshot, gpu) + demand_problems(snapshot.host(gpu.host_id), gpu, demand)


def host_takes(host: HostState | None, demand: Demand | None) -> bool:
    """Whether ``host`` is healthy, not cordoned, has the CPU and memory of ``demand``, a
    runtime that runs its workload (process workloads allowed, for a process) and the labels
    it requires, and is not reserved for other teams."""
    if host is None or not host.healthy or host.cordoned:
        return False
    return demand is None or (
        _cpu_ok(host, demand)
        and _memory_ok(host, demand)
        and _runtime_ok(host, demand)
        and _process_ok(host, demand)
        and _labels_ok(host, demand)
        and _reservation_ok(host, demand)
    )


def gpu_takes(gpu: GpuState, demand: Demand | None) -> bool:
    """Whether ``gpu`` (on a host that takes the request) is healthy, not cordoned and allowed."""
    if not gpu.healthy or gpu.cordoned:
        return False
    return demand is None or not demand.products or gpu.product_key in demand.products


def _cpu_ok(host: HostState, demand: Demand) -> bool:
    return host.cpu_free_milli is None or host.cpu_free_milli >= demand.cpu_milli


def _memory_ok(host: HostState, demand: Demand) -> bool:
    return host.memory_free_mib is None or host.memory_free_mib >= demand.host_memory_mib


def _runtime_ok(host: HostState, demand: Demand) -> bool:
    return not demand.runtimes or host.runtime is None or host.runtime in demand.runtimes


def _process_ok(host: HostState, demand: Demand) -> bool:
    return not demand.process_runtime or host.process_runtime is not False


def _labels_ok(host: HostState, demand: Demand) -> bool:
    if not demand.host_labels:
        return True
    have = dict(host.labels)
    return all(have.get(key) == value for key, value in demand.host_labels)


def _reservation_ok(host: HostState, demand: Demand) -> bool:
    if not host.reserved_for:
        return True
    return any(team == demand.team for team, _ in host.reserved_for)


def mode_mismatch(gpu: GpuState, wanted: str) -> Violation:
    """The GPU is in another sharing mode than the request needs."""
    return Violation(
        "placement.mode_mismatch",
        f"GPU {gpu.id} is in {gpu.mode} mode, not {wanted}.",
        {"mode": gpu.mode, "wanted": wanted},
    )


def mps_shares(gpu: GpuState) -> list[tuple[int | None, MpsShare]]:
    """Where MPS clients can go on a GPU: the whole GPU in MPS mode, or each MIG instance that
    runs its own daemon (MPS inside MIG)."""
    if gpu.mode == "mps":
        return [(gpu.whole_partition_id, gpu.whole_mps())]
    if gpu.mode == "mig":
        return [(p.id, p.mps) for p in gpu.partitions if p.mps is not None]
    return []


def mps_fits(
    gpu: GpuState, request: MpsRequest
) -> tuple[list[tuple[int | None, MpsShare]], list[Refusal]]:
    """The MPS daemons of ``gpu`` that take one more client ``request``, and why the others do
    not (ECS semantics: reserved memory and the client count are capacity; the compute cap is
    checked against the daemon's policy, never summed)."""
    shares = mps_shares(gpu)
    if not shares:
        return [], [Refusal(gpu.id, None, (mode_mismatch(gpu, "mps"),))]
    fitting: list[tuple[int | None, MpsShare]] = []
    refused: list[Refusal] = []
    for partition_id, share in shares:
        if share.blocked:
            busy = Violation(
                "placement.partition_busy",
                f"Partition {partition_id} on GPU {gpu.id} runs a whole-partition workload.",
            )
            refused.append(Refusal(gpu.id, partition_id, (busy,)))
            continue
        problems = check_fit(share.device, share.reservations, request, share.policy)
        if problems:
            refused.append(Refusal(gpu.id, partition_id, tuple(_as_placement(v) for v in problems)))
            continue
        fitting.append((partition_id, share))
    return fitting, refused


ShareState = tuple[int, int, int, int, int]
"""What an MPS daemon offers one more client: free MiB, client slots left, the per-client memory
cap, the thread-percentage cap, and the device's MiB."""


def share_state(share: MpsShare) -> ShareState:
    """The numbers :func:`mps_fits` decides on (a blocked daemon offers nothing)."""
    if share.blocked:
        return (0, 0, 0, 0, share.device.memory_mib)
    return daemon_state(share.device, share.policy, share.reservations)


def daemon_state(
    device: MpsDevice, policy: MpsPolicy | None, reservations: Sequence[MpsRequest]
) -> ShareState:
    """:func:`share_state` of a daemon that is not blocked."""
    cap = device.memory_mib
    thread = 100
    if policy is not None:
        thread = policy.default_active_thread_percentage
        if policy.default_pinned_mem_limit_mib is not None:
            cap = policy.default_pinned_mem_limit_mib
    return (
        free_memory_mib(device, reservations),
        max_clients(device, policy) - len(reservations),
        cap,
        thread,
        device.memory_mib,
    )


def with_client(state: ShareState, memory_mib: int) -> ShareState:
    """The daemon after one more client reserving ``memory_mib``."""
    free, slots, cap, thread, device = state
    return (free - memory_mib, slots - 1, cap, thread, device)


def request_valid(request: MpsRequest) -> bool:
    """Whether the request itself is well formed (no daemon takes an invalid one)."""
    return not validate_request(request)


def mps_takes(state: ShareState | tuple[int, ...], memory_mib: int, compute: int | None) -> bool:
    """Fast form of :func:`mps_fits` for one daemon and a valid request: room for the memory, a
    client slot, and within the policy's per-client memory and thread caps."""
    return (
        state[0] >= memory_mib
        and state[1] > 0
        and memory_mib <= state[2]
        and (compute is None or compute <= state[3])
    )


def _as_placement(violation: Violation) -> Violation:
    code = _MPS_CODES.get(violation.code, "placement.mps")
    return Violation(code, violation.message, {**violation.details, "rule": violation.code})


def whole_problems(
    snapshot: FleetSnapshot, gpu: GpuState, demand: Demand | None = None
) -> tuple[Violation, ...]:
    """Why ``gpu`` is not a free dedicated GPU for a whole-GPU request with ``demand``."""
    problems = list(blocked(snapshot, gpu, demand))
    if gpu.mode != "dedicated":
        problems.append(mode_mismatch(gpu, "dedicated"))
    elif gpu.taken:
        problems.append(Violation("placement.gpu_busy", f"GPU {gpu.id} already runs a workload."))
    return tuple(problems)


def whole_free(gpu: GpuState, demand: Demand | None) -> bool:
    """Fast form of ``not whole_problems(...)`` for a GPU whose host takes ``demand``."""
    return gpu.mode == "dedicated" and not gpu.taken and gpu_takes(gpu, demand)
