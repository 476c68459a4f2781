"""A host with one replica of each kind, and agent ticks for it (shared by the replica metrics
tests)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.inventory.models import Gpu, Host
from fleet.mps import MpsPolicy
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory

GI = 2  # the MIG GPU instance id the agent reports for the 3g.40gb instance


@dataclass
class ReplicaFleet:
    host: Host
    mig_gpu: Gpu
    mps_gpu: Gpu
    whole_gpu: Gpu
    mig: Allocation
    mps_a: Allocation
    mps_b: Allocation
    whole: Allocation


def replica_fleet() -> ReplicaFleet:
    """A MIG replica (3g.40gb at 0, observed as GPU instance :data:`GI`), two MPS replicas on one
    GPU and a whole-GPU replica, all on one host."""
    host = HostFactory()
    mig_gpu, mps_gpu, whole_gpu = (GpuFactory(host=host) for _ in range(3))
    gpu_set_layout(
        gpu_id=mig_gpu.pk,
        spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("3g.40gb", 0),)),
    )
    gpu_set_layout(gpu_id=mps_gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    gpu_set_layout(gpu_id=whole_gpu.pk, spec=LayoutSpec(mode="dedicated"))
    partition = Partition.objects.get(gpu=mig_gpu, kind="mig")
    Gpu.objects.filter(pk=mig_gpu.pk).update(
        observed={
            "mig_instances": [
                {"gpu_instance_id": GI, "profile_id": partition.profile_id, "start": 0}
            ]
        }
    )
    chat = deployment_create(
        name="chat", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )
    deployment_place(deployment_id=chat.pk, partition_id=partition.pk)
    embed = deployment_create(
        name="embed", request=DeploymentRequest(kind="mps", memory_mib=20000), replicas=2
    )
    deployment_place(deployment_id=embed.pk, gpu_id=mps_gpu.pk)
    deployment_place(deployment_id=embed.pk, gpu_id=mps_gpu.pk)
    train = deployment_create(
        name="train", request=DeploymentRequest(kind="gpu", gpu_count=1), replicas=1
    )
    deployment_place(deployment_id=train.pk, gpu_id=whole_gpu.pk)
    mps_a, mps_b = Allocation.objects.filter(deployment=embed).order_by("replica")
    return ReplicaFleet(
        host=Host.objects.get(pk=host.pk),
        mig_gpu=mig_gpu,
        mps_gpu=mps_gpu,
        whole_gpu=whole_gpu,
        mig=Allocation.objects.get(deployment=chat),
        mps_a=mps_a,
        mps_b=mps_b,
        whole=Allocation.objects.get(deployment=train),
    )


def gpu_sample(uuid: str, **values: Any) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "status": "ok",
        "utilization_gpu_percent": None,
        "memory_used_mib": None,
        "memory_total_mib": 81559,
        "temperature_c": 40,
        "power_mw": None,
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "processes": [],
        "mig": [],
        **values,
    }


def process(pid: int, mib: float | None, allocation_id: int | None) -> dict[str, Any]:
    found: dict[str, Any] = {
        "pid": pid,
        "used_memory_mib": mib,
        "gpu_instance_id": None,
        "compute_instance_id": None,
        "kind": "compute",
    }
    if allocation_id is not None:
        found["allocation_id"] = allocation_id
    return found


def busy_tick(f: ReplicaFleet, ts: float | None = None, util: float | None = 37.5) -> Any:
    """A tick with values for every replica: the MIG instance's (GPM), two processes of MPS
    replica a, one of b, one of another host's replica, and the whole GPU's."""
    return {
        "type": "telemetry",
        "ts": time.time() if ts is None else ts,
        "gpus": [
            gpu_sample(
                f.mig_gpu.uuid,
                mig=[
                    {
                        "gpu_instance_id": GI,
                        "compute_instance_id": 0,
                        "uuid": None,
                        "utilization_percent": util,
                        "memory_used_mib": 9000,
                        "memory_total_mib": 40000,
                    }
                ],
            ),
            gpu_sample(
                f.mps_gpu.uuid,
                utilization_gpu_percent=80,
                processes=[
                    process(10, 1000, f.mps_a.pk),
                    process(11, 500, f.mps_a.pk),
                    process(12, 2048, f.mps_b.pk),
                    process(13, 4096, f.whole.pk),  # not on this GPU: ignored
                    process(14, 100, None),
                ],
            ),
            gpu_sample(
                f.whole_gpu.uuid,
                utilization_gpu_percent=64,
                processes=[process(20, 30000, f.whole.pk)],
            ),
        ],
    }
