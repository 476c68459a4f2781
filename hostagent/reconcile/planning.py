"""The pure planner: ``(DesiredGpu, ObservedGpu) -> tuple[Action, ...]``.

What blocks a step is a process where it acts, with two refinements (review D5, D15):

* the ``nvidia-cuda-mps-server`` of a daemon the agent manages is MPS itself, not a workload:
  it does not block destroying its partition or changing the MIG mode; the plan quits the
  daemon first (``StopMps`` comes before every destroy);
* MPS clients do block, with their PIDs, and so does quitting a daemon they are connected to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hostagent.gpu.backend import MigInstance
from hostagent.mps import MpsLimits, daemon_limits, enforced_by_daemon
from hostagent.protocol import DesiredAllocation, DesiredGpu, DesiredMps
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

WHOLE_GPU = -1
"""Stands for "every process of the GPU" where a GPU-instance ID is expected."""


def gi_key(gpu_uuid: str, slot: Slot) -> str:
    """The item key of an observed instance: ``<gpu>:gi:<profile>@<start>``."""
    return f"{gpu_uuid}:gi:{slot[0]}@{slot[1]}"


def mode_key(gpu_uuid: str) -> str:
    """The item key of the MIG mode change."""
    return f"{gpu_uuid}:mig_mode"


def _overlaps(a: Slot, b: Slot, sizes: dict[int, int]) -> bool:
    a_end = a[1] + sizes.get(a[0], 1)
    b_end = b[1] + sizes.get(b[0], 1)
    return a[1] < b_end and b[1] < a_end


# ------------------------------------------------------------------------------------------------
# Who blocks what
# ------------------------------------------------------------------------------------------------


def _target_gi(obs: ObservedGpu, target: str) -> int:
    """The GPU instance an MPS target runs in (``WHOLE_GPU`` for the GPU's own daemon)."""
    for inst in obs.instances:
        if inst.uuid == target:
            return inst.gpu_instance_id
    return WHOLE_GPU


def _on(gi: int | None, where: int) -> bool:
    return where == WHOLE_GPU or gi == where


def blockers(obs: ObservedGpu, where: int) -> tuple[int, ...]:
    """PIDs that keep a partition (GI ``where``) or the whole GPU (``WHOLE_GPU``) busy: every
    process except the MPS servers of the agent's own daemons, plus those daemons' clients."""
    ours = {pid for pids in obs.mps_servers.values() for pid in pids}
    pids = {
        p.pid
        for p in obs.processes
        if _on(p.gpu_instance_id, where) and not (p.kind == "mps_server" and p.pid in ours)
    }
    for target, clients in obs.mps_clients.items():
        if _on(_target_gi(obs, target), where):
            pids.update(clients)
    return tuple(sorted(pids))


def mps_clients(obs: ObservedGpu, target: str) -> tuple[int, ...]:
    """Clients of one daemon: what it answers (``get_client_list``) and what NVML lists as MPS
    clients where it runs (``nvmlDeviceGetMPSComputeRunningProcesses``)."""
    where = _target_gi(obs, target)
    pids = set(obs.mps_clients.get(target, ()))
    pids.update(
        p.pid for p in obs.processes if p.kind == "mps_client" and _on(p.gpu_instance_id, where)
    )
    return tuple(sorted(pids))


# ------------------------------------------------------------------------------------------------
# MIG
# ------------------------------------------------------------------------------------------------


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
    deferred: list[Deferred] = field(default_factory=list)
    create_gi: list[CreateGpuInstance] = field(default_factory=list)
    create_ci: list[CreateComputeInstance] = field(default_factory=list)
    ensure: list[Action] = field(default_factory=list)


def _defer(p: _Plan, profile_id: int) -> bool:
    """MIG is off and about to be enabled, and the driver lists no such profile: it lists them
    only once MIG is on (R535-era drivers), so the instance is planned after the switch."""
    obs = p.observed
    listed = any(pp.profile_id == profile_id for pp in obs.placements)
    return obs.mig_capable and not obs.mig_mode_current and not listed


def _valid_desired(p: _Plan) -> tuple[dict[Slot, str], dict[Slot, str]]:
    """Desired instances that are placeable, and those to plan after enabling MIG, by slot;
    the rest become :class:`Invalid`."""
    uuid = p.observed.uuid
    allowed = {pp.profile_id: {s for s, _ in pp.placements} for pp in p.observed.placements}
    out: dict[Slot, str] = {}
    later: dict[Slot, str] = {}
    for inst in sorted(p.desired["instances"], key=lambda i: (i["start"], i["profile_id"])):
        slot = (inst["profile_id"], inst["start"])
        if _defer(p, slot[0]):
            later[slot] = inst["key"]
        elif slot[1] not in allowed.get(slot[0], set()):
            p.invalid.append(Invalid(uuid, inst["key"], "placement not allowed by the driver"))
        elif any(_overlaps(slot, other, p.sizes) for other in out):
            p.invalid.append(Invalid(uuid, inst["key"], "overlaps another desired instance"))
        else:
            out[slot] = inst["key"]
    return out, later


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
        key = gi_key(uuid, slot)
        pids = blockers(p.observed, gi_id)
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


def _plan_mode(p: _Plan, want_mig: bool) -> tuple[int, ...]:
    """Plan the MIG mode change; return the PIDs that hold it back (``()`` if none)."""
    obs, uuid = p.observed, p.observed.uuid
    if not obs.mig_capable or bool(obs.mig_mode_current) == want_mig:
        return ()
    blocked_pids = tuple(sorted({pid for b in p.blocked for pid in b.pids}))
    busy = blocked_pids or blockers(obs, WHOLE_GPU)
    if busy:
        p.blocked.append(Blocked(uuid, mode_key(uuid), busy, "GPU is busy"))
    else:
        p.mode.append(SetMigMode(uuid, mode_key(uuid), want_mig))
    return busy


def _plan_mig(p: _Plan) -> None:
    obs, uuid = p.observed, p.observed.uuid
    want_mig = p.desired["mig_enabled"]
    if want_mig and not obs.mig_capable:
        p.invalid.append(Invalid(uuid, mode_key(uuid), "GPU is not MIG capable"))
        return
    wanted, later = _valid_desired(p) if want_mig else ({}, {})
    occupied = _plan_removals(p, wanted)
    blocked_pids = tuple(sorted({pid for b in p.blocked for pid in b.pids}))
    mode_busy = _plan_mode(p, want_mig)
    for slot, key in sorted(later.items(), key=lambda kv: kv[0][1]):
        if mode_busy:
            p.blocked.append(Blocked(uuid, key, mode_busy, "MIG mode cannot change yet"))
        else:
            p.deferred.append(Deferred(uuid, key, *slot))
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


# ------------------------------------------------------------------------------------------------
# MPS
# ------------------------------------------------------------------------------------------------


def limits_of(mps: DesiredMps) -> MpsLimits:
    """The daemon limits a desired MPS setting asks for."""
    return MpsLimits(mps["default_active_thread_percentage"], mps["default_pinned_mem_limit_mib"])


@dataclass(frozen=True)
class _Daemon:
    """One daemon the plan wants: its operator setting and the shares placed on it."""

    setting: MpsLimits
    shares: tuple[MpsLimits, ...]

    def limits(self, running: MpsLimits | None) -> MpsLimits:
        return daemon_limits(self.setting, self.shares, running)

    def note(self, limits: MpsLimits) -> str:
        """Say so when some shares are held to the daemon's larger limits only."""
        loose = [s for s in self.shares if not enforced_by_daemon(limits, s, self.setting)]
        if not loose:
            return ""
        return (
            f"{len(loose)} of {len(self.shares)} MPS share(s) ask less than the daemon's "
            f"{limits.active_thread_percentage} % / {limits.pinned_mem_limit_mib or 'unlimited'} "
            "MiB: one MPS server serves them all, so their own limits are in their environment "
            "only"
        )


def _shares(
    allocations: list[DesiredAllocation], partition_key: str | None
) -> tuple[MpsLimits, ...]:
    """The limits of the shares placed on one partition (``None``: the whole GPU)."""
    return tuple(
        MpsLimits(a["max_compute_percent"], a["memory_mib"])
        for a in allocations
        if a["partition_key"] == partition_key
    )


def _mps_targets(
    p: _Plan,
) -> tuple[dict[str, tuple[Slot | None, _Daemon]], list[tuple[Slot, _Daemon]]]:
    """Daemons wanted on existing targets, and on instances still to be created."""
    obs, uuid, mps = p.observed, p.observed.uuid, p.desired["mps"]
    allocations = p.desired["allocations"]
    uuid_of_slot = {(i.profile_id, i.start): i.uuid for i in obs.instances if i.uuid is not None}
    targets: dict[str, tuple[Slot | None, _Daemon]] = {}
    pending: list[tuple[Slot, _Daemon]] = []
    if p.desired["mig_enabled"]:
        for inst in p.desired["instances"]:
            # An instance's own MPS setting wins; otherwise the GPU's applies to every instance.
            own = inst.get("mps")
            wanted = own if own is not None else mps
            if not wanted["enabled"]:
                continue
            slot = (inst["profile_id"], inst["start"])
            daemon = _Daemon(limits_of(wanted), _shares(allocations, inst["key"]))
            target = uuid_of_slot.get(slot)
            if target is None:
                pending.append((slot, daemon))
            else:
                targets[target] = (slot, daemon)
    elif mps["enabled"]:
        targets[uuid] = (None, _Daemon(limits_of(mps), _shares(allocations, None)))
    return targets, pending


def _plan_mps(p: _Plan) -> None:
    obs, uuid = p.observed, p.observed.uuid
    targets, pending = _mps_targets(p)
    for target in sorted(set(obs.mps) - set(targets)):
        clients = mps_clients(obs, target)
        if clients:  # quit would end the clients' work (review D15)
            p.blocked.append(Blocked(uuid, f"{target}:mps", clients, "MPS clients are connected"))
        else:
            p.stops.append(StopMps(uuid, f"{target}:mps", target))
    for target, (target_slot, daemon) in sorted(targets.items()):
        seen = obs.mps.get(target)
        limits = daemon.limits(seen)
        if seen is None or seen.normalized() != limits.normalized():
            key = f"{target}:mps"
            p.ensure.append(EnsureMps(uuid, key, target_slot, limits, daemon.note(limits)))
    for new_slot, daemon in pending:
        if any(a.profile_id == new_slot[0] and a.start == new_slot[1] for a in p.create_gi):
            limits = daemon.limits(None)
            key = gi_key(uuid, new_slot) + ":mps"
            p.ensure.append(EnsureMps(uuid, key, new_slot, limits, daemon.note(limits)))


def plan(desired: DesiredGpu, observed: ObservedGpu) -> tuple[Action, ...]:
    """Plan the steps that take ``observed`` to ``desired`` on one GPU.

    Returns ``()`` when nothing is to be done, so applying a plan and planning again on the
    new observation yields ``()`` (idempotence), unless an item is blocked or invalid. Steps
    that need the MIG mode change first come after it as :class:`Deferred`.
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
        *p.deferred,
        *p.create_gi,
        *p.create_ci,
        *p.ensure,
    )
