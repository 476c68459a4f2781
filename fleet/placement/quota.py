"""Team quotas: what a replica takes, what a team holds, and which limits a new replica breaks.

Stdlib only. The quota bounds reservations (allocations), as capacity does, never measured use:
whole GPUs (``gpus``), the compute slices of MIG replicas (``mig_compute_slices``, the ``g`` of
the profile name), MPS memory (``mps_memory_mib``) and replicas per MIG profile
(``mig_profiles``). A limit left ``None`` (or a profile not listed) bounds nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet.domain import Violation
from fleet.placement.snapshot import MigRequest, MpsRequest, PlacementRequest, WholeGpuRequest

QUOTA_EXCEEDED = "quota.exceeded"

_COMPUTE_SLICES = re.compile(r"(?:^|[^0-9])(\d+)g\.")


def compute_slices_of(profile: str | int) -> int:
    """The compute slices of a MIG profile name: the ``g`` in ``3g.40gb`` (``1g.10gb+me``: 1).

    A profile given by its numeric id has no name to read: 0 (the catalog's names are the
    ones the API takes)."""
    found = _COMPUTE_SLICES.search(str(profile))
    return int(found.group(1)) if found else 0


def profile_key(profile: str | int) -> str:
    """The name a ``mig_profiles`` limit is keyed by (``mig-3g.40gb`` counts as ``3g.40gb``)."""
    text = str(profile).strip()
    return text[4:] if text.startswith("mig-") else text


@dataclass(frozen=True)
class Usage:
    """Capacity held by a team, or asked for by one replica."""

    gpus: int = 0
    mig_compute_slices: int = 0
    mps_memory_mib: int = 0
    mig_profiles: Mapping[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "gpus": self.gpus,
            "mig_compute_slices": self.mig_compute_slices,
            "mps_memory_mib": self.mps_memory_mib,
            "mig_profiles": dict(self.mig_profiles),
        }


@dataclass(frozen=True)
class Quota:
    """A team's limits; ``None`` (or a profile absent from ``mig_profiles``): unbounded."""

    gpus: int | None = None
    mig_compute_slices: int | None = None
    mps_memory_mib: int | None = None
    mig_profiles: Mapping[str, int] = field(default_factory=dict)

    @property
    def bounded(self) -> bool:
        limits = (self.gpus, self.mig_compute_slices, self.mps_memory_mib)
        return any(limit is not None for limit in limits) or bool(self.mig_profiles)


def replica_demand(request: PlacementRequest) -> Usage:
    """What one replica of ``request`` takes from its team's quota."""
    if isinstance(request, MigRequest):
        return Usage(
            mig_compute_slices=compute_slices_of(request.profile),
            mig_profiles={profile_key(request.profile): 1},
        )
    if isinstance(request, MpsRequest):
        return Usage(mps_memory_mib=request.memory_mib)
    assert isinstance(request, WholeGpuRequest)
    return Usage(gpus=request.count)


def quota_violations(quota: Quota, in_use: Usage, requested: Usage) -> list[Violation]:
    """Every limit that ``in_use + requested`` would pass, each a ``quota.exceeded`` violation
    naming the limit, its value, what is in use and what is asked. Asking for nothing of a
    limit never breaks it, even when the team is already over it (a lowered quota)."""
    checks: list[tuple[str, int | None, int, int]] = [
        ("gpus", quota.gpus, in_use.gpus, requested.gpus),
        (
            "mig_compute_slices",
            quota.mig_compute_slices,
            in_use.mig_compute_slices,
            requested.mig_compute_slices,
        ),
        ("mps_memory_mib", quota.mps_memory_mib, in_use.mps_memory_mib, requested.mps_memory_mib),
    ]
    for profile, asked in sorted(requested.mig_profiles.items()):
        limit = quota.mig_profiles.get(profile)
        checks.append(
            (f"mig_profiles.{profile}", limit, in_use.mig_profiles.get(profile, 0), asked)
        )
    return [
        Violation(
            QUOTA_EXCEEDED,
            f"The team's quota of {limit} for {name} is reached: {used} in use, "
            f"{asked} more asked.",
            {"limit": name, "quota": limit, "in_use": used, "requested": asked},
        )
        for name, limit, used, asked in checks
        if limit is not None and asked > 0 and used + asked > limit
    ]


def quota_shares(quota: Quota, usage: Usage) -> dict[str, float]:
    """Each bounded limit's use as a share of it (``gpus``, ``mig_compute_slices``,
    ``mps_memory_mib``, ``mig_profiles.<profile>``); a limit of 0 counts as full."""
    shares: dict[str, float] = {}
    for name, limit, used in (
        ("gpus", quota.gpus, usage.gpus),
        ("mig_compute_slices", quota.mig_compute_slices, usage.mig_compute_slices),
        ("mps_memory_mib", quota.mps_memory_mib, usage.mps_memory_mib),
    ):
        if limit is not None:
            shares[name] = used / limit if limit else 1.0
    for profile, limit in quota.mig_profiles.items():
        used = usage.mig_profiles.get(profile, 0)
        shares[f"mig_profiles.{profile}"] = used / limit if limit else 1.0
    return shares


def covers(a: Usage, b: Usage) -> bool:
    """Whether ``a`` asks for at least ``b`` of every kind (each MIG profile of ``b`` too).
    Quota and borrowing verdicts are monotone in the demand, so a team's quota refusing ``b``
    refuses ``a`` too, on the same holdings and fleet."""
    return (
        a.gpus >= b.gpus
        and a.mig_compute_slices >= b.mig_compute_slices
        and a.mps_memory_mib >= b.mps_memory_mib
        and all(a.mig_profiles.get(key, 0) >= n for key, n in b.mig_profiles.items())
    )


def plus(a: Usage, b: Usage) -> Usage:
    """Two usages added up."""
    profiles = dict(a.mig_profiles)
    for key, n in b.mig_profiles.items():
        profiles[key] = profiles.get(key, 0) + n
    return Usage(
        gpus=a.gpus + b.gpus,
        mig_compute_slices=a.mig_compute_slices + b.mig_compute_slices,
        mps_memory_mib=a.mps_memory_mib + b.mps_memory_mib,
        mig_profiles=profiles,
    )


def minus(a: Usage, b: Usage) -> Usage:
    """``a`` less ``b``, kind by kind, never below 0 (a profile left at 0 is dropped)."""
    profiles = {
        key: left
        for key, n in a.mig_profiles.items()
        if (left := n - b.mig_profiles.get(key, 0)) > 0
    }
    return Usage(
        gpus=max(0, a.gpus - b.gpus),
        mig_compute_slices=max(0, a.mig_compute_slices - b.mig_compute_slices),
        mps_memory_mib=max(0, a.mps_memory_mib - b.mps_memory_mib),
        mig_profiles=profiles,
    )
