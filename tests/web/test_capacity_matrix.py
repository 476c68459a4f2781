"""The capacity matrix presenter: rows are profile shapes, each cell the product's own profile
with the planner's numbers, unchanged."""

from __future__ import annotations

from typing import Any

from fleet.web.presenters.capacity_matrix import capacity_matrix


def _product(key: str, name: str, profiles: list[tuple[str, int, int, int]]) -> dict[str, Any]:
    return {
        "product": name,
        "product_key": key,
        "gpus": 2,
        "schedulable_gpus": 2,
        "mig": {
            "gpus": 2,
            "profiles": [
                {"profile": n, "profile_id": i, "fits_now": now, "fits_if_idle_reshaped": later}
                for n, i, now, later in profiles
            ],
        },
        "mps": {"gpus": 0, "free_memory_mib": 0, "stranded_memory_mib": 0, "free_clients": 0},
        "whole": {"free_gpus": 0},
    }


PAYLOAD: Any = {
    "products": [
        _product("h200-sxm-141gb", "NVIDIA H200", [("1g.18gb", 19, 3, 7), ("1g.35gb", 15, 0, 2)]),
        _product("a30-24gb", "NVIDIA A30", [("1g.6gb", 14, 0, 0), ("4g.24gb", 0, 1, 1)]),
        _product("", "Tesla T4", []),  # no catalog entry, no MIG: no column
    ],
    "fragmentation": {"score": 0, "stranded_gpu_equivalents": 0, "free_gpu_equivalents": 0},
}


def test_a_row_is_a_shape_and_each_cell_the_products_own_profile():
    matrix = capacity_matrix(PAYLOAD)

    assert [c.name for c in matrix.columns] == ["NVIDIA H200", "NVIDIA A30"]
    rows = {
        r.label: [(c.profile, c.fits_now, c.fits_if_idle_reshaped, c.state) for c in r.cells]
        for r in matrix.rows
    }
    assert list(rows) == ["4g", "1g \u00b7 more memory", "1g"]  # largest first
    assert rows["1g"] == [("1g.18gb", 3, 7, "now"), ("1g.6gb", 0, 0, "none")]
    assert rows["1g \u00b7 more memory"] == [("1g.35gb", 0, 2, "reshape"), ("", 0, 0, "absent")]
    assert rows["4g"] == [("", 0, 0, "absent"), ("4g.24gb", 1, 1, "now")]


def test_a_chosen_product_keeps_only_its_column():
    matrix = capacity_matrix(PAYLOAD, "a30-24gb")

    assert [c.key for c in matrix.columns] == ["a30-24gb"]
    assert [r.label for r in matrix.rows] == ["4g", "1g"]
