"""The built-in product tables: a fallback for GPUs whose agent has not reported placements yet.

Every number comes from ``reference/mig_mps_nvml_facts.md`` (section numbers below). The driver is
the authority: agents read ``nvmlDeviceGetGpuInstancePossiblePlacements_v2`` at run time and
:meth:`fleet.mig.model.Product.with_placements` lets their report override these tables.

Marks, as in the facts file: ◐ = inferred from same-family evidence, not seen for this exact GPU.

Memory:

* ``Product.memory_mib`` is the nominal size (marketing GB x 1024); NVML reports a little less.
* ``Profile.memory_mib`` is the GiB that ``nvidia-smi mig -lgip`` printed x 1024, rounded, where a
  transcript exists (§1.3-§1.5). Where none exists it is an **estimate**: the product's nominal
  memory times the profile's memory fraction (placement size / memory-slice count). Each table says
  which rows are estimates.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleet.mig.model import Placement, Product, Profile

# (id, compute slices, memory slices, max instances, placement starts, media) per geometry family.
_Geometry = tuple[tuple[int, int, int, int, tuple[int, ...], str], ...]

# §1.2: identical on A100, H100, H200, GH200, B200, GB200 (transcripts for A100/H100 only; the
# others are ◐ — same ids, counts and fractions in -lgip, no -lgipp transcript, §7.1).
_EIGHT_UNIT: _Geometry = (
    (0, 7, 8, 1, (0,), ""),
    (5, 4, 4, 1, (0,), ""),
    (9, 3, 4, 2, (0, 4), ""),
    (14, 2, 2, 3, (0, 2, 4), ""),
    (15, 1, 2, 4, (0, 2, 4, 6), ""),
    (19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6), ""),
    (20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6), "+me"),
)

# §1.3: A30, -lgipp transcript, driver 535.183.01.
_FOUR_UNIT: _Geometry = (
    (0, 4, 4, 1, (0,), ""),
    (5, 2, 2, 2, (0, 2), ""),
    (6, 2, 2, 1, (0, 2), "+me"),
    (14, 1, 1, 4, (0, 1, 2, 3), ""),
    (21, 1, 1, 1, (0, 1, 2, 3), "+me"),
)

# §1.4: RTX PRO 6000 Blackwell Server Edition, one -lgipp transcript (driver 610.43.02), so ◐.
_TWELVE_UNIT: _Geometry = (
    (0, 4, 12, 1, (0,), ""),
    (32, 4, 12, 1, (0,), "+gfx"),
    (5, 2, 6, 2, (0, 6), ""),
    (35, 2, 6, 2, (0, 6), "+gfx"),
    (64, 2, 6, 1, (0, 6), "+me.all"),
    (66, 2, 6, 2, (0, 6), "-me"),
    (14, 1, 3, 4, (0, 3, 6, 9), ""),
    (21, 1, 3, 1, (0, 3, 6, 9), "+me"),
    (47, 1, 3, 4, (0, 3, 6, 9), "+gfx"),
    (65, 1, 3, 1, (0, 3, 6, 9), "+me.all"),
    (67, 1, 3, 4, (0, 3, 6, 9), "-me"),
)


def _profiles(
    geometry: _Geometry,
    *,
    slice_count: int,
    product_mib: int,
    names: Mapping[int, str],
    gib: Mapping[int, float],
    aliases: Mapping[int, tuple[str, ...]] | None = None,
) -> tuple[Profile, ...]:
    """Builds a product's profiles from its family geometry, names and measured GiB."""
    profiles = []
    for profile_id, g, size, count, starts, media in geometry:
        measured = gib.get(profile_id)
        memory_mib = (
            round(measured * 1024) if measured is not None else product_mib * size // slice_count
        )
        profiles.append(
            Profile(
                id=profile_id,
                name=names[profile_id],
                compute_slices=g,
                memory_slices=size,
                memory_mib=memory_mib,
                max_instances=count,
                placements=tuple(Placement(start, size) for start in starts),
                media=media,
                aliases=(aliases or {}).get(profile_id, ()),
            )
        )
    return tuple(profiles)


