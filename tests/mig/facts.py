"""Expected catalog rows, copied by hand from reference/mig_mps_nvml_facts.md §1.2-§1.5 and §1.8.

Kept separate from fleet.mig.products on purpose: a typo in either shows up as a test failure.
"""

from __future__ import annotations

# (id, name, compute slices, memory slices, max instances, starts, media)
Row = tuple[int, str, int, int, int, tuple[int, ...], str]


def eight_unit(one: str, double: str, half: str, full: str) -> tuple[Row, ...]:
    """§1.2: the placement table shared by A100, H100, H200, GH200, B200 and GB200."""
    return (
        (0, f"7g.{full}", 7, 8, 1, (0,), ""),
        (5, f"4g.{half}", 4, 4, 1, (0,), ""),
        (9, f"3g.{half}", 3, 4, 2, (0, 4), ""),
        (14, f"2g.{double}", 2, 2, 3, (0, 2, 4), ""),
        (15, f"1g.{double}", 1, 2, 4, (0, 2, 4, 6), ""),
        (19, f"1g.{one}", 1, 1, 7, (0, 1, 2, 3, 4, 5, 6), ""),
        (20, f"1g.{one}+me", 1, 1, 1, (0, 1, 2, 3, 4, 5, 6), "+me"),
    )


A30: tuple[Row, ...] = (  # §1.3
    (0, "4g.24gb", 4, 4, 1, (0,), ""),
    (5, "2g.12gb", 2, 2, 2, (0, 2), ""),
    (6, "2g.12gb+me", 2, 2, 1, (0, 2), "+me"),
    (14, "1g.6gb", 1, 1, 4, (0, 1, 2, 3), ""),
    (21, "1g.6gb+me", 1, 1, 1, (0, 1, 2, 3), "+me"),
)

RTX_PRO_6000: tuple[Row, ...] = (  # §1.4
    (0, "4g.96gb", 4, 12, 1, (0,), ""),
    (32, "4g.96gb+gfx", 4, 12, 1, (0,), "+gfx"),
    (5, "2g.48gb", 2, 6, 2, (0, 6), ""),
    (35, "2g.48gb+gfx", 2, 6, 2, (0, 6), "+gfx"),
    (64, "2g.48gb+me.all", 2, 6, 1, (0, 6), "+me.all"),
    (66, "2g.48gb-me", 2, 6, 2, (0, 6), "-me"),
    (14, "1g.24gb", 1, 3, 4, (0, 3, 6, 9), ""),
    (21, "1g.24gb+me", 1, 3, 1, (0, 3, 6, 9), "+me"),
    (47, "1g.24gb+gfx", 1, 3, 4, (0, 3, 6, 9), "+gfx"),
    (65, "1g.24gb+me.all", 1, 3, 1, (0, 3, 6, 9), "+me.all"),
    (67, "1g.24gb-me", 1, 3, 4, (0, 3, 6, 9), "-me"),
)

# key: (NVML name, PCI device ids, grid (memory slices, compute slices, max instances), rows)
PRODUCT_FACTS: dict[str, tuple[str, tuple[int, ...], tuple[int, int, int], tuple[Row, ...]]] = {
    "a30-24gb": ("NVIDIA A30", (0x20B7,), (4, 4, 4), A30),
    "a100-sxm4-40gb": (
        "NVIDIA A100-SXM4-40GB",
        (0x20B0,),
        (8, 7, 7),
        eight_unit("5gb", "10gb", "20gb", "40gb"),
    ),
    "a100-pcie-40gb": (
        "NVIDIA A100-PCIE-40GB",
        (0x20F1, 0x20B1),
        (8, 7, 7),
        eight_unit("5gb", "10gb", "20gb", "40gb"),
    ),
    "a100-sxm4-80gb": (
        "NVIDIA A100-SXM4-80GB",
        (0x20B2,),
        (8, 7, 7),
        eight_unit("10gb", "20gb", "40gb", "80gb"),
    ),
    "a100-pcie-80gb": (
        "NVIDIA A100 80GB PCIe",
        (0x20B5,),
        (8, 7, 7),
        eight_unit("10gb", "20gb", "40gb", "80gb"),
    ),
    "h100-sxm5-80gb": (
        "NVIDIA H100 80GB HBM3",
        (0x2330,),
        (8, 7, 7),
        eight_unit("10gb", "20gb", "40gb", "80gb"),
    ),
    "h100-pcie-80gb": (
        "NVIDIA H100 PCIe",
        (0x2331,),
        (8, 7, 7),
        eight_unit("10gb", "20gb", "40gb", "80gb"),
    ),
    "h100-nvl-94gb": (
        "NVIDIA H100 NVL",
        (0x2321,),
        (8, 7, 7),
        eight_unit("12gb", "24gb", "47gb", "94gb"),
    ),
    "h100-sxm5-94gb": (
        "NVIDIA H100",
        (0x2339,),
        (8, 7, 7),
        eight_unit("12gb", "24gb", "47gb", "94gb"),
    ),
    "h100-96gb": (
        "NVIDIA H100 96GB",
        (0x233D,),
        (8, 7, 7),
        eight_unit("12gb", "24gb", "48gb", "96gb"),
    ),
    "gh200-96gb": (
        "NVIDIA GH200 480GB",
        (0x2342,),
        (8, 7, 7),
        eight_unit("12gb", "24gb", "48gb", "96gb"),
    ),
    "h20-96gb": ("NVIDIA H20", (0x2329,), (8, 7, 7), eight_unit("12gb", "24gb", "48gb", "96gb")),
    "h200-sxm-141gb": (
        "NVIDIA H200",
        (0x2335,),
        (8, 7, 7),
        eight_unit("18gb", "35gb", "71gb", "141gb"),
    ),
    "h200-nvl-141gb": (
        "NVIDIA H200 NVL",
        (0x233B,),
        (8, 7, 7),
        eight_unit("18gb", "35gb", "71gb", "141gb"),
    ),
    "gh200-144gb": (
        "NVIDIA GH200 144G HBM3e",
        (0x2348,),
        (8, 7, 7),
        eight_unit("18gb", "36gb", "72gb", "144gb"),
    ),
    "b200-180gb": (
        "NVIDIA B200",
        (0x2901, 0x2909),
        (8, 7, 7),
        eight_unit("23gb", "45gb", "90gb", "180gb"),
    ),
    "gb200-186gb": (
        "NVIDIA GB200",
        (0x2941,),
        (8, 7, 7),
        eight_unit("23gb", "47gb", "93gb", "186gb"),
    ),
    "rtx-pro-6000-server": (
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        (0x2BB5,),
        (12, 4, 4),
        RTX_PRO_6000,
    ),
    "rtx-pro-6000-ws": (
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        (0x2BB1,),
        (12, 4, 4),
        RTX_PRO_6000,
    ),
    "rtx-pro-6000-maxq": (
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        (0x2BB4,),
        (12, 4, 4),
        RTX_PRO_6000,
    ),
}

