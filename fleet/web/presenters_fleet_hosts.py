"""Host groups of the fleet view: a summary per host (GPU count, modes, idle GPUs, free MIG
instances, utilisation, health) read from light rows, and which groups are drawn whole on the
first render. On a large fleet the page draws the first screen's cards and sends only the
summaries of the other hosts; the browser draws their cards as they scroll into view
(``static/web/fleet/lazy.js``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fleet.inventory.models import Gpu, SharingMode
from fleet.web.presenters import UNHEALTHY, GpuCard, utilization_value

LAZY_AFTER_GPUS = 256
"""A fleet view showing more GPUs than this draws only its first screen of host groups whole."""

FIRST_SCREEN_GPUS = 48
"""How many GPUs' cards the first render of a large fleet draws (the host groups they fill)."""

MODE_LABELS: dict[str, str] = {"mig": "MIG", "mps": "MPS", "dedicated": "Dedicated"}


@dataclass(frozen=True)
class HostSummary:
    """One host in numbers: every GPU of the host, whatever the filters show."""

    gpus: int
    products: str
    by_mode: tuple[tuple[str, int], ...]
    idle: int
    free_instances: int
    unhealthy: int
    cordoned: int
    mean_utilization: float | None

    @property
    def modes(self) -> str:
        return ", ".join(f"{count} {MODE_LABELS.get(mode, mode)}" for mode, count in self.by_mode)


def host_summaries(
    rows: Iterable[Gpu],
    utilization: dict[int, Any],
    allocations: dict[int, int],
    free_instances: dict[int, int],
) -> dict[int, HostSummary]:
    """``{host id: summary}`` from light GPU rows (:func:`fleet.web.selectors.fleet_gpu_rows`),
    their utilisation (:func:`fleet.web.selectors.gpu_utilization`), allocations per GPU and
    free MIG instances per host."""
    by_host: dict[int, list[Gpu]] = {}
    for gpu in rows:
        by_host.setdefault(gpu.host_id, []).append(gpu)
    return {
        host_id: _summary(gpus, utilization, allocations, free_instances.get(host_id, 0))
        for host_id, gpus in by_host.items()
    }


def _summary(
    gpus: list[Gpu],
    utilization: dict[int, Any],
    allocations: dict[int, int],
    free_instances: int,
) -> HostSummary:
    utils = [utilization_value(utilization.get(g.pk)) for g in gpus]
    known = [u for u in utils if u is not None]
    modes = [(m, sum(1 for g in gpus if g.mode == m)) for m in SharingMode.values]
    return HostSummary(
        gpus=len(gpus),
        products=", ".join(sorted({g.product_name.removeprefix("NVIDIA ").strip() for g in gpus})),
        by_mode=tuple((m, n) for m, n in modes if n),
        idle=sum(1 for g in gpus if not allocations.get(g.pk)),
        free_instances=free_instances,
        unhealthy=sum(1 for g in gpus if g.health in UNHEALTHY),
        cordoned=sum(1 for g in gpus if g.cordoned),
        mean_utilization=round(sum(known) / len(known), 1) if known else None,
    )


def first_screen(gpu_host_ids: Iterable[int], *, limit: int = FIRST_SCREEN_GPUS) -> set[int]:
    """The hosts whose cards the first render draws: in page order, until ``limit`` GPUs."""
    drawn: set[int] = set()
    for count, host_id in enumerate(gpu_host_ids):
        if count >= limit and host_id not in drawn:
            break
        drawn.add(host_id)
    return drawn


@dataclass(frozen=True)
class HostView:
    """A host group as the fleet view shows it: its summary, and its cards when drawn."""

    host: Any
    summary: HostSummary
    cards: list[GpuCard]
    drawn: bool = True
    shown: int = 0  # GPUs of the host the filters keep (drawn or not)

    @property
    def placeholder_rows(self) -> int:
        """About how many rows of cards the undrawn group will take (keeps the scrollbar)."""
        return max(1, -(-self.shown // 4))
