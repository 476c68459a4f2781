"""Simulated GPU specs for tests, from the facts file §1.2/§1.3 (what the catalog would send)."""

from __future__ import annotations

from hostagent.protocol import SimulatedGpuSpec, SimulatedProfileSpec


def _eight_unit(gb_slice: int, total_mib: int) -> list[SimulatedProfileSpec]:
    per_slice = total_mib // 8
    rows = [
        (19, f"1g.{gb_slice}gb", 1, 1, 7, [0, 1, 2, 3, 4, 5, 6]),
        (20, f"1g.{gb_slice}gb+me", 1, 1, 1, [0, 1, 2, 3, 4, 5, 6]),
        (15, f"1g.{2 * gb_slice}gb", 1, 2, 4, [0, 2, 4, 6]),
        (14, f"2g.{2 * gb_slice}gb", 2, 2, 3, [0, 2, 4]),
        (9, f"3g.{4 * gb_slice}gb", 3, 4, 2, [0, 4]),
        (5, f"4g.{4 * gb_slice}gb", 4, 4, 1, [0]),
        (0, f"7g.{8 * gb_slice}gb", 7, 8, 1, [0]),
    ]
    return [
        {
            "id": pid,
            "name": name,
            "compute_slices": c,
            "memory_slices": m,
            "memory_mib": per_slice * m,
            "max_instances": n,
            "placements": [[s, m] for s in starts],
        }
        for pid, name, c, m, n, starts in rows
    ]


def h100() -> SimulatedGpuSpec:
    return {
        "name": "NVIDIA H100 80GB HBM3",
        "pci_device_id": 0x233010DE,
        "memory_mib": 81559,
        "mig_capable": True,
        "compute_slice_count": 7,
        "memory_slice_count": 8,
        "profiles": _eight_unit(10, 81559),
    }


def a100() -> SimulatedGpuSpec:
    return {
        "name": "NVIDIA A100-SXM4-40GB",
        "pci_device_id": 0x20B010DE,
        "memory_mib": 40960,
        "mig_capable": True,
        "compute_slice_count": 7,
        "memory_slice_count": 8,
        "profiles": _eight_unit(5, 40960),
    }


def a30() -> SimulatedGpuSpec:
    rows = [
        (14, "1g.6gb", 1, 1, 4, [0, 1, 2, 3]),
        (21, "1g.6gb+me", 1, 1, 1, [0, 1, 2, 3]),
        (5, "2g.12gb", 2, 2, 2, [0, 2]),
        (6, "2g.12gb+me", 2, 2, 1, [0, 2]),
        (0, "4g.24gb", 4, 4, 1, [0]),
    ]
    return {
        "name": "NVIDIA A30",
        "pci_device_id": 0x20B710DE,
        "memory_mib": 24576,
        "mig_capable": True,
        "compute_slice_count": 4,
        "memory_slice_count": 4,
        "profiles": [
            {
                "id": pid,
                "name": name,
                "compute_slices": c,
                "memory_slices": m,
                "memory_mib": 6144 * m,
                "max_instances": n,
                "placements": [[s, m] for s in starts],
            }
            for pid, name, c, m, n, starts in rows
        ],
    }


def l4() -> SimulatedGpuSpec:
    return {
        "name": "NVIDIA L4",
        "pci_device_id": 0x27B810DE,
        "memory_mib": 23034,
        "mig_capable": False,
        "compute_slice_count": 0,
        "memory_slice_count": 0,
        "profiles": [],
    }