# GiB that `nvidia-smi mig -lgip` printed where a transcript exists (§1.5), per product and id.
MEASURED_GIB: dict[str, dict[int, float]] = {
    "a30-24gb": {0: 23.44, 5: 11.69, 14: 5.81},
    "a100-sxm4-40gb": {0: 39.25, 5: 19.50, 9: 19.50, 14: 9.62, 15: 9.62, 19: 4.75},
    "h100-sxm5-80gb": {9: 39.50, 14: 19.62, 15: 19.62, 19: 9.75},
    "h100-pcie-80gb": {0: 79.00, 5: 39.25, 9: 39.25, 14: 19.50, 15: 19.50, 19: 9.62},
    "h100-nvl-94gb": {0: 93.12, 5: 46.38, 9: 46.38, 14: 21.62, 15: 21.62, 19: 10.75},
    "h200-sxm-141gb": {0: 139.75, 5: 69.50, 9: 69.50, 14: 32.25, 15: 32.25, 19: 16.00},
    "gh200-144gb": {14: 35.25, 15: 35.25, 19: 17.50},
    "b200-180gb": {14: 44.25, 15: 44.25, 19: 22.00},
    "gb200-186gb": {14: 45.50, 15: 45.50, 19: 22.00},
    "rtx-pro-6000-server": {0: 95.12, 5: 47.38, 14: 23.62},
}

# §1.6: the 19 maximal layouts of profiles 19/14/9/5/0, in "<g>g@<start>" notation.
NINETEEN_MAXIMAL = (
    "7g@0",
    "4g@0 3g@4",
    "4g@0 2g@4 1g@6",
    "4g@0 1g@4 1g@5 1g@6",
    "3g@0 3g@4",
    "3g@0 2g@4 1g@6",
    "3g@0 1g@4 1g@5 1g@6",
    "1g@0 1g@1 1g@2 1g@3 3g@4",
    "1g@0 1g@1 1g@2 1g@3 2g@4 1g@6",
    "1g@0 1g@1 1g@2 1g@3 1g@4 1g@5 1g@6",
    "1g@0 1g@1 2g@2 1g@4 1g@5 1g@6",
    "1g@0 1g@1 2g@2 2g@4 1g@6",
    "1g@0 1g@1 2g@2 3g@4",
    "2g@0 1g@2 1g@3 1g@4 1g@5 1g@6",
    "2g@0 1g@2 1g@3 2g@4 1g@6",
    "2g@0 1g@2 1g@3 3g@4",
    "2g@0 2g@2 1g@4 1g@5 1g@6",
    "2g@0 2g@2 2g@4 1g@6",
    "2g@0 2g@2 3g@4",
)
EIGHT_UNIT_IDS = {"1g": 19, "2g": 14, "3g": 9, "4g": 5, "7g": 0}

# §1.6: the 5 maximal A30 layouts (profiles 14/5/0).
A30_MAXIMAL = ("4g@0", "2g@0 2g@2", "2g@0 1g@2 1g@3", "1g@0 1g@1 2g@2", "1g@0 1g@1 1g@2 1g@3")
A30_IDS = {"1g": 14, "2g": 5, "4g": 0}
