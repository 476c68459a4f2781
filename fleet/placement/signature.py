"""Hashable summaries of GPUs, for memoising the product strategy on frozen states.

A GPU's *signature* (:func:`gpu_sig`) is what fragmentation looks at: its kind (idle, full, MPS,
MIG), product and memory, and its free capacity (an MPS daemon's free memory, slot and caps; a
MIG layout with busy and idle instances). Its *fit key* (:func:`fit_key`) is everything the rules
and the score depend on but its ids, so GPUs with equal keys on hosts in equal states get equal
answers. Both are memoised on the GPU's frozen state and die with it.
"""

from __future__ import annotations

import itertools
from typing import Any

from fleet.mig import Product, product_by_key
from fleet.placement import migfit
from fleet.placement.rules import ShareState, daemon_state, mps_shares, share_state
from fleet.placement.snapshot import GpuState, MigPartition

IDLE, FULL, MPS, MIG = 0, 1, 2, 3
MAX_MEMO = 500_000

Sig = tuple[Any, ...]
"""``(IDLE, product, memory)``, ``(FULL, "", 0)``, ``(MPS, product, memory, *share state)`` or
``(MIG, product, memory, layout)``; a layout entry is ``(start, profile id, busy, share state)``."""
FULL_SIG: Sig = (FULL, "", 0)
_NO_SHARE: tuple[()] = ()
_SIG = "signature.sig"
_ENTRIES = "signature.entries"
_STATES = "signature.states"
_FIT = "signature.fit"

_IDS = itertools.count()
_INTERNED: dict[Any, int] = {}
_PRODUCTS: dict[str, Product | None] = {}


def next_id() -> int:
    """A fresh int, never reused (memo slots and state ids: cheap to hash)."""
    return next(_IDS)


def intern(key: Any) -> int:
    """A small id for a hashable state (equal states, equal ids), shared by every scorer."""
    found = _INTERNED.get(key)
    if found is None:
        if len(_INTERNED) > MAX_MEMO:
            _INTERNED.clear()
        found = _INTERNED[key] = next_id()
    return found


def register(gpu: GpuState) -> None:
    """Remember the product a GPU reports (its MIG geometry), the first one per key."""
    key = gpu.product_key or ""
    if key not in _PRODUCTS:
        _PRODUCTS[key] = migfit.product_of(gpu)


def product_for(key: str) -> Product | None:
    """The product registered for ``key``, else the catalog's."""
    if key not in _PRODUCTS:
        _PRODUCTS[key] = product_by_key(key) if key else None
    return _PRODUCTS[key]


def sig_share(state: ShareState) -> ShareState:
    """A daemon's state as fragmentation sees it: whether a client slot is left, not how many
    (so hosts that differ only in client counts share one memoised value)."""
    free, slots, cap, thread, device = state
    return (free, 1 if slots > 0 else 0, cap, thread, device)


def layout_entry(partition: MigPartition) -> tuple[Any, ...]:
    """A MIG instance: start, profile id, busy, and its daemon's exact state (if it runs one)."""
    share = share_state(partition.mps) if partition.mps is not None else _NO_SHARE
    return (partition.start, partition.profile_id, int(partition.occupied), share)


def _sig_entry(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    start, profile_id, busy, share = entry
    return (start, profile_id, busy, sig_share(share) if share else share)


def layout_entries(gpu: GpuState) -> list[tuple[Any, ...]]:
    """The layout entries of a MIG GPU's partitions, in their order (memoised)."""
    memo = gpu.memo
    entries: list[tuple[Any, ...]] | None = memo.get(_ENTRIES)
    if entries is None:
        entries = memo[_ENTRIES] = [layout_entry(p) for p in gpu.partitions]
    return entries


def mps_states(gpu: GpuState) -> list[tuple[int | None, ShareState]]:
    """Each MPS daemon of the GPU (see :func:`fleet.placement.rules.mps_shares`), by start
    slice, with what it offers one more client (memoised)."""
    memo = gpu.memo
    states: list[tuple[int | None, ShareState]] | None = memo.get(_STATES)
    if states is None:
        if gpu.mode == "mps":
            whole = daemon_state(gpu.whole_mps_device(), gpu.mps_policy, gpu.mps_reservations)
            states = [(gpu.whole_partition_id, whole)]
        else:
            starts = {p.id: p.start for p in gpu.partitions}
            shares = sorted(mps_shares(gpu), key=lambda pair: starts.get(pair[0] or -1, -1))
            states = [(pid, share_state(share)) for pid, share in shares]
        memo[_STATES] = states
    return states


def gpu_sig(gpu: GpuState) -> Sig:
    """The GPU's capacity signature (memoised on the frozen state)."""
    memo = gpu.memo
    sig = memo.get(_SIG)
    if sig is None:
        sig = memo[_SIG] = _sig_of(gpu)
    return sig


def _sig_of(gpu: GpuState) -> Sig:
    if not gpu.healthy or gpu.cordoned:
        return FULL_SIG
    key = gpu.product_key or ""
    if gpu.mode == "dedicated":
        return FULL_SIG if gpu.taken else (IDLE, key, gpu.memory_mib)
    if gpu.mode == "mps":
        if not gpu.mps_reservations:
            return (IDLE, key, gpu.memory_mib)
        return (MPS, key, gpu.memory_mib, *sig_share(mps_states(gpu)[0][1]))
    entries = layout_entries(gpu)
    if not any(entry[2] for entry in entries):
        return (IDLE, key, gpu.memory_mib)
    return mig_sig(gpu, entries)


def mig_sig(gpu: GpuState, entries: list[tuple[Any, ...]]) -> Sig:
    """A MIG GPU's signature with these (exact) layout entries."""
    layout = tuple(sorted(_sig_entry(e) for e in entries))
    return (MIG, gpu.product_key or "", gpu.memory_mib, layout)


def fit_key(gpu: GpuState) -> tuple[Any, ...] | None:
    """Everything the rules and the score of a GPU depend on but its ids (memoised): GPUs with
    equal keys on hosts in equal states get equal answers. ``None`` for a MIG GPU with a product
    of its own (agent-read placements), whose answers are not shared."""
    memo = gpu.memo
    if _FIT in memo:
        found: tuple[Any, ...] | None = memo[_FIT]
        return found
    if not gpu.healthy or gpu.cordoned:
        found = ("out", gpu.product_key or "")
    elif gpu.mode == "mig":
        own = gpu.product is not None and gpu.product is not product_by_key(gpu.product_key or "")
        layout = tuple(sorted(layout_entries(gpu)))
        found = None if own else ("mig", gpu.product_key or "", gpu.memory_mib, layout)
    elif gpu.mode == "mps":
        found = ("mps", gpu.product_key or "", gpu.memory_mib, mps_states(gpu)[0][1])
    else:
        found = ("dedicated", gpu.product_key or "", gpu.memory_mib, gpu.taken)
    memo[_FIT] = found
    return found
