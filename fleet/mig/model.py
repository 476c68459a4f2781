"""The MIG catalog's value types: placements, GPU-instance profiles and GPU products.

Stdlib only. The product tables live in :mod:`fleet.mig.products`; :mod:`fleet.mig.catalog` is the
public entry point that re-exports these types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

MEDIA_KINDS = ("", "+me", "+me.all", "-me", "+gfx")
"""Attribute suffixes of a profile name (go-nvlib: REV1, ALL_ME, NO_ME, GFX)."""


@dataclass(frozen=True, order=True)
class Placement:
    """Where a GPU instance sits, in memory-slice units.

    Attributes:
        start: index of the first occupied memory slice (NVML ``nvmlGpuInstancePlacement_t.start``).
        size: number of memory slices occupied (NVML ``nvmlGpuInstancePlacement_t.size``).
    """

    start: int
    size: int

    @property
    def slices(self) -> range:
        """The memory-slice indices this placement occupies."""
        return range(self.start, self.start + self.size)

    def overlaps(self, other: Placement) -> bool:
        """Whether the two placements share at least one memory slice."""
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True)
class Profile:
    """One GPU-instance profile of a product, as ``nvidia-smi mig -lgip`` / ``-lgipp`` show it.

    Attributes:
        id: NVML ``nvmlGpuInstanceProfileInfo_v2_t.id``, the number ``nvidia-smi`` prints.
        name: label such as ``1g.10gb`` or ``1g.10gb+me``; names drift between drivers.
        compute_slices: the ``g`` in the name.
        memory_slices: placement size in memory slices.
        memory_mib: instance memory in MiB (see the product table for where each number comes from).
        max_instances: NVML ``instanceCount``.
        placements: NVML possible placements (``nvidia-smi mig -lgipp``).
        media: ``""``, ``"+me"``, ``"+me.all"``, ``"-me"`` or ``"+gfx"``.
        aliases: other names drivers have printed for this profile (e.g. ``3g.39gb``).
    """

    id: int
    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    max_instances: int
    placements: tuple[Placement, ...]
    media: str = ""
    aliases: tuple[str, ...] = field(default=(), compare=False)

    def placement_at(self, start: int) -> Placement:
        """The placement of this profile that begins at ``start`` (allowed or not).

        The size is the listed placement's where there is one (the driver's word), else the
        profile's ``memory_slices``.
        """
        return next((p for p in self.placements if p.start == start), None) or Placement(
            start, self.memory_slices
        )

    def allows_start(self, start: int) -> bool:
        """Whether NVML lists a placement of this profile starting at ``start``."""
        return any(p.start == start for p in self.placements)

    def as_dict(self) -> dict[str, Any]:
        """The profile as JSON: what NVML reports for it (``-lgip`` / ``-lgipp``)."""
        return {
            "id": self.id,
            "name": self.name,
            "compute_slices": self.compute_slices,
            "memory_slices": self.memory_slices,
            "memory_mib": self.memory_mib,
            "max_instances": self.max_instances,
            "placements": [[p.start, p.size] for p in self.placements],
        }

    def answers_to(self, name: str) -> bool:
        """Whether ``name`` names this profile (any case, optional SageMaker ``mig-`` prefix)."""
        wanted = normalize_profile_name(name)
        return wanted in (normalize_profile_name(n) for n in (self.name, *self.aliases))


@dataclass(frozen=True)
class Product:
    """A GPU product and its MIG geometry.

    Attributes:
        key: stable slug such as ``a100-sxm4-40gb``.
        name: the NVML product name (``nvmlDeviceGetName``).
        aliases: other names NVML may print for the same product.
        pci_device_ids: 16-bit PCI device ids (the high half of ``nvmlPciInfo_t.pciDeviceId``).
        memory_mib: nominal frame-buffer size in MiB.
        mig_capable: whether the product supports MIG at all.
        memory_slice_count: memory slices of the placement grid (8, 4 or 12; 0 without MIG).
        compute_slice_count: compute slices (7 or 4; 0 without MIG).
        max_instances: most GPU instances at once (7 or 4; 0 without MIG).
        profiles: the GPU-instance profiles, largest first.
    """

    key: str
    name: str
    aliases: tuple[str, ...]
    pci_device_ids: tuple[int, ...]
    memory_mib: int
    mig_capable: bool
    memory_slice_count: int
    compute_slice_count: int
    max_instances: int
    profiles: tuple[Profile, ...]

    def profile(self, ref: int | str) -> Profile | None:
        """Looks a profile up by NVML id or by name.

        Names match case-insensitively, with or without the SageMaker ``mig-`` prefix
        (``mig-3g.40gb``), and also match the profile's known aliases. A string of digits is an id.

        Args:
            ref: profile id (``nvidia-smi mig -lgip`` "ID" column) or name.

        Returns:
            The profile, or ``None`` when this product has no such profile.
        """
        if isinstance(ref, str) and ref.strip().isdecimal():
            ref = int(ref)
        if isinstance(ref, int):
            return next((p for p in self.profiles if p.id == ref), None)
        return next((p for p in self.profiles if p.answers_to(ref)), None)

    def with_placements(self, reported: Mapping[int, Sequence[Placement]]) -> Product:
        """A copy whose placements are the ones an agent read from the driver.

        Mirrors ``nvmlDeviceGetGpuInstancePossiblePlacements_v2`` per profile id: reported
        placements replace the catalog's, profiles missing from the report keep theirs, and a
        profile reported with no placements is dropped (the driver does not offer it). Reported
        ids the catalog lacks are ignored: without ``-lgip`` data their name and counts are unknown.

        Args:
            reported: placements per profile id.

        Returns:
            A new product; this one is unchanged.
        """
        profiles: list[Profile] = []
        for profile in self.profiles:
            if profile.id not in reported:
                profiles.append(profile)
                continue
            placements = tuple(sorted(set(reported[profile.id])))
            if placements:
                size = placements[0].size
                profiles.append(replace(profile, placements=placements, memory_slices=size))
        return replace(self, profiles=tuple(profiles))


def normalize_profile_name(name: str) -> str:
    """Canonical form of a profile name: lower case, no blanks, no SageMaker ``mig-`` prefix."""
    cleaned = name.strip().lower()
    return cleaned.removeprefix("mig-")
