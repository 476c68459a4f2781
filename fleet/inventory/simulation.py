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
        "profiles": [p.as_dict() for p in product.profiles],  # type: ignore[misc]
    }
    if uuid is not None:
        spec["uuid"] = uuid
    return spec
