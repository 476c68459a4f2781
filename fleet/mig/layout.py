"""MIG layouts: validation, free placements, suggestions and enumeration.

The public face of :mod:`fleet.mig.rules` (what a layout must satisfy) and
:mod:`fleet.mig.planning` (finding placements).
"""

from __future__ import annotations

from fleet.mig.planning import (
    LayoutPlan,
    UnknownProfileError,
    maximal_layouts,
    plan_layout,
    resolve_profiles,
    suggest_layout,
    valid_layouts,
)
from fleet.mig.rules import (
    DEVICE_FILTER_MISMATCH,
    DOES_NOT_FIT,
    MEDIA_EXTENSION_LIMIT,
    NOT_SUPPORTED,
    OVERLAP,
    PLACEMENT_NOT_ALLOWED,
    TOO_MANY_INSTANCES,
    UNKNOWN_PRODUCT,
    UNKNOWN_PROFILE,
    Instance,
    free_placements,
    instance_sort_key,
    occupied_slices,
    validate_layout,
)

__all__ = [
    "DEVICE_FILTER_MISMATCH",
    "DOES_NOT_FIT",
    "MEDIA_EXTENSION_LIMIT",
    "NOT_SUPPORTED",
    "OVERLAP",
    "PLACEMENT_NOT_ALLOWED",
    "TOO_MANY_INSTANCES",
    "UNKNOWN_PRODUCT",
    "UNKNOWN_PROFILE",
    "Instance",
    "LayoutPlan",
    "UnknownProfileError",
    "free_placements",
    "instance_sort_key",
    "maximal_layouts",
    "occupied_slices",
    "plan_layout",
    "resolve_profiles",
    "suggest_layout",
    "valid_layouts",
    "validate_layout",
]
