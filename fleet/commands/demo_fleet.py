"""The demo fleet: a dozen hosts mixing H100, A100, H200 and A30 GPUs in MIG, MPS and dedicated
mode, with a few deployments, built through the same services the API uses."""

from __future__ import annotations

import logging
import os
import uuid as uuidlib
from dataclasses import dataclass

from django.db import transaction

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.services import DeploymentRequest, deployment_create
from fleet.core.models import default_team_id
from fleet.core.policy import team_policy_set
from fleet.inventory.models import AgentRuntime, Host, HostStatus
from fleet.inventory.services import gpu_upsert, host_create
from fleet.mig import Product, product_by_key
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoHost:
    name: str
    product_key: str
    gpus: int
    mode: str  # "mig-balanced", "mig-small", "mps", "dedicated", "mixed"


DEMO_HOSTS = (
    DemoHost("h100-a01", "h100-sxm5-80gb", 8, "mig-balanced"),
    DemoHost("h100-a02", "h100-sxm5-80gb", 8, "mixed"),
    DemoHost("h100-a03", "h100-sxm5-80gb", 8, "mps"),
    DemoHost("h100-a04", "h100-sxm5-80gb", 8, "dedicated"),
    DemoHost("a100-b01", "a100-sxm4-80gb", 8, "mig-small"),
    DemoHost("a100-b02", "a100-sxm4-80gb", 8, "mixed"),
    DemoHost("a100-b03", "a100-sxm4-40gb", 8, "mps"),
    DemoHost("h200-c01", "h200-sxm-141gb", 8, "mig-balanced"),
    DemoHost("h200-c02", "h200-sxm-141gb", 8, "mixed"),
    DemoHost("h200-c03", "h200-nvl-141gb", 4, "dedicated"),
    DemoHost("a30-d01", "a30-24gb", 4, "mig-small"),
    DemoHost("a30-d02", "a30-24gb", 4, "mps"),
)


def _balanced(product: Product) -> list[MigInstanceSpec]:
    """mig-parted's ``all-balanced``: 1g x2 + 2g + 3g (A30: 1g x2 + 2g)."""
    one, two = product.profile(19) or product.profile(14), product.profile(14) or product.profile(5)
    if product.memory_slice_count == 4:
        small = product.profile(14)
        double = product.profile(5)
        assert small and double
        return [
            MigInstanceSpec(double.id, 0),
            MigInstanceSpec(small.id, 2),
            MigInstanceSpec(small.id, 3),
        ]
    three = product.profile(9)
    assert one and two and three
    return [
        MigInstanceSpec(three.id, 4),
        MigInstanceSpec(two.id, 2),
        MigInstanceSpec(one.id, 0),
        MigInstanceSpec(one.id, 1),
    ]


def _small(product: Product) -> list[MigInstanceSpec]:
    ref = 19 if product.memory_slice_count == 8 else 14
    profile = product.profile(ref)
    assert profile is not None
    return [MigInstanceSpec(profile.id, p.start) for p in profile.placements]


def _layout(product: Product, mode: str, index: int) -> LayoutSpec:
    if mode == "mixed":
        mode = ("mig-balanced", "mps", "dedicated", "mig-small")[index % 4]
    if mode == "mig-balanced":
        return LayoutSpec(mode="mig", instances=tuple(_balanced(product)))
    if mode == "mig-small":
        return LayoutSpec(mode="mig", instances=tuple(_small(product)))
    if mode == "mps":
        return LayoutSpec(mode="mps", mps=MpsPolicy(max_clients=16))
    return LayoutSpec(mode="dedicated")


def demo_gpu_uuid(host_name: str, index: int) -> str:
    return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{host_name}.fleet.demo/{index}')}"


@transaction.atomic
def seed_demo_fleet(*, with_agents: bool = False) -> dict[str, int]:
    """Create the demo fleet once; a second call changes nothing. Returns what exists."""
    if Host.objects.filter(name=DEMO_HOSTS[0].name).exists():
        return {"hosts": Host.objects.count(), "created": 0}
    for demo in DEMO_HOSTS:
        product = product_by_key(demo.product_key)
        assert product is not None, demo.product_key
        host, _ = host_create(name=demo.name, labels={"demo": "true", "product": product.name})
        host.status = HostStatus.READY
        # What the demo's agents report in their hello: they run process workloads (they are
        # started allowing them), so feature-worker's replicas can be placed before the agents
        # first connect.
        host.runtime = AgentRuntime.PROCESS
        host.process_runtime = True
        host.save(update_fields=["status", "runtime", "process_runtime"])
        for index in range(demo.gpus):
            gpu = gpu_upsert(
                host=host,
                index=index,
                uuid=demo_gpu_uuid(demo.name, index),
                product_name=product.name,
                product_key=product.key,
                memory_mib=product.memory_mib,
                pci_device_id=(product.pci_device_ids[0] << 16) | 0x10DE,
                mig_capable=product.mig_capable,
            )
            gpu.health = "healthy"
            gpu.save(update_fields=["health"])
            gpu_set_layout(gpu_id=gpu.pk, spec=_layout(product, demo.mode, index))
    _allow_demo_processes()
    _seed_deployments()
    return {"hosts": Host.objects.count(), "created": len(DEMO_HOSTS)}


def demo_process_user() -> str:
    """The ``uid:gid`` the demo's process workloads run as: the demo's own user (its agents run
    on this machine as that user), or ``nobody`` when the demo runs as root."""
    uid, gid = os.getuid(), os.getgid()
    return f"{uid}:{gid}" if uid != 0 else "65534:65534"


def _allow_demo_processes() -> None:
    """The ``default`` team, which owns the demo's deployments, may run process workloads (the
    restricted default policy refuses them), as a non-root user; any non-root uid, since a
    developer's own uid may be below 1000 (macOS: 501)."""
    team_policy_set(
        team_id=default_team_id(),
        policy={
            "runtimes": ["container", "process"],
            "process_user": demo_process_user(),
            "uids": [[1, 2_147_483_647]],
        },
    )


DEMO_DEPLOYMENTS = (
    ("llama-3-8b-chat", DeploymentRequest(kind="mig", profile="1g.10gb"), 6, 3),
    ("mistral-7b-rag", DeploymentRequest(kind="mig", profile="3g.40gb"), 3, 2),
    (
        "whisper-large",
        DeploymentRequest(kind="mps", memory_mib=12_288, max_compute_percent=40),
        8,
        5,
    ),
    (
        "embeddings-bge",
        DeploymentRequest(kind="mps", memory_mib=4_096, max_compute_percent=20),
        12,
        8,
    ),
    ("sdxl-turbo", DeploymentRequest(kind="mig", profile="2g.35gb"), 4, 1),
    ("llama-70b-train", DeploymentRequest(kind="gpu", gpu_count=4), 2, 1),
    ("qwen-14b-batch", DeploymentRequest(kind="mig", profile="1g.6gb"), 4, 0),
    (
        "feature-worker",
        DeploymentRequest(kind="mps", memory_mib=2_048, max_compute_percent=10),
        2,
        2,
    ),
)

# One deployment whose replicas the demo's agents really run, as processes on this machine.
DEMO_WORKLOADS = {
    "feature-worker": {
        "runtime": "process",
        "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
        "stop_grace_s": 5,
    }
}


def _seed_deployments() -> None:
    for name, request, replicas, placed in DEMO_DEPLOYMENTS:
        deployment = deployment_create(
            name=name, request=request, replicas=replicas, workload=DEMO_WORKLOADS.get(name)
        )
        if placed:
            deployment_autoplace(deployment_id=deployment.pk, limit=placed)