def _eight_unit_names(one: str, double: str, half: str, full: str) -> dict[int, str]:
    """Profile names of the 8-unit family from its memory sizes, e.g. ``("5gb", "10gb", ...)``."""
    return {
        0: f"7g.{full}",
        5: f"4g.{half}",
        9: f"3g.{half}",
        14: f"2g.{double}",
        15: f"1g.{double}",
        19: f"1g.{one}",
        20: f"1g.{one}+me",
    }


def _gpu(
    key: str,
    name: str,
    pci: tuple[int, ...],
    memory_mib: int,
    profiles: tuple[Profile, ...],
    *,
    aliases: tuple[str, ...] = (),
) -> Product:
    """A MIG-capable product; grid sizes follow from its profiles' family."""
    memory_slices = max(p.memory_slices for p in profiles)
    compute_slices = max(p.compute_slices for p in profiles)
    # §1.8 "Supported GPUs and max instances": 7 on the 8-unit family, 4 on A30 / RTX PRO 6000.
    max_instances = 7 if memory_slices == 8 else 4
    return Product(
        key=key,
        name=name,
        aliases=aliases,
        pci_device_ids=pci,
        memory_mib=memory_mib,
        mig_capable=True,
        memory_slice_count=memory_slices,
        compute_slice_count=compute_slices,
        max_instances=max_instances,
        profiles=profiles,
    )


def _no_mig(key: str, name: str, pci: tuple[int, ...], memory_mib: int) -> Product:
    """A product without MIG: ``nvmlDeviceGetMigMode`` answers NOT_SUPPORTED."""
    return Product(key, name, (), pci, memory_mib, False, 0, 0, 0, ())


def _eight_unit(
    product_mib: int,
    names: dict[int, str],
    gib: Mapping[int, float],
    aliases: Mapping[int, tuple[str, ...]] | None = None,
) -> tuple[Profile, ...]:
    return _profiles(
        _EIGHT_UNIT, slice_count=8, product_mib=product_mib, names=names, gib=gib, aliases=aliases
    )


# --- A30 (§1.3, §1.5): -lgip GiB from driver 535.183.01. ---------------------------------------
_A30 = _profiles(
    _FOUR_UNIT,
    slice_count=4,
    product_mib=24 * 1024,
    names={0: "4g.24gb", 5: "2g.12gb", 6: "2g.12gb+me", 14: "1g.6gb", 21: "1g.6gb+me"},
    gib={0: 23.44, 5: 11.69, 6: 11.69, 14: 5.81, 21: 5.81},
)

# --- A100 40GB (§1.5): -lgip GiB from the MIG user guide transcript. -----------------------------
_A100_40GB = _eight_unit(
    40 * 1024,
    _eight_unit_names("5gb", "10gb", "20gb", "40gb"),
    {0: 39.25, 5: 19.50, 9: 19.50, 14: 9.62, 15: 9.62, 19: 4.75, 20: 4.75},
)

# --- A100 80GB (§1.5): names from the guide; no GiB captured, so every memory_mib is an estimate.
# Id 15 placements are ◐ (§7.4). Drivers 535/545 printed 3g.40gb as 3g.39gb (§1.7).
_A100_80GB = _eight_unit(
    80 * 1024, _eight_unit_names("10gb", "20gb", "40gb", "80gb"), {}, {9: ("3g.39gb",)}
)

# --- H100 80GB (§1.5). SXM5: -lgip GiB for 1g/2g/3g; 4g reuses 3g's number (◐, same 4 memory
# slices) and 7g is an estimate. PCIe: full -lgip, driver 525.125.06. ----------------------------
_H100_NAMES = _eight_unit_names("10gb", "20gb", "40gb", "80gb")
_H100_SXM5 = _eight_unit(
    80 * 1024, _H100_NAMES, {5: 39.50, 9: 39.50, 14: 19.62, 15: 19.62, 19: 9.75, 20: 9.75}
)
_H100_PCIE = _eight_unit(
    80 * 1024,
    _H100_NAMES,
    {0: 79.00, 5: 39.25, 9: 39.25, 14: 19.50, 15: 19.50, 19: 9.62, 20: 9.62},
)

