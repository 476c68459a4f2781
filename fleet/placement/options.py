"""What one GPU offers a MIG or MPS request, by the shared rules, and what a host could offer.

Both are memoised on the frozen states they are computed from (a GPU's options per request, a
host group's room per request kind), so the product strategy asks the rules once per state.
"""

from __future__ import annotations

from typing import Any

from fleet.mig import Instance
from fleet.mps import MpsRequest
from fleet.placement import migfit, rules
from fleet.placement.signature import (
    MPS,
    Sig,
    layout_entries,
    mig_sig,
    mps_states,
    sig_share,
)
from fleet.placement.snapshot import GpuState, HostGroup, MigRequest, PlacementRequest

Option = tuple[int | None, Instance | None, Sig, int | None]
"""A target on one GPU: its partition, the instance it creates, the GPU's signature after it, and
where it is on any GPU with the same fit key (the partition's start; ``None``: the whole GPU's
daemon, or a new instance). A GPU's options come in an order its fit key fixes."""
_ROOM = "options.room"


def request_key(request: PlacementRequest) -> tuple[Any, ...]:
    if isinstance(request, MpsRequest):
        return ("mps", request.memory_mib, request.max_compute_percent)
    if isinstance(request, MigRequest):
        return ("mig", request.profile)
    return ("gpu", request.count)


def room(group: HostGroup, kind: str) -> int:
    """What the group could offer a request of ``kind`` at most (memoised): for ``mps`` the
    most free MiB of a daemon with a client slot left, for ``mig`` whether a GPU is in MIG mode,
    for ``gpu`` the free dedicated GPUs. Each is a condition the rules need, so a group without
    room is skipped without asking them."""
    memo_key = (_ROOM, kind)
    room: int | None = group.memo.get(memo_key)
    if room is None:
        usable = [gpu for gpu in group.gpus if gpu.healthy and not gpu.cordoned]
        if kind == "mps":
            room = max(
                (
                    s[0]
                    for gpu in usable
                    if gpu.mode != "dedicated"
                    for _, s in mps_states(gpu)
                    if s[1] > 0
                ),
                default=-1,
            )
        elif kind == "mig":
            room = int(any(gpu.mode == "mig" for gpu in usable))
        else:
            room = sum(1 for gpu in usable if gpu.mode == "dedicated" and not gpu.taken)
        group.memo[memo_key] = room
    return room


def options(gpu: GpuState, request: MigRequest | MpsRequest) -> tuple[Option, ...]:
    """Every target of a MIG or MPS request on ``gpu`` that the rules allow, with the GPU's
    signature after it (memoised on the GPU's state). Eligibility is the caller's, and so is the
    validity of an MPS request (:func:`fleet.placement.rules.request_valid`)."""
    memo_key = request_key(request)
    found = gpu.memo.get(memo_key)
    if found is None:
        if isinstance(request, MigRequest):
            found = _mig_options(gpu, request)
        else:
            found = _mps_options(gpu, request)
        gpu.memo[memo_key] = found
    return found


def _mps_options(gpu: GpuState, request: MpsRequest) -> tuple[Option, ...]:
    memory, compute = request.memory_mib, request.max_compute_percent
    found: list[Option] = []
    for partition_id, state in mps_states(gpu):
        if not rules.mps_takes(state, memory, compute):
            continue
        after_share = rules.with_client(state, memory)
        if gpu.mode == "mps":
            after: Sig = (MPS, gpu.product_key or "", gpu.memory_mib, *sig_share(after_share))
            found.append((partition_id, None, after, None))
            continue
        entries = []
        locator = None
        for p, entry in zip(gpu.partitions, layout_entries(gpu), strict=True):
            if p.id == partition_id:
                entry, locator = (p.start, p.profile_id, 1, after_share), p.start
            entries.append(entry)
        found.append((partition_id, None, mig_sig(gpu, entries), locator))
    return tuple(found)


def _mig_options(gpu: GpuState, request: MigRequest) -> tuple[Option, ...]:
    if gpu.mode != "mig":
        return ()
    resolved = migfit.profile_on(gpu, request.profile)
    if not isinstance(resolved, tuple):
        return ()
    product, profile = resolved
    entries = layout_entries(gpu)
    found: list[Option] = []
    by_start = sorted(range(len(gpu.partitions)), key=lambda k: gpu.partitions[k].start)
    for k in by_start:
        partition = gpu.partitions[k]
        if partition.profile_id == profile.id and not partition.occupied:
            taken = list(entries)
            taken[k] = (partition.start, partition.profile_id, 1, entries[k][3])
            found.append((partition.id, None, mig_sig(gpu, taken), partition.start))
    instances = tuple(Instance(p.profile_id, p.start) for p in gpu.partitions)
    for where in migfit.free_placements(product, profile.id, instances):
        created = (where.start, profile.id, 1, ())
        instance = Instance(profile.id, where.start)
        found.append((None, instance, mig_sig(gpu, [*entries, created]), None))
    return tuple(found)
