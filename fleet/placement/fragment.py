"""Fragmentation of a host measured against the fleet's request mix: FGD, generalised.

FGD (Weng et al., ATC'23) counts, for each pod type of a workload, the free GPU that the type
cannot use on a node, weighted by the type's share of the workload. Here the types are the
product's request shapes (:class:`RequestShape`): MPS shares (reserved memory, the client count
and the daemon's policy caps, as in ECS), MIG profiles (the free slices no placement of the
profile covers, as :mod:`fleet.placement.migfit` measures them), whole GPUs (a host with fewer
idle GPUs than a shape asks for strands all its free capacity for that shape), and, where the
caller tracks host CPU and memory, the host's share of those (a shape the host cannot feed finds
none of its GPUs usable; free GPU the host's CPU and memory cannot feed at the mix's average
ratio is stranded).

A GPU is summarised by a hashable signature (:mod:`fleet.placement.signature`), a host by its
CPU and memory left and its GPUs' sorted signatures, so hosts in the same state share one
memoised value. Free
capacity is in milli-GPU: an idle GPU is 1000 whatever its mode (its mode is the operator's to
change, so it is room for any shape its product can serve); an MPS daemon's free memory counts
in proportion to the GPU's memory; a MIG GPU counts the slices outside busy instances.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from fleet.mig import Instance, Product, Profile
from fleet.placement import migfit
from fleet.placement.mix import ANY_PROFILE, NEUTRAL_MIX, RequestMix, RequestShape
from fleet.placement.rules import mps_takes
from fleet.placement.signature import (
    IDLE,
    MAX_MEMO,
    MIG,
    MPS,
    Sig,
    gpu_sig,
    next_id,
    product_for,
)
from fleet.placement.snapshot import HostGroup

MILLI = 1000.0
TEMPERATURE_MILLI = 1000.0
STRAND_WEIGHT = 1.0

HostKey = tuple[int | None, int | None, tuple[Sig, ...]]
"""A host's state: CPU and memory left (``None``: not tracked), its GPUs' sorted signatures."""

_HOST, _MULTI, _ADD = 0, 1, 2


def fgd_score(delta_milli: float, temperature_milli: float = TEMPERATURE_MILLI) -> int:
    """FGD's integer score 0-100 for a fragmentation increase of ``delta_milli``:
    ``int(100 · sigmoid(-ΔF / temperature))``, so placements within a few tens of milli-GPU of
    the best tie (and the snapshot order decides)."""
    x = delta_milli / temperature_milli
    if x > 700:
        return 0
    return int(100.0 / (1.0 + math.exp(x)))


@dataclass(frozen=True, slots=True)
class _Compiled:
    code: int
    weight: float
    shape: RequestShape
    products: frozenset[str]


class Fragmentation:
    """Memoised fragmentation of host states against one mix.

    Args:
        mix: the request mix.
        strand_weight: weight of the stranding term (free GPU the host's CPU and memory cannot
            feed), which applies only where hosts carry CPU and memory.
    """

    def __init__(self, mix: RequestMix, strand_weight: float = STRAND_WEIGHT) -> None:
        self.mix = mix
        self.strand_weight = strand_weight
        self._compiled = tuple(
            _Compiled(_code(shape), weight, shape, frozenset(shape.products))
            for shape, weight in zip(mix.shapes, mix.weights, strict=True)
        )
        self._rows = tuple(
            (
                c.code,
                c.weight,
                c.shape.cpu_milli,
                c.shape.host_memory_mib,
                c.shape.gpu_count,
                c.products,
            )
            for c in self._compiled
        )
        self._free: dict[Sig, float] = {}
        self._terms: dict[Sig, list[float]] = {}
        self._frag: dict[HostKey, float] = {}
        self._ratios: dict[tuple[int, str], tuple[float, float]] = {}
        self.scores: dict[Any, int] = {}
        self.slot = next_id()
        self._slots: dict[Any, int] = {}
        self.templates: dict[Any, Any] = {}

    def remember(self, key: Any, template: Any) -> None:
        """Store a host state's answer to a request (bounded memo)."""
        if len(self.templates) > MAX_MEMO:
            self.templates.clear()
        self.templates[key] = template

    def slot_of(self, key: Any) -> int:
        """A memo slot for ``key`` (a request and its demand), unique across scorers."""
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = next_id()
        return slot

    def host_key(self, group: HostGroup, sigs: list[Sig] | None = None) -> HostKey:
        """The state of a host: CPU and memory left, and its GPUs' sorted signatures."""
        host = group.host
        if sigs is None:
            sigs = [gpu_sig(gpu) for gpu in group.gpus]
        ordered = tuple(sorted(sigs))
        if host is None:
            return (None, None, ordered)
        return (host.cpu_free_milli, host.memory_free_mib, ordered)

    def of(self, key: HostKey) -> float:
        """Fragmentation of a host state, in milli-GPU."""
        value = self._frag.get(key)
        if value is None:
            if len(self._frag) > MAX_MEMO:
                self._frag.clear()
            value = self._frag[key] = self._compute(key)
        return value

    def delta_score(
        self,
        state: tuple[int, HostKey],
        old: tuple[Sig, ...],
        new: tuple[Sig, ...],
        cpu: int,
        memory: int,
    ) -> int:
        """The FGD score of replacing the signatures ``old`` by ``new`` on a host in ``state``
        (its id and key) and taking ``cpu`` and ``memory`` from it."""
        sid, key = state
        memo_key = (sid, old, new, cpu, memory)
        score = self.scores.get(memo_key)
        if score is None:
            host_cpu, host_memory, sigs = key
            rest = list(sigs)
            for sig in old:
                rest.remove(sig)
            rest.extend(new)
            after: HostKey = (
                None if host_cpu is None else host_cpu - cpu,
                None if host_memory is None else host_memory - memory,
                tuple(sorted(rest)),
            )
            score = fgd_score(self.of(after) - self.of(key))
            if len(self.scores) > MAX_MEMO:
                self.scores.clear()
            self.scores[memo_key] = score
        return score

    def free(self, sig: Sig) -> float:
        """Free capacity of a GPU in milli-GPU."""
        value = self._free.get(sig)
        if value is None:
            value = self._free[sig] = self._free_of(sig)
        return value

    def _free_of(self, sig: Sig) -> float:
        kind = sig[0]
        if kind == IDLE:
            return MILLI
        if kind == MPS:
            free: float = MILLI * max(0, sig[3]) / sig[2]
            return free
        if kind != MIG:
            return 0.0
        product = self._product(sig[1])
        if product is None or not product.memory_slice_count:
            return 0.0
        busy = [Instance(e[1], e[0]) for e in sig[3] if e[2]]
        free_slices = product.memory_slice_count - len(migfit.occupied_slices(product, tuple(busy)))
        value = MILLI * free_slices / product.memory_slice_count
        for entry in sig[3]:
            if entry[2] and entry[3]:
                value += MILLI * max(0, entry[3][0]) / sig[2]
        return value

    def _product(self, key: str) -> Product | None:
        return product_for(key)

    def _terms_of(self, sig: Sig) -> list[float]:
        terms = self._terms.get(sig)
        if terms is None:
            free = self.free(sig)
            terms = self._terms[sig] = [
                self._term(sig, free, c) if c.code == _ADD and free else 0.0 for c in self._compiled
            ]
        return terms

    def _term(self, sig: Sig, free: float, c: _Compiled) -> float:
        """Free milli of one GPU that a single-GPU shape cannot use."""
        if c.products and sig[1] not in c.products:
            return free
        kind, shape = sig[0], c.shape
        if shape.kind == "gpu":
            return 0.0 if kind == IDLE else free
        if shape.kind == "mps":
            return self._mps_term(sig, free, shape)
        return self._mig_term(sig, free, shape)

    def _mps_term(self, sig: Sig, free: float, shape: RequestShape) -> float:
        kind = sig[0]
        if kind == IDLE:
            return 0.0 if sig[2] >= shape.memory_mib else free
        if kind == MPS:
            return 0.0 if _takes(sig[3:], shape) else free
        usable = 0.0
        product = self._product(sig[1])
        for start, profile_id, busy, share in sig[3]:
            if not share or not _takes(share, shape):
                continue
            if busy:
                usable += MILLI * share[0] / sig[2]
            elif product is not None and (profile := migfit.find_profile(product, profile_id)):
                usable += MILLI * profile.placement_at(start).size / product.memory_slice_count
        return max(0.0, free - usable)

    def _mig_term(self, sig: Sig, free: float, shape: RequestShape) -> float:
        product = self._product(sig[1])
        if product is None or not product.memory_slice_count:
            return free
        profiles = _profiles(product, shape.profile)
        if not profiles:
            return free
        if sig[0] == IDLE:
            return 0.0
        if sig[0] != MIG:
            return free
        instances = tuple(Instance(e[1], e[0]) for e in sig[3])
        count = product.memory_slice_count
        lost = 0.0
        for profile in profiles:
            reusable = frozenset(
                s
                for start, pid, busy, _ in sig[3]
                if pid == profile.id and not busy
                for s in _slices(profile, start)
            )
            covered = migfit.covered_slices(product, profile, instances, reusable)
            lost += max(0.0, free - MILLI * len(covered) / count)
        return lost / len(profiles)

    def _compute(self, key: HostKey) -> float:
        cpu, memory, sigs = key
        total = 0.0
        for sig in sigs:
            total += self.free(sig)
        if total == 0:
            return 0.0
        terms = [self._terms_of(sig) for sig in sigs]
        columns = [sum(column) for column in zip(*terms, strict=True)]
        idle = sum(1 for s in sigs if s[0] == IDLE)
        no_cpu = cpu is None
        no_memory = memory is None
        frag = 0.0
        for index, (code, weight, shape_cpu, shape_memory, count, products) in enumerate(
            self._rows
        ):
            if (
                code == _HOST
                or (not no_cpu and cpu < shape_cpu)  # type: ignore[operator]
                or (not no_memory and memory < shape_memory)  # type: ignore[operator]
            ):
                frag += weight * total
            elif code == _MULTI:
                usable = idle
                if products:
                    usable = sum(1 for s in sigs if s[0] == IDLE and s[1] in products)
                frag += weight * (total - MILLI * usable if usable >= count else total)
            else:
                frag += weight * columns[index]
        if self.strand_weight and not (no_cpu and no_memory):
            frag += self.strand_weight * self._stranded(total, cpu, memory, sigs)
        return frag

    def _stranded(
        self, total: float, cpu: int | None, memory: int | None, sigs: tuple[Sig, ...]
    ) -> float:
        """Free milli the host's CPU and memory cannot feed at the mix's mean demand per GPU."""
        reference = next((s for s in sigs if s[2]), None)
        if reference is None:
            return 0.0
        cpu_per_milli, memory_per_milli = self._demand_ratios(reference[2], reference[1])
        usable = total
        if cpu is not None and cpu_per_milli > 0:
            usable = min(usable, cpu / cpu_per_milli)
        if memory is not None and memory_per_milli > 0:
            usable = min(usable, memory / memory_per_milli)
        return max(0.0, total - usable)

    def _demand_ratios(self, memory_mib: int, product_key: str) -> tuple[float, float]:
        ratios = self._ratios.get((memory_mib, product_key))
        if ratios is None:
            gpu = cpu = host_memory = 0.0
            for c in self._compiled:
                milli = self._shape_milli(c.shape, memory_mib, product_key)
                if milli:
                    gpu += c.weight * milli
                    cpu += c.weight * c.shape.cpu_milli
                    host_memory += c.weight * c.shape.host_memory_mib
            ratios = (cpu / gpu, host_memory / gpu) if gpu else (0.0, 0.0)
            self._ratios[(memory_mib, product_key)] = ratios
        return ratios

    def _shape_milli(self, shape: RequestShape, memory_mib: int, product_key: str) -> float:
        """The GPU a shape takes on a GPU of this size and product, in milli-GPU."""
        if shape.kind == "gpu":
            return MILLI * shape.gpu_count
        if shape.kind == "mps":
            return min(MILLI, MILLI * shape.memory_mib / memory_mib)
        if shape.kind != "mig":
            return 0.0
        product = self._product(product_key)
        profiles = _profiles(product, shape.profile) if product is not None else ()
        if product is None or not profiles or shape.profile == ANY_PROFILE:
            return 0.0
        return MILLI * profiles[0].memory_slices / product.memory_slice_count


