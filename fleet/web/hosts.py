"""The fleet view's host groups, for the first render and for every fragment that redraws them.

Every group carries its host's summary, read from light rows of the whole host. A group is
*drawn* (its GPU cards rendered) or not (its summary header and a labelled placeholder the
browser fills when it scrolls into view): on a fleet showing more than
:data:`~fleet.web.presenters_fleet_hosts.LAZY_AFTER_GPUS` GPUs the first render draws only its first
screen, so the page costs about the same at 10,000 GPUs as at a few hundred.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fleet.inventory.filters import GPU_FILTER_NAMES, filter_gpus
from fleet.inventory.models import Gpu
from fleet.web import presenters, selectors
from fleet.web.presenters_fleet_hosts import (
    LAZY_AFTER_GPUS,
    HostView,
    first_screen,
    host_summaries,
)


@dataclass(frozen=True)
class HostsView:
    groups: list[HostView]
    rows: list[Gpu]  # every GPU row read (light), by host and index
    utilization: dict[int, Any]  # the latest utilisation of every GPU read
    shown: int  # GPUs the filters keep
    lazy: bool  # some groups are not drawn


def filtering(params: Any) -> bool:
    return any(str(params.get(name, "")).strip() for name in GPU_FILTER_NAMES)


def hosts_view(
    params: Any,
    *,
    host_ids: Iterable[int] | None = None,
    gpu_ids: set[int] | None = None,
    drawn: set[int] | None = None,
    lazy_after: int | None = LAZY_AFTER_GPUS,
) -> HostsView:
    """The groups of the GPUs ``params``' filters keep (of ``host_ids``; cards only for
    ``gpu_ids`` when given). ``drawn``: the hosts whose cards to render (``None``: every host,
    or, past ``lazy_after`` GPUs shown, the first screen's)."""
    hosts_filter = None if host_ids is None else set(host_ids)
    rows = list(selectors.fleet_gpu_rows(host_ids=hosts_filter))
    shown_rows = rows
    if filtering(params):
        keep = set(
            filter_gpus(selectors.fleet_gpu_rows(host_ids=hosts_filter), params).values_list(
                "pk", flat=True
            )
        )
        shown_rows = [r for r in rows if r.pk in keep]
    lazy = drawn is not None
    if drawn is None and lazy_after is not None and len(shown_rows) > lazy_after:
        drawn, lazy = first_screen(r.host_id for r in shown_rows), True
    utilization = selectors.gpu_utilization(rows)
    return HostsView(
        groups=_groups(shown_rows, rows, utilization, hosts_filter, gpu_ids, drawn),
        rows=rows,
        utilization=utilization,
        shown=len(shown_rows),
        lazy=lazy,
    )


def _groups(
    shown_rows: list[Gpu],
    rows: list[Gpu],
    utilization: dict[int, Any],
    host_ids: set[int] | None,
    gpu_ids: set[int] | None,
    drawn: set[int] | None,
) -> list[HostView]:
    summaries = host_summaries(
        rows,
        utilization,
        selectors.allocation_counts(host_ids=host_ids),
        selectors.free_instance_counts(host_ids=host_ids),
    )
    shown: dict[int, int] = {}
    for row in shown_rows:
        shown[row.host_id] = shown.get(row.host_id, 0) + 1
    card_ids = [
        r.pk
        for r in shown_rows
        if (gpu_ids is None or r.pk in gpu_ids) and (drawn is None or r.host_id in drawn)
    ]
    hosts = list(selectors.fleet_hosts(host_ids=shown))
    everything = gpu_ids is None and drawn is None and len(card_ids) == len(rows)
    read = None if everything else card_ids  # the whole fleet: no list of ids to send
    gpus = list(selectors.fleet_gpus(gpu_ids=read)) if card_ids else []
    samples = selectors.latest_samples(gpus)
    groups = presenters.host_groups(gpus, hosts, selectors.gpus_applying(read), samples)
    cards = {g.host.pk: g.cards for g in groups}
    return [
        HostView(
            host=host,
            summary=summaries[host.pk],
            cards=cards.get(host.pk, []),
            drawn=drawn is None or host.pk in drawn,
            shown=shown[host.pk],
        )
        for host in hosts
    ]
