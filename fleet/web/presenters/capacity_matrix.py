"""The capacity page's matrix: MIG profiles by GPU product, what fits now and after reshaping
idle instances (the numbers of :func:`fleet.allocations.planning.capacity.fleet_capacity`, never
recomputed here).

Profile names are per product (``1g.10gb`` on an H100, ``1g.18gb`` on an H200, ``1g.6gb`` on an
A30), so a row is a profile *shape*: its compute slices, its media extension, and whether it is
the smaller or a larger memory size of that compute size on its product (``1g.10gb`` and
``1g.20gb`` on an H100). Each cell names the product's own profile of that shape, or says the
product offers none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fleet.allocations.planning.capacity import CapacityPayload, ProductPayload
from fleet.mig import Profile, product_by_key

CellState = Literal["now", "reshape", "none", "absent"]
Shape = tuple[int, int, str]  # compute slices, memory rank within them (0: smallest), media


@dataclass(frozen=True)
class ProductColumn:
    key: str
    name: str
    mig_gpus: int


@dataclass(frozen=True)
class MatrixCell:
    """One product's profile of a row's shape ("" and state ``absent`` when it has none)."""

    product: str
    profile: str
    fits_now: int
    fits_if_idle_reshaped: int
    state: CellState


@dataclass(frozen=True)
class MatrixRow:
    label: str
    cells: tuple[MatrixCell, ...]


@dataclass(frozen=True)
class CapacityMatrix:
    columns: tuple[ProductColumn, ...]
    rows: tuple[MatrixRow, ...]


def _shapes(profiles: tuple[Profile, ...]) -> dict[int, Shape]:
    """Each profile's shape, by profile id."""
    sizes: dict[tuple[int, str], list[int]] = {}
    for p in profiles:
        sizes.setdefault((p.compute_slices, p.media), []).append(p.memory_slices)
    return {
        p.id: (
            p.compute_slices,
            sorted(set(sizes[(p.compute_slices, p.media)])).index(p.memory_slices),
            p.media,
        )
        for p in profiles
    }


def _label(shape: Shape) -> str:
    compute, rank, media = shape
    memory = (
        " \u00b7 more memory" if rank == 1 else f" \u00b7 memory size {rank + 1}" if rank else ""
    )
    return f"{compute}g{memory}{f' {media}' if media else ''}"


def _state(fits_now: int, fits_if_idle_reshaped: int) -> CellState:
    if fits_now:
        return "now"
    return "reshape" if fits_if_idle_reshaped else "none"


def _cells_by_shape(product: ProductPayload) -> dict[Shape, MatrixCell]:
    """The product's profiles keyed by shape (its catalog says each profile's shape)."""
    catalog = product_by_key(product["product_key"]) if product["product_key"] else None
    if catalog is None or not catalog.mig_capable:
        return {}
    shapes = _shapes(catalog.profiles)
    cells: dict[Shape, MatrixCell] = {}
    for entry in product["mig"]["profiles"]:
        shape = shapes.get(entry["profile_id"])
        if shape is not None:
            now, later = entry["fits_now"], entry["fits_if_idle_reshaped"]
            cells[shape] = MatrixCell(
                product["product"], entry["profile"], now, later, _state(now, later)
            )
    return cells


def capacity_matrix(payload: CapacityPayload, product_key: str = "") -> CapacityMatrix:
    """Profiles (largest first) by MIG product; only ``product_key``'s column when one is given."""
    found: list[tuple[ProductColumn, dict[Shape, MatrixCell]]] = []
    for product in payload["products"]:
        if product_key and product["product_key"] != product_key:
            continue
        cells = _cells_by_shape(product)
        if cells:
            column = ProductColumn(
                product["product_key"], product["product"], product["mig"]["gpus"]
            )
            found.append((column, cells))
    shapes = sorted({s for _, cells in found for s in cells}, key=lambda s: (-s[0], -s[1], s[2]))
    rows = tuple(
        MatrixRow(
            _label(shape),
            tuple(
                cells.get(shape) or MatrixCell(column.name, "", 0, 0, "absent")
                for column, cells in found
            ),
        )
        for shape in shapes
    )
    return CapacityMatrix(tuple(column for column, _ in found), rows)