def _code(shape: RequestShape) -> int:
    if shape.kind == "host":
        return _HOST
    if shape.kind == "gpu" and shape.gpu_count > 1:
        return _MULTI
    return _ADD


def _takes(share: tuple[int, ...], shape: RequestShape) -> bool:
    return mps_takes(share, shape.memory_mib, shape.compute_percent or None)


def _profiles(product: Product, ref: str) -> tuple[Profile, ...]:
    if ref == ANY_PROFILE:
        return migfit.size_profiles(product)
    profile = migfit.find_profile(product, ref)
    return () if profile is None else (profile,)


def _slices(profile: Profile, start: int) -> range:
    return profile.placement_at(start).slices


_SCORERS: OrderedDict[RequestMix, Fragmentation] = OrderedDict()
_SCORER_CACHE = 8


def scorer_for(mix: RequestMix | None) -> Fragmentation:
    """The compiled scorer of a mix (an empty or missing mix: :data:`NEUTRAL_MIX`); equal
    mixes share one, so its memo stays warm from one ranking to the next."""
    if mix is None or not mix.shapes:
        mix = NEUTRAL_MIX
    scorer = mix.memo.get("scorer")
    if isinstance(scorer, Fragmentation):
        return scorer
    scorer = _SCORERS.get(mix)
    if scorer is None:
        scorer = Fragmentation(mix)
        _SCORERS[mix] = scorer
        while len(_SCORERS) > _SCORER_CACHE:
            _SCORERS.popitem(last=False)
    mix.memo["scorer"] = scorer
    return scorer
