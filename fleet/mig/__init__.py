"""Pure MIG rules: the product catalog, layout validation and search, and mig-parted files.

Stdlib only (plus PyYAML in :mod:`fleet.mig.migparted`); importing this package never boots
Django.
"""

from __future__ import annotations

from fleet.mig.capacity import ProfileCapacity, max_new_instances, profile_capacity
from fleet.mig.catalog import PRODUCTS, Placement, Product, Profile, find_product, product_by_key
from fleet.mig.migparted.convert import layout_to_migparted, migparted_to_layout, render_migparted
from fleet.mig.migparted.parse import parse_migparted
from fleet.mig.migparted.spec import (
    MigConfigSpec,
    MigPartedConfig,
    MigPartedError,
    device_filter_id,
)
from fleet.mig.notation import NotationError, format_instances, parse_instances
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
    resolve_instances,
    unknown_profile,
    validate_layout,
)

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
    "ProfileCapacity",
    "UnknownProfileError",
    "device_filter_id",
    "find_product",
    "format_instances",
    "free_placements",
    "instance_sort_key",
    "layout_to_migparted",
    "max_new_instances",
    "maximal_layouts",
    "migparted_to_layout",
    "occupied_slices",
    "parse_instances",
    "parse_migparted",
    "plan_layout",
    "product_by_key",
    "profile_capacity",
    "render_migparted",
    "resolve_instances",
    "resolve_profiles",
    "suggest_layout",
    "unknown_profile",
    "valid_layouts",
    "validate_layout",
]