# --- H100 94GB (§1.5): -lgip GiB from Azure NC40ads_H100_v5, driver 560.35.03. ------------------
_H100_94GB = _eight_unit(
    94 * 1024,
    _eight_unit_names("12gb", "24gb", "47gb", "94gb"),
    {0: 93.12, 5: 46.38, 9: 46.38, 14: 21.62, 15: 21.62, 19: 10.75, 20: 10.75},
)

# --- H100 96GB / GH200 96GB / H20 (§1.5): names from the guide, ids and placements ◐ (8-unit
# family), no GiB captured: every memory_mib is an estimate. --------------------------------------
_H100_96GB = _eight_unit(96 * 1024, _eight_unit_names("12gb", "24gb", "48gb", "96gb"), {})

# --- H200 141GB SXM and NVL (§1.5): -lgip GiB from mig-parted issue #120 (R580 gives a little more:
# 140.00/69.75/32.50, so these are the safe bound); placements probed on an SXM with R580 (✅). ----
_H200 = _eight_unit(
    141 * 1024,
    _eight_unit_names("18gb", "35gb", "71gb", "141gb"),
    {0: 139.75, 5: 69.50, 9: 69.50, 14: 32.25, 15: 32.25, 19: 16.00, 20: 16.00},
)

# --- GH200 144G HBM3e (§1.5): first four rows from mig-parted PR #139; ids 9/5/0 ◐, their
# memory_mib estimates; placements ◐. ------------------------------------------------------------
_GH200_144GB = _eight_unit(
    144 * 1024,
    _eight_unit_names("18gb", "36gb", "72gb", "144gb"),
    {14: 35.25, 15: 35.25, 19: 17.50, 20: 17.50},
)

# --- B200 (§1.5): 1g/2g GiB from mig-parted PR #166 (launch driver); ids 9/5/0 ◐ and estimated;
# 4g.90gb only appears with later drivers (PR #187); placements ◐. --------------------------------
_B200 = _eight_unit(
    180 * 1024,
    _eight_unit_names("23gb", "45gb", "90gb", "180gb"),
    {14: 44.25, 15: 44.25, 19: 22.00, 20: 22.00},
)

# --- GB200 (§1.5): older drivers named 1g.23gb "1g.24gb" (mig-parted #227); ids 9/5/0 ◐. --------
_GB200 = _eight_unit(
    186 * 1024,
    _eight_unit_names("23gb", "47gb", "93gb", "186gb"),
    {14: 45.50, 15: 45.50, 19: 22.00, 20: 22.00},
    {19: ("1g.24gb",), 20: ("1g.24gb+me",)},
)

# --- RTX PRO 6000 Blackwell (§1.4): one -lgip transcript on the Server Edition; the Workstation
# and Max-Q editions are ◐ (same profile table in the guide, MIG needs a minimum VBIOS). ---------
_RTX_PRO_6000 = _profiles(
    _TWELVE_UNIT,
    slice_count=12,
    product_mib=96 * 1024,
    names={
        0: "4g.96gb",
        32: "4g.96gb+gfx",
        5: "2g.48gb",
        35: "2g.48gb+gfx",
        64: "2g.48gb+me.all",
        66: "2g.48gb-me",
        14: "1g.24gb",
        21: "1g.24gb+me",
        47: "1g.24gb+gfx",
        65: "1g.24gb+me.all",
        67: "1g.24gb-me",
    },
    gib={
        0: 95.12,
        32: 95.12,
        5: 47.38,
        35: 47.38,
        64: 47.38,
        66: 47.38,
        14: 23.62,
        21: 23.62,
        47: 23.62,
        65: 23.62,
        67: 23.62,
    },
)

