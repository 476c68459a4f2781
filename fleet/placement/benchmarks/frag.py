"""Fragmentation of a node measured against a workload mix (FGD, Weng et al., ATC'23).

A node's fragmentation for one pod type is the free GPU milli that type cannot use: all of it when
the type needs no GPU, or the node lacks the CPU (or memory, when counted) or the GPU model, or
cannot supply the type's GPUs; otherwise the free milli of each GPU too small for the type. The
node's fragmentation is the mix-weighted sum over types.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from fleet.placement.benchmarks.trace import TracePod


@dataclass(frozen=True, slots=True, order=True)
class PodType:
    """What fragmentation looks at in a pod (memory only where the mix counts it)."""

    cpu_milli: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class Mix:
    """Pod types and their weights (summing to 1)."""

    types: tuple[PodType, ...]
    weights: tuple[float, ...]


def pod_type(pod: TracePod, *, with_memory: bool = False) -> PodType:
    """The type of ``pod``; memory is part of it only when ``with_memory``."""
    return PodType(
        cpu_milli=pod.cpu_milli,
        num_gpu=pod.num_gpu,
        gpu_milli=pod.gpu_milli,
        gpu_spec=pod.gpu_spec,
        memory_mib=pod.memory_mib if with_memory else 0,
    )


def mix_from_counts(counts: Counter[PodType], coverage: float = 0.95) -> Mix:
    """Keep the most popular types until they cover ``coverage`` of pods, then renormalise."""
    total = sum(counts.values())
    if total == 0:
        return Mix((), ())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    kept: list[tuple[PodType, int]] = []
    covered = 0
    for kind, count in ranked:
        kept.append((kind, count))
        covered += count
        if covered >= coverage * total:
            break
    return Mix(tuple(k for k, _ in kept), tuple(c / covered for _, c in kept))


def typical_mix(
    pods: Iterable[TracePod], *, coverage: float = 0.95, with_memory: bool = False
) -> Mix:
    """FGD's target workload: the popular pod types of ``pods`` (CPU-only pods included)."""
    counts = Counter(pod_type(p, with_memory=with_memory) for p in pods)
    return mix_from_counts(counts, coverage)


NodeKey = tuple[str, int, int, tuple[int, ...]]


class Fragmentation:
    """Memoised fragmentation of node states ``(model, cpu_left, mem_left, sorted gpu lefts)``."""

    def __init__(self, mix: Mix, *, count_memory: bool = False, strand_weight: float = 0.0) -> None:
        self.mix = mix
        self.count_memory = count_memory
        self.strand_weight = strand_weight
        self.cpu_per_milli, self.mem_per_milli = _demand_ratios(mix)
        self._per_model: dict[str, list[tuple[int, int, int, int, bool, float]]] = {}
        self._memo: dict[NodeKey, float] = {}

    def _compiled(self, model: str) -> list[tuple[int, int, int, int, bool, float]]:
        rows = self._per_model.get(model)
        if rows is None:
            rows = [
                (
                    t.cpu_milli,
                    t.memory_mib if self.count_memory else 0,
                    t.num_gpu,
                    t.gpu_milli,
                    bool(t.gpu_spec) and model not in t.gpu_spec,
                    w,
                )
                for t, w in zip(self.mix.types, self.mix.weights, strict=True)
            ]
            self._per_model[model] = rows
        return rows

    def of(self, key: NodeKey) -> float:
        """Fragmentation in milli-GPU of the node state ``key``."""
        value = self._memo.get(key)
        if value is None:
            value = self._compute(key)
            self._memo[key] = value
        return value

    def _compute(self, key: NodeKey) -> float:
        model, cpu_left, mem_left, gpus = key
        total = sum(gpus)
        if total == 0:
            return 0.0
        frag = 0.0
        for cpu, mem, n, milli, wrong_model, weight in self._compiled(model):
            if n == 0 or wrong_model or cpu_left < cpu or mem_left < mem:
                frag += weight * total
                continue
            usable = sum(1 for g in gpus if g >= milli)
            if usable >= n:
                frag += weight * sum(g for g in gpus if g < milli)
            else:
                frag += weight * total
        if self.strand_weight:
            frag += self.strand_weight * self._stranded(total, cpu_left, mem_left)
        return frag

    def _stranded(self, total: int, cpu_left: int, mem_left: int) -> float:
        """Free GPU milli the node's CPU (and memory) cannot feed at the mix's average ratio."""
        usable: float = total
        if self.cpu_per_milli > 0:
            usable = min(usable, cpu_left / self.cpu_per_milli)
        if self.count_memory and self.mem_per_milli > 0:
            usable = min(usable, mem_left / self.mem_per_milli)
        return max(0.0, total - usable)


def _demand_ratios(mix: Mix) -> tuple[float, float]:
    """Mean CPU milli and memory MiB that GPU-requesting pods of ``mix`` ask per milli-GPU."""
    gpu = cpu = mem = 0.0
    for t, w in zip(mix.types, mix.weights, strict=True):
        if t.num_gpu:
            gpu += w * t.num_gpu * t.gpu_milli
            cpu += w * t.cpu_milli
            mem += w * t.memory_mib
    if gpu == 0:
        return 0.0, 0.0
    return cpu / gpu, mem / gpu


def fgd_score(delta_milli: float, temperature_milli: float = 1000.0) -> int:
    """FGD's integer score 0-100 for a fragmentation increase of ``delta_milli``.

    ``int(100 · sigmoid(-ΔF / temperature))``: nodes within a few tens of milli-GPU tie.
    """
    x = delta_milli / temperature_milli
    if x > 700:
        return 0
    return int(100.0 / (1.0 + math.exp(x)))
