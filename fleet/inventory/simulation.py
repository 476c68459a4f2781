"""Simulated GPU specs for simulated agents, generated from the MIG catalog (the agent carries no
catalog of its own)."""

from __future__ import annotations

from fleet.mig import Product
from hostagent import protocol


def simulated_spec(product: Product, *, uuid: str | None = None) -> protocol.SimulatedGpuSpec:
    """The spec of one simulated GPU of ``product`` (profiles and placements as NVML gives them)."""
    spec: protocol.SimulatedGpuSpec = {
        "name": product.name,
        "pci_device_id": (product.pci_device_ids[0] << 16 | 0x10DE)
        if product.pci_device_ids
        else 0,
        "memory_mib": product.memory_mib,
        "mig_capable": product.mig_capable,
        "compute_slice_count": product.compute_slice_count,
        "memory_slice_count": product.memory_slice_count,
        "profiles": [
            {
                "id": p.id,
                "name": p.name,
                "compute_slices": p.compute_slices,
                "memory_slices": p.memory_slices,
                "memory_mib": p.memory_mib,
                "max_instances": p.max_instances,
                "placements": [[pl.start, pl.size] for pl in p.placements],
            }
            for p in product.profiles
        ],
    }
    if uuid is not None:
        spec["uuid"] = uuid
    return spec