# Names and PCI device ids: §1.8 (open-gpu-kernel-modules README, pci.ids).
PRODUCTS: tuple[Product, ...] = (
    _gpu("a30-24gb", "NVIDIA A30", (0x20B7,), 24 * 1024, _A30),
    _gpu("a100-sxm4-40gb", "NVIDIA A100-SXM4-40GB", (0x20B0,), 40 * 1024, _A100_40GB),
    # §1.8 lists 0x20B1 and 0x20F1 for the 40GB PCIe card; the driver name is 0x20F1's.
    _gpu("a100-pcie-40gb", "NVIDIA A100-PCIE-40GB", (0x20F1, 0x20B1), 40 * 1024, _A100_40GB),
    _gpu("a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB", (0x20B2,), 80 * 1024, _A100_80GB),
    _gpu("a100-pcie-80gb", "NVIDIA A100 80GB PCIe", (0x20B5,), 80 * 1024, _A100_80GB),
    _gpu("h100-sxm5-80gb", "NVIDIA H100 80GB HBM3", (0x2330,), 80 * 1024, _H100_SXM5),
    _gpu("h100-pcie-80gb", "NVIDIA H100 PCIe", (0x2331,), 80 * 1024, _H100_PCIE),
    _gpu("h100-nvl-94gb", "NVIDIA H100 NVL", (0x2321,), 94 * 1024, _H100_94GB),
    # ◐ the guide's 94GB table covers "PCIe and SXM5"; the SXM5 94GB prints plain "NVIDIA H100".
    _gpu("h100-sxm5-94gb", "NVIDIA H100", (0x2339,), 94 * 1024, _H100_94GB),
    # ◐ the driver name of 0x233D is unconfirmed (§1.8 "❓"); this one is a guess from pci.ids.
    _gpu("h100-96gb", "NVIDIA H100 96GB", (0x233D,), 96 * 1024, _H100_96GB),
    # GH200 with 96GB HBM3: the name depends on the subsystem id (§1.8).
    _gpu(
        "gh200-96gb",
        "NVIDIA GH200 480GB",
        (0x2342,),
        96 * 1024,
        _H100_96GB,
        aliases=("NVIDIA GH200 120GB",),
    ),
    # ◐ H20: mig-parted groups it with the 96GB class (§1.5); no -lgip transcript.
    _gpu("h20-96gb", "NVIDIA H20", (0x2329,), 96 * 1024, _H100_96GB),
    _gpu("h200-sxm-141gb", "NVIDIA H200", (0x2335,), 141 * 1024, _H200),
    _gpu("h200-nvl-141gb", "NVIDIA H200 NVL", (0x233B,), 141 * 1024, _H200),
    _gpu("gh200-144gb", "NVIDIA GH200 144G HBM3e", (0x2348,), 144 * 1024, _GH200_144GB),
    _gpu("b200-180gb", "NVIDIA B200", (0x2901, 0x2909), 180 * 1024, _B200),
    _gpu("gb200-186gb", "NVIDIA GB200", (0x2941,), 186 * 1024, _GB200),
    _gpu(
        "rtx-pro-6000-server",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        (0x2BB5,),
        96 * 1024,
        _RTX_PRO_6000,
    ),
    _gpu(
        "rtx-pro-6000-ws",
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        (0x2BB1,),
        96 * 1024,
        _RTX_PRO_6000,
    ),
    _gpu(
        "rtx-pro-6000-maxq",
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        (0x2BB4,),
        96 * 1024,
        _RTX_PRO_6000,
    ),
    # Not MIG-capable. Device ids are pci.ids entries (10de:27b8 L4, 10de:1eb8 T4), not from the
    # facts file; only their lack of MIG matters here.
    _no_mig("l4-24gb", "NVIDIA L4", (0x27B8,), 24 * 1024),
    _no_mig("t4-16gb", "Tesla T4", (0x1EB8,), 16 * 1024),
)
