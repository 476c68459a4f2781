"""Pure MIG rules: the product catalog, layout validation and search, and mig-parted files.

Stdlib only (plus PyYAML in :mod:`fleet.mig.migparted`); importing this package never boots
Django.
"""

from __future__ import annotations

from fleet.mig.catalog import PRODUCTS, Placement, Product, Profile, find_product, product_by_key
from fleet.mig.layout import (
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
    LayoutPlan,
    UnknownProfileError,
    free_placements,
    maximal_layouts,
    occupied_slices,
    plan_layout,
    resolve_profiles,
    suggest_layout,
    valid_layouts,
    validate_layout,
)
from fleet.mig.migparted import (
    MigConfigSpec,
    MigPartedConfig,
    MigPartedError,
    device_filter_id,
    layout_to_migparted,
    migparted_to_layout,
    parse_migparted,
    render_migparted,
)
from fleet.mig.notation import NotationError, format_instances, parse_instances

__all__ = [
    "DEVICE_FILTER_MISMATCH",
    "DOES_NOT_FIT",
    "MEDIA_EXTENSION_LIMIT",
    "NOT_SUPPORTED",
    "OVERLAP",
    "PLACEMENT_NOT_ALLOWED",
    "PRODUCTS",
    "TOO_MANY_INSTANCES",
    "UNKNOWN_PRODUCT",
    "UNKNOWN_PROFILE",
    "Instance",
    "LayoutPlan",
    "MigConfigSpec",
    "MigPartedConfig",
    "MigPartedError",
    "NotationError",
    "Placement",
    "Product",
    "Profile",
    "UnknownProfileError",
    "device_filter_id",
    "find_product",
    "format_instances",
    "free_placements",
    "layout_to_migparted",
    "maximal_layouts",
    "migparted_to_layout",
    "occupied_slices",
    "parse_instances",
    "parse_migparted",
    "plan_layout",
    "product_by_key",
    "render_migparted",
    "resolve_profiles",
    "suggest_layout",
    "valid_layouts",
    "validate_layout",
]
