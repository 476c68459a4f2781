"""What a team holds against its quota: its replicas in place, each counted once, and the new
copies of its moves in flight but the first (its one surge replica); its quota and limits as
domain values. The rules that read them: :mod:`fleet.allocations.quotas` and
:mod:`fleet.allocations.borrowing`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum

from fleet.allocations.models import Allocation, AllocationState, RequestKind
from fleet.core.models import Team
from fleet.placement.quota import Quota, Usage, plus, profile_key
from fleet.placement.sharing import Sharing

_PLACED = (AllocationState.PENDING, AllocationState.ACTIVE)


@dataclass(frozen=True)
class MovingCopy:
    """The new copy of one of a team's moves in flight: its replica and its allocations."""

    deployment_id: int
    name: str
    replica: int
    allocation_ids: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{self.name}[{self.replica}]"


def quota_of(team: Team) -> Quota:
    return Quota(
        gpus=team.quota_gpus,
        mig_compute_slices=team.quota_mig_compute_slices,
        mps_memory_mib=team.quota_mps_memory_mib,
        mig_profiles=dict(team.quota_mig_profiles or {}),
    )


def team_usage(team_id: int, moving: list[MovingCopy] | None = None) -> Usage:
    """What the team holds against its quota now: its replicas, each counted once, and the new
    copies of its moves in flight but the first (its one surge replica). ``moving``: the
    team's :func:`moving_copies`, when read already."""
    placed = Allocation.objects.placed().filter(deployment__team_id=team_id)
    held = usage_of(placed)
    if moving is None:
        moving = moving_copies(team_id)
    if len(moving) < 2:
        return held
    counted = [pk for copy in moving[1:] for pk in copy.allocation_ids]
    return plus(held, _summed(placed.filter(pk__in=counted)))


def moving_copies(team_id: int) -> list[MovingCopy]:
    """The new copies of the team's moves in flight (each beside the copy it replaces, still in
    place), oldest first: the first is the team's surge replica."""
    rows = (
        Allocation.objects.placed()
        .filter(deployment__team_id=team_id, replaces__state__in=_PLACED)
        .order_by("pk")
        .values_list("pk", "deployment_id", "deployment__name", "replica")
    )
    copies: dict[tuple[int, int], list[Any]] = {}
    for pk, deployment_id, name, replica in rows:
        found = copies.setdefault((deployment_id, replica), [name, []])
        found[1].append(pk)
    return [
        MovingCopy(deployment_id, name, replica, tuple(pks))
        for (deployment_id, replica), (name, pks) in copies.items()
    ]


def usage_of(placed: QuerySet[Allocation]) -> Usage:
    """What the replicas of these placed allocation rows hold, each counted once (a move's new
    copy not while the copy it replaces is in place)."""
    return _summed(placed.exclude(replaces__state__in=_PLACED))


def _summed(rows: QuerySet[Allocation]) -> Usage:
    """What these allocation rows hold (one query for the sums, one for the profiles)."""
    sums = rows.aggregate(
        gpus=Count("pk", filter=Q(kind=RequestKind.GPU)),
        slices=Sum("partition__compute_slices", filter=Q(kind=RequestKind.MIG)),
        mps=Sum("memory_mib", filter=Q(kind=RequestKind.MPS)),
    )
    profiles: dict[str, int] = {}
    per_profile = (
        rows.filter(kind=RequestKind.MIG)
        .values_list("deployment__profile")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for profile, n in per_profile:
        key = profile_key(profile)
        profiles[key] = profiles.get(key, 0) + n
    return Usage(
        gpus=sums["gpus"] or 0,
        mig_compute_slices=sums["slices"] or 0,
        mps_memory_mib=sums["mps"] or 0,
        mig_profiles=profiles,
    )


def limit_of(team: Team) -> Quota:
    return Quota(
        gpus=team.limit_gpus,
        mig_compute_slices=team.limit_mig_compute_slices,
        mps_memory_mib=team.limit_mps_memory_mib,
        mig_profiles=dict(team.limit_mig_profiles or {}),
    )


def sharing_of(team: Team) -> Sharing:
    """The team's deserved share (its quota) and its limit."""
    return Sharing(deserved=quota_of(team), limit=limit_of(team))
