"""Seed a large fleet through the same services the agents and the API use (gpu_upsert and
gpu_set_layout): ``seed_fleet(hosts=125)`` gives 1,000 GPUs mixing MIG, MPS and dedicated."""

from __future__ import annotations

import random
from typing import Any

from django.db import transaction

from fleet.inventory.models import Gpu, Host, HostStatus
from fleet.inventory.services import gpu_upsert
from fleet.mig import product_by_key
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout

LAYOUTS = (
    LayoutSpec(mode="mig", instances=tuple(MigInstanceSpec(19, s) for s in range(7))),
    LayoutSpec(
        mode="mig",
        instances=(
            MigInstanceSpec(19, 0),
            MigInstanceSpec(19, 1),
            MigInstanceSpec(14, 2),
            MigInstanceSpec(9, 4),
        ),
    ),
    LayoutSpec(mode="mps", mps=MpsPolicy(max_clients=16)),
    LayoutSpec(mode="dedicated"),
)


def live_values(rng: random.Random, memory_mib: int) -> dict[str, Any]:
    return {
        "utilization_percent": round(rng.uniform(0, 100), 1),
        "memory_used_mib": round(rng.uniform(0, memory_mib), 1),
        "memory_total_mib": memory_mib,
        "temperature_c": round(rng.uniform(30, 80), 1),
        "power_w": round(rng.uniform(60, 700), 1),
        "health": "healthy",
        "partitions": {},
    }


@transaction.atomic
def seed_fleet(*, hosts: int = 125, gpus_per_host: int = 8, seed: int = 7) -> list[int]:
    """Create ``hosts`` hosts of H100s (a layout per GPU, round robin); returns the GPU ids."""
    product = product_by_key("h100-sxm5-80gb")
    assert product is not None
    rng = random.Random(seed)
    ids: list[int] = []
    for h in range(hosts):
        host = Host.objects.create(name=f"bulk-{h:04d}", status=HostStatus.READY)
        for index in range(gpus_per_host):
            gpu = gpu_upsert(
                host=host,
                index=index,
                uuid=f"GPU-bulk-{h:04d}-{index}",
                product_name=product.name,
                product_key=product.key,
                memory_mib=product.memory_mib,
                mig_capable=True,
            )
            gpu_set_layout(gpu_id=gpu.pk, spec=LAYOUTS[(h + index) % len(LAYOUTS)])
            ids.append(gpu.pk)
    gpus = list(Gpu.objects.filter(pk__in=ids))
    for gpu in gpus:
        gpu.health = "healthy"
        gpu.last_telemetry = live_values(rng, gpu.memory_mib)
    Gpu.objects.bulk_update(gpus, ["health", "last_telemetry"], batch_size=500)
    return ids
