"""Alibaba GPU-sharing traces (ATC'23 "Beware of Fragmentation"): loading and arrival order.

The replay protocol is the one in ``../shared/data/README.md``: a seeded shuffle of the pod list,
then inflation to 130 % of the cluster's GPU capacity by sampling the original list with
replacement (or dropping random pods where the trace already asks for more).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MILLI = 1000


@dataclass(frozen=True, slots=True)
class TraceNode:
    """A machine: CPU in milli-cores, memory in MiB, ``gpu_count`` GPUs of ``model``."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    """One pod: ``gpu_milli`` is per GPU; ``gpu_spec`` lists the allowed models (empty: any)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    creation_time: int | None = None
    deletion_time: int | None = None

    @property
    def gpu_request_milli(self) -> int:
        """Total GPU asked for, in milli-GPU."""
        return self.num_gpu * self.gpu_milli

    @property
    def is_sharing(self) -> bool:
        """True for a pod that takes a share of one GPU (the only kind that shares)."""
        return self.num_gpu == 1 and self.gpu_milli < MILLI


def _int_or_none(value: str | None) -> int | None:
    if value is None or value.strip() == "":
        return None
    return int(float(value))


def parse_nodes(rows: Iterable[dict[str, str]]) -> tuple[TraceNode, ...]:
    """Turn ``openb_node_list_*.csv`` rows into nodes."""
    return tuple(
        TraceNode(
            name=row["sn"],
            cpu_milli=int(row["cpu_milli"]),
            memory_mib=int(row["memory_mib"]),
            gpu_count=int(row["gpu"]),
            model=row.get("model") or "",
        )
        for row in rows
    )


def parse_pods(rows: Iterable[dict[str, str]]) -> tuple[TracePod, ...]:
    """Turn ``openb_pod_list_*.csv`` rows into pods; the time columns are optional."""
    pods = []
    for row in rows:
        spec = row.get("gpu_spec") or ""
        num_gpu = int(row["num_gpu"])
        pods.append(
            TracePod(
                name=row["name"],
                cpu_milli=int(row["cpu_milli"]),
                memory_mib=int(row["memory_mib"]),
                num_gpu=num_gpu,
                gpu_milli=int(row["gpu_milli"]) if num_gpu else 0,
                gpu_spec=tuple(sorted(s for s in spec.split("|") if s)),
                creation_time=_int_or_none(row.get("creation_time")),
                deletion_time=_int_or_none(row.get("deletion_time")),
            )
        )
    return tuple(pods)


def arrival_order(
    pods: Sequence[TracePod], capacity_milli: int, *, seed: int, inflation: float = 1.3
) -> tuple[TracePod, ...]:
    """The protocol's arrival sequence: seeded shuffle, then inflation (or deflation) to target.

    Sampling appends pods drawn uniformly with replacement from the original list and stops at the
    first draw that would take the total GPU request past ``inflation x capacity``.
    """
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    target = inflation * capacity_milli
    total = sum(p.gpu_request_milli for p in order)
    if total > target:
        while total > target and order:
            total -= order.pop(rng.randrange(len(order))).gpu_request_milli
        return tuple(order)
    if not any(p.gpu_request_milli for p in pods):
        return tuple(order)
    while True:
        pod = pods[rng.randrange(len(pods))]
        if total + pod.gpu_request_milli > target:
            return tuple(order)
        order.append(pod)
        total += pod.gpu_request_milli
