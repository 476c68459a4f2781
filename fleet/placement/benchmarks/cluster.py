"""Mutable cluster state for trace replay: free CPU, memory and per-GPU milli on every node.

Kept apart from the public snapshot types on purpose: replay makes ~10^7 feasibility checks, so
this module trades immutability for flat lists. It never lets a placement exceed capacity:
:meth:`Cluster.place` checks every resource and raises on a violation.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from fleet.placement.benchmarks.trace import MILLI, TraceNode, TracePod


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod went: a node index and the GPU indices it uses (empty for CPU-only pods)."""

    node: int
    gpus: tuple[int, ...]


class CapacityError(ValueError):
    """A placement that does not fit; replay treats it as a bug in the policy."""


class Cluster:
    """Free resources per node, visited in a fixed order (the protocol's per-seed tie order)."""

    def __init__(self, nodes: Sequence[TraceNode], order: Sequence[int] | None = None) -> None:
        self.nodes = tuple(nodes)
        self.order = tuple(order) if order is not None else tuple(range(len(nodes)))
        if sorted(self.order) != list(range(len(nodes))):
            raise ValueError("order must be a permutation of the node indices")
        self.rank = [0] * len(nodes)
        for position, index in enumerate(self.order):
            self.rank[index] = position
        self.model = [n.model for n in nodes]
        self.cpu_left = [n.cpu_milli for n in nodes]
        self.mem_left = [n.memory_mib for n in nodes]
        self.gpus = [[MILLI] * n.gpu_count for n in nodes]
        self.max_left = [MILLI if n.gpu_count else 0 for n in nodes]
        self.full_free = [n.gpu_count for n in nodes]
        self.version = [0] * len(nodes)
        self.capacity_milli = MILLI * sum(n.gpu_count for n in nodes)
        self.allocated_milli = 0
        self._spec_ok: dict[tuple[str, ...], list[bool]] = {}

    def model_ok(self, spec: tuple[str, ...]) -> list[bool]:
        """Per node: whether its GPU model is allowed by ``spec`` (empty: any model)."""
        ok = self._spec_ok.get(spec)
        if ok is None:
            ok = [not spec or m in spec for m in self.model]
            self._spec_ok[spec] = ok
        return ok

    def candidates(self, pod: TracePod) -> Iterator[int]:
        """Indices of the nodes where ``pod`` fits, in the fixed tie order."""
        cpu, mem, n, milli = pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli
        ok = self.model_ok(pod.gpu_spec) if n else None
        cpu_left, mem_left = self.cpu_left, self.mem_left
        if n == 0:
            for i in self.order:
                if cpu_left[i] >= cpu and mem_left[i] >= mem:
                    yield i
            return
        assert ok is not None
        sharing = n == 1 and milli < MILLI
        gpu_room = self.max_left if sharing else self.full_free
        need = milli if sharing else n
        for i in self.order:
            if gpu_room[i] >= need and cpu_left[i] >= cpu and mem_left[i] >= mem and ok[i]:
                yield i

    def fits(self, i: int, pod: TracePod) -> bool:
        """Whether ``pod`` fits on node ``i`` at all."""
        if self.cpu_left[i] < pod.cpu_milli or self.mem_left[i] < pod.memory_mib:
            return False
        if pod.num_gpu == 0:
            return True
        if not self.model_ok(pod.gpu_spec)[i]:
            return False
        if pod.is_sharing:
            return self.max_left[i] >= pod.gpu_milli
        return self.full_free[i] >= pod.num_gpu

    def exclusive_gpus(self, i: int, count: int) -> tuple[int, ...]:
        """The first ``count`` fully free GPUs of node ``i``."""
        return tuple(g for g, left in enumerate(self.gpus[i]) if left == MILLI)[:count]

    def place(self, pod: TracePod, placement: Placement) -> None:
        """Take the pod's resources; raise :class:`CapacityError` if anything would go negative."""
        i = placement.node
        self._check(pod, placement)
        self.cpu_left[i] -= pod.cpu_milli
        self.mem_left[i] -= pod.memory_mib
        gpus = self.gpus[i]
        for g in placement.gpus:
            gpus[g] -= pod.gpu_milli
        self._refresh(i)
        self.allocated_milli += pod.gpu_request_milli

    def remove(self, pod: TracePod, placement: Placement) -> None:
        """Give back a placed pod's resources (departures)."""
        i = placement.node
        self.cpu_left[i] += pod.cpu_milli
        self.mem_left[i] += pod.memory_mib
        for g in placement.gpus:
            self.gpus[i][g] += pod.gpu_milli
        self._refresh(i)
        self.allocated_milli -= pod.gpu_request_milli

    def _check(self, pod: TracePod, placement: Placement) -> None:
        i = placement.node
        if not self.fits(i, pod):
            raise CapacityError(f"{pod.name} does not fit on {self.nodes[i].name}")
        if len(placement.gpus) != pod.num_gpu or len(set(placement.gpus)) != pod.num_gpu:
            raise CapacityError(f"{pod.name} needs {pod.num_gpu} distinct GPUs")
        for g in placement.gpus:
            if self.gpus[i][g] < pod.gpu_milli:
                raise CapacityError(f"GPU {g} of {self.nodes[i].name} lacks {pod.gpu_milli}m")

    def _refresh(self, i: int) -> None:
        gpus = self.gpus[i]
        self.max_left[i] = max(gpus, default=0)
        self.full_free[i] = sum(1 for g in gpus if g == MILLI)
        self.version[i] += 1
