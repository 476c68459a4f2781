"""Trace-replay placement policies: Random, FirstFit, BestFit and FGD as the ATC'23 paper describes.

Every scored policy follows the published tie rule: nodes are visited in the cluster's fixed
per-seed order and only a strictly better score replaces the incumbent, so among the best-scored
nodes the first in that order wins.
"""

from __future__ import annotations

import random
from typing import Protocol

from fleet.placement.benchmarks.cluster import Cluster, Placement
from fleet.placement.benchmarks.frag import Fragmentation, Mix, fgd_score
from fleet.placement.benchmarks.trace import MILLI, TracePod

MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000


class Policy(Protocol):
    """Chooses where a pod goes; ``None`` only when it fits nowhere."""

    name: str
    uses_trace_mix: bool

    def observe(self, pod: TracePod) -> None:
        """Learn from an arrival before it is placed (most policies ignore it)."""
        ...

    def choose(self, cluster: Cluster, pod: TracePod) -> Placement | None:
        """Pick a placement for ``pod`` on ``cluster`` (not applied)."""
        ...


class _Stateless:
    def observe(self, pod: TracePod) -> None:
        """Nothing to learn."""


def fullest_gpu(gpus: list[int], milli: int) -> int:
    """Index of the GPU with the least free milli that still fits ``milli`` (first on ties)."""
    best, best_left = -1, MILLI + 1
    for g, left in enumerate(gpus):
        if milli <= left < best_left:
            best, best_left = g, left
    return best


def default_gpus(cluster: Cluster, node: int, pod: TracePod) -> tuple[int, ...]:
    """BestFit's GPU choice: the fullest GPU for a sharing pod, else the first free GPUs."""
    if pod.num_gpu == 0:
        return ()
    if pod.is_sharing:
        return (fullest_gpu(cluster.gpus[node], pod.gpu_milli),)
    return cluster.exclusive_gpus(node, pod.num_gpu)


class FirstFit(_Stateless):
    """The first node in the fixed order that fits."""

    name = "firstfit"
    uses_trace_mix = False

    def choose(self, cluster: Cluster, pod: TracePod) -> Placement | None:
        for i in cluster.candidates(pod):
            return Placement(i, default_gpus(cluster, i, pod))
        return None


class RandomFit(_Stateless):
    """A uniformly random feasible node and GPU (seeded)."""

    name = "random"
    uses_trace_mix = False

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def choose(self, cluster: Cluster, pod: TracePod) -> Placement | None:
        nodes = list(cluster.candidates(pod))
        if not nodes:
            return None
        i = self._rng.choice(nodes)
        if pod.is_sharing:
            fitting = [g for g, left in enumerate(cluster.gpus[i]) if left >= pod.gpu_milli]
            return Placement(i, (self._rng.choice(fitting),))
        return Placement(i, default_gpus(cluster, i, pod))


class BestFit(_Stateless):
    """Least CPU and GPU left after placement (weights ½, ½), integer score 0-100."""

    name = "bestfit"
    uses_trace_mix = False

    def choose(self, cluster: Cluster, pod: TracePod) -> Placement | None:
        best, best_score = -1, -(10**9)
        gpus = cluster.gpus
        cpu_left = cluster.cpu_left
        request = pod.gpu_request_milli
        for i in cluster.candidates(pod):
            free = 0.5 * (cpu_left[i] - pod.cpu_milli) / MAX_SPEC_CPU_MILLI
            free += 0.5 * (sum(gpus[i]) - request) / MAX_SPEC_GPU_MILLI
            score = int((1.0 - free) * 100)
            if score > best_score:
                best, best_score = i, score
        if best < 0:
            return None
        return Placement(best, default_gpus(cluster, best, pod))


class Fgd(_Stateless):
    """Fragmentation gradient descent: the placement that least grows the node's fragmentation.

    Args:
        mix: the workload the fragmentation is measured against (FGD: the trace's own mix).
        uses_trace_mix: whether ``mix`` came from the trace itself (knowledge of the future).
    """

    name = "fgd"
    temperature_milli = 1000.0

    def __init__(self, mix: Mix, *, uses_trace_mix: bool = True) -> None:
        self.uses_trace_mix = uses_trace_mix
        self.frag = Fragmentation(mix)
        self._reset()

    def _reset(self) -> None:
        self._state: dict[tuple[str, int, int, tuple[int, ...]], int] = {}
        self._node_state: dict[int, tuple[int, int]] = {}
        self._types: dict[tuple[int, int, int, tuple[str, ...], int], int] = {}
        self._keys: list[tuple[str, int, int, tuple[int, ...]]] = []
        self._memo: dict[int, tuple[int, tuple[int, ...]]] = {}

    def _sid(self, cluster: Cluster, i: int) -> int:
        version = cluster.version[i]
        cached = self._node_state.get(i)
        if cached is not None and cached[0] == version:
            return cached[1]
        mem = cluster.mem_left[i] if self.frag.count_memory else 0
        key = (cluster.model[i], cluster.cpu_left[i], mem, tuple(sorted(cluster.gpus[i])))
        sid = self._state.get(key)
        if sid is None:
            sid = self._state[key] = len(self._keys)
            self._keys.append(key)
        self._node_state[i] = (version, sid)
        return sid

    def node_score(
        self, key: tuple[str, int, int, tuple[int, ...]], pod: TracePod
    ) -> tuple[int, tuple[int, ...]]:
        """Best FGD score of ``pod`` on a node state, and the GPU values that reach it."""
        model, cpu_left, mem_left, gpus = key
        before = self.frag.of(key)
        cpu_after = cpu_left - pod.cpu_milli
        if self.frag.count_memory:
            mem_left -= pod.memory_mib
        if not pod.is_sharing:
            # Sorted ascending, so the last ``num_gpu`` entries are the fully free GPUs it takes.
            after = list(gpus)
            for g in range(len(after) - pod.num_gpu, len(after)):
                after[g] = 0
            new = (model, cpu_after, mem_left, tuple(sorted(after)))
            return fgd_score(self.frag.of(new) - before, self.temperature_milli), ()
        best = -1
        values: tuple[int, ...] = ()
        for v in sorted(set(gpus)):
            if v < pod.gpu_milli:
                continue
            after = list(gpus)
            after[after.index(v)] = v - pod.gpu_milli
            new = (model, cpu_after, mem_left, tuple(sorted(after)))
            score = fgd_score(self.frag.of(new) - before, self.temperature_milli)
            if score > best:
                best, values = score, (v,)
            elif score == best:
                values = (*values, v)
        return best, values

    def choose(self, cluster: Cluster, pod: TracePod) -> Placement | None:
        key_t = (pod.cpu_milli, pod.num_gpu, pod.gpu_milli, pod.gpu_spec, pod.memory_mib)
        tid = self._types.setdefault(key_t, len(self._types))
        best, best_score = -1, -1
        best_values: tuple[int, ...] = ()
        keys = self._keys
        for i in cluster.candidates(pod):
            sid = self._sid(cluster, i)
            memo_key = (sid << 20) | tid
            hit = self._memo.get(memo_key)
            if hit is None:
                if len(keys) <= sid:
                    keys = self._keys
                hit = self.node_score(keys[sid], pod)
                self._memo[memo_key] = hit
            if hit[0] > best_score:
                best, best_score, best_values = i, hit[0], hit[1]
        if best < 0:
            return None
        if pod.is_sharing:
            gpus = cluster.gpus[best]
            return Placement(best, (next(g for g, v in enumerate(gpus) if v in best_values),))
        return Placement(best, default_gpus(cluster, best, pod))
