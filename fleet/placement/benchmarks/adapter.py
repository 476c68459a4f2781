"""The trace's cluster as the product sees it: a :class:`FleetSnapshot`, and pods as requests.

Modelling (see ``fleet/placement/README.md``):

* a node is a host with its CPU and memory tracked (``HostState.cpu_free_milli``,
  ``memory_free_mib``, which the product leaves unset); its GPUs have the node's model as
  ``product_key`` and all the same nominal memory, :data:`GPU_MEMORY_MIB` (the trace gives
  shares of a GPU, not MiB);
* a sharing pod (``gpu_milli`` < 1000) is an MPS client reserving memory in proportion to its
  share (:data:`MIB_PER_MILLI` per milli-GPU), with a compute cap of its share in percent
  (a limit, as in ECS, never summed);
* a whole-GPU or multi-GPU pod is a :class:`WholeGpuRequest`; a CPU-only pod takes host CPU and
  memory only (the product has no such request: :func:`fleet.placement.rank_host_only`);
* host CPU and memory and the allowed models (``gpu_spec``) travel as a :class:`Demand`;
* a GPU's mode follows its use: a GPU with MPS clients is in MPS mode, a GPU running a whole-GPU
  pod is dedicated and taken, and an idle GPU is shown in the mode the request needs (the
  operator's mode switch of an idle GPU; FGD's model, where an idle GPU can be shared or taken
  whole). Idle GPUs are the same capacity to the strategy in either mode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from fleet.mps import MpsRequest
from fleet.placement.benchmarks.trace import MILLI, TraceNode, TracePod
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuState,
    HostState,
    PlacementRequest,
    WholeGpuRequest,
)

MIB_PER_MILLI = 16
GPU_MEMORY_MIB = MIB_PER_MILLI * MILLI


def trace_request(pod: TracePod) -> PlacementRequest | None:
    """The product request of a pod; ``None`` for a CPU-only pod."""
    if pod.num_gpu <= 0:
        return None
    if pod.is_sharing:
        return MpsRequest(pod.gpu_milli * MIB_PER_MILLI, max(1, math.ceil(pod.gpu_milli / 10)))
    return WholeGpuRequest(pod.num_gpu)


def trace_demand(pod: TracePod) -> Demand:
    """What a pod needs beside its GPU share: host CPU and memory, and the allowed models."""
    return Demand(pod.cpu_milli, pod.memory_mib, pod.gpu_spec)


class TraceFleet:
    """The nodes as hosts and GPUs, updated one placement at a time.

    Host ``i`` is node ``i``; GPU ids are global, node by node. The snapshot lists hosts (and
    their GPUs) in ``order``, the protocol's per-seed node order, so ``rank``'s snapshot-order
    tie rule is the protocol's tie rule.
    """

    def __init__(self, nodes: Sequence[TraceNode], order: Sequence[int] | None = None) -> None:
        order = list(order) if order is not None else list(range(len(nodes)))
        self.first_gpu: list[int] = []
        total = 0
        for node in nodes:
            self.first_gpu.append(total)
            total += node.gpu_count
        self.hosts = [
            HostState(i, cpu_free_milli=n.cpu_milli, memory_free_mib=n.memory_mib)
            for i, n in enumerate(nodes)
        ]
        self.gpus: list[GpuState] = []
        for i, node in enumerate(nodes):
            for _ in range(node.gpu_count):
                self.gpus.append(GpuState(len(self.gpus), i, node.model, GPU_MEMORY_MIB))
        self._idle_mps = [replace(g, mode="mps") for g in self.gpus]
        hosts = tuple(self.hosts[i] for i in order)
        ordered = [g for i in order for g in self._node_gpus(i)]
        self.dedicated = FleetSnapshot(hosts, tuple(ordered))
        self.mps = FleetSnapshot(hosts, tuple(self._idle_mps[g.id] for g in ordered))

    def _node_gpus(self, node: int) -> list[GpuState]:
        start = self.first_gpu[node]
        end = self.first_gpu[node + 1] if node + 1 < len(self.first_gpu) else len(self.gpus)
        return self.gpus[start:end]

    def snapshot_for(self, request: PlacementRequest | None) -> FleetSnapshot:
        """The fleet with idle GPUs in the mode ``request`` needs."""
        return self.mps if isinstance(request, MpsRequest) else self.dedicated

    def local(self, gpu_id: int) -> tuple[int, int]:
        """The node and the node-local index of a GPU."""
        node = self.gpus[gpu_id].host_id
        return node, gpu_id - self.first_gpu[node]

    def place(
        self, node: int, demand: Demand, request: PlacementRequest | None, gpu_ids: Sequence[int]
    ) -> None:
        """Take ``demand`` from host ``node`` and the request's share of ``gpu_ids``."""
        host = self.hosts[node]
        assert host.cpu_free_milli is not None and host.memory_free_mib is not None
        host = replace(
            host,
            cpu_free_milli=host.cpu_free_milli - demand.cpu_milli,
            memory_free_mib=host.memory_free_mib - demand.host_memory_mib,
        )
        self.hosts[node] = host
        changed: list[GpuState] = []
        for gpu_id in gpu_ids:
            gpu = self.gpus[gpu_id]
            if isinstance(request, MpsRequest):
                gpu = replace(gpu, mode="mps", mps_reservations=(*gpu.mps_reservations, request))
            else:
                gpu = replace(gpu, mode="dedicated", taken=True)
            self.gpus[gpu_id] = gpu
            changed.append(gpu)
        self.dedicated = self.dedicated.with_changes(hosts=(host,), gpus=changed)
        self.mps = self.mps.with_changes(hosts=(host,), gpus=changed)
