"""The fleet view's host groups and its summary in numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleet.inventory.models import Gpu, Host, SharingMode
from fleet.web.presenters.formats import utilization_value
from fleet.web.presenters.gpu_cards import UNHEALTHY, GpuCard, safe_gpu_card


@dataclass(frozen=True)
class HostGroup:
    host: Host
    cards: list[GpuCard]

    @property
    def products(self) -> str:
        names = sorted({c.product_short for c in self.cards})
        return ", ".join(names)

    @property
    def unhealthy(self) -> int:
        return sum(1 for c in self.cards if c.unhealthy)


def host_groups(
    gpus: list[Gpu],
    hosts: list[Host],
    applying: set[int],
    samples: dict[int, tuple[dict[str, Any], Any]] | None = None,
) -> list[HostGroup]:
    by_host: dict[int, list[GpuCard]] = {h.pk: [] for h in hosts}
    host_of = {h.pk: h for h in hosts}
    samples = samples or {}
    for gpu in gpus:
        if gpu.host_id in by_host:
            found = samples.get(gpu.pk)
            by_host[gpu.host_id].append(
                safe_gpu_card(
                    gpu,
                    applying=gpu.pk in applying,
                    host=host_of[gpu.host_id],
                    sample=found[0] if found else None,
                )
            )
    return [HostGroup(host=h, cards=by_host[h.pk]) for h in hosts if by_host[h.pk]]


@dataclass(frozen=True)
class FleetSummary:
    hosts: int
    gpus: int
    by_mode: dict[str, int]
    unhealthy: int
    cordoned: int
    mean_utilization: float | None


def fleet_summary(gpus: list[Gpu], utilization: dict[int, Any]) -> FleetSummary:
    """The whole fleet in numbers; ``utilization`` from
    :func:`fleet.web.selectors.gpu_utilization`."""
    utils = [utilization_value(utilization.get(g.pk)) for g in gpus]
    known = [u for u in utils if u is not None]
    return FleetSummary(
        hosts=len({g.host_id for g in gpus}),
        gpus=len(gpus),
        by_mode={mode: sum(1 for g in gpus if g.mode == mode) for mode in SharingMode.values},
        unhealthy=sum(1 for g in gpus if g.health in UNHEALTHY),
        cordoned=sum(1 for g in gpus if g.cordoned),
        mean_utilization=round(sum(known) / len(known), 1) if known else None,
    )
