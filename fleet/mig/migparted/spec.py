"""A mig-parted file as values (Go ``Spec`` and ``MigConfigSpec``), and the error a document
that does not follow the v1 schema raises."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet.mig.model import Product

SPEC_VERSION = "v1"

_NVIDIA_VENDOR = "10DE"


class MigPartedError(ValueError):
    """A mig-parted document that does not follow the v1 schema.

    Attributes:
        message: what is wrong, for people.
        details: where (config name, entry index, key).
    """

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = dict(details or {})


@dataclass(frozen=True)
class MigConfigSpec:
    """One entry of a named config (Go ``MigConfigSpec``).

    Attributes:
        devices: ``"all"`` or GPU indices.
        mig_enabled: whether MIG mode is on for these GPUs.
        mig_devices: (profile name, count) pairs in document order.
        device_filter: ``0x<DEVICE><VENDOR>`` ids (upper-case hex) the entry applies to;
            empty means any GPU.
    """

    devices: str | tuple[int, ...] = "all"
    mig_enabled: bool = True
    mig_devices: tuple[tuple[str, int], ...] = ()
    device_filter: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        """``mig-devices`` as a dict."""
        return dict(self.mig_devices)

    def applies_to(self, product: Product) -> bool:
        """Whether the device filter (if any) matches one of the product's PCI ids."""
        if not self.device_filter:
            return True
        return any(device_filter_id(d) in self.device_filter for d in product.pci_device_ids)


@dataclass(frozen=True)
class MigPartedConfig:
    """A whole mig-parted file (Go ``Spec``).

    Attributes:
        mig_configs: (config name, entries) pairs in document order.
        version: always ``v1``.
    """

    mig_configs: tuple[tuple[str, tuple[MigConfigSpec, ...]], ...]
    version: str = SPEC_VERSION

    def config(self, name: str) -> tuple[MigConfigSpec, ...] | None:
        """The entries of a named config (what ``nvidia-mig-parted apply -c <name>`` selects)."""
        return dict(self.mig_configs).get(name)


def device_filter_id(pci_device_id: int) -> str:
    """The mig-parted form of a 16-bit device id: ``0x20B0`` -> ``"0x20B010DE"``."""
    return f"0x{pci_device_id:04X}{_NVIDIA_VENDOR}"
