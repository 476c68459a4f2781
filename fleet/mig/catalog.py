"""The MIG catalog: GPU products, their GPU-instance profiles and the placements NVML allows.

This is the fallback for what an agent reads at run time with ``nvidia-smi mig -lgip`` /
``-lgipp`` (``nvmlDeviceGetGpuInstanceProfileInfoV`` and
``nvmlDeviceGetGpuInstancePossiblePlacements_v2``); see :mod:`fleet.mig.products` for the tables
and their sources.
"""

from __future__ import annotations

from fleet.mig.model import MEDIA_KINDS, Placement, Product, Profile, normalize_profile_name
from fleet.mig.products import PRODUCTS

__all__ = [
    "MEDIA_KINDS",
    "PRODUCTS",
    "Placement",
    "Product",
    "Profile",
    "find_product",
    "normalize_profile_name",
    "product_by_key",
]

_NVIDIA_VENDOR_ID = 0x10DE
_BY_KEY = {product.key: product for product in PRODUCTS}


def _normalize_product_name(name: str) -> str:
    # R450 drivers printed "A100-SXM4-40GB" where later ones print "NVIDIA A100-SXM4-40GB" (§1.8).
    return " ".join(name.split()).lower().removeprefix("nvidia ")


_BY_NAME = {
    _normalize_product_name(name): product
    for product in PRODUCTS
    for name in (product.name, *product.aliases)
}
_BY_PCI = {device_id: product for product in PRODUCTS for device_id in product.pci_device_ids}


def find_product(*, name: str | None = None, pci_device_id: int | None = None) -> Product | None:
    """Finds the catalog product for what NVML says about a GPU.

    The name is ``nvmlDeviceGetName`` (``nvidia-smi --query-gpu=name``); the PCI id is
    ``nvmlPciInfo_t.pciDeviceId``. When both are given and both are known, the PCI id wins: names
    change with drivers and subsystem ids, device ids do not.

    Args:
        name: product name, case-insensitive, with or without the ``NVIDIA `` prefix.
        pci_device_id: the 16-bit device id (``0x20B0``) or the combined 32-bit
            device/vendor form (``0x20B010DE``) that NVML and mig-parted device filters use.

    Returns:
        The product, or ``None`` when the catalog does not know it.
    """
    if pci_device_id is not None:
        device_id = pci_device_id
        if device_id > 0xFFFF and device_id & 0xFFFF == _NVIDIA_VENDOR_ID:
            device_id >>= 16
        if device_id in _BY_PCI:
            return _BY_PCI[device_id]
    if name is not None:
        return _BY_NAME.get(_normalize_product_name(name))
    return None


def product_by_key(key: str) -> Product | None:
    """The product with this stable slug (e.g. ``a100-sxm4-40gb``), or ``None``."""
    return _BY_KEY.get(key.strip().lower())
